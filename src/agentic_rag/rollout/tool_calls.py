"""Tool calls off the decode loop: one batch call per tool, each on a daemon thread of its own.

:meth:`ToolRunner.submit` takes the calls of every trajectory that stopped for a tool in one decode step
and sends the queries of all of them to each tool in **one** ``tool.batch(queries, k)`` call, started at
once on its own thread. :meth:`ToolBatch.collect` waits for the results, at most until ``timeout_s`` after
submission, and hands each call its slice (or its error). The engine decides *when* to collect (see
:mod:`.engine`); nothing here depends on timing except whether a call made its deadline.

Why a thread per call and not a fixed pool: a call that times out is abandoned, not killed (Python cannot
kill a thread). In a pool of N workers, N hung calls would hold every worker and every later call would
queue behind them and time out too. Here an abandoned call holds only its own thread, which is a daemon
thread, so it never keeps the process from exiting either; :attr:`ToolRunner.abandoned` counts the ones
still running. Starting a thread costs far less than any search, and at most one batch per tool is in
flight per engine at a time.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from ..tools.base import ToolRegistry, ToolResult, is_argument_tool

log = logging.getLogger(__name__)

_thread_ids = itertools.count()


@dataclass
class ToolCall:
    """One tool call of a trajectory's turn: what it asks, then its results or its error.

    A query tool gets ``queries`` (one result each); an argument tool gets ``arguments`` and the rollout's ``state``
    (one result). A call answered before any tool runs (malformed, unknown tool, over its limit) has ``answered``
    set: ``error`` (malformed, counted) or ``notice`` (a refusal the model reads) and is never submitted."""

    index: int
    tool: str
    queries: tuple[str, ...] = ()
    arguments: Mapping[str, Any] = field(default_factory=dict)
    state: Any = None
    slot: int = 0  # its place among the turn's calls
    raw: str = ""  # the call as the model wrote it (the tag's content, the JSON)
    results: list[ToolResult] = field(default_factory=list)
    error: str | None = None
    notice: str | None = None
    malformed: bool = False
    retrieves: bool = True  # a search (passages, max_searches, search events); set from the tool
    answered: bool = False
    arguments_call: bool = False  # an argument tool's call (one text result) rather than a query tool's

    @property
    def expected(self) -> int:
        return 1 if self.arguments_call else len(self.queries)


def _spawn(name: str, fn: Callable[..., Any], *args: Any) -> Future:
    """Run ``fn(*args)`` on a new daemon thread; its outcome lands in the returned future."""
    future: Future = Future()
    future.set_running_or_notify_cancel()

    def target() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever collects the call
            future.set_exception(exc)

    threading.Thread(target=target, name=f"rollout-tool-{name}-{next(_thread_ids)}", daemon=True).start()
    return future


@dataclass
class ToolBatch:
    """The calls submitted together (one decode step's), one future per tool, and their common deadline."""

    calls: list[ToolCall]
    jobs: list[tuple[str, list[ToolCall], Future]]
    deadline: float
    timeout_s: float
    runner: ToolRunner

    def collect(self) -> list[ToolCall]:
        """Wait (until the deadline at most) for every tool of the batch and distribute the results."""
        for name, group, future in self.jobs:
            try:
                waited = time.perf_counter()
                try:
                    results = future.result(timeout=max(0.0, self.deadline - time.monotonic()))
                finally:
                    self.runner.wait_seconds += time.perf_counter() - waited
                wanted = sum(c.expected for c in group)
                if len(results) != wanted:
                    unit = "calls" if group[0].arguments_call else "queries"
                    raise RuntimeError(f"tool {name!r} returned {len(results)} results for {wanted} {unit}")
            except FutureTimeout:
                self.runner._abandon(future)
                for call in group:
                    call.error = (f"the search timed out after {self.timeout_s:g} s" if call.retrieves else
                                  f"the tool {name} timed out after {self.timeout_s:g} s")
                continue
            except Exception as exc:  # noqa: BLE001 - a tool error goes back to the model as text
                log.warning("tool %s failed: %s", name, exc)
                for call in group:
                    what = "the search" if call.retrieves else f"the tool {name}"
                    call.error = f"{what} failed ({type(exc).__name__}: {str(exc)[:200]})"
                continue
            pos = 0
            for call in group:
                call.results = list(results[pos:pos + call.expected])
                pos += call.expected
        return self.calls


class ToolRunner:
    """Starts batch tool calls on daemon threads; see the module docstring."""

    def __init__(self, tools: ToolRegistry):
        self.tools = tools
        self.closed = False
        self._abandoned: list[Future] = []
        self._lock = threading.Lock()
        # time spent in tool calls (on their threads) and time the engine stood waiting for them (on its own)
        self.call_seconds = 0.0
        self.wait_seconds = 0.0
        self.seconds_by_tool: dict[str, float] = {}  # per tool: time in its batch calls
        self.calls_by_tool: dict[str, int] = {}  # per tool: calls made

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent = time.perf_counter() - started
                with self._lock:
                    self.call_seconds += spent
                    self.seconds_by_tool[name] = self.seconds_by_tool.get(name, 0.0) + spent

        return run

    def submit(self, calls: list[ToolCall], k: int, timeout_s: float) -> ToolBatch:
        """Start one batch call per tool for all ``calls`` not yet answered (in order); a missing tool is an error
        at once."""
        if self.closed:
            raise RuntimeError("the rollout engine is closed")
        by_tool: dict[str, list[ToolCall]] = {}
        for call in calls:
            if not call.answered:
                by_tool.setdefault(call.tool, []).append(call)
        jobs = []
        start = time.monotonic()
        for name, group in by_tool.items():
            if name not in self.tools:
                for call in group:
                    call.error = f"no tool named {name!r} is available"
                continue
            tool = self.tools.get(name)
            with self._lock:
                self.calls_by_tool[name] = self.calls_by_tool.get(name, 0) + len(group)
            if is_argument_tool(tool):
                job = _spawn(name, self._timed(name, tool.call_batch), [(c.arguments, c.state) for c in group])
            else:
                job = _spawn(name, self._timed(name, tool.batch), [q for c in group for q in c.queries], k)
            jobs.append((name, group, job))
        return ToolBatch(calls, jobs, start + timeout_s, timeout_s, self)

    def _abandon(self, future: Future) -> None:
        with self._lock:
            self._abandoned = [f for f in self._abandoned if not f.done()] + [future]
            n = len(self._abandoned)
        log.warning("a tool call timed out and was abandoned (%d abandoned call(s) still running)", n)

    @property
    def abandoned(self) -> int:
        """Timed-out calls whose threads are still running."""
        with self._lock:
            self._abandoned = [f for f in self._abandoned if not f.done()]
            return len(self._abandoned)

    def close(self) -> None:
        """Refuse new calls. Abandoned calls are left to finish on their daemon threads."""
        self.closed = True
        if self.abandoned:
            log.warning("closing with %d abandoned tool call(s) still running on daemon threads", self.abandoned)
