"""What the environment does with a turn's tool calls, and the observations it appends (the engine's half that faces
the tools; :class:`~.engine.AgentRollout` inherits it).

A tag dialect's search tag and its other tools' tags, and a native turn's calls: each call checked (malformed, unknown
tool, wrong arguments: an error result the model reads, counted), held to its tool's limit (``max_searches`` for
searches, ``max_calls`` for the others: a notice), and the rest started together, one batch per tool
(:mod:`.tool_calls`). Their results come back as environment segments (env_mask 0): a search's passages formatted by
the dialect, a tool's text, each cut to its observation budget and the room left at a word boundary with a visible
notice (one truncation rule, :meth:`ToolTurns._shorten`), encoded as untrusted text (:mod:`.encoding`) inside the
dialect's wrapper or the chat template's tool turn.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any

from ..search.types import Hit, clean_query
from ..tools.base import ToolError, ToolRegistry, is_argument_tool, retrieves, schema
from ..tools.python import argument_problem
from .encoding import encode_pieces, encode_text
from .protocol import Action, ActionKind, Dialect
from .settings import RolloutSettings
from .tool_calls import ToolBatch, ToolCall, ToolRunner
from .trajectory import ENV, NOTICE, OBSERVATION, Trajectory


class ToolTurns:
    """The tool calls and observations of :class:`~.engine.AgentRollout` (a mixin: it uses the engine's settings,
    dialect, tokenizer, tools and tool runner, and its ``_finish``)."""

    # set by AgentRollout.__init__
    settings: RolloutSettings
    dialect: Dialect
    tokenizer: Any
    tools: ToolRegistry
    client_tools: frozenset[str]
    search_timeout_s: float
    _tool_runner: ToolRunner

    def _finish(self, t: Trajectory, reason: str) -> None:
        raise NotImplementedError  # AgentRollout's

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
