"""R1-Searcher's two-stage curriculum as one reward.

Song et al. 2025, "R1-Searcher: Incentivizing the Search Capability in LLMs via Reinforcement Learning"
(arXiv:2503.05592), section 2.2 "Two-Stage Outcome-based Reinforcement Learning", subsection "Reward Design"
(the retrieve, format and answer rewards; symbols as in the paper):

* **Stage 1** teaches the model to search, and does not look at the answer:
  ``R = R_format + R_retrieval`` with ``R_format`` = 0.5 when the trajectory is well formed, else 0, and
  ``R_retrieval`` = 0.5 when the model made at least one retrieval call (``n >= 1``, n the number of
  retrieval invocations), else 0. So 1.0 at best.
* **Stage 2** teaches the model to answer: ``R = R_answer + R'_format`` with ``R_answer`` the token F1 of the
  answer against the gold and ``R'_format`` = 0 when well formed, -2 otherwise. A malformed trajectory is
  still ranked by its answer (F1 - 2 lies in [-2, -1]), below every well-formed one.

Here "well formed" is :func:`agentic_rag.rewards.format.check_format` passing every rule, the F1 is
:func:`agentic_rag.rewards.accuracy.f1_score` (HotpotQA's F1, as the authors' reward code computes it), and a
retrieval call is a search the searcher ran, whether or not it found anything: a ``search`` event of the
trajectory. A search refused past ``max_searches``, one with an empty query, or one whose tool call failed
outright is not a retrieval. The three amounts are settings (``format_reward``, ``retrieval_bonus``,
``format_penalty``) with the paper's values as defaults. (The authors' released reward servers differ from the
paper in places, e.g. a -1 format penalty; this module follows the paper.)

The stage switches at ``stage2_step`` (global step), or is fixed for the whole run with ``fixed_stage``:
stage 2 as a second config (``curriculum.stage: 2``) that starts from the stage-1 adapter (``model.adapter``),
as the paper trains the stages one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Curriculum:
    stage2_step: int = 100
    retrieval_bonus: float = 0.5  # stage 1: R_retrieval when the model searched at least once
    format_penalty: float = -2.0  # stage 2: R'_format of a malformed trajectory
    fixed_stage: int | None = None  # 1 or 2 for the whole run; None: switch at stage2_step
    format_reward: float = 0.5  # stage 1: R_format of a well-formed trajectory

    def __post_init__(self) -> None:
        if self.fixed_stage not in (None, 1, 2):
            raise ValueError(f"fixed_stage must be 1, 2 or None, got {self.fixed_stage!r}")

    def stage(self, global_step: int) -> int:
        if self.fixed_stage is not None:
            return self.fixed_stage
        return 1 if global_step < self.stage2_step else 2

    def reward(self, global_step: int, *, format_ok: bool, searches: int, answer_f1: float) -> float:
        """The reward of one trajectory: ``searches`` retrieval calls, ``answer_f1`` the answer's F1 (0 for no
        answer)."""
        if self.stage(global_step) == 1:
            return (self.format_reward if format_ok else 0.0) + (self.retrieval_bonus if searches >= 1 else 0.0)
        return answer_f1 + (0.0 if format_ok else self.format_penalty)
