"""The rollout engine: batched multi-turn generation that searches mid-rollout, with exact masks.

What happens to a trajectory, turn by turn:

1. its visible context (prompt + the path to its last segment) is decoded together with the others'; it
   generates until it closes an action tag, ends, or spends its turn budget;
2. the turn is appended as a *model* segment, its ids exactly as generated (never decoded and re-encoded),
   and its action is parsed: answer (done), search, backtrack, summary, or none (done);
3. a search becomes a tool call; the queries of every trajectory whose turn ended in the same decode step
   (the same round, with a round-based policy) go to each tool in **one** batch call, started on its own
   thread (:mod:`.tool_calls`) with a timeout; a failure or timeout becomes an error observation, counted;
4. observations are tokenized on their own and appended as *environment* segments (env_mask 0), cut to
   ``max_observation_tokens`` and to the room left; then the trajectory starts its next turn.

Passages, tool results and echoed text are untrusted: their dialect tags are made text
(:meth:`~.protocol.Dialect.neutralize`) and the body is encoded with no control token recognised
(:mod:`.encoding`), inside the dialect's own wrapper; search events record the hits as the observation showed them.

When a searching trajectory resumes. With a session-capable policy (:class:`~.policy.HFPolicy`), decoding
goes one step at a time over all live rows. The tool calls of the rows that stopped at step ``t`` are
started at once; if any other row is still generating, the session decodes **exactly one more step**
(``t + 1``) for the others, then the engine collects those calls (waiting for them if they are not done),
appends the observations and resumes the rows, which generate again from step ``t + 2``. If no other row is
generating, the calls are collected at once. So a search overlaps one decode step of the others, the batch
grouping is kept (one call per tool per step), and the step at which a row resumes never depends on how
long its tool took: with the same seed, runs are identical. Rows that stopped for a backtrack, a summary
or an empty query need no tool and resume at once; a finished trajectory hands its slot to the next
prompt. Any other policy runs in synchronous rounds: every active trajectory generates one turn, the
round's tool calls are collected, and the next round starts.

Limits end a trajectory with a ``finish_reason`` that says which limit: ``answer`` (normal), ``eos`` (ended
without an answer), ``turn_token_limit``, ``max_completion_tokens`` (also when an observation or note does
not fit at all in the room left: resuming without it would let the model go on as if the environment had
answered), ``max_turns``, ``max_searches`` (only with ``on_search_limit="end"``); ``cancelled`` comes from
the hooks. A search past ``max_searches`` is refused, not run: by default (``on_search_limit="observe"``)
the environment answers it with a notice that no searches are left, and the model goes on within its
remaining turns and tokens, so it can still answer; with ``"end"`` the trajectory ends there.

Shown passages. A search's observation is cut to its budget; a passage counts as shown (listed under
``hits`` in the search event, and never shown again when ``dedup_passages``) only if at least the start of
its text is in the observation as kept, and its ``text`` there is what the observation held of it; ``partial``
marks one whose text was cut partway (the model read its title and opening, which is what a reader of a
truncated result list sees). Passages cut off entirely are
listed under ``cut`` and may come back in a later search.

The memory stack. Backtrack abandons the last search step in the visible context (the model turn that
searched and its observation, see :meth:`.Trajectory.last_search_step`) with everything after it: the next
segment is a note from the environment that hangs off the segment *before* that step, so the abandoned
text leaves the context. Backtracks in a row pop one search step each; earlier backtrack notes and notices
are passed over. With no search step left (none yet, or none since a replacing summary), the backtrack is
refused with a notice and stays visible. Summary (``summary_mode="replace"``) restarts the context from the
prompt with an environment note holding the summary; ``"keep"`` leaves the context as it is. Both keep
every token's context a path from the prompt, which is what makes training-time scoring exact
(:mod:`.scoring`).

Continuing. :meth:`AgentRollout.continue_turns` takes unfinished trajectories (a trajectory cut before its last turn,
say) and runs them on exactly as above, each one's next turn opening with ids the caller forces: answer branching
(:mod:`.branching`) samples several answers after one trajectory's searches this way.

An engine may be reused for many runs and closed when done (``close()`` or ``with AgentRollout(...) as
engine``); a tool call that times out is abandoned on its daemon thread and never holds up later calls.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..search.types import Searcher, clean_query
from ..tools.base import SearchTool, Tool, ToolRegistry, is_argument_tool, retrieves
from .events import shown_docids
from .policy import STOP_EOS, STOP_LENGTH, Policy
from .protocol import Action, ActionKind, Dialect, get_dialect
from .settings import RolloutSettings
from .tool_calls import ToolBatch, ToolCall, ToolRunner
from .tool_turns import ToolTurns
from .trajectory import BACKTRACK_NOTE, MODEL, NOTICE, OBSERVATION, SUMMARY_NOTE, Trajectory

log = logging.getLogger(__name__)

FINISH_REASONS = ("answer", "eos", "turn_token_limit", "max_completion_tokens", "max_turns", "max_searches",
                  "cancelled", "tool_calls")
MIN_TURN_TOKENS = 8  # below this much room left, a trajectory ends instead of starting a turn


def check_settings(settings: RolloutSettings) -> list[str]:
    """What is wrong with ``settings`` for a rollout, checked as a config checks them (an engine built in code
    gets the same refusals as a YAML file)."""
    from ..settings import SettingsError, load, to_dict

    try:
        load(RolloutSettings, data=to_dict(settings), env={}, source="rollout settings")
    except SettingsError as exc:
        return list(exc.problems)
    return []


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


def as_registry(tools: ToolRegistry | Tool | Searcher | None) -> ToolRegistry:
    if tools is None:
        return ToolRegistry()
    if isinstance(tools, ToolRegistry):
        return tools
    if (callable(getattr(tools, "batch", None)) or is_argument_tool(tools)) and hasattr(tools, "name"):
        return ToolRegistry([tools])
    if callable(getattr(tools, "batch_search", None)):
        return ToolRegistry([SearchTool(tools)])
    raise TypeError(f"tools must be a ToolRegistry, a Tool or a Searcher, got {type(tools).__name__}")


def tool_schemas(tools: ToolRegistry | Tool | Searcher | None) -> list[dict[str, Any]]:
    """The schemas of ``tools`` (anything :func:`as_registry` takes): what the native dialect's prompt lists."""
    return as_registry(tools).schemas()


