"""What a user watches while a model trains: one console line per optimizer step (SFT and GRPO alike), and the
greedy validation score every few GRPO steps.

:class:`ProgressLine` prints, on the main process, after every logged step::

    [grpo] step 3/12  reward 0.412  em 0.375  searches 1.94  41.2 s/step  left 6m10s
    [sft] step 40/220  loss 0.8341  lr 4.5e-04  2.9 s/step  left 8m42s

so a minute never passes in silence; the numbers are the ones the trainer logs (and SwanLab shows): ``reward``,
the first accuracy reward's mean (``rewards/em/mean``, ``rewards/f1/mean``...), ``agentic/searches_per_trajectory``.

:class:`ValidationEval` rolls the current policy out greedily on a validation question file every ``every`` steps
and at the end (:meth:`~agentic_rag.training.trainer.AgenticGRPOTrainer.greedy_rollouts`: the run's own settings,
prompt and searcher), scores exact match and F1, overall and per question kind when the file says it
(``kind``: yes_no, pick_one, multi_hop), and logs them as ``eval/em``, ``eval/f1``, ``eval/em_<kind>``,
``eval/searches``: into the trainer's metrics (so they reach its log history and SwanLab with the step's other
numbers), a console line, and ``OUTPUT_DIR/validation.jsonl``; each question's answer, queries and EM go to
``OUTPUT_DIR/validation/step<N>.jsonl``. RL runs on small models often peak early and then
collapse; this is how a run shows where.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..rollout.events import search_queries

ACCURACY_KEYS = ("rewards/em/mean", "rewards/f1/mean", "rewards/cover_em_tokens/mean", "rewards/cover_em/mean",
                 "rewards/judge/mean", "rewards/choice/mean")


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class ProgressLine(TrainerCallback):
    """One line per logged step on the main process (see the module docstring); ``label`` is ``grpo`` or ``sft``."""

    def __init__(self, label: str, stream: Any = None):
        self.label, self.stream = label, stream
        self._started: float | None = None
        self._start_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._started, self._start_step = time.perf_counter(), state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "epoch" not in logs or self._started is None:
            return
        done = max(1, state.global_step - self._start_step)
        per_step = (time.perf_counter() - self._started) / done
        parts = [f"[{self.label}] step {state.global_step}/{state.max_steps}"]
        if "reward" in logs:
            parts.append(f"reward {logs['reward']:.3f}")
            key = next((k for k in ACCURACY_KEYS if k in logs), None)
            if key:
                parts.append(f"{key.split('/')[1]} {logs[key]:.3f}")
            if "agentic/searches_per_trajectory" in logs:
                parts.append(f"searches {logs['agentic/searches_per_trajectory']:.2f}")
        elif "loss" in logs:
            parts.append(f"loss {logs['loss']:.4f}")
            if "learning_rate" in logs:
                parts.append(f"lr {logs['learning_rate']:.1e}")
        if "eval/em" in logs:
            parts.append(f"val-em {logs['eval/em']:.3f}")
        parts.append(f"{per_step:.1f} s/step")
        parts.append(f"left {duration(per_step * (state.max_steps - state.global_step))}")
        print("  ".join(parts), file=self.stream or sys.stderr, flush=True)


def read_validation(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The validation questions: ``question``, gold ``answers`` and ``kind`` (None when the file does not say)."""
    from ..data.questions import read_questions

    rows = read_questions(path, limit=limit, require_answers=True)
    return [{"question": r.question, "answers": r.answers, "kind": r.meta.get("kind")} for r in rows]


def score(trajs: list[Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    """EM and F1 of greedy trajectories against their rows' gold answers, overall and per kind, and searches."""
    from ..rewards.accuracy import exact_match, f1_score

    em = [exact_match(t.answer, r["answers"]) if t.answer is not None else 0.0 for t, r in zip(trajs, rows,
                                                                                           strict=True)]
    f1 = [f1_score(t.answer, r["answers"]) if t.answer is not None else 0.0 for t, r in zip(trajs, rows, strict=True)]
    out = {"eval/em": sum(em) / len(em), "eval/f1": sum(f1) / len(f1),
           "eval/searches": sum(t.num_searches for t in trajs) / len(trajs)}
    for kind in sorted({r["kind"] for r in rows if r["kind"]}):
        values = [e for e, r in zip(em, rows, strict=True) if r["kind"] == kind]
        out[f"eval/em_{kind}"] = sum(values) / len(values)
    return out


class ValidationEval(TrainerCallback):
    """Greedy validation every ``every`` optimizer steps and at the end, and before the first step unless
    ``at_start`` is false; ``at_end`` false: none after the last step, even on the ``every`` grid (see the module
    docstring)."""

    def __init__(self, trainer_ref: list, path: str | Path, every: int, output_dir: str | Path,
                 limit: int | None = None, stream: Any = None, at_start: bool = True, at_end: bool = True):
        self.trainer_ref, self.every, self.at_start, self.at_end = trainer_ref, every, at_start, at_end
        self.rows = read_validation(path, limit)
        self.out = Path(output_dir) / "validation.jsonl"
        self.stream = stream
        self._done: set[int] = set()

    def _run(self, state) -> dict[str, float]:
        trainer = self.trainer_ref[0]
        started = time.perf_counter()
        trajs = trainer.greedy_rollouts([r["question"] for r in self.rows])
        metrics = score(trajs, self.rows)
        seconds = time.perf_counter() - started
        self._done.add(state.global_step)
        if state.is_world_process_zero:
            kinds = "  ".join(f"{k.removeprefix('eval/em_')} {v:.3f}" for k, v in metrics.items()
                              if k.startswith("eval/em_"))
            print(f"[validation] step {state.global_step}: em {metrics['eval/em']:.3f}  f1 {metrics['eval/f1']:.3f}  "
                  f"{kinds}  searches {metrics['eval/searches']:.2f}  ({len(self.rows)} questions, {seconds:.0f} s)",
                  file=self.stream or sys.stderr, flush=True)
            with open(self.out, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": state.global_step, **metrics, "seconds": round(seconds, 1)}) + "\n")
            self._write_answers(state.global_step, trajs)
        return metrics

    def _write_answers(self, step: int, trajs: list[Any]) -> None:
        """Each question's greedy answer, queries and EM at this step (``OUTPUT_DIR/validation/step<N>.jsonl``):
        what changed between two points of the curve, question by question."""
        from ..rewards.accuracy import exact_match

        folder = self.out.parent / "validation"
        folder.mkdir(exist_ok=True)
        lines = []
        for t, r in zip(trajs, self.rows, strict=True):
            queries = search_queries(t.events)
            lines.append(json.dumps({"question": r["question"], "kind": r["kind"], "gold": r["answers"],
                                     "answer": t.answer, "queries": queries, "finish_reason": t.finish_reason,
                                     "em": exact_match(t.answer, r["answers"]) if t.answer is not None else 0.0},
                                    ensure_ascii=False) + "\n")
        (folder / f"step{step}.jsonl").write_text("".join(lines), encoding="utf-8")

    def on_step_end(self, args, state, control, **kwargs):
        # before the step is logged: the numbers join the step's log entry (log history, SwanLab)
        last = state.global_step == state.max_steps
        if (self.at_end or not last) and (self.every and state.global_step % self.every == 0 or last):
            metrics = self._run(state)
            trainer = self.trainer_ref[0]
            for key, value in metrics.items():
                trainer._metrics["train"][key].append(value)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0 and self.at_start:  # the starting point of the curve (the SFT model, say)
            metrics = self._run(state)
            self.start = metrics
