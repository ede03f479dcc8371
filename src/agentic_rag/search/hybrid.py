"""Hybrid retrieval by composition: any two searchers, fused by reciprocal rank or by weighted scores."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .types import Hit, PartialSearchError, Searcher

FUSIONS = ("rrf", "weighted")


def rrf_fuse(runs: Sequence[list[Hit]], k: int, rrf_k: float = 60.0,
             weights: Sequence[float] | None = None) -> list[Hit]:
    """Reciprocal-rank fusion: score(d) = sum over runs of w / (rrf_k + rank(d)), ranks from 1."""
    weights = weights or [1.0] * len(runs)
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for run, w in zip(runs, weights, strict=True):
        for rank, hit in enumerate(run, start=1):
            scores[hit.docid] = scores.get(hit.docid, 0.0) + w / (rrf_k + rank)
            first.setdefault(hit.docid, hit)
    ranked = sorted(scores, key=lambda d: (-scores[d], d))[:k]
    return [replace(first[d], score=scores[d]) for d in ranked]


def weighted_fuse(runs: Sequence[list[Hit]], k: int, weights: Sequence[float]) -> list[Hit]:
    """Weighted sum of min-max normalised scores; a document missing from a run gets that run's 0."""
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for run, w in zip(runs, weights, strict=True):
        if not run:
            continue
        lo, hi = min(h.score for h in run), max(h.score for h in run)
        span = hi - lo
        for hit in run:
            norm = (hit.score - lo) / span if span > 0 else 1.0
            scores[hit.docid] = scores.get(hit.docid, 0.0) + w * norm
            first.setdefault(hit.docid, hit)
    ranked = sorted(scores, key=lambda d: (-scores[d], d))[:k]
    return [replace(first[d], score=scores[d]) for d in ranked]


class HybridSearcher:
    """Fuses a sparse and a dense searcher (or any two).

    Each part retrieves ``max(k, depth)`` candidates; ``fusion="weighted"`` scores
    ``alpha * dense + (1 - alpha) * sparse`` on min-max normalised scores; ``fusion="rrf"`` sums reciprocal
    ranks (weighted by ``2 * alpha`` and ``2 * (1 - alpha)``; alpha 0.5 is classic RRF).

    The defaults (weighted, alpha 0.3, depth 50) were chosen on the first 100 2WikiMultiHopQA dev questions
    with BM25 + all-MiniLM-L6-v2, and beat both parts on the other 400 (experiments/retrieval/README.md).
    A stronger dense encoder deserves a larger alpha.
    """

    def __init__(self, sparse: Searcher, dense: Searcher, *, fusion: str = "weighted", alpha: float = 0.3,
                 rrf_k: float = 60.0, depth: int = 50):
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}; choose one of {', '.join(FUSIONS)}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.sparse, self.dense = sparse, dense
        self.fusion, self.alpha, self.rrf_k, self.depth = fusion, alpha, rrf_k, depth

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Fused hits per query. A query that one part cannot answer fails alone: the others are fused and
        returned in a :class:`PartialSearchError` (a fused list from one part alone would be a different
        ranking, silently)."""
        depth = max(k, self.depth)
        sparse_runs, sparse_errors = _runs(self.sparse, queries, depth)
        dense_runs, dense_errors = _runs(self.dense, queries, depth)
        weights = (1.0 - self.alpha, self.alpha)
        if self.fusion == "rrf":
            # With alpha = 0.5 both runs count equally, the classic RRF.
            fused = [rrf_fuse((s, d), k, self.rrf_k, [2 * w for w in weights])
                     for s, d in zip(sparse_runs, dense_runs, strict=True)]
        else:
            fused = [weighted_fuse((s, d), k, weights) for s, d in zip(sparse_runs, dense_runs, strict=True)]
        errors = [se or de for se, de in zip(sparse_errors, dense_errors, strict=True)]
        if any(errors):
            raise PartialSearchError([None if e else hits for hits, e in zip(fused, errors, strict=True)], errors)
        return fused


def _runs(searcher: Searcher, queries: Sequence[str], depth: int) -> tuple[list[list[Hit]], list[str | None]]:
    """One part's hits per query and its per-query failures (an empty run where a query failed)."""
    try:
        return searcher.batch_search(queries, depth), [None] * len(queries)
    except PartialSearchError as exc:
        return [hits or [] for hits in exc.results], list(exc.errors)
