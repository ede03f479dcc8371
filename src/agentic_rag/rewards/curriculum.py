"""R1-Searcher's two-stage curriculum as one reward.

Stage 1 teaches the behaviour: a well-formed trajectory earns its format score, and one that retrieved
something earns ``retrieval_bonus`` (0.5) more. Stage 2 teaches the answer: the answer's token F1, or
``format_penalty`` (-2) for a malformed trajectory. The stage switches at ``stage2_step`` (global step), or
is fixed for the whole run with ``fixed_stage``: stage 2 as a second config (``curriculum.stage: 2``) that
starts from the stage-1 adapter (``model.adapter``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Curriculum:
    stage2_step: int = 100
    retrieval_bonus: float = 0.5
    format_penalty: float = -2.0
    fixed_stage: int | None = None  # 1 or 2 for the whole run; None: switch at stage2_step

    def __post_init__(self) -> None:
        if self.fixed_stage not in (None, 1, 2):
            raise ValueError(f"fixed_stage must be 1, 2 or None, got {self.fixed_stage!r}")

    def stage(self, global_step: int) -> int:
        if self.fixed_stage is not None:
            return self.fixed_stage
        return 1 if global_step < self.stage2_step else 2

    def reward(self, global_step: int, *, format_ok: bool, format_score: float, retrieved: bool,
               answer_f1: float) -> float:
        if self.stage(global_step) == 1:
            return format_score + (self.retrieval_bonus if retrieved else 0.0)
        return answer_f1 if format_ok else self.format_penalty
