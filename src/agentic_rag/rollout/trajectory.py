"""A trajectory: what the trainer, evaluation and the chat service consume.

The completion is a sequence of *segments*, each either written by the model (``env_mask`` 1) or inserted
by the environment (``env_mask`` 0). Every segment has a ``parent``: the segment it follows in the context
it was produced with (-1 = right after the prompt). Without backtrack or summary the parents form a chain
and the context of each token is simply everything before it. A backtrack or summary starts a new branch:
the next segment's parent is an earlier segment, so the abandoned text leaves what the model sees.

Because each segment's context is the path from the prompt to its parent, every token's context is a
prefix-closed set and one forward pass with a tree-shaped attention mask (:mod:`.scoring`) reproduces, for
every token, exactly the context it was generated with.

Each segment also says what it is (``kind``): a model turn carries the action that ended it (``search``,
``answer``, ``backtrack``, ``summary``, ``none``); an environment segment is a search step's
``observation`` (results, or the error of a failed or empty search), a ``backtrack_note``, a
``summary_note``, or a ``notice`` (a refused action: nothing to backtrack, no searches left). A *search
step* is a model ``search`` turn and the ``observation`` that follows it: the unit a backtrack abandons.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .events import search_outcomes  # noqa: F401 - re-exported: its readers import it from here

MODEL, ENV = "model", "env"
# kinds of environment segments (a model segment's kind is its turn's action, an ActionKind value)
OBSERVATION, NOTICE, BACKTRACK_NOTE, SUMMARY_NOTE = "observation", "notice", "backtrack_note", "summary_note"


@dataclass
class Segment:
    start: int  # offset in completion_ids
    end: int  # exclusive
    source: str  # MODEL or ENV
    parent: int  # index of the segment this one follows in its context; -1 = the prompt
    kind: str = ""  # what it is: a model turn's action, or OBSERVATION, NOTICE, BACKTRACK_NOTE, SUMMARY_NOTE

    def __len__(self) -> int:
        return self.end - self.start


@dataclass
class Trajectory:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1 = the model wrote it, 0 = the environment inserted it
    logprobs: list[float] | None = field(default_factory=list)  # per completion token; 0.0 for env tokens
    segments: list[Segment] = field(default_factory=list)
    text: str = ""
    answer: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    num_searches: int = 0  # calls of retrieval tools (a tag dialect's search action with several queries is one)
    tool_calls: dict[str, int] = field(default_factory=dict)  # calls of every other tool, by name
    num_turns: int = 0
    finish_reason: str = ""
    question: str = ""
    # answer branching (:mod:`.branching`): the completion offset where this trajectory left the trunk it shares with
    # its group; the tokens before it are that shared context (0: not a branch)
    branch_start: int = 0

    # ------------------------------------------------------------------------------------ structure

    def path(self, segment: int) -> list[int]:
        """Segments from the prompt to ``segment`` inclusive (its context plus itself), in order."""
        out = []
        while segment >= 0:
            out.append(segment)
            segment = self.segments[segment].parent
        return out[::-1]

    @property
    def is_linear(self) -> bool:
        """True when every segment follows the previous one (no backtrack/summary branch)."""
        return all(s.parent == i - 1 for i, s in enumerate(self.segments))

    def visible_ids(self) -> list[int]:
        """What the model sees next: the prompt and the path to the last segment."""
        ids = list(self.prompt_ids)
        if self.segments:
            for i in self.path(len(self.segments) - 1):
                s = self.segments[i]
                ids.extend(self.completion_ids[s.start:s.end])
        return ids

    def append(self, ids: list[int], source: str, parent: int | None = None,
               logprobs: list[float] | None = None, kind: str = "") -> int:
        """Add a segment (parent defaults to the last segment); returns its index."""
        start = len(self.completion_ids)
        parent = len(self.segments) - 1 if parent is None else parent
        self.completion_ids.extend(ids)
        self.env_mask.extend([1 if source == MODEL else 0] * len(ids))
        if self.logprobs is not None:
            if source == MODEL and logprobs is not None and len(logprobs) == len(ids):
                self.logprobs.extend(logprobs)
            elif source == MODEL:
                self.logprobs = None  # the backend gave none: no partial lists
            else:
                self.logprobs.extend([0.0] * len(ids))
        self.segments.append(Segment(start, start + len(ids), source, parent, kind))
        return len(self.segments) - 1

    def last_search_step(self, segment: int) -> int | None:
        """The model turn that opens the last search step on the path to ``segment``, or None when that path
        holds none. Backtrack notes, notices and model turns after the step are passed over; a replacing
        summary note starts its path at the prompt, so no step before a summary is ever found."""
        for index in reversed(self.path(segment)):
            seg = self.segments[index]
            if seg.source == ENV and seg.kind == OBSERVATION and seg.parent >= 0:
                return seg.parent
        return None

    def __post_init__(self) -> None:
        # the per-rollout tools' state (a class tool's instance), by the tool's state_key: not a field, not recorded
        self.tool_states: dict[Any, Any] = {}

    def event(self, type_: str, **data: Any) -> None:
        ev = {"type": type_, "turn": self.num_turns, **data}
        self.events.append(ev)
        listener = getattr(self, "listener", None)
        if listener is not None:
            listener(ev)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def trained_mask(self) -> list[int]:
        """What a trainer may train on: ``env_mask`` with an answer branch's shared trunk (before ``branch_start``)
        zeroed."""
        return [0] * self.branch_start + self.env_mask[self.branch_start:]

    @property
    def model_tokens(self) -> int:
        return sum(self.env_mask)

    @property
    def env_tokens(self) -> int:
        return len(self.env_mask) - sum(self.env_mask)
