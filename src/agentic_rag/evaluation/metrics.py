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
* ``well_formed`` is 1 when the trajectory is well formed for evaluation purposes: it ended by answering
  (``finish_reason == "answer"``, not a limit, EOS or cancellation), the answer is not empty, and the model
  never wrote an environment-only tag (``<observation>``, ``<information>``, ``<|begin_of_documents|>``: a
  forged observation). (Runs written before the rename call it ``format``, the name the training reward that
  scores the tag format has; :func:`~agentic_rag.rewards.registry.metric_value` reads either.)
* A trajectory without an answer scores 0 on every accuracy metric.

The metric names are the scorer registry's (:mod:`agentic_rag.rewards.registry`, shared with the training
rewards); :func:`example_metrics` dispatches on them through :data:`METRIC_FUNCS`.

The summary holds, besides the mean of every metric: ``n``, searches and turns per question, the
per-question latency (seconds from the start of its batch to its finish) p50 / p99 / mean, tokens per
question, how trajectories ended, search errors, ``answer_tag_rate`` (the share of replies that wrote the answer
tag: the agent's format failures, reported apart from its answers; in ``direct`` and ``naive_rag`` mode the rest
are scored on their plain reply), and the judge's failure counts. Two more parts when the records
carry what they need:

* ``samples`` (records with ``samples``: ``samples: N`` > 1): ``n`` per question, and for each accuracy metric m
  ``pass_at_n`` (the share of questions with at least one sample scoring 1 on m) and ``mean_over_samples`` (the
  mean of m over every sample), and ``mixed_share``: the share of questions whose samples disagree on ``em``
  (``mixed_on`` names the metric; the first accuracy metric when em is not measured) - the GRPO groups that
  carry signal, since a group that is all right or all wrong has zero advantage;
* ``by_kind`` / ``by_type`` (records whose ``meta`` has ``kind`` / ``type``): per group, ``n``, the mean of every
  accuracy metric and searches per question (questions without the field are the group ``(none)``).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ..data.questions import GROUP_KEYS  # the question fields a summary is broken down by (by_kind, by_type)
from ..jsonl import FileFormatError, iter_jsonl
from ..rewards.accuracy import choice_accuracy, cover_exact_match, exact_match, f1_score
from ..rewards.registry import accuracy_names, compare_fn, get_scorer, metric_names, metric_value

# the accuracy metrics (the rest score the trajectory): what a report counts as fixed or broken per question
ACCURACY = tuple(n for n in metric_names() if n in accuracy_names())


def text_golds(golds: Sequence[str], options: Mapping[str, str] | None) -> list[str]:
    """The golds that are answers in words: without bare option letters on a multiple-choice row."""
    if not options:
        return list(golds)
    letters = {str(k).strip().upper() for k in options}
    kept = [g for g in golds if g.strip().upper() not in letters]
    return kept or list(golds)


def is_well_formed(finish_reason: str, answer: str | None, events: Iterable[Mapping[str, Any]]) -> bool:
    """Answered (not cut by a limit), a non-empty answer, no forged environment tag: the ``well_formed`` metric."""
    return (finish_reason == "answer" and bool((answer or "").strip())
            and not any(e.get("type") == "forged_tag" for e in events))


class Example(NamedTuple):
    """What a metric sees of one example."""

    prediction: str | None
    golds: Sequence[str]  # as given (a multiple-choice row's include the letter)
    words: list[str]  # the golds in words (:func:`text_golds`)
    options: Mapping[str, str] | None
    well_formed: bool
    judge: bool | None  # the judge's verdict, None = none


# one function per metric of the registry that is not an answer comparison (those come from the registry)
METRIC_FUNCS: dict[str, Callable[[Example], float | None]] = {
    "choice": lambda e: choice_accuracy(e.prediction, e.golds, e.options) if e.options else None,
    "judge": lambda e: None if e.judge is None else float(e.judge),
    "well_formed": lambda e: float(e.well_formed),
}


