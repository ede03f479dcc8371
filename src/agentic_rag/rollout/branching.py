"""Answer branching: one trajectory's searches, several answers.

A trajectory that ended with an answer is cut just after the answer's open tag (its *branch point*): everything
before it, the searches and the passages they returned included, is a *trunk* that ``n`` branches share, and each
branch writes its own answer from there (:meth:`~.engine.AgentRollout.continue_turns`, so a branch ends, and is
parsed, exactly as a turn of :meth:`~.engine.AgentRollout.run` would). A GRPO group made of one trunk's branches
compares answers given the same evidence: the signal for reading a passage right, which whole-rollout groups of a
small model rarely carry, because its sampled rollouts seldom find the evidence and misread it in different ways
(experiments/wiki/README.md, "Where the signal is"). Tree-structured rollouts branch in the same spirit at several
points (TreeRL, Hou et al. 2025; ARPO, Dong et al. 2025, at high-entropy steps after a tool call); here the one
branch point is the answer tag.

Each branch records its branch point in :attr:`~.trajectory.Trajectory.branch_start`: the trainer trains on the
tokens after it only (the trunk is the same context for every branch of the group). A trunk without an answer (it
ran out of turns or tokens, or ended without the tag) has no branch point: its ``n`` branches are copies of it with
``branch_start`` at its end, nothing in them to train on.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .engine import AgentRollout, RolloutHooks
from .protocol import ActionKind
from .trajectory import MODEL, Trajectory


@dataclass
class BranchPoint:
    """Where a trajectory branches: model segment ``segment`` (its answer turn) is kept as generated up to completion
    offset ``kept``, then ``tail`` (ids) ends the forced prefix just after the answer's open tag. ``tail`` is empty
    when a generated token ends exactly at the tag; when the token that completes the tag also holds the start of the
    answer (``>F`` in Qwen's vocabulary), that token is re-encoded from the text up to the tag, so that no branch
    starts with the trunk's first letters."""

    segment: int
    kept: int
    tail: list[int]

    def forced(self, t: Trajectory) -> list[int]:
        """The ids a branch's answer turn starts with."""
        return t.completion_ids[t.segments[self.segment].start:self.kept] + self.tail


def answer_branch_point(t: Trajectory, tokenizer: Any, answer_open: str) -> BranchPoint | None:
    """The branch point of ``t``'s answer turn (see :class:`BranchPoint`), at the first open tag the turn holds; None
    when ``t`` did not end with an answer or the open tag is not in that turn (a close tag alone)."""
    if t.finish_reason != "answer" or not t.segments:
        return None
    index = len(t.segments) - 1
    seg = t.segments[index]
    if seg.source != MODEL or seg.kind != ActionKind.ANSWER.value:
        return None
    ids = t.completion_ids[seg.start:seg.end]

    def text(k: int) -> str:
        return tokenizer.decode(ids[:k], skip_special_tokens=False)

    if answer_open not in text(len(ids)):
        return None
    k = next(k for k in range(1, len(ids) + 1) if answer_open in text(k))  # the first k tokens hold the tag
    whole = text(k)
    tag_end = whole.find(answer_open) + len(answer_open)
    if tag_end == len(whole):
        return BranchPoint(index, seg.start + k, [])
    before = text(k - 1)
    if not whole.startswith(before):  # a multi-byte character split across tokens: re-encode from the turn's start
        return BranchPoint(index, seg.start, tokenizer(whole[:tag_end], add_special_tokens=False)["input_ids"])
    tail = tokenizer(whole[len(before):tag_end], add_special_tokens=False)["input_ids"]
    return BranchPoint(index, seg.start + k - 1, tail)


def stem(t: Trajectory, segment: int) -> Trajectory:
    """``t`` as it was before the turn of model segment ``segment`` began: its segments, ids and masks before it,
    the events of the turns before it, unfinished."""
    start = t.segments[segment].start
    turn = t.num_turns  # the answer turn is the last; its events carry its number
    return Trajectory(prompt_ids=list(t.prompt_ids), completion_ids=t.completion_ids[:start],
                      env_mask=t.env_mask[:start], logprobs=None if t.logprobs is None else t.logprobs[:start],
                      segments=copy.deepcopy(t.segments[:segment]),
                      events=[copy.deepcopy(e) for e in t.events if e.get("turn", 0) < turn],
                      num_searches=t.num_searches, num_turns=turn - 1, question=t.question)


def answer_branches(engine: AgentRollout, trunks: Sequence[Trajectory], n: int,
                    hooks: RolloutHooks | None = None) -> list[list[Trajectory]]:
    """``n`` branches of each trunk (see the module docstring), all decoded in one continued run of ``engine`` (whose
    policy samples them). The branch's forced prefix (the answer turn up to its tag) keeps the trunk's recorded
    log-probabilities. Returns one list of ``n`` trajectories per trunk; the trunks are left as they are."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    open_tag = engine.dialect.answer_open
    out: list[list[Trajectory]] = []
    todo: list[Trajectory] = []
    forced: list[list[int]] = []
    prefix_logprobs: list[list[float] | None] = []
    for t in trunks:
        point = answer_branch_point(t, engine.tokenizer, open_tag)
        if point is None:
            copies = [copy.deepcopy(t) for _ in range(n)]
            for c in copies:
                c.branch_start = len(c.completion_ids)
            out.append(copies)
            continue
        start = t.segments[point.segment].start
        prefix = point.forced(t)
        group = []
        for _ in range(n):
            b = stem(t, point.segment)
            b.branch_start = start + len(prefix)
            group.append(b)
            todo.append(b)
            forced.append(prefix)
            # the recorded log-probabilities of the part kept as generated (a re-encoded tail has none: 0.0)
            prefix_logprobs.append(None if t.logprobs is None else t.logprobs[start:point.kept])
        out.append(group)
    if todo:
        engine.continue_turns(todo, forced, hooks)
        for b, prefix, lps in zip(todo, forced, prefix_logprobs, strict=True):
            if b.logprobs is None:
                continue
            if lps is None:
                b.logprobs = None
            else:
                first = b.branch_start - len(prefix)
                b.logprobs[first:first + len(lps)] = lps
    return out
