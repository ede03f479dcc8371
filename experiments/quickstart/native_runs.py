"""GRPO runs of the world quick start in the native tool-call format from an existing native quick start's SFT adapter
(its recipe, or a learning rate of your choosing), each evaluated greedily on the held-out questions (issue 57, item
4).

    python -m agentic_rag.demo.quickstart --dialect native --out /work/runs/qs_native --seeds 1   # world, SFT, ...
    python experiments/quickstart/native_runs.py --out /work/runs/qs_native --lr 1e-4 --seeds 0 [--control] \\
        [--set algorithm.warmup_ratio=0.3]
    python experiments/quickstart/native_runs.py --out /work/runs/qs_native --seeds 0 1 2 --control --sampled 4

With neither ``--lr`` nor ``--set`` the runs are the quick start's own (``seedN-grpo``, ``seedN-control``: its
recipe, ``Settings.native_recipe``), trained only where the quick start has not, so ``--sampled`` adds the sampled
view to a quick start's table.

Each run is the quick start's own (``train_run``: the same config, `--set` overrides, its own process), with
``algorithm.learning_rate`` set where ``--lr`` is given; a finished run or evaluation is skipped (run it again to
print the table of finished runs). Each run's greedy evaluation is compared with the SFT start's question by
question (``vs_sft``: right where the start was wrong, the reverse, McNemar's exact p). ``--sampled N`` also
evaluates the SFT start and each run with N rollouts a question at temperature 1 (``sampled``: the mean EM over
samples, and its difference from the SFT's, question by question, with a paired 95% interval): greedy EM says which
way a model decides, the sampled EM how much of its policy has moved, which tells a run that learned from one that
drifted across a close decision. Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentic_rag.demo.quickstart import REAL_MODEL, Settings, evaluate, train_run
from agentic_rag.evaluation.paired import paired, predictions


def sample_means(folder: Path) -> dict[str, dict]:
    """Each question's EM averaged over its samples, as records ``paired`` reads."""
    out = {}
    for qid, r in predictions(folder).items():
        ems = [float(x["metrics"]["em"]) for x in (r.get("samples") or [r])]
        out[qid] = {**r, "metrics": {"em": sum(ems) / len(ems)}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a native quick start's output folder (its world, index and SFT)")
    ap.add_argument("--lr", type=float, default=None,
                    help="the learning rate (default: the quick start's native recipe, and its runs' names)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--control", action="store_true", help="also the shuffled-reward control of each seed")
    ap.add_argument("--only-control", action="store_true", help="the controls alone (another process runs the GRPO)")
    ap.add_argument("--workers", type=int, default=1, help="runs training at once on the machine (threads: cores/N)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="another training setting (algorithm.warmup_ratio=0.3), named in the run's name too")
    ap.add_argument("--sampled", type=int, default=0, metavar="N",
                    help="also evaluate the SFT start and each run with N rollouts a question at temperature 1")
    args = ap.parse_args()
    if args.sampled == 1:
        ap.error("--sampled N: N rollouts a question, 2 or more (the greedy evaluation is the one-rollout one)")
    s = Settings.from_dir(Path(args.out).resolve(), seeds=args.seeds, workers=args.workers)
    if s.dialect != "native":
        ap.error(f"{args.out} is a quick start in the {s.dialect} dialect; native_runs.py trains the native format")
    sft_dir = s.out / "sft"
    if args.sampled:  # the SFT start's sampled evaluation, once: every run is paired with it
        sft_sampled = f"sft-sampled{args.sampled}"
        evaluate(s, sft_sampled, REAL_MODEL, sft_dir, samples=args.sampled)
        sft_means = sample_means(s.out / "eval" / sft_sampled)
    rows = []
    for seed in args.seeds:
        for control in [True] if args.only_control else [False, True] if args.control else [False]:
            extra = dict(kv.split("=", 1) for kv in args.sets)
            suffix = "".join(f"-{k.rsplit('.', 1)[-1]}{v}" for k, v in extra.items())
            name = f"seed{seed}-{'control' if control else 'grpo'}"
            if args.lr is not None:
                extra["algorithm.learning_rate"] = args.lr
                name += f"-lr{args.lr:g}"
            name += suffix
            out = train_run(s, sft_dir, name, seed, {"algorithm.shuffle_rewards": str(control).lower(), **extra})
            summary = evaluate(s, name, REAL_MODEL, out / "final")
            rows.append({"run": name, "em": summary["metrics"]["em"], "searches": summary["searches_per_question"],
                         "vs_sft": paired(predictions(s.out / "eval" / name), predictions(s.out / "eval" / "sft"))})
            if args.sampled:
                sampled = evaluate(s, f"{name}-sampled{args.sampled}", REAL_MODEL, out / "final", samples=args.sampled)
                rows[-1]["sampled"] = {
                    "em": sampled["samples"]["mean_over_samples"]["em"],
                    "vs_sft": paired(sample_means(s.out / "eval" / f"{name}-sampled{args.sampled}"), sft_means)}
            print(rows[-1], flush=True)
    sft = json.loads((s.out / "eval" / "sft" / "summary.json").read_text())
    print(json.dumps({"lr": args.lr, "settings": args.sets, "em_sft": sft["metrics"]["em"], "runs": rows}))


if __name__ == "__main__":
    main()
