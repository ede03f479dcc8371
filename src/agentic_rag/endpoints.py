"""OpenAI-compatible endpoints (vLLM, SGLang, a hosted API): API keys from the environment and a fast check
that the endpoint answers before any work starts.

Used by the endpoint policy (:mod:`agentic_rag.rollout.remote`) and the LLM judge
(:mod:`agentic_rag.rewards.judge`). A base URL is what the OpenAI client takes, e.g.
``http://127.0.0.1:8000/v1``; ``/models``, ``/completions`` and ``/chat/completions`` are appended to it.
"""

from __future__ import annotations

import os

import httpx

NO_KEY = "EMPTY"  # what local servers (vLLM, SGLang) accept when they were started without --api-key


class EndpointError(RuntimeError):
    """An OpenAI-compatible endpoint cannot be used; the message names its URL and the likely fix."""


def api_key_from_env(var: str | None) -> str:
    """The API key in environment variable ``var``; ``EMPTY`` when no variable is named or it is unset
    (local servers need none; a hosted API will answer 401, which :func:`check_endpoint` reports)."""
    return (os.environ.get(var) if var else None) or NO_KEY


def check_endpoint(base_url: str, api_key: str = NO_KEY, *, model: str | None = None, timeout_s: float = 5.0,
                   what: str = "endpoint") -> list[str]:
    """``GET {base_url}/models`` with a short timeout; returns the served model ids.

    Raises :class:`EndpointError` naming the URL when the server cannot be reached, refuses the key, or
    does not serve ``model`` (when it lists its models).
    """
    url = base_url.rstrip("/") + "/models"
    try:
        resp = httpx.get(url, headers={"Authorization": f"Bearer {api_key}"},
                         timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 3.0)))
    except httpx.HTTPError as exc:
        raise EndpointError(f"cannot reach the {what} at {base_url} ({type(exc).__name__}: {exc}); is the server "
                            f"running and is the URL right (it usually ends in /v1)?") from None
    if resp.status_code in (401, 403):
        raise EndpointError(f"the {what} at {base_url} refused the API key (HTTP {resp.status_code}); set the "
                            f"environment variable named by api_key_env")
    if resp.status_code == 404:
        hint = f"; did you mean {base_url.rstrip('/')}/v1?" if not base_url.rstrip("/").endswith("/v1") else ""
        raise EndpointError(f"the {what} at {base_url} has no /models route (HTTP 404){hint}")
    if resp.status_code >= 400:
        raise EndpointError(f"the {what} at {base_url} answered GET /models with HTTP {resp.status_code}: "
                            f"{resp.text[:200]}")
    try:
        ids = [str(m.get("id")) for m in resp.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
        raise EndpointError(f"the {what} at {base_url} is not an OpenAI-compatible API (GET /models did not "
                            f"return a model list)") from None
    if model and ids and model not in ids:
        raise EndpointError(f"the {what} at {base_url} does not serve model {model!r}; it serves: {', '.join(ids)}")
    return ids
