"""GRPO runs of the world quick start in the native tool-call format from an existing native quick start's SFT
adapter, at a learning rate of your choosing, each evaluated greedily on the held-out questions (issue 57, item 4).

    python -m agentic_rag.demo.quickstart --dialect native --out /work/runs/qs_native --seeds 1   # world, SFT, ...
    python experiments/quickstart/native_runs.py --out /work/runs/qs_native --lr 1e-4 --seeds 0 [--control]

Each run is the quick start's own (``train_run``: the same config, `--set` overrides, its own process) with
``algorithm.learning_rate`` set; a finished run or evaluation is skipped. Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentic_rag.demo.quickstart import REAL_MODEL, Settings, evaluate, train_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a native quick start's output folder (its world, index and SFT)")
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--control", action="store_true", help="also the shuffled-reward control of each seed")
    args = ap.parse_args()
    s = Settings(out=Path(args.out).resolve(), seeds=args.seeds, dialect="native")
    sft_dir = s.out / "sft"
    rows = []
    for seed in args.seeds:
        for control in ([False, True] if args.control else [False]):
            name = f"seed{seed}-{'control' if control else 'grpo'}-lr{args.lr:g}"
            out = train_run(s, sft_dir, name, seed, {"algorithm.learning_rate": args.lr,
                                                      "algorithm.shuffle_rewards": str(control).lower()})
            summary = evaluate(s, name, REAL_MODEL, out / "final")
            rows.append({"run": name, "em": summary["metrics"]["em"],
                         "searches": summary["searches_per_question"]})
            print(rows[-1], flush=True)
    sft = json.loads((s.out / "eval" / "sft" / "summary.json").read_text())
    print(json.dumps({"lr": args.lr, "em_sft": sft["metrics"]["em"], "runs": rows}))


if __name__ == "__main__":
    main()
