"""Retrieval quality: how often the gold titles of a question are among the top-k hits.

For each k: ``all`` (every gold title found: what a multi-hop question needs), ``any`` (at least one) and
``mean_fraction`` (the fraction of gold titles found, averaged over questions). Titles are compared
after Unicode NFC normalisation, case folding and whitespace collapsing.

It joins question files (:mod:`agentic_rag.data.questions`) with any ``Searcher``, so it lives here, above
both, and the search layer imports nothing from data. The commands are in :mod:`.retrieval_commands`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from ..data.questions import QARow
from ..search.types import Searcher


def normalize_title(title: str) -> str:
    return " ".join(unicodedata.normalize("NFC", title).casefold().split())


def recall_at_k(rows: Sequence[QARow], searcher: Searcher, ks: Sequence[int], *, batch_size: int = 64,
                progress: bool = True) -> dict[str, Any]:
    """Evaluate ``searcher`` on the questions of ``rows`` that have gold titles."""
    ks = sorted(set(ks))
    if not ks or ks[0] < 1:
        raise ValueError(f"k values must be positive integers, got {ks}")
    rows = [r for r in rows if r.gold_titles]
    if not rows:
        raise ValueError("no question has gold titles (supporting_facts): nothing to evaluate")
    kmax = ks[-1]
    sums = {k: {"all": 0.0, "any": 0.0, "mean_fraction": 0.0} for k in ks}
    with tqdm(total=len(rows), desc="retrieval eval", unit="q", disable=not progress) as bar:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            results = searcher.batch_search([r.question for r in chunk], kmax)
            for row, hits in zip(chunk, results, strict=True):
                gold = {normalize_title(t) for t in row.gold_titles}
                titles = [normalize_title(h.title) for h in hits]
                for k in ks:
                    found = gold & set(titles[:k])
                    sums[k]["all"] += float(found == gold)
                    sums[k]["any"] += float(bool(found))
                    sums[k]["mean_fraction"] += len(found) / len(gold)
            bar.update(len(chunk))
    n = len(rows)
    return {"questions": n, "recall": {str(k): {m: round(v / n, 4) for m, v in sums[k].items()} for k in ks}}


def format_table(result: dict[str, Any], title: str = "") -> str:
    lines = [title] if title else []
    lines.append(f"{'k':>4}  {'all gold':>9}  {'any gold':>9}  {'mean frac':>9}   (n={result['questions']})")
    for k, m in result["recall"].items():
        lines.append(f"{k:>4}  {m['all']:>9.4f}  {m['any']:>9.4f}  {m['mean_fraction']:>9.4f}")
    return "\n".join(lines)
