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
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..search.types import Hit, Searcher, clean_query
from ..tools.base import SearchTool, Tool, ToolError, ToolRegistry, is_argument_tool, retrieves, schema
from ..tools.python import argument_problem
from .encoding import encode_pieces, encode_text
from .events import shown_docids
from .policy import STOP_EOS, STOP_LENGTH, Policy
from .protocol import Action, ActionKind, Dialect, get_dialect
from .settings import RolloutSettings
from .tool_calls import ToolBatch, ToolCall, ToolRunner
from .trajectory import BACKTRACK_NOTE, ENV, MODEL, NOTICE, OBSERVATION, SUMMARY_NOTE, Trajectory

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


class AgentRollout:
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

    # --------------------------------------------------------------------------------------------- tools

    def _tool(self, name: str) -> Any:
        return self.tools.get(name) if name in self.tools else None

    def _over_limit(self, t: Trajectory, tool: Any, name: str) -> str | None:
        """The notice a call past its tool's ``max_calls`` gets (recorded as a ``limit`` event), or None (the call is
        counted)."""
        limit = getattr(tool, "max_calls", None)
        used = t.tool_calls.get(name, 0)
        if limit is not None and used >= limit:
            t.event("limit", name="max_calls", tool=name)
            return f"You have no calls of {name} left (the limit is {limit})."
        t.tool_calls[name] = used + 1
        return None

    def _tag_tool_call(self, t: Trajectory, action: Action, tool: Any, calls: list[ToolCall], i: int) -> bool:
        """A tag dialect's tag for a tool that does not retrieve (a calculator under ``<calc>``): its own limit, never
        counted as a search. An argument tool takes the tag's content as its one argument (or as JSON)."""
        t.segments[-1].kind = ActionKind.TOOL.value
        notice = self._over_limit(t, tool, action.tool)
        if notice is not None:
            return not self._append_observation(t, notice, kind=NOTICE)
        call = ToolCall(i, action.tool, action.queries, raw=action.content, retrieves=False)
        if is_argument_tool(tool):
            props = list(schema(tool)["parameters"].get("properties") or {})
            arguments: Any = {props[0]: action.content} if len(props) == 1 else None
            if arguments is None:
                try:
                    arguments = json.loads(action.content or "{}")
                except json.JSONDecodeError:
                    arguments = None
            problem = ("the arguments must be a JSON object" if not isinstance(arguments, dict)
                       else argument_problem(arguments, schema(tool)["parameters"]))
            if problem:
                t.event("error", kind="malformed_call", tool=action.tool, message=problem, raw=action.content[:200])
                return not self._append_observation(t, f"Error: {problem}.", kind=OBSERVATION)
            call.arguments, call.arguments_call = arguments, True
            call.state = t.tool_states.get(getattr(tool, "state_key", None))
        calls.append(call)
        return False

    def _native_calls(self, t: Trajectory, action: Action, calls: list[ToolCall], i: int) -> bool:
        """A native turn's calls: each checked (malformed, unknown tool, wrong arguments: an error result, counted),
        limited (a search by ``max_searches``, another tool by its ``max_calls``: a notice) and, the rest, called
        together. Every call gets its result in the turn's one tool message (:meth:`_observe_native`)."""
        lim = self.settings
        outside = [c for c in action.calls if c.tool in self.client_tools and not c.error]
        if outside:  # the caller runs these: the trajectory ends here and hands them over
            t.segments[-1].kind = ActionKind.TOOL.value
            t.event("client_calls", calls=[{"name": c.tool, "arguments": dict(c.arguments)} for c in outside])
            self._finish(t, "tool_calls")
            return True
        group: list[ToolCall] = []
        for slot, c in enumerate(action.calls):
            call = ToolCall(i, c.tool, slot=slot, raw=c.raw)
            tool = self._tool(c.tool) if c.tool else None
            problem = c.error or (None if tool is not None else
                                  f"there is no tool named {c.tool!r}; the tools are: {', '.join(self.tools.names())}")
            if not problem:
                problem = argument_problem(c.arguments, schema(tool)["parameters"])
            if problem:
                call.answered, call.malformed, call.error, call.retrieves = True, True, problem, False
                t.event("error", kind="malformed_call", tool=c.tool, message=problem, raw=c.raw[:200])
            elif retrieves(tool):
                call.queries = c.queries
                if t.num_searches >= lim.max_searches:
                    t.event("limit", name="max_searches", queries=list(c.queries))
                    if lim.on_search_limit == "end":
                        self._finish(t, "max_searches")
                        return True
                    call.answered = True
                    call.notice = (f"You have no searches left (the limit is {lim.max_searches}). "
                                   "Answer with what you know.")
                else:
                    t.num_searches += 1
                    if not c.queries or not any(clean_query(q) for q in c.queries):
                        t.event("error", kind="empty_query", content=c.raw[:200])
                        call.answered, call.malformed, call.error = True, True, "the search query was empty"
            else:
                call.retrieves = False
                notice = self._over_limit(t, tool, c.tool)
                if notice is not None:
                    call.answered, call.notice = True, notice
                elif is_argument_tool(tool):
                    call.arguments, call.arguments_call = c.arguments, True
                    call.state = t.tool_states.get(getattr(tool, "state_key", None))
                else:
                    call.queries = (str(c.arguments.get("query", "")),)
            group.append(call)
        searching = all(c.retrieves and not c.malformed for c in group)
        t.segments[-1].kind = (ActionKind.SEARCH if searching else ActionKind.TOOL).value
        calls.extend(group)
        return False

    def _submit(self, calls: list[ToolCall]) -> ToolBatch:
        """Start one batch call per tool for all ``calls`` (see :mod:`.tool_calls`)."""
        k = self.settings.passages_per_search + (20 if self.settings.dedup_passages else 0)
        return self._tool_runner.submit(calls, k, self.search_timeout_s)

    def _observe_all(self, trajs: list[Trajectory], shown: list[set[str]], batch: ToolBatch,
                     calls: list[ToolCall] | None = None) -> None:
        """Wait for ``batch`` and append each call's observation (all of the batch's calls by default)."""
        batch.collect()
        turns: dict[int, list[ToolCall]] = {}
        for call in batch.calls if calls is None else calls:
            turns.setdefault(call.index, []).append(call)
        for i, group in turns.items():
            if self.dialect.native:
                self._observe_native(trajs[i], group, shown[i])
            else:
                for call in group:
                    self._observe(trajs[i], call, shown[i])

    def _observe(self, t: Trajectory, call: ToolCall, shown: set[str]) -> None:
        """Append a search's observation. A passage counts as shown (never shown again with dedup, and listed
        under ``hits`` in the search event) when at least the start of its text made it into the observation
        as kept after truncation; one whose text was cut partway is marked ``partial``, and one cut off
        entirely is listed under ``cut`` and may come back in a later search."""
        if call.error is not None:
            self._failed(t, call)
            self._append_observation(t, f"Error: {call.error}. " + ("You may search again or answer."
                                                                    if call.retrieves else "You may go on."),
                                     kind=OBSERVATION)
            return
        body, spans, record = self._call_body(call, shown)
        ids, kept = self._fit_observation(t, body)
        self._record(t, call, body, kept, spans, record, shown)
        self._add_observation(t, ids, kept < len(body), kind=OBSERVATION)

    def _failed(self, t: Trajectory, call: ToolCall) -> None:
        """The error event of a call its tool failed (an exception, a timeout): a search's counts as a failed search."""
        if call.retrieves:
            t.event("error", kind="search_failed", message=call.error, queries=list(call.queries))
        else:
            t.event("error", kind="tool_failed", tool=call.tool, message=call.error)

    def _call_body(self, call: ToolCall, shown: set[str]) -> tuple[str, list[tuple[int, Hit, int, int]],
                                                                      list[dict[str, Any]]]:
        """A call's results as the text the model reads, the span of each passage shown in it (query index, hit,
        start, end of its text) and the per-query records of a search event."""
        neutralize = self.dialect.neutralize
        if call.arguments_call:
            result = call.results[0]
            return neutralize(str(result)), [], [{"text": neutralize(str(result))[:200]}]
        k = self.settings.passages_per_search
        multi = len(call.queries) > 1
        parts: list[str] = []
        spans: list[tuple[int, Hit, int, int]] = []  # (query index, hit, start, end of its text in the body)
        taken: set[str] = set()
        offset = 0
        for qi, (query, result) in enumerate(zip(call.queries, call.results, strict=True)):
            head = f'Results for "{neutralize(query)}":\n' if multi else ""
            if isinstance(result, str):
                block = neutralize(result)
            else:
                fresh: list[Hit] = []
                for hit in result:
                    if hit.docid in taken or (self.settings.dedup_passages and hit.docid in shown):
                        continue
                    fresh.append(self.dialect.neutral_hit(hit))
                    taken.add(hit.docid)
                    if len(fresh) == k:
                        break
                block, local = self.dialect.format_passages_with_spans(fresh) if fresh else ("No new results.", [])
                base = offset + len(head)
                spans.extend((qi, hit, base + a, base + b) for hit, (a, b) in zip(fresh, local, strict=True))
            parts.append(head + block)
            offset += len(parts[-1]) + 1
        record: list[dict[str, Any]] = []
        for query, result in zip(call.queries, call.results, strict=True):
            if isinstance(result, str):
                record.append({"query": query, "text": neutralize(result)[:200]})
            else:
                record.append({"query": query, "hits": [], "cut": []})
        return "\n".join(parts), spans, record

    def _record(self, t: Trajectory, call: ToolCall, body: str, kept: int, spans: list[tuple[int, Hit, int, int]],
                record: list[dict[str, Any]], shown: set[str]) -> None:
        """The events of a call whose results were shown, ``kept`` characters of ``body`` of them: a search event
        with the passages as shown (see :meth:`_observe`), or a tool event."""
        for query, result in zip(() if call.arguments_call else call.queries, call.results, strict=False):
            if isinstance(result, ToolError):  # this query failed, the others of the batch were answered
                kind = "search_failed" if call.retrieves else "tool_failed"
                extra = {"queries": [query], "partial": True} if call.retrieves else {"tool": call.tool}
                t.event("error", kind=kind, message=str(result), **extra)
        if call.arguments_call:
            result = call.results[0]
            if isinstance(result, ToolError):
                t.event("error", kind="tool_failed", tool=call.tool, message=str(result))
            t.event("tool", tool=call.tool, arguments=dict(call.arguments), result=record[0]["text"],
                    failed=isinstance(result, ToolError), truncated=kept < len(body))
            return
        for qi, hit, start, end in spans:
            if kept > start:
                shown.add(hit.docid)
                # the text as the observation showed it (up to the cut of a truncated observation): what the
                # model read, and what the RAGAS reward judges
                text = hit.text[:min(end, kept) - start]
                record[qi]["hits"].append({"docid": hit.docid, "title": hit.title, "text": text,
                                           "partial": bool(body[kept:end].strip())})
            else:
                record[qi]["cut"].append({"docid": hit.docid, "title": hit.title})
        if call.retrieves:
            t.event("search", tool=call.tool, queries=list(call.queries), results=record)
        else:
            t.event("tool", tool=call.tool, queries=list(call.queries), results=record, truncated=kept < len(body))

    def _observe_native(self, t: Trajectory, group: list[ToolCall], shown: set[str]) -> None:
        """The tool message of a native turn: each call's result (or error, or notice) in the chat template's tool
        role, in the order of the calls, as one environment segment. Each result is cut to its tool's observation
        budget and to its share of the room left, with a visible notice; a turn whose wrapper does not fit at all
        ends the trajectory (``max_completion_tokens``)."""
        from .native import tool_turn

        bodies: list[tuple[ToolCall, str, list, list]] = []
        for call in group:
            if call.notice is not None:
                bodies.append((call, call.notice, [], []))
            elif call.error is not None:
                if not call.malformed:
                    self._failed(t, call)
                bodies.append((call, f"Error: {call.error}.", [], []))
            else:
                bodies.append((call, *self._call_body(call, shown)))
        # the template's tool turn starts after the model's end-of-turn token: the one it wrote, when it wrote one
        last = t.completion_ids[t.segments[-1].end - 1] if t.segments and t.segments[-1].end else None
        eot = self.tokenizer.convert_ids_to_tokens(last) if last is not None else ""

        def wrapped(contents: list[str]) -> list[int]:
            return encode_pieces(self.tokenizer, tool_turn(self.tokenizer, contents, eot=eot))

        room = self.settings.max_completion_tokens - len(t.completion_ids)
        overhead = len(wrapped([""] * len(group)))
        share = (room - overhead) // max(1, len(group))
        cut_to = [min(share, getattr(self._tool(c.tool), "max_observation_tokens", None)
                      or self.settings.max_observation_tokens) for c, *_ in bodies]
        while True:
            if min(cut_to) < 1:
                self._add_observation(t, None, True, kind=OBSERVATION)
                return
            cuts = [self._cut_text(self.dialect.neutralize(body), n) for (_, body, _, _), n in zip(bodies, cut_to,
                                                                                                   strict=True)]
            ids = wrapped([text for text, _ in cuts])
            if len(ids) <= room:
                break
            over = len(ids) - room  # the pieces' edges merged differently: take it off the longest
            longest = max(range(len(cut_to)), key=lambda j: cut_to[j])
            cut_to[longest] -= max(1, over)
        for (call, body, spans, record), (_, kept) in zip(bodies, cuts, strict=True):
            if call.notice is None and call.error is None:
                self._record(t, call, body, kept, spans, record, shown)
        self._add_observation(t, ids, any(kept < len(body) for (_, body, _, _), (_, kept) in zip(bodies, cuts,
                                                                                                   strict=True)),
                              kind=OBSERVATION)

    def _cut_text(self, body: str, budget: int) -> tuple[str, int]:
        """``body`` within ``budget`` tokens (as untrusted text) and how many of its leading characters that keeps:
        cut at a word boundary, with a visible notice of the cut."""
        ids = encode_text(self.tokenizer, body)
        if len(ids) <= budget:
            return body, len(body)
        notice = " ... [cut: the result was longer]"
        keep = budget - len(encode_text(self.tokenizer, notice))
        shortened = self._shorten(body, ids, keep, budget, notice, functools.partial(encode_text, self.tokenizer))
        return (shortened[1], shortened[2]) if shortened is not None else ("[cut]", 0)

    def _shorten(self, body: str, body_ids: list[int], keep: int, budget: int, suffix: str,
                 encode: Callable[[str], list[int]]) -> tuple[list[int], str, int] | None:
        """The longest cut of ``body`` at a word boundary, from its first ``keep`` tokens down, whose
        ``encode(cut + suffix)`` fits ``budget``: those ids, that text and the characters of ``body`` it keeps; None
        when none fits. The one truncation rule of observations and tool results."""
        while keep > 0:
            cut = self.tokenizer.decode(body_ids[:keep], skip_special_tokens=False)
            if " " in cut.strip():
                cut = cut[: cut.rstrip().rfind(" ")]
            cut = cut.rstrip()
            ids = encode(cut + suffix)
            if len(ids) <= budget:
                return ids, cut + suffix, len(os.path.commonprefix([cut, body]))
            keep -= max(1, len(ids) - budget)
        return None

    # ----------------------------------------------------------------------------------- observations

    def _encode(self, body: str) -> list[int]:
        """The ids of the observation holding ``body``: the dialect's wrapper as the engine's own text, the body as
        untrusted text (no control token recognised; its tags are neutralized by the callers)."""
        mark = "\ue000"
        head, _, tail = self.dialect.wrap_observation(mark).partition(mark)
        return encode_pieces(self.tokenizer, [(head, True), (body, False), (tail, True)])

    def observation_text(self, body: str) -> str:
        """``body`` (its dialect tags neutralized) as much as one observation shows of it (``max_observation_tokens``,
        tags included): cut at a word boundary and marked with ' ...' where it is cut. The naive-RAG baseline gives its
        passages this budget, so it reads exactly what the agent's one search would show."""
        body = self.dialect.neutralize(body)
        _, kept = self._fit(body, self.settings.max_observation_tokens)
        return body if kept >= len(body) else body[:kept].rstrip() + " ..."

    def _fit_observation(self, t: Trajectory, body: str) -> tuple[list[int] | None, int]:
        """The observation's ids within this trajectory's limits, and how many leading characters of ``body``
        they hold (None and 0 when not even the tags fit)."""
        room = self.settings.max_completion_tokens - len(t.completion_ids)
        return self._fit(body, min(self.settings.max_observation_tokens, room))

    def _append_observation(self, t: Trajectory, body: str, parent: int | None = None, *, kind: str) -> bool:
        """Tokenize an observation on its own, truncated cleanly to the limits, and append it (mask 0) as a
        segment of ``kind``. False when it did not fit at all: the trajectory is then finished
        (``max_completion_tokens``). ``body``'s dialect tags (an error message's, a summary's) are neutralized."""
        body = self.dialect.neutralize(body)
        ids, kept = self._fit_observation(t, body)
        return self._add_observation(t, ids, kept < len(body), parent, kind=kind)

    def _add_observation(self, t: Trajectory, ids: list[int] | None, truncated: bool,
                         parent: int | None = None, *, kind: str) -> bool:
        if ids is None:
            # resuming without it would let the model continue right after its action tag, as if the
            # environment had answered nothing: the trajectory ends here instead
            t.event("observation", tokens=0, truncated=True, dropped="no room left")
            self._finish(t, "max_completion_tokens")
            return False
        t.append(ids, ENV, parent=parent, kind=kind)
        t.event("observation", tokens=len(ids), truncated=truncated)
        return True

    def _fit(self, body: str, budget: int) -> tuple[list[int] | None, int]:
        """The wrapped observation's ids within ``budget`` tokens and the number of leading characters of
        ``body`` they hold: the body is cut at a word boundary and marked with '...', the closing tag always
        kept. ``(None, 0)`` when not even the tags fit. ``body`` is untrusted text (:meth:`_encode`)."""
        ids = self._encode(body)
        if len(ids) <= budget:
            return ids, len(body)
        overhead = len(self._encode(" ...")) + 1
        if overhead > budget:
            return None, 0
        shortened = self._shorten(body, encode_text(self.tokenizer, body), budget - overhead, budget, " ...",
                                  self._encode)
        if shortened is not None:
            return shortened[0], shortened[2]
        ids = self._encode("...")
        return (ids, 0) if len(ids) <= budget else (None, 0)
