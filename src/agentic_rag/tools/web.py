"""A web-search tool over a configurable HTTP search API.

Many web search APIs answer ``GET/POST`` with JSON holding a list of results, each with a title, a snippet
and a URL, under different field names. :class:`WebSearchTool` is configured with the endpoint, the
method, the name of the query parameter, the path to the result list and the field names, and an API key
read from an environment variable (never from a config file, never logged).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..search.client import http_client
from ..search.types import Hit, SearchError
from .base import QUERY_PARAMETERS, ToolResult


class WebSearchTool:
    retrieves = True  # its calls are searches
    parameters = QUERY_PARAMETERS
    max_calls = None  # a search: rollout.max_searches limits it
    max_observation_tokens = None  # rollout.max_observation_tokens

    def __init__(self, url: str, *, name: str = "web_search", method: str = "GET", query_param: str = "q",
                 count_param: str | None = "count", results_path: Sequence[str] = ("results",),
                 title_field: str = "title", text_field: str = "snippet", url_field: str = "url",
                 api_key_env: str | None = None, api_key_header: str = "Authorization",
                 api_key_prefix: str = "Bearer ", timeout: float = 10.0, max_workers: int = 4):
        if method not in ("GET", "POST"):
            raise ValueError(f"method must be GET or POST, got {method!r}")
        self.url, self.name, self.method = url, name, method
        self.description = "search the web"
        self.query_param, self.count_param = query_param, count_param
        self.results_path = list(results_path)
        self.title_field, self.text_field, self.url_field = title_field, text_field, url_field
        self.headers: dict[str, str] = {}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"the web search API key variable {api_key_env} is not set")
            self.headers[api_key_header] = api_key_prefix + key
        self._client = http_client(timeout)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="web-search")

    def _one(self, query: str, k: int) -> list[Hit]:
        params: dict[str, Any] = {self.query_param: query}
        if self.count_param:
            params[self.count_param] = k
        if self.method == "GET":
            resp = self._client.get(self.url, params=params, headers=self.headers)
        else:
            resp = self._client.post(self.url, json=params, headers=self.headers)
        if resp.status_code >= 400:
            raise SearchError(f"web search {self.url} answered HTTP {resp.status_code}: {resp.text[:200]}")
        data: Any = resp.json()
        for key in self.results_path:
            data = data.get(key, []) if isinstance(data, dict) else []
        if not isinstance(data, list):
            raise SearchError(f"web search {self.url}: {'.'.join(self.results_path)} is not a list")
        hits = []
        for rank, item in enumerate(data[:k]):
            if not isinstance(item, dict):
                continue
            hits.append(Hit(docid=str(item.get(self.url_field, rank)), title=str(item.get(self.title_field, "")),
                            text=str(item.get(self.text_field, "")), score=float(k - rank)))
        return hits

    def batch(self, queries: Sequence[str], k: int) -> list[ToolResult]:
        return list(self._pool.map(lambda q: self._one(q, k), queries))

    def close(self) -> None:
        self._client.close()
        self._pool.shutdown(wait=False)
