"""Paired comparisons of two evaluations of the same questions: which answers flipped, and whether the flips could be
chance (McNemar's exact test: under "no difference" each flip goes either way with probability 1/2).

On the quick start's 55 or the wiki task's 200 questions a gain of a few points is the net of a handful of flips; the
counts and the p-value say whether it is distinguishable from zero.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


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
    return {"questions": len(ids), "better": better, "worse": worse, "p": float(f"{mcnemar(better, worse):.3g}")}
