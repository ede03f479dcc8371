"""What sampling finds that greedy misses: for the questions of a sampled evaluation (``agentic-rag eval --samples
N``, temperature > 0), how many the greedy evaluation of the same adapter answers wrong while at least one sample
answers right (the answers GRPO could promote into greedy ones), and how many greedy answers right while no sample
does. Prints one JSON line: those counts and the whole greedy-right x samples-right table.

    python experiments/wiki/headroom.py outputs/quickstart_wiki/eval/sft/predictions.jsonl \\
        outputs/quickstart_wiki/eval/sft_sampled_multi_hop/predictions.jsonl

RL with verifiable rewards rarely reaches beyond what its starting policy samples (Yue et al. 2025, *Does
reinforcement learning really incentivize reasoning capacity beyond the base model?*), so the first count is what
a few GRPO steps have to work with on these questions; it grows with N (rare right draws), so compare counts at the
same N.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("greedy", type=Path, help="predictions.jsonl of a greedy evaluation")
    ap.add_argument("sampled", type=Path, help="predictions.jsonl of an evaluation with --samples N")
    args = ap.parse_args(argv)
    with args.greedy.open() as f:
        greedy = {p["id"]: p["metrics"]["em"] == 1.0 for p in map(json.loads, f)}
    table: collections.Counter[tuple[bool, int]] = collections.Counter()
    samples = set()
    with args.sampled.open() as f:
        for p in map(json.loads, f):
            if p["id"] not in greedy:
                raise SystemExit(f"question {p['id']} of {args.sampled} is not in {args.greedy}")
            right = sum(s["metrics"]["em"] == 1.0 for s in p["samples"])
            samples.add(len(p["samples"]))
            table[greedy[p["id"]], right] += 1
    out = {
        "questions": sum(table.values()),
        "samples": sorted(samples),
        "greedy_right": sum(n for (g, _), n in table.items() if g),
        "greedy_wrong_some_sample_right": sum(n for (g, k), n in table.items() if not g and k),
        "greedy_right_no_sample_right": sum(n for (g, k), n in table.items() if g and not k),
        "table": {f"greedy_{'right' if g else 'wrong'}/{k}_samples_right": n for (g, k), n in sorted(table.items())},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
