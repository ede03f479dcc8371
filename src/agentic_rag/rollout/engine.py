"""The rollout engine: batched multi-turn generation that searches mid-rollout, with exact masks.

One round of :meth:`AgentRollout.run`:

1. every active trajectory's visible context (prompt + the path to its last segment) goes to the policy in
   one batch; each sequence generates until it closes an action tag, ends, or spends its turn budget;
2. each new turn is appended as a *model* segment, its ids exactly as generated (never decoded and
   re-encoded), and its action is parsed: answer (done), search, backtrack, summary, or none (done);
3. the queries of every sequence that searched this round go to each tool in **one** batch call (with a
   timeout; a failure becomes an error observation, counted, and the batch goes on);
4. observations are tokenized on their own and appended as *environment* segments (env_mask 0).

A sequence that answers is done; one that searches waits only for the round, never for another sequence's
stop. Limits end a trajectory with a ``finish_reason`` that says which limit: ``answer`` (normal), ``eos``
(ended without an answer), ``turn_token_limit``, ``max_completion_tokens``, ``max_turns``, ``max_searches``.

Backtrack abandons the last search step (the model turn that searched and its observation): the next
segment is a note from the environment that hangs off the segment *before* that step, so the abandoned
text leaves the context. Summary (``summary_mode="replace"``) restarts the context from the prompt with an
environment note holding the summary. Both keep every token's context a path from the prompt, which is
what makes training-time scoring exact (:mod:`.scoring`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from ..search.types import Hit, Searcher, clean_query
from ..tools.base import SearchTool, Tool, ToolRegistry, ToolResult
from .policy import STOP_EOS, STOP_LENGTH, Policy
from .protocol import Action, ActionKind, Dialect, get_dialect
from .trajectory import ENV, MODEL, Trajectory

log = logging.getLogger(__name__)

FINISH_REASONS = ("answer", "eos", "turn_token_limit", "max_completion_tokens", "max_turns", "max_searches",
                  "cancelled")


@dataclass
class RolloutHooks:
    """Callbacks for streaming and cancellation (the chat service uses them), all keyed by trajectory index.

    ``on_token(i, token_id)`` for every token the model writes, as it is written (per step with a
    session-capable policy, per turn otherwise); ``on_event(i, event)`` for every event as it is recorded
    (searches with their hits, observations, errors, finish); ``cancelled(i)`` is polled between steps, and
    a trajectory for which it returns True ends with finish_reason ``cancelled`` and frees its slot.
    """

    on_token: Callable[[int, int], None] | None = None
    on_event: Callable[[int, dict[str, Any]], None] | None = None
    cancelled: Callable[[int], bool] | None = None


@dataclass
class RolloutLimits:
    """Budgets of one trajectory. Every one that runs out ends it with a finish_reason of its name."""

    max_turns: int = 8  # model turns
    max_searches: int = 4  # search actions (a failed search counts)
    max_tokens_per_turn: int = 256  # new model tokens in one turn
    max_completion_tokens: int = 1024  # everything after the prompt: model and environment tokens
    passages_per_search: int = 3  # hits shown per query
    max_observation_tokens: int = 384  # one observation, tags included; longer ones are truncated cleanly
    search_timeout_s: float = 30.0  # one batch tool call
    dedup_passages: bool = True  # a passage already shown in this trajectory is not shown again
    min_turn_tokens: int = 8  # below this much room left, the trajectory ends instead of starting a turn

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in ("max_turns", "max_tokens_per_turn", "max_completion_tokens", "passages_per_search",
                                 "max_observation_tokens") if getattr(self, name) < 1]
        if self.max_searches < 0:
            problems.append(f"max_searches must be >= 0, got {self.max_searches}")
        if self.search_timeout_s <= 0:
            problems.append(f"search_timeout_s must be > 0, got {self.search_timeout_s}")
        if self.max_observation_tokens < 16:
            problems.append(f"max_observation_tokens must be >= 16 to hold the tags, got {self.max_observation_tokens}")
        if problems:
            raise ValueError("invalid rollout limits: " + "; ".join(problems))


@dataclass
class _Call:
    """One trajectory's pending tool call."""

    index: int
    action: Action
    results: list[ToolResult] = field(default_factory=list)
    error: str | None = None


def as_registry(tools: ToolRegistry | Tool | Searcher | None) -> ToolRegistry:
    if tools is None:
        return ToolRegistry()
    if isinstance(tools, ToolRegistry):
        return tools
    if callable(getattr(tools, "batch", None)) and hasattr(tools, "name"):
        return ToolRegistry([tools])
    if callable(getattr(tools, "batch_search", None)):
        return ToolRegistry([SearchTool(tools)])
    raise TypeError(f"tools must be a ToolRegistry, a Tool or a Searcher, got {type(tools).__name__}")


