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
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from ..tools.base import ToolRegistry, ToolResult
from .protocol import Action

log = logging.getLogger(__name__)

_thread_ids = itertools.count()


@dataclass
class ToolCall:
    """One trajectory's tool call: its action, then its results or its error."""

    index: int
    action: Action
    results: list[ToolResult] = field(default_factory=list)
    error: str | None = None


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
                if len(results) != sum(len(c.action.queries) for c in group):
                    raise RuntimeError(f"tool {name!r} returned {len(results)} results for "
                                       f"{sum(len(c.action.queries) for c in group)} queries")
            except FutureTimeout:
                self.runner._abandon(future)
                for call in group:
                    call.error = f"the search timed out after {self.timeout_s:g} s"
                continue
            except Exception as exc:  # noqa: BLE001 - a tool error goes back to the model as text
                log.warning("tool %s failed: %s", name, exc)
                for call in group:
                    call.error = f"the search failed ({type(exc).__name__}: {str(exc)[:200]})"
                continue
            pos = 0
            for call in group:
                call.results = list(results[pos:pos + len(call.action.queries)])
                pos += len(call.action.queries)
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

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self.call_seconds += time.perf_counter() - started

        return run

    def submit(self, calls: list[ToolCall], k: int, timeout_s: float) -> ToolBatch:
        """Start one batch call per tool for all ``calls`` (in order); a missing tool is an error at once."""
        if self.closed:
            raise RuntimeError("the rollout engine is closed")
        by_tool: dict[str, list[ToolCall]] = {}
        for call in calls:
            by_tool.setdefault(call.action.tool, []).append(call)
        jobs = []
        start = time.monotonic()
        for name, group in by_tool.items():
            if name not in self.tools:
                for call in group:
                    call.error = f"no tool named {name!r} is available"
                continue
            queries = [q for call in group for q in call.action.queries]
            jobs.append((name, group, _spawn(name, self._timed(self.tools.get(name).batch), queries, k)))
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
