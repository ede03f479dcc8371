"""The events of a trajectory: one schema, written by the engine, read by rewards, metrics, monitoring, serving and
the gold-trajectory tools through the functions here (so no reader re-parses event dicts its own way).

Events stay plain JSON objects (they are saved in trajectory files, evaluation records and checkpoints); each has a
``type`` and the ``turn`` it happened in. The types and their fields:

======================  ================================================================================================
``search``              a retrieval tool's call answered: ``tool``, ``queries``, ``results`` (per query: ``query``,
                        ``hits`` as shown ``{docid, title, text, partial}``, ``cut`` ``{docid, title}``, or ``text``)
``tool``                another tool's call answered: ``tool``, ``arguments`` (or ``queries`` for a query tool),
                        ``result`` (its first 200 characters) or ``results``, ``failed``, ``truncated``
``observation``         the environment's text was appended: ``tokens``, ``truncated`` (``dropped`` when it did not fit)
``error``               ``kind``: ``search_failed`` (``message``, ``queries``, ``partial``), ``tool_failed`` (``tool``,
                        ``message``), ``malformed_call`` (``tool``, ``message``, ``raw``), ``empty_query``,
                        ``nothing_to_backtrack``
``limit``               a call past its limit was refused: ``name`` (``max_searches``, ``max_calls``), ``tool``
``answer``              the final answer: ``text``
``backtrack``           ``reason``, ``dropped_tokens``
``summary``             ``text``, ``mode``
``forged_tag``          the model wrote an environment tag: ``tag``
``client_calls``        calls of tools the caller runs (a chat client's): ``calls`` (``name``, ``arguments``)
``finish``              ``reason``
======================  ================================================================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypedDict

Event = Mapping[str, Any]

SEARCH, TOOL, OBSERVATION, ERROR, LIMIT, ANSWER = "search", "tool", "observation", "error", "limit", "answer"
BACKTRACK, SUMMARY, FORGED_TAG, FINISH = "backtrack", "summary", "forged_tag", "finish"
CLIENT_CALLS = "client_calls"
EVENT_TYPES = (SEARCH, TOOL, OBSERVATION, ERROR, LIMIT, ANSWER, BACKTRACK, SUMMARY, FORGED_TAG, FINISH, CLIENT_CALLS)
ERROR_KINDS = ("search_failed", "tool_failed", "malformed_call", "empty_query", "nothing_to_backtrack")


class SearchEvent(TypedDict, total=False):
    type: Literal["search"]
    turn: int
    tool: str
    queries: list[str]
    results: list[dict[str, Any]]


class ToolEvent(TypedDict, total=False):
    type: Literal["tool"]
    turn: int
    tool: str
    arguments: dict[str, Any]
    queries: list[str]
    result: str
    results: list[dict[str, Any]]
    failed: bool
    truncated: bool


class ErrorEvent(TypedDict, total=False):
    type: Literal["error"]
    turn: int
    kind: str
    tool: str
    message: str
    queries: list[str]
    partial: bool
    raw: str


def of_type(events: Iterable[Event], kind: str) -> list[Event]:
    return [e for e in events if e.get("type") == kind]


def search_events(events: Iterable[Event]) -> list[Event]:
    """The searches that were answered (a retrieval tool's calls)."""
    return of_type(events, SEARCH)


def search_queries(events: Iterable[Event]) -> list[str]:
    """Every query the searches asked, in order."""
    return [q for e in search_events(events) for q in e.get("queries", [])]


def searched_with_hits(events: Iterable[Event]) -> bool:
    """Whether some search showed at least one passage."""
    return any(r.get("hits") for e in search_events(events) for r in e.get("results", []))


def shown_docids(events: Iterable[Event]) -> set[str]:
    """The docids of every passage the searches showed."""
    return {h["docid"] for e in search_events(events) for r in e.get("results", []) for h in r.get("hits", [])}


def tool_events(events: Iterable[Event]) -> list[Event]:
    """The calls of tools that do not retrieve, answered."""
    return of_type(events, TOOL)


def calls_by_tool(events: Iterable[Event]) -> Counter[str]:
    """Answered calls per tool name (searches and other tools alike)."""
    return Counter(e.get("tool") or "search" for e in events if e.get("type") in (SEARCH, TOOL))


def failures_by_tool(events: Iterable[Event]) -> Counter[str]:
    """Failed calls per tool name (a search's under its tool's name; a malformed call under the name it gave)."""
    out: Counter[str] = Counter()
    for e in events:
        if e.get("type") != ERROR:
            continue
        if e.get("kind") == "search_failed":
            out["search"] += len(e.get("queries") or [None])
        elif e.get("kind") in ("tool_failed", "malformed_call"):
            out[e.get("tool") or "(unnamed)"] += 1
    return out


def errors(events: Iterable[Event], kind: str | None = None) -> list[Event]:
    return [e for e in events if e.get("type") == ERROR and (kind is None or e.get("kind") == kind)]


def search_outcomes(events: Iterable[Event]) -> tuple[int, int]:
    """``(failed, carried out)`` search queries of a trajectory's events: the measure of a broken search target that
    evaluation and training stop on. A search call that failed whole is one ``search_failed`` error naming its
    queries; a call that was answered is a ``search`` event, and a query of it that failed alone also has an error
    (``partial``). A search the rollout never ran (the turn limit came first) counts in neither."""
    failed = attempted = 0
    for e in events:
        if e.get("type") == SEARCH:
            attempted += len(e.get("queries") or [None])
        elif e.get("type") == ERROR and e.get("kind") == "search_failed":
            n = len(e.get("queries") or [None])
            failed += n
            if not e.get("partial"):
                attempted += n
    return failed, attempted