def example_metrics(prediction: str | None, golds: Sequence[str], metrics: Sequence[str], *,
                    options: Mapping[str, str] | None = None, well_formed: bool = False,
                    judge: bool | None = None) -> dict[str, float | None]:
    """The requested metrics of one example (``judge`` is the verdict already obtained, None = none). A name the
    registry does not list as a metric is a ValueError; one it lists that has no function here, a bug."""
    example = Example(prediction, golds, text_golds(golds, options), options, well_formed, judge)
    out: dict[str, float | None] = {}
    for name in metrics:
        if get_scorer(name, kind="metric").compare:  # the answer against the golds in words
            out[name] = compare_fn(name)(prediction, example.words)
            continue
        fn = METRIC_FUNCS.get(name)
        if fn is None:
            raise NotImplementedError(f"metric {name!r} is in the scorer registry (agentic_rag.rewards.registry) but "
                                      f"agentic_rag.evaluation.metrics has no function for it: add one to "
                                      f"METRIC_FUNCS")
        out[name] = fn(example)
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
        values = [v for r in records if (v := metric_value(r["metrics"], name)) is not None]
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
        # the replies that wrote the answer tag (direct and naive_rag score the others' plain reply: answer_source)
        "answer_tag_rate": _mean([float(r["answer_source"] == "tag") for r in records if "answer_source" in r]),
        "finish_reasons": dict(Counter(r["finish_reason"] for r in records)),
        "search_errors": sum(r.get("search_errors", 0) for r in records),
        "latency_s": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
                      "mean": _mean(latencies)},
    }
    accuracy = [m for m in metrics if m in ACCURACY]
    if any(r.get("samples") for r in records):
        summary["samples"] = sample_summary(records, accuracy)
    for key in GROUP_KEYS:
        if any((r.get("meta") or {}).get(key) is not None for r in records):
            summary[f"by_{key}"] = group_summary(records, accuracy, key)
    if "judge" in metrics:
        statuses = Counter((r.get("judge") or {}).get("status", "missing") for r in records)
        summary["judge"] = {"judged": counted.get("judge", 0), "yes": statuses.get("yes", 0),
                            "no": statuses.get("no", 0) + statuses.get("skipped", 0),
                            "skipped_empty_prediction": statuses.get("skipped", 0),
                            "failed": statuses.get("failed", 0), "garbage": statuses.get("garbage", 0)}
    return summary


def sample_summary(records: Sequence[Mapping[str, Any]], accuracy: Sequence[str]) -> dict[str, Any]:
    """pass@n, the mean over samples and the share of mixed questions (see the module docstring). A record
    without ``samples`` counts as its one sample; a metric with no value (no judge verdict) is left out."""
    per_question = [r.get("samples") or [r] for r in records]
    pass_at_n: dict[str, float | None] = {}
    mean_over: dict[str, float | None] = {}
    for m in accuracy:
        values = [[v for s in group if (v := metric_value(s["metrics"], m)) is not None] for group in per_question]
        scored = [vs for vs in values if vs]
        pass_at_n[m] = _mean([float(max(vs) >= 1.0) for vs in scored])
        mean_over[m] = _mean([v for vs in scored for v in vs])
    on = "em" if "em" in accuracy else (accuracy[0] if accuracy else None)
    mixed = None
    if on is not None:
        groups = [{v for s in group if (v := metric_value(s["metrics"], on)) is not None} for group in per_question]
        mixed = _mean([float(len(g) > 1) for g in groups if g])
    return {"n": max(len(g) for g in per_question), "pass_at_n": pass_at_n, "mean_over_samples": mean_over,
            "mixed_share": mixed, "mixed_on": on}


def group_summary(records: Sequence[Mapping[str, Any]], accuracy: Sequence[str], key: str) -> dict[str, Any]:
    """Per value of ``meta[key]`` (in order of first appearance): ``n``, the mean of each accuracy metric, and
    searches per question."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        value = (r.get("meta") or {}).get(key)
        groups.setdefault("(none)" if value is None else str(value), []).append(r)
    out: dict[str, Any] = {}
    for name, rs in groups.items():
        means = {m: _mean([v for r in rs if (v := metric_value(r["metrics"], m)) is not None]) for m in accuracy}
        out[name] = {"n": len(rs), "metrics": means, "searches_per_question": _mean([r["num_searches"] for r in rs])}
    return out


# ------------------------------------------------------------------------------------------ re-scoring

PRED_FIELDS = ("prediction", "pred_ans", "pred", "predicted_answer", "answer_pred")
GOLD_FIELDS = ("gold", "golden_answers", "answers", "answer")


PredictionFileError = FileFormatError  # the name this module's callers and tests know


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
    for lineno, obj in iter_jsonl(path):
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
