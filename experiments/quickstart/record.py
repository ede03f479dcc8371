"""Copy a finished quick start's results into experiments/quickstart/ (the recorded run).

    python experiments/quickstart/record.py [--qs outputs/quickstart] [--record DIR]

Writes here (or in ``--record``): ``summary.json``, ``reward_curve.png`` and ``sft_sampled_behaviour.json`` (the
quick start's own files) and ``training_curves.json``: per GRPO step of every run, from the trainers' logs, the
batch's mean reward, exact match, searches per trajectory and model tokens per trajectory. Prints one JSON line
last: the first-5 and last-5 step means of each curve.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CURVES = {"reward": "reward", "em": "rewards/em/mean",
          "searches_per_trajectory": "agentic/searches_per_trajectory",
          "model_tokens": "completions/mean_length"}
OLD_NAMES = {"rewards/em/mean": "rewards/exact_match/mean"}  # runs logged before the em reward's rename


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qs", default="outputs/quickstart")
    ap.add_argument("--record", type=Path, default=HERE, help="where the files go (default: this folder)")
    args = ap.parse_args()
    qs, record = Path(args.qs), args.record
    if not (qs / "summary.json").is_file():
        sys.exit(f"no finished quick start in {qs}: run bash script/quickstart.sh first")
    record.mkdir(parents=True, exist_ok=True)
    for name, dest in (("summary.json", "summary.json"), ("reward_curve.png", "reward_curve.png"),
                       ("eval/sft_sampled_behaviour.json", "sft_sampled_behaviour.json")):
        shutil.copyfile(qs / name, record / dest)
    curves: dict[str, dict[str, list[float]]] = {}
    for run in sorted((qs / "runs").iterdir()):
        steps = [h for h in json.loads((run / "train_summary.json").read_text())["log_history"] if "reward" in h]
        curves[run.name] = {k: [round(h[v] if v in h else h[OLD_NAMES[v]], 4) for h in steps]
                            for k, v in CURVES.items()}
    (record / "training_curves.json").write_text(json.dumps(curves) + "\n")
    mean = lambda xs: round(sum(xs) / len(xs), 3)  # noqa: E731
    print(json.dumps({run: {k: [mean(v[:5]), mean(v[-5:])] for k, v in c.items()} for run, c in curves.items()}))


if __name__ == "__main__":
    main()