class AgentRollout(ToolTurns):
    """Runs a batch of prompts to finished trajectories. Safe to reuse; not safe to share across threads."""

    def __init__(self, policy: Policy, tokenizer: Any, tools: ToolRegistry | Tool | Searcher | None = None,
                 settings: RolloutSettings | None = None, *, dialect: Dialect | None = None,
                 search_timeout_s: float = 30.0, min_turn_tokens: int = MIN_TURN_TOKENS,
                 client_tools: Sequence[str] = ()):
        """``settings``: the dialect, limits and summary mode (:class:`~.settings.RolloutSettings`, checked here as
        a config would be). ``dialect``: a :class:`~.protocol.Dialect` object of your own (another tool tag, say)
        instead of the registry's ``settings.dialect``. ``search_timeout_s``: the most one batch tool call may take
        (the config's ``search.timeout_s``). ``min_turn_tokens``: below this much room left, a trajectory ends
        instead of starting a turn. ``client_tools``: names of tools the caller runs itself (a chat client's declared
        tools): a native turn that calls one ends the trajectory (finish_reason ``tool_calls``, the calls in a
        ``client_calls`` event) instead of running anything."""
        settings = settings or RolloutSettings()
        problems = check_settings(settings)
        if search_timeout_s <= 0:
            problems.append(f"search_timeout_s must be > 0, got {search_timeout_s}")
        if problems:
            raise ValueError("invalid rollout settings: " + "; ".join(problems))
        self.policy, self.tokenizer = policy, tokenizer
        self.tools = as_registry(tools)
        self.settings = settings
        self.dialect = dialect if dialect is not None else get_dialect(settings.dialect)
        self.search_timeout_s, self.min_turn_tokens = search_timeout_s, min_turn_tokens
        self.client_tools = frozenset(client_tools)
        # with max_searches 0 (closed book) a search is refused before any tool is asked: no search tool is needed
        missing = [t.tool for t in self.dialect.tool_tags if t.tool
                   and t.tool not in self.tools and not (t.tool == "search" and settings.max_searches == 0)]
        if missing:
            log.warning("no tool registered for %s: those actions will get an error observation", missing)
        self._tool_runner = ToolRunner(self.tools)
        if self.dialect.native:  # the tools are listed and answered through the chat template's tool format
            from .native import prepare_tokenizer

            prepare_tokenizer(tokenizer)

    @property
    def tool_stats(self) -> dict[str, dict[str, float]]:
        """Per tool: the calls made and the seconds spent in them, so far."""
        runner = self._tool_runner
        return {name: {"calls": runner.calls_by_tool.get(name, 0), "seconds": runner.seconds_by_tool.get(name, 0.0)}
                for name in self.tools.names()}

    @property
    def tool_seconds(self) -> tuple[float, float]:
        """Seconds spent in tool calls (on their threads) and seconds the engine waited for them, so far."""
        return self._tool_runner.call_seconds, self._tool_runner.wait_seconds

    def close(self) -> None:
        """Refuse further runs. Tool calls that timed out are left to finish on their daemon threads (see
        :mod:`.tool_calls`); the tools themselves belong to the caller and stay open."""
        self._tool_runner.close()

    def __enter__(self) -> AgentRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ main loop

    def run(self, prompts: Sequence[Sequence[int]], questions: Sequence[str] | None = None,
            hooks: RolloutHooks | None = None, rows: Sequence[dict[str, Any]] | None = None,
            forced: Sequence[Sequence[int]] | None = None) -> list[Trajectory]:
        """Roll out every prompt (token ids, already templated) to a finished trajectory. ``rows``: each prompt's
        question fields, handed to the per-rollout tools' ``reset(**row)`` (default: ``{"question": question}``).
        ``forced``: ids that open each trajectory's first turn as if the model wrote them (a chat server's forced
        tool call, ``tool_choice``), as :meth:`continue_turns` forces them."""
        trajs = [Trajectory(prompt_ids=list(p), question=questions[i] if questions else "")
                 for i, p in enumerate(prompts)]
        for i, t in enumerate(trajs):
            row = rows[i] if rows is not None else {"question": t.question}
            t.tool_states = self.tools.new_states(row)
        if forced is not None and len(forced) != len(trajs):
            raise ValueError(f"{len(forced)} forced prefixes for {len(trajs)} prompts")
        opening = {i: list(f) for i, f in enumerate(forced or ()) if len(f)}
        return self._drive(trajs, [set() for _ in trajs], opening, hooks)

    def continue_turns(self, trajectories: Sequence[Trajectory], forced: Sequence[Sequence[int]],
                       hooks: RolloutHooks | None = None) -> list[Trajectory]:
        """Go on with unfinished trajectories (in place, and returned) as :meth:`run` would have, each one's next turn
        starting with the ids ``forced[i]``, taken as written by the model: they open that turn's model segment,
        with log-probability 0.0 where the trajectory records them (the caller replaces them if it has the real
        ones). Answer branching (:mod:`.branching`) continues a trajectory cut just after its answer tag this way.
        Passages the trajectory's searches showed count as shown (``dedup_passages``)."""
        trajs = list(trajectories)
        if len(forced) != len(trajs):
            raise ValueError(f"{len(forced)} forced prefixes for {len(trajs)} trajectories")
        for t in trajs:
            if t.finish_reason:
                raise ValueError(f"a finished trajectory ({t.finish_reason}) cannot be continued")
        shown = [shown_docids(t.events) for t in trajs]
        return self._drive(trajs, shown, {i: list(f) for i, f in enumerate(forced) if len(f)}, hooks)

    def _drive(self, trajs: list[Trajectory], shown: list[set[str]], forced: dict[int, list[int]],
               hooks: RolloutHooks | None) -> list[Trajectory]:
        """Run ``trajs`` to their end (see :meth:`run` and :meth:`continue_turns`)."""
        if self._tool_runner.closed:
            raise RuntimeError("this AgentRollout is closed")
        self._forced = forced
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
        room = self.settings.max_completion_tokens - len(t.completion_ids)
        if room < self.min_turn_tokens:
            self._finish(t, "max_completion_tokens")
            return None
        return min(self.settings.max_tokens_per_turn, room)

    def _start(self, i: int, t: Trajectory, budget: int) -> tuple[list[int], int]:
        """The context and new-token budget of trajectory ``i``'s next turn: its visible ids, followed by its forced
        prefix when it has one (which counts against the turn's budget)."""
        prefix = self._forced.get(i, [])
        if len(prefix) >= budget:
            raise ValueError(f"a forced prefix of {len(prefix)} tokens leaves no room in a turn of {budget}")
        return t.visible_ids() + prefix, budget - len(prefix)

    def _whole_turn(self, i: int, gen: Any) -> Any:
        """``gen`` with trajectory ``i``'s forced prefix put in front (once: only the turn it opens)."""
        prefix = self._forced.pop(i, None)
        if not prefix:
            return gen
        logprobs = None if gen.logprobs is None else [0.0] * len(prefix) + list(gen.logprobs)
        return dataclasses.replace(gen, ids=prefix + list(gen.ids), logprobs=logprobs)

    def _cancelled(self, t: Trajectory, i: int) -> bool:
        if self._hooks.cancelled is not None and self._hooks.cancelled(i):
            self._finish(t, "cancelled")
            return True
        return False

    def _run_rounds(self, trajs: list[Trajectory], shown: list[set[str]]) -> None:
        """Any Policy: every active trajectory generates a turn in one batched call per round; the round's
        tool calls are collected before the next round."""
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
            starts = [self._start(i, trajs[i], budgets[i]) for i in active]
            gens = self.policy.generate([c for c, _ in starts], stop_strings=self.dialect.stop_strings,
                                        max_new_tokens=[b for _, b in starts])
            if self._hooks.on_token is not None:
                for i, gen in zip(active, gens, strict=True):
                    for token in gen.ids:
                        self._hooks.on_token(i, token)
            gens = [self._whole_turn(i, g) for i, g in zip(active, gens, strict=True)]
            continuing, calls = self._turns(trajs, [(i, g, budgets[i]) for i, g in zip(active, gens, strict=True)])
            if calls:
                self._observe_all(trajs, shown, self._submit(calls))
            active = [i for i in continuing if not trajs[i].finish_reason]

    def _run_continuous(self, trajs: list[Trajectory], shown: list[set[str]]) -> None:
        """A policy with sessions: one decode step at a time; see the module docstring for when a row that
        stopped for a tool gets its observation and resumes."""
        session = self.policy.open_session(self.dialect.stop_strings)
        if self._hooks.on_token is not None:
            session.on_token = lambda row, token: self._hooks.on_token(row.user, token)
        slots = getattr(self.policy, "max_batch_size", None) or len(trajs)
        queue = list(range(len(trajs)))
        row_of: dict[int, int] = {}  # session row -> trajectory
        row_for: dict[int, int] = {}  # trajectory -> session row
        budgets: dict[int, int] = {}
        turn_segment: dict[int, int] = {}  # trajectory -> index of the model segment of its last turn

        def drop(i: int) -> None:
            row = row_for.pop(i)
            session.release(row)
            del row_of[row]

        def start_next() -> None:
            while queue and len(row_of) < slots:
                i = queue.pop(0)
                b = self._budget(trajs[i])
                if b is None:
                    continue
                budgets[i] = b
                row = session.add(*self._start(i, trajs[i], b), user=i)
                row_of[row], row_for[i] = i, row

        def advance(i: int) -> None:
            """A stopped row whose turn's action is carried out: resume it with what the environment added,
            restart it from its new context after a branch, or let it go when its trajectory is over."""
            t = trajs[i]
            b = None if t.finish_reason else self._budget(t)
            if b is None:
                drop(i)
                return
            budgets[i] = b
            model_seg = turn_segment[i]
            added = t.segments[model_seg + 1:]
            if all(seg.parent == model_seg + k for k, seg in enumerate(added)):
                session.resume(row_for[i], t.completion_ids[t.segments[model_seg].end:], b)
            else:  # a backtrack or summary branched the context: the row restarts from it
                session.reset(row_for[i], t.visible_ids(), b)

        def collect(batch: ToolBatch) -> None:
            live = [c for c in batch.calls if c.index in row_for]  # a cancelled row's call is discarded
            self._observe_all(trajs, shown, batch, live)
            for i in dict.fromkeys(c.index for c in live):
                advance(i)

        model = getattr(self.policy, "model", None)
        was_training = bool(getattr(model, "training", False))
        if model is not None:
            model.eval()
        pending: ToolBatch | None = None  # tool calls of the rows that stopped in the previous step
        try:
            start_next()
            while row_of:
                for i in list(row_of.values()):
                    if self._cancelled(trajs[i], i):
                        drop(i)
                start_next()
                if not row_of:
                    break
                stopped = session.step() if session.busy else []
                if pending is not None:  # the others have decoded one step meanwhile: collect, resume
                    batch, pending = pending, None
                    collect(batch)
                if stopped:
                    turns = []
                    for row, gen in stopped:
                        i = row_of[row]
                        turn_segment[i] = len(trajs[i].segments)
                        turns.append((i, self._whole_turn(i, gen), budgets[i]))
                    continuing, calls = self._turns(trajs, turns)
                    waiting = {c.index for c in calls}
                    for i, _, _ in turns:
                        if i not in continuing:
                            drop(i)
                        elif i not in waiting:
                            advance(i)
                    if calls:
                        pending = self._submit(calls)
                start_next()
                if pending is not None and not session.busy:  # nobody else is decoding: collect at once
                    batch, pending = pending, None
                    collect(batch)
                if row_of and pending is None and not session.busy:
                    raise RuntimeError("decode session idle with unfinished trajectories")
        finally:
            if was_training:
                model.train()

    def _turns(self, trajs: list[Trajectory], turns: list[tuple[int, Any, int]]) -> tuple[list[int], list[ToolCall]]:
        """Record finished turns and carry out their actions; returns the trajectories that continue and the
        tool calls to make (the callers wait for them before resuming)."""
        calls: list[ToolCall] = []
        continuing: list[int] = []
        for i, gen, budget in turns:
            t = trajs[i]
            t.num_turns += 1
            segment = t.append(list(gen.ids), MODEL, logprobs=gen.logprobs)
            text = self.tokenizer.decode(gen.ids, skip_special_tokens=False)
            for tag in self.dialect.forged_tags(text):
                t.event("forged_tag", tag=tag)
            action = self.dialect.parse_turn(text)
            ends_calls = self.dialect.native and gen.stop == STOP_EOS  # native calls end at the end of the turn
            if gen.stop in (STOP_EOS, STOP_LENGTH) and action.kind is not ActionKind.ANSWER and not ends_calls:
                # only a complete answer counts in a turn that ran into EOS or its budget
                action = Action(ActionKind.NONE)
            t.segments[segment].kind = action.kind.value
            done = self._apply(t, action, gen.stop, budget, calls, i)
            if not done and t.num_turns >= self.settings.max_turns:
                calls = [c for c in calls if c.index != i]
                self._finish(t, "max_turns")
                done = True
            if not done:
                continuing.append(i)
        return continuing, calls

    # ------------------------------------------------------------------------------------------- actions

    def _finish(self, t: Trajectory, reason: str) -> None:
        t.finish_reason = reason
        t.event("finish", reason=reason)

    def _apply(self, t: Trajectory, action: Action, stop: str, budget: int, calls: list[ToolCall], i: int) -> bool:
        """Carry out a turn's action; returns True when the trajectory is finished."""
        lim = self.settings
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
        if action.kind is ActionKind.TOOL:
            return self._native_calls(t, action, calls, i)
        tool = self._tool(action.tool)
        if action.kind is ActionKind.SEARCH and tool is not None and not retrieves(tool):
            return self._tag_tool_call(t, action, tool, calls, i)
        if action.kind is ActionKind.SEARCH:
            if t.num_searches >= lim.max_searches:
                t.event("limit", name="max_searches", queries=list(action.queries))
                if lim.on_search_limit == "end":
                    self._finish(t, "max_searches")
                    return True
                return not self._append_observation(
                    t, f"You have no searches left (the limit is {lim.max_searches}). Answer with what you know.",
                    kind=NOTICE)
            t.num_searches += 1
            if not action.queries or not any(clean_query(q) for q in action.queries):
                t.event("error", kind="empty_query", content=action.content[:200])
                return not self._append_observation(
                    t, "The search query was empty. Write a query inside the search tags.", kind=OBSERVATION)
            calls.append(ToolCall(i, action.tool, action.queries, raw=action.content))
            return False
        if action.kind is ActionKind.BACKTRACK:
            return not self._backtrack(t, action.content)
        if action.kind is ActionKind.SUMMARY:
            t.event("summary", text=action.content, mode=self.settings.summary_mode)
            if self.settings.summary_mode == "replace":
                body = f"Summary of the earlier steps: {action.content}" if action.content else "Summary: (empty)"
                return not self._append_observation(t, body, parent=-1, kind=SUMMARY_NOTE)
            return False
        raise AssertionError(f"unhandled action {action.kind}")

    def _backtrack(self, t: Trajectory, reason: str) -> bool:
        """Abandon the last search step in the visible context and everything after it, the backtrack turn
        included: the note hangs off the segment before the step. ``dropped_tokens`` counts the tokens that
        leave the context (those on the path from the step to the backtrack turn). With no search step to
        abandon, a notice answers and the backtrack turn stays. False when the note did not fit (the
        trajectory is then finished)."""
        current = len(t.segments) - 1  # the backtrack turn
        step = t.last_search_step(current)
        if step is None:
            t.event("error", kind="nothing_to_backtrack")
            return self._append_observation(t, "There is no search step to backtrack from.", kind=NOTICE)
        path = t.path(current)
        dropped = sum(len(t.segments[i]) for i in path[path.index(step):])
        t.event("backtrack", reason=reason, dropped_tokens=dropped)
        note = "Backtracked: the previous search step was removed." + (f" Reason: {reason}" if reason else "")
        return self._append_observation(t, note, parent=t.segments[step].parent, kind=BACKTRACK_NOTE)
