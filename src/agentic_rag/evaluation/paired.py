"""Paired comparisons of two evaluations of the same questions: which answers flipped, whether the flips could be
chance (McNemar's exact test: under "no difference" each flip goes either way with probability 1/2), and a 95%
interval for the difference of the means (the paired bootstrap over questions: Efron & Tibshirani 1993, ch. 16).

On the quick start's 55 or the wiki task's 200 questions a gain of a few points is the net of a handful of flips; the
counts, the p-value and the interval say whether it is distinguishable from zero. Pooled over seeds
(:func:`pooled`), each question's difference is averaged over the seeds first and the questions are resampled, so
the seeds' shared questions are not counted as independent evidence (a cluster bootstrap); McNemar's test, which
needs independent pairs, is given per seed only.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

BOOTSTRAP_SAMPLES = 10_000


def predictions(folder: str | Path) -> dict[str, dict[str, Any]]:
    """An evaluation's per-question records (``predictions.jsonl`` of ``agentic-rag eval``), by question id."""
    lines = (Path(folder) / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def mcnemar(better: int, worse: int) -> float:
    """McNemar's exact two-sided p for ``better`` flips one way and ``worse`` the other (1.0 with no flips)."""
    flips = better + worse
    if not flips:
        return 1.0
    tail = sum(math.comb(flips, i) for i in range(min(better, worse) + 1)) / 2 ** flips
    return min(1.0, 2 * tail)


def paired(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]], *, metric: str = "em",
           where: Callable[[Mapping[str, Any]], bool] | None = None) -> dict[str, Any]:
    """``a`` against ``b`` on their common questions (those ``where`` keeps, judged on ``a``'s record): questions
    right in ``a`` and wrong in ``b`` (``better``), the reverse (``worse``), and McNemar's exact p."""
    ids = [q for q in a if q in b and (where is None or where(a[q]))]
    score = lambda r: float(r["metrics"][metric])  # noqa: E731
    better = sum(1 for q in ids if score(a[q]) > score(b[q]))
    worse = sum(1 for q in ids if score(a[q]) < score(b[q]))
    diffs = [score(a[q]) - score(b[q]) for q in ids]
    low, high = bootstrap_interval(diffs)
    return {"questions": len(ids), "better": better, "worse": worse, "p": float(f"{mcnemar(better, worse):.3g}"),
            "difference": _mean(diffs), "ci95": [low, high]}


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def bootstrap_interval(diffs: Sequence[float], *, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0,
                       level: float = 0.95) -> tuple[float | None, float | None]:
    """The percentile bootstrap interval of the mean of per-question differences (questions resampled with
    replacement, ``samples`` times, seeded): (None, None) for no questions."""
    n = len(diffs)
    if not n:
        return None, None
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(samples))
    tail = (1 - level) / 2
    low, high = means[int(tail * samples)], means[min(samples - 1, int((1 - tail) * samples))]
    return round(low, 4), round(high, 4)


def pooled(pairs: Sequence[tuple[Mapping[str, Mapping[str, Any]], Mapping[str, Mapping[str, Any]]]], *,
           metric: str = "em", where: Callable[[Mapping[str, Any]], bool] | None = None) -> dict[str, Any]:
    """Several seeds' ``(a, b)`` evaluations of the same questions at once: each question's difference averaged over
    the seeds, the mean and its 95% interval by resampling questions (see the module docstring), and the flips
    summed over the seeds (for reading; no p-value: the seeds share their questions)."""
    score = lambda r: float(r["metrics"][metric])  # noqa: E731
    per_question: dict[str, list[float]] = {}
    better = worse = 0
    for a, b in pairs:
        for q in a:
            if q in b and (where is None or where(a[q])):
                d = score(a[q]) - score(b[q])
                per_question.setdefault(q, []).append(d)
                better += d > 0
                worse += d < 0
    diffs = [sum(ds) / len(ds) for ds in per_question.values()]
    low, high = bootstrap_interval(diffs)
    return {"questions": len(diffs), "seeds": len(pairs), "better": better, "worse": worse,
            "difference": _mean(diffs), "ci95": [low, high]}


def distinguishable(result: Mapping[str, Any]) -> bool:
    """Whether a comparison's 95% interval excludes zero."""
    low, high = result.get("ci95") or (None, None)
    return low is not None and (low > 0 or high < 0)