class AgentRollout:
    """Runs a batch of prompts to finished trajectories. Safe to reuse; not safe to share across threads."""

    def __init__(self, policy: Policy, tokenizer: Any, tools: ToolRegistry | Tool | Searcher | None = None,
                 protocol: Dialect | str = "agentic", limits: RolloutLimits | None = None, *,
                 summary_mode: str = "replace"):
        if summary_mode not in ("replace", "keep"):
            raise ValueError(f"summary_mode must be 'replace' or 'keep', got {summary_mode!r}")
        self.policy, self.tokenizer = policy, tokenizer
        self.tools = as_registry(tools)
        self.dialect = get_dialect(protocol) if isinstance(protocol, str) else protocol
        self.limits = limits or RolloutLimits()
        self.summary_mode = summary_mode
        missing = [t.tool for t in self.dialect.tool_tags if t.tool not in self.tools]
        if missing:
            log.warning("no tool registered for %s: those actions will get an error observation", missing)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rollout-tools")

    # ------------------------------------------------------------------------------------------ main loop

    def run(self, prompts: Sequence[Sequence[int]], questions: Sequence[str] | None = None,
            hooks: RolloutHooks | None = None) -> list[Trajectory]:
        """Roll out every prompt (token ids, already templated) to a finished trajectory."""
        trajs = [Trajectory(prompt_ids=list(p), question=questions[i] if questions else "")
                 for i, p in enumerate(prompts)]
        shown: list[set[str]] = [set() for _ in trajs]
        self._hooks = hooks or RolloutHooks()
        if self._hooks.on_event is not None:
            for i, t in enumerate(trajs):
                t.listener = functools.partial(self._hooks.on_event, i)
        try:
            if callable(getattr(self.policy, "open_session", None)):
                self._run_continuous(trajs, shown)
            else:
                self._run_rounds(trajs, shown)
        finally:
            for t in trajs:
                t.listener = None
        for t in trajs:
            t.text = self.tokenizer.decode(t.completion_ids, skip_special_tokens=False)
        return trajs

    def _budget(self, t: Trajectory) -> int | None:
        """The next turn's token budget, or None (and the trajectory finished) when there is no room."""
        room = self.limits.max_completion_tokens - len(t.completion_ids)
        if room < self.limits.min_turn_tokens:
            self._finish(t, "max_completion_tokens")
            return None
        return min(self.limits.max_tokens_per_turn, room)

    def _cancelled(self, t: Trajectory, i: int) -> bool:
        if self._hooks.cancelled is not None and self._hooks.cancelled(i):
            self._finish(t, "cancelled")
            return True
        return False

    def _run_rounds(self, trajs: list[Trajectory], shown: list[set[str]]) -> None:
        """Any Policy: every active trajectory generates a turn in one batched call per round."""
        active = list(range(len(trajs)))
        while active:
            budgets: dict[int, int] = {}
            for i in active:
                if self._cancelled(trajs[i], i):
                    continue
                b = self._budget(trajs[i])
                if b is not None:
                    budgets[i] = b
            active = list(budgets)
            if not active:
                break
            gens = self.policy.generate([trajs[i].visible_ids() for i in active],
                                        stop_strings=self.dialect.stop_strings,
                                        max_new_tokens=[budgets[i] for i in active])
            if self._hooks.on_token is not None:
                for i, gen in zip(active, gens, strict=True):
                    for token in gen.ids:
                        self._hooks.on_token(i, token)
            continuing = self._turns(trajs, shown, [(i, g, budgets[i]) for i, g in zip(active, gens, strict=True)])
            active = [i for i, _ in continuing]

    def _run_continuous(self, trajs: list[Trajectory], shown: list[set[str]]) -> None:
        """A policy with sessions: a trajectory that stops for a search resumes as soon as its observation
        is ready, while the others keep generating; a finished one hands its slot to the next prompt."""
        session = self.policy.open_session(self.dialect.stop_strings)
        if self._hooks.on_token is not None:
            session.on_token = lambda row, token: self._hooks.on_token(row.user, token)
        slots = getattr(self.policy, "max_batch_size", None) or len(trajs)
        queue = list(range(len(trajs)))
        row_of: dict[int, int] = {}  # session row -> trajectory
        budgets: dict[int, int] = {}

        def start_next() -> None:
            while queue and len(row_of) < slots:
                i = queue.pop(0)
                b = self._budget(trajs[i])
                if b is None:
                    continue
                budgets[i] = b
                row_of[session.add(trajs[i].visible_ids(), b, user=i)] = i

        model = getattr(self.policy, "model", None)
        was_training = bool(getattr(model, "training", False))
        if model is not None:
            model.eval()
        try:
            start_next()
            while row_of:
                for row, i in list(row_of.items()):
                    if self._cancelled(trajs[i], i):
                        session.release(row)
                        del row_of[row]
                start_next()
                if not row_of:
                    break
                stopped = session.step()
                if not stopped:
                    if not session.busy:
                        raise RuntimeError("decode session idle with unfinished trajectories")
                    continue
                done_turns = [(row_of[row], gen, budgets[row_of[row]]) for row, gen in stopped]
                before = {i: len(trajs[i].segments) for i, _, _ in done_turns}
                continuing = dict(self._turns(trajs, shown, done_turns))
                for row, _ in stopped:
                    i = row_of[row]
                    if i not in continuing:
                        session.release(row)
                        del row_of[row]
                        continue
                    t = trajs[i]
                    b = self._budget(t)
                    if b is None:
                        session.release(row)
                        del row_of[row]
                        continue
                    budgets[i] = b
                    model_seg = before[i]  # index of the model segment this turn appended
                    added = t.segments[model_seg + 1:]
                    if all(seg.parent == model_seg + k for k, seg in enumerate(added)):
                        session.resume(row, t.completion_ids[t.segments[model_seg].end:], b)
                    else:  # a backtrack or summary branched the context: the row restarts from it
                        session.reset(row, t.visible_ids(), b)
                start_next()
        finally:
            if was_training:
                model.train()

    def _turns(self, trajs: list[Trajectory], shown: list[set[str]],
               turns: list[tuple[int, Any, int]]) -> list[tuple[int, bool]]:
        """Record finished turns, carry out their actions (one batch tool call per tool for all of them),
        append the observations; returns ``(trajectory, True)`` for those that continue."""
        calls: list[_Call] = []
        continuing: list[tuple[int, bool]] = []
        for i, gen, budget in turns:
            t = trajs[i]
            t.num_turns += 1
            t.append(list(gen.ids), MODEL, logprobs=gen.logprobs)
            text = self.tokenizer.decode(gen.ids, skip_special_tokens=False)
            for tag in self.dialect.forged_tags(text):
                t.event("forged_tag", tag=tag)
            action = self.dialect.parse_turn(text)
            if gen.stop in (STOP_EOS, STOP_LENGTH) and action.kind is not ActionKind.ANSWER:
                # only a complete answer counts in a turn that ran into EOS or its budget
                action = Action(ActionKind.NONE)
            done = self._apply(t, action, gen.stop, budget, calls, i)
            if not done and t.num_turns >= self.limits.max_turns:
                calls = [c for c in calls if c.index != i]
                self._finish(t, "max_turns")
                done = True
            if not done:
                continuing.append((i, True))
        self._run_tools(calls)
        for call in calls:
            self._observe(trajs[call.index], call, shown[call.index])
        return continuing

    # ------------------------------------------------------------------------------------------- actions

    def _finish(self, t: Trajectory, reason: str) -> None:
        t.finish_reason = reason
        t.event("finish", reason=reason)

    def _apply(self, t: Trajectory, action: Action, stop: str, budget: int, calls: list[_Call], i: int) -> bool:
        """Carry out a turn's action; returns True when the trajectory is finished."""
        lim = self.limits
        if action.kind is ActionKind.ANSWER:
            t.answer = action.content
            t.event("answer", text=action.content)
            self._finish(t, "answer")
            return True
        if action.kind is ActionKind.NONE:
            if stop == STOP_EOS:
                self._finish(t, "eos")
            elif len(t.completion_ids) >= lim.max_completion_tokens or budget < lim.max_tokens_per_turn:
                self._finish(t, "max_completion_tokens")
            else:
                self._finish(t, "turn_token_limit")
            return True
        if action.kind is ActionKind.SEARCH:
            if t.num_searches >= lim.max_searches:
                t.event("limit", name="max_searches", queries=list(action.queries))
                self._finish(t, "max_searches")
                return True
            t.num_searches += 1
            if not action.queries or not any(clean_query(q) for q in action.queries):
                t.event("error", kind="empty_query", content=action.content[:200])
                self._append_observation(t, "The search query was empty. Write a query inside the search tags.")
                return False
            calls.append(_Call(i, action))
            return False
        if action.kind is ActionKind.BACKTRACK:
            self._backtrack(t, action.content)
            return False
        if action.kind is ActionKind.SUMMARY:
            t.event("summary", text=action.content, mode=self.summary_mode)
            if self.summary_mode == "replace":
                body = f"Summary of the earlier steps: {action.content}" if action.content else "Summary: (empty)"
                self._append_observation(t, body, parent=-1)
            return False
        raise AssertionError(f"unhandled action {action.kind}")

    def _backtrack(self, t: Trajectory, reason: str) -> None:
        """Abandon the last search step: the next segment hangs off the segment before it."""
        current = len(t.segments) - 1  # the backtrack turn
        parent = t.segments[current].parent
        if parent >= 0 and t.segments[parent].source == ENV and t.segments[parent].parent >= 0:
            step_model = t.segments[parent].parent
            new_parent = t.segments[step_model].parent
            dropped = t.segments[current].end - t.segments[step_model].start
            t.event("backtrack", reason=reason, dropped_tokens=dropped)
            note = "Backtracked: the previous search step was removed." + (f" Reason: {reason}" if reason else "")
            self._append_observation(t, note, parent=new_parent)
        else:
            t.event("error", kind="nothing_to_backtrack")
            self._append_observation(t, "There is no search step to backtrack from.")

    # --------------------------------------------------------------------------------------------- tools

    def _run_tools(self, calls: list[_Call]) -> None:
        """One batch call per tool for all queries of this round, with a timeout."""
        by_tool: dict[str, list[_Call]] = {}
        for call in calls:
            by_tool.setdefault(call.action.tool, []).append(call)
        for name, group in by_tool.items():
            if name not in self.tools:
                for call in group:
                    call.error = f"no tool named {name!r} is available"
                continue
            queries = [q for call in group for q in call.action.queries]
            k = self.limits.passages_per_search + (20 if self.limits.dedup_passages else 0)
            future = self._pool.submit(self.tools.get(name).batch, queries, k)
            try:
                results = future.result(timeout=self.limits.search_timeout_s)
                if len(results) != len(queries):
                    raise RuntimeError(f"tool {name!r} returned {len(results)} results for {len(queries)} queries")
            except FutureTimeout:
                for call in group:
                    call.error = f"the search timed out after {self.limits.search_timeout_s:g} s"
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

    def _observe(self, t: Trajectory, call: _Call, shown: set[str]) -> None:
        if call.error is not None:
            t.event("error", kind="search_failed", message=call.error, queries=list(call.action.queries))
            self._append_observation(t, f"Error: {call.error}. You may search again or answer.")
            return
        k = self.limits.passages_per_search
        blocks, record = [], []
        for query, result in zip(call.action.queries, call.results, strict=True):
            if isinstance(result, str):
                blocks.append((query, result))
                record.append({"query": query, "text": result[:200]})
                continue
            fresh: list[Hit] = []
            for hit in result:
                if self.limits.dedup_passages and hit.docid in shown:
                    continue
                fresh.append(hit)
                shown.add(hit.docid)
                if len(fresh) == k:
                    break
            body = self.dialect.format_passages(fresh) if fresh else "No new results."
            blocks.append((query, body))
            record.append({"query": query, "hits": [{"docid": h.docid, "title": h.title, "text": h.text[:1000]}
                                                    for h in fresh]})
        t.event("search", tool=call.action.tool, queries=list(call.action.queries), results=record)
        if len(blocks) == 1:
            body = blocks[0][1]
        else:
            body = "\n".join(f'Results for "{q}":\n{b}' for q, b in blocks)
        self._append_observation(t, body)

    # ----------------------------------------------------------------------------------- observations

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _append_observation(self, t: Trajectory, body: str, parent: int | None = None) -> None:
        """Tokenize an observation on its own, truncated cleanly to the limits, and append it (mask 0)."""
        room = self.limits.max_completion_tokens - len(t.completion_ids)
        budget = min(self.limits.max_observation_tokens, room)
        ids, truncated = self._fit(body, budget)
        if ids is None:
            t.event("observation", tokens=0, truncated=True, dropped="no room left")
            return
        t.append(ids, ENV, parent=parent)
        t.event("observation", tokens=len(ids), truncated=truncated)

    def _fit(self, body: str, budget: int) -> tuple[list[int] | None, bool]:
        """The wrapped observation's ids within ``budget`` tokens: the body is cut at a word boundary and
        marked with '...', the closing tag always kept. None when not even the tags fit."""
        ids = self._encode(self.dialect.wrap_observation(body))
        if len(ids) <= budget:
            return ids, False
        overhead = len(self._encode(self.dialect.wrap_observation(" ..."))) + 1
        if overhead > budget:
            return None, True
        body_ids = self._encode(body)
        keep = budget - overhead
        while keep > 0:
            cut = self.tokenizer.decode(body_ids[:keep], skip_special_tokens=False)
            if " " in cut.strip():
                cut = cut[: cut.rstrip().rfind(" ")]
            ids = self._encode(self.dialect.wrap_observation(cut.rstrip() + " ..."))
            if len(ids) <= budget:
                return ids, True
            keep -= max(1, len(ids) - budget)
        ids = self._encode(self.dialect.wrap_observation("..."))
        return (ids, True) if len(ids) <= budget else (None, True)
