"""Ask a searcher one query before a run depends on it: a dead server or an unreadable index stops the run at
start with the reason, instead of turning every search of the run into an error observation that is then scored
as if the model had been searching."""

from __future__ import annotations

from typing import Any

from ..errors import UserError

PROBE_QUERY = "probe"


class SearchUnavailableError(UserError):
    """The search target did not answer the probe query; the message names it and the reason."""


def probe(searcher: Any, where: str | None = None) -> None:
    """``searcher.search(PROBE_QUERY, 1)``; :class:`SearchUnavailableError` naming ``where`` (an index directory
    or a server URL) when it raises. No hits is an answer (a corpus without the word)."""
    try:
        searcher.search(PROBE_QUERY, 1)
    except Exception as exc:  # noqa: BLE001 - every failure is the search target's, reported with its reason
        target = where or type(searcher).__name__
        fix = ("is `agentic-rag serve-search` running there, and is the URL right?"
               if str(target).startswith(("http://", "https://")) else "rebuild or fix the index")
        raise SearchUnavailableError(f"the search target {target} does not answer a probe query "
                                     f"({type(exc).__name__}: {exc}); {fix}") from None
