"""The batching scheduler: one worker thread owns the model; requests wait in a bounded queue.

Requests from the HTTP side become :class:`Job` s in a FIFO queue bounded by ``queue_size`` (one more is
refused with :class:`QueueFull`, which the app answers 429 with Retry-After). The worker takes the oldest
job plus every other waiting job with the same :attr:`Job.batch_key` - its :class:`~.schema.Sampling` (temperature,
top_p, max_tokens), the names of the client's tools whose calls end the run, and whether it runs one turn only (a
forced tool call) - up to ``max_batch``, and runs them together through one :meth:`AgentRollout.run`: one KV cache,
searches of the batch in one call, each job's forced opening (``forced``) in front of its first turn. Grouping is how
each request's settings are honoured exactly (the decoder samples a batch with one setting, the engine hands over the
calls of one set of client tools); a job that does not match waits at most one run, since the next run starts from
the then-oldest job.

Streaming rides on :class:`RolloutHooks`: every token the model writes and every event (search with its
queries and hits, observation, finish) is pushed to the job's ``sink`` as it happens; ``cancelled`` tells the
engine that a job's client went away, and that trajectory ends with finish_reason ``cancelled`` and leaves
the decode batch at once. A job cancelled while still queued never runs.

A run admits no new jobs: requests arriving meanwhile wait for it to end (the engine's run takes a fixed
list of prompts). With short replies and a batch as wide as the hardware likes, that costs little latency.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..rollout.decoding import SamplingParams
from ..rollout.engine import MIN_TURN_TOKENS, AgentRollout, RolloutHooks
from ..rollout.settings import RolloutSettings
from ..rollout.trajectory import Trajectory
from .schema import Sampling

log = logging.getLogger(__name__)

_ids = itertools.count()


class QueueFull(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"the request queue is full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Job:
    """One request's work. ``sink(kind, payload)`` is called from the worker thread with ``("token", id)``,
    ``("event", dict)`` (streaming jobs only), then exactly once ``("done", Trajectory)`` or
    ``("error", Exception)``; it must be thread-safe and must not block."""

    prompt_ids: list[int]
    question: str
    sampling: Sampling
    sink: Callable[[str, Any], None]
    stream: bool = False
    client_tools: frozenset[str] = frozenset()  # tools whose calls end the run and go to the client
    forced: list[int] = field(default_factory=list)  # ids that open the first turn (a forced tool call)
    single_turn: bool = False  # the run ends after the first model turn (a forced tool call is the reply)
    id: int = field(default_factory=lambda: next(_ids))
    cancel_event: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def batch_key(self) -> tuple[Sampling, frozenset[str], bool]:
        """What the jobs of one engine run share."""
        return self.sampling, self.client_tools, self.single_turn

    def cancel(self) -> None:
        """The client went away: the job leaves the queue, or its trajectory ends at the next step."""
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()


@dataclass
class SchedulerStats:
    submitted: int = 0
    rejected: int = 0  # queue full
    completed: int = 0
    failed: int = 0
    cancelled_in_queue: int = 0
    runs: int = 0
    batch_sizes: collections.Counter = field(default_factory=collections.Counter)
    finish_reasons: collections.Counter = field(default_factory=collections.Counter)
    run_seconds_ema: float | None = None


class Scheduler:
    def __init__(self, engine: AgentRollout, *, max_batch: int, queue_size: int,
                 base_settings: RolloutSettings | None = None):
        if max_batch < 1 or queue_size < 1:
            raise ValueError(f"max_batch and queue_size must be >= 1, got {max_batch} and {queue_size}")
        self.engine = engine
        self.max_batch, self.queue_size = max_batch, queue_size
        self.base_settings = base_settings or engine.settings
        self.stats = SchedulerStats()
        self._queue: collections.deque[Job] = collections.deque()
        self._running: list[Job] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------- the HTTP side

    def submit(self, job: Job) -> None:
        """Queue ``job``, or raise :class:`QueueFull` (with a Retry-After estimate) when the queue is full."""
        with self._cond:
            if self._stop:
                raise RuntimeError("the scheduler is stopped")
            self._drop_cancelled()
            if len(self._queue) >= self.queue_size:
                self.stats.rejected += 1
                raise QueueFull(self._retry_after())
            self._queue.append(job)
            self.stats.submitted += 1
            self._cond.notify()

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return sum(not j.cancelled for j in self._queue)

    @property
    def active(self) -> int:
        with self._cond:
            return len(self._running)

    def _retry_after(self) -> int:
        """Seconds until a queue slot is likely free: the runs ahead of the queue times a run's duration."""
        per_run = self.stats.run_seconds_ema or 1.0
        runs_ahead = math.ceil(len(self._queue) / self.max_batch)
        return int(min(120, max(1, math.ceil(per_run * max(1, runs_ahead)))))

    def _drop_cancelled(self) -> None:
        kept = [j for j in self._queue if not j.cancelled]
        for j in self._queue:
            if j.cancelled:
                self.stats.cancelled_in_queue += 1
                self.stats.finish_reasons["cancelled"] += 1
                _send(j, "error", ConnectionAbortedError("cancelled before it ran"))
        if len(kept) != len(self._queue):
            self._queue = collections.deque(kept)

    # ------------------------------------------------------------------------------------------- worker

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="chat-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel everything queued and running, wait for the worker to finish its run, and close the engine
        (it refuses further runs; a search call that timed out is left to end on its own daemon thread)."""
        with self._cond:
            self._stop = True
            for j in list(self._queue) + self._running:
                j.cancel()
            self._drop_cancelled()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self.engine.close()

    def _take(self) -> list[Job]:
        """The oldest job and the other waiting jobs with its sampling settings, up to max_batch."""
        with self._cond:
            while not self._stop:
                self._drop_cancelled()
                if self._queue:
                    break
                self._cond.wait()
            if self._stop:
                return []
            first = self._queue.popleft()
            batch, rest = [first], collections.deque()
            while self._queue:
                j = self._queue.popleft()
                (batch if len(batch) < self.max_batch and j.batch_key == first.batch_key else rest).append(j)
            self._queue = rest
            self._running = batch
            return batch

    def _work(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._running = []

    def _run(self, batch: list[Job]) -> None:
        self._configure(batch[0])
        now = time.monotonic()
        for j in batch:
            j.started_at = now
        hooks = RolloutHooks(
            on_token=lambda i, token: batch[i].stream and _send(batch[i], "token", token),
            on_event=lambda i, event: batch[i].stream and _send(batch[i], "event", dict(event)),
            cancelled=lambda i: batch[i].cancelled)
        t0 = time.monotonic()
        try:
            forced = {"forced": [j.forced for j in batch]} if any(j.forced for j in batch) else {}
            trajs = self.engine.run([j.prompt_ids for j in batch], [j.question for j in batch], hooks, **forced)
        except Exception as exc:  # noqa: BLE001 - the engine failed: every job of the run gets the error
            log.exception("engine run of %d request(s) failed", len(batch))
            with self._cond:
                self.stats.failed += len(batch)
            for j in batch:
                _send(j, "error", exc)
            return
        elapsed = time.monotonic() - t0
        with self._cond:  # /health reads the stats from the event loop's thread
            ema = self.stats.run_seconds_ema
            self.stats.run_seconds_ema = elapsed if ema is None else 0.8 * ema + 0.2 * elapsed
            self.stats.runs += 1
            self.stats.batch_sizes[len(batch)] += 1
            self.stats.completed += len(batch)
            for t in trajs:
                self.stats.finish_reasons[t.finish_reason] += 1
        for j, t in zip(batch, trajs, strict=True):
            j.finished_at = time.monotonic()
            _send(j, "done", t)

    def _configure(self, job: Job) -> None:
        """Point the engine's policy, rollout settings and client tools at this run's, which ``job`` shares with the
        others of the run (a request's max_tokens is its completion budget; one worker: no race)."""
        s = job.sampling
        policy = self.engine.policy
        if hasattr(policy, "sampling"):
            greedy = s.temperature == 0
            policy.sampling = SamplingParams(temperature=1.0 if greedy else s.temperature, top_p=s.top_p,
                                             do_sample=not greedy)
        base = self.base_settings
        self.engine.settings = replace(base, max_completion_tokens=s.max_tokens,
                                       max_tokens_per_turn=min(base.max_tokens_per_turn, s.max_tokens),
                                       max_turns=1 if job.single_turn else base.max_turns)
        self.engine.client_tools = job.client_tools
        self.engine.min_turn_tokens = min(MIN_TURN_TOKENS, s.max_tokens)

    def describe(self) -> dict[str, Any]:
        with self._cond:
            st = self.stats
            return {"queue_depth": sum(not j.cancelled for j in self._queue), "queue_size": self.queue_size,
                    "active": len(self._running), "max_batch": self.max_batch, "submitted": st.submitted,
                    "completed": st.completed, "rejected_queue_full": st.rejected, "failed": st.failed,
                    "runs": st.runs, "cancelled_in_queue": st.cancelled_in_queue,
                    "finish_reasons": dict(st.finish_reasons),
                    "batch_sizes": {str(k): v for k, v in sorted(st.batch_sizes.items())},
                    "run_seconds_ema": None if st.run_seconds_ema is None else round(st.run_seconds_ema, 3)}


def _send(job: Job, kind: str, payload: Any) -> bool:
    try:
        job.sink(kind, payload)
    except Exception:  # noqa: BLE001 - a broken sink (closed loop) must not stop the engine
        log.debug("sink of job %d failed for %s", job.id, kind, exc_info=True)
    return True


__all__ = ["Job", "QueueFull", "Scheduler", "SchedulerStats", "Trajectory"]
