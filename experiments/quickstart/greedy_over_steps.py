"""How many GRPO steps the quick start's SFT model is from flipping its greedy two-hop behaviour.

Re-runs the quick start's GRPO for one seed from its SFT model, saving the adapter every 2 steps, and
evaluates each checkpoint greedily on the held-out questions (EM, searches per question). Needs a finished
quick start in --qs (default outputs/quickstart), with the settings it was made with (its ``settings.json``: the
tiny model or the real one, its world, its GRPO steps). Prints one JSON line last.

    python experiments/quickstart/greedy_over_steps.py [--qs outputs/quickstart] [--seed 0] [--every 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from agentic_rag.demo import quickstart as qs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qs", default="outputs/quickstart")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=2)
    args = ap.parse_args()
    src = Path(args.qs).resolve()
    if not (src / "sft" / "sft_summary.json").is_file() or not (src / "settings.json").is_file():
        sys.exit(f"no finished quick start in {src}: run bash script/quickstart.sh first")
    work = src.parent / f"{src.name}_steps"
    shutil.rmtree(work, ignore_errors=True)
    s = qs.Settings.from_dir(src, out=work, seeds=[args.seed], workers=1)  # one run: every core
    for part in ("world", "index"):
        shutil.copytree(src / part, work / part)
    # the same GRPO run as the quick start's, with a checkpoint every few steps, all kept
    run_dir = qs.train_run(s, src / "sft", f"seed{args.seed}-grpo", args.seed,
                           {"algorithm.shuffle_rewards": "false", "checkpoint.save_steps": args.every,
                            "checkpoint.save_total_limit": "null"})
    base, adapter = qs.models_of(s, src / "sft")
    points = [{"step": 0, **_point(qs.evaluate(s, "step0", base, adapter))}]
    for ckpt in sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
        step = int(ckpt.name.split("-")[1])
        points.append({"step": step, **_point(qs.evaluate(s, f"step{step}", base, ckpt))})
        print(points[-1], flush=True)
    half = next((p["step"] for p in points if p["em"] >= (points[0]["em"] + points[-1]["em"]) / 2), None)
    print(json.dumps({"seed": args.seed, "points": points, "first_step_past_half_the_gain": half}))


def _point(summary: dict) -> dict:
    return {"em": summary["metrics"]["em"], "searches_per_question": summary["searches_per_question"]}


if __name__ == "__main__":
    main()
