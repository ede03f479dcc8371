"""Per-example metrics of an evaluation run, their summary, and re-scoring any system's prediction file.

Every accuracy number comes from :mod:`agentic_rag.rewards.accuracy` (one normalisation for everyone).
This module decides what is compared with what and how a run is summarised:

* ``em``, ``f1``, ``cover_em`` compare the answer inside the answer tags with every gold answer (the best
  counts). On a multiple-choice row (MedQA) the gold answers are the letter and the option text; these
  three compare with the option text only (a bare letter would "cover" any prediction containing it), and
  ``choice`` compares the option letter read from the prediction with the gold letter. ``f1`` is HotpotQA's (0
  when either side is yes/no/noanswer and they differ); ``cover_em`` is the substring test FlashRAG and
  R1-Searcher report, kept here to compare with their numbers (training has ``cover_em_tokens`` instead).
* ``judge`` (ACC_L) is the LLM judge's verdict; the mean is over the examples that got one (``yes`` or
  ``no``), and how many got none (the judge failed or replied garbage) is reported next to it.
* ``format`` is 1 when the trajectory is well formed for evaluation purposes: it ended by answering
  (``finish_reason == "answer"``, not a limit, EOS or cancellation), the answer is not empty, and the model
  never wrote an environment-only tag (``<observation>``, ``<information>``, ``<|begin_of_documents|>``: a
  forged observation).
* A trajectory without an answer scores 0 on every accuracy metric.

The summary holds, besides the mean of every metric: ``n``, searches and turns per question, the
per-question latency (seconds from the start of its batch to its finish) p50 / p99 / mean, tokens per
question, how trajectories ended, search errors, and the judge's failure counts.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..rewards.accuracy import choice_accuracy, cover_exact_match, exact_match, f1_score

ACCURACY = ("em", "f1", "cover_em", "judge", "choice")


def text_golds(golds: Sequence[str], options: Mapping[str, str] | None) -> list[str]:
    """The golds that are answers in words: without bare option letters on a multiple-choice row."""
    if not options:
        return list(golds)
    letters = {str(k).strip().upper() for k in options}
    kept = [g for g in golds if g.strip().upper() not in letters]
    return kept or list(golds)


def format_ok(finish_reason: str, answer: str | None, events: Iterable[Mapping[str, Any]]) -> bool:
    """Answered (not cut by a limit), a non-empty answer, no forged environment tag."""
    return (finish_reason == "answer" and bool((answer or "").strip())
            and not any(e.get("type") == "forged_tag" for e in events))


def example_metrics(prediction: str | None, golds: Sequence[str], metrics: Sequence[str], *,
                    options: Mapping[str, str] | None = None, well_formed: bool = False,
                    judge: bool | None = None) -> dict[str, float | None]:
    """The requested metrics of one example (``judge`` is the verdict already obtained, None = none)."""
    words = text_golds(golds, options)
    out: dict[str, float | None] = {}
    for name in metrics:
        if name == "em":
            out[name] = exact_match(prediction, words)
        elif name == "f1":
            out[name] = f1_score(prediction, words)
        elif name == "cover_em":
            out[name] = cover_exact_match(prediction, words)
        elif name == "choice":
            out[name] = choice_accuracy(prediction, golds, options) if options else None
        elif name == "format":
            out[name] = float(well_formed)
        elif name == "judge":
            out[name] = None if judge is None else float(judge)
        else:
            raise ValueError(f"unknown metric {name!r}")
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(records: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    """The summary of a run's per-example records (see the module docstring)."""
    n = len(records)
    means: dict[str, float | None] = {}
    counted: dict[str, int] = {}
    for name in metrics:
        values = [r["metrics"][name] for r in records if r["metrics"].get(name) is not None]
        means[name] = _mean(values)
        counted[name] = len(values)
    latencies = [float(r["latency_s"]) for r in records if r.get("latency_s") is not None]
    summary: dict[str, Any] = {
        "n": n,
        "metrics": means,
        "metric_counts": counted,
        "searches_per_question": _mean([r["num_searches"] for r in records]),
        "turns_per_question": _mean([r["num_turns"] for r in records]),
        "completion_tokens_per_question": _mean([r.get("completion_tokens", 0) for r in records]),
        "answered": sum(1 for r in records if r.get("prediction") is not None),
        "finish_reasons": dict(Counter(r["finish_reason"] for r in records)),
        "search_errors": sum(r.get("search_errors", 0) for r in records),
        "latency_s": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
                      "mean": _mean(latencies)},
    }
    if "judge" in metrics:
        statuses = Counter((r.get("judge") or {}).get("status", "missing") for r in records)
        summary["judge"] = {"judged": counted.get("judge", 0), "yes": statuses.get("yes", 0),
                            "no": statuses.get("no", 0) + statuses.get("skipped", 0),
                            "skipped_empty_prediction": statuses.get("skipped", 0),
                            "failed": statuses.get("failed", 0), "garbage": statuses.get("garbage", 0)}
    return summary


# ------------------------------------------------------------------------------------------ re-scoring

PRED_FIELDS = ("prediction", "pred_ans", "pred", "predicted_answer", "answer_pred")
GOLD_FIELDS = ("gold", "golden_answers", "answers", "answer")


class PredictionFileError(ValueError):
    def __init__(self, path: str | os.PathLike, line: int, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}")


def _as_golds(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list):
        return [str(v) for v in value if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
    return []


def score_predictions(path: str | os.PathLike, *, pred_field: str | None = None,
                      answer_field: str | None = None) -> dict[str, Any]:
    """EM, F1 and cover-EM of a JSONL prediction file, with the project's normalisation.

    Fields default to the first present of :data:`PRED_FIELDS` / :data:`GOLD_FIELDS` in the first record. A
    record without the field, or with no gold answer, is an error naming the field and the line; a null
    prediction scores 0.
    """
    totals = {"em": 0.0, "f1": 0.0, "cover_em": 0.0}
    n = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise PredictionFileError(path, lineno, f"invalid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise PredictionFileError(path, lineno, "a record must be a JSON object")
            if pred_field is None:
                pred_field = next((k for k in PRED_FIELDS if k in obj), None)
                if pred_field is None:
                    raise PredictionFileError(path, lineno, f"no prediction field (tried {', '.join(PRED_FIELDS)}); "
                                                            f"name it with --pred-field (fields: {', '.join(obj)})")
            if answer_field is None:
                answer_field = next((k for k in GOLD_FIELDS if k in obj and k != pred_field), None)
                if answer_field is None:
                    raise PredictionFileError(path, lineno, f"no gold answer field (tried {', '.join(GOLD_FIELDS)}); "
                                                            f"name it with --answer-field (fields: {', '.join(obj)})")
            for name in (pred_field, answer_field):
                if name not in obj:
                    raise PredictionFileError(path, lineno, f"missing field '{name}'")
            golds = _as_golds(obj[answer_field])
            if not golds:
                raise PredictionFileError(path, lineno, f"field '{answer_field}' holds no gold answer "
                                                        f"(got {obj[answer_field]!r})")
            pred = obj[pred_field]
            pred = None if pred is None else str(pred)
            totals["em"] += exact_match(pred, golds)
            totals["f1"] += f1_score(pred, golds)
            totals["cover_em"] += cover_exact_match(pred, golds)
            n += 1
    if n == 0:
        raise PredictionFileError(path, 1, "no records")
    return {"n": n, **{k: v / n for k, v in totals.items()}, "pred_field": pred_field, "answer_field": answer_field}
