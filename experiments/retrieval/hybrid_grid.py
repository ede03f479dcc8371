"""How the hybrid defaults were chosen: a grid over fusion, alpha and depth, tuned on the first 100 dev
questions and reported on the other 400 (one JSON line per setting, mean fraction of gold titles found)."""

from __future__ import annotations

import argparse
import itertools
import json

from agentic_rag.data.questions import read_questions
from agentic_rag.evaluation.retrieval import recall_at_k
from agentic_rag.search import CachedSearcher, open_searcher
from agentic_rag.search.hybrid import HybridSearcher


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--tune", type=int, default=100,
                    help="the first N questions tune, the rest are held out (default 100: of the 500 dev questions)")
    args = ap.parse_args()
    rows = read_questions(args.questions)
    splits = {f"tune_first{args.tune}": rows[:args.tune], f"heldout_last{len(rows) - args.tune}": rows[args.tune:]}
    bm25 = CachedSearcher(open_searcher(args.index, "bm25"), 100_000)
    dense = CachedSearcher(open_searcher(args.index, "dense"), 100_000)

    def score(searcher, split):
        r = recall_at_k(splits[split], searcher, [5, 10, 20], progress=False)["recall"]
        return {f"k{k}": r[k]["mean_fraction"] for k in r}

    for split in splits:
        print(json.dumps({"split": split, "retriever": "bm25", **score(bm25, split)}), flush=True)
        print(json.dumps({"split": split, "retriever": "dense", **score(dense, split)}), flush=True)
        for fusion, alpha, depth in itertools.product(["rrf", "weighted"], [0.3, 0.4, 0.5], [20, 50, 100]):
            hybrid = HybridSearcher(bm25, dense, fusion=fusion, alpha=alpha, depth=depth)
            print(json.dumps({"split": split, "retriever": "hybrid", "fusion": fusion, "alpha": alpha,
                              "depth": depth, **score(hybrid, split)}), flush=True)


if __name__ == "__main__":
    main()
