"""The algorithms side by side on the real-model task: the quick start's SFT start (SmolLM2-135M-Instruct with its
SFT LoRA adapter, one world) trained by each preset with the quick start's budget (10 steps of 8 questions x 4
rollouts, its learning rate and rollout limits; the packaged `world_grpo_smollm2.yaml`), 3 seeds each,
then evaluated greedily on the world's held-out questions.

    python experiments/algorithms/compare.py --quickstart outputs/qs_w0_v4 --seeds 0,1,2

Resumable: each finished (algorithm, seed) is a file under ``--record``/runs and is skipped; a run killed half
way starts again. One run at a time, with every core (wall clocks are comparable only that way). What each row
changes against the recipe's config (``OVERRIDES``):

* every preset runs with its paper's defaults: ``algorithm.scale_rewards`` is unset (the recipe sets ``none``), so
  grpo, dapo and gspo divide by the group's std, dr_grpo does not;
* ``grpo (recipe)`` is the quick start's own run (``scale_rewards: none``) and ``control`` its shuffled-reward
  control, both read from the quick start's directory (``runs/seed<k>-grpo``, ``-control``) when there;
* ``reinforce_pp`` is REINFORCE++ as its paper defines it, with the KL in the reward at ``beta`` 0.01 (OpenRLHF's
  default KL coefficient) against the SFT adapter as loaded;
* ``dapo`` samples dynamically (at most one batch more of rollouts a step).

Prints one JSON line last: the table (per algorithm: held-out EM mean and per seed, searches per question,
entropy of the policy's tokens at the last step, searches per trajectory at the last step, training wall clock,
extra rollouts drawn); writes ``--record``/results.json, table.md and curves.png.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from agentic_rag.demo import quickstart as qs  # noqa: E402
from agentic_rag.rewards.registry import metric_value  # noqa: E402 - reads runs written before well_formed's rename

PAPER_DEFAULTS = {"algorithm.scale_rewards": "null"}
OVERRIDES: dict[str, dict[str, Any]] = {
    "grpo": {**PAPER_DEFAULTS, "algorithm.name": "grpo"},
    "grpo (recipe)": {},
    "dr_grpo": {**PAPER_DEFAULTS, "algorithm.name": "dr_grpo"},
    "dapo": {**PAPER_DEFAULTS, "algorithm.name": "dapo"},
    "gspo": {**PAPER_DEFAULTS, "algorithm.name": "gspo"},
    "cispo": {**PAPER_DEFAULTS, "algorithm.name": "cispo"},
    "sapo": {**PAPER_DEFAULTS, "algorithm.name": "sapo"},
    "reinforce_pp": {**PAPER_DEFAULTS, "algorithm.name": "reinforce_pp", "algorithm.beta": 0.01},
    "control": {"algorithm.shuffle_rewards": "true"},
}
DEFAULT = ("grpo", "dr_grpo", "dapo", "gspo", "reinforce_pp", "grpo (recipe)", "control")
QUICKSTART_RUNS = {"grpo (recipe)": "grpo", "control": "control"}  # the quick start's own run names


def slug(algorithm: str) -> str:
    return algorithm.replace(" (recipe)", "-recipe")


def settings_of(quickstart: Path, seeds: list[int], allow_tiny: bool = False) -> qs.Settings:
    """The settings that directory's quick start was made with (its settings.json), checked against it. A
    ``--tiny`` quick start only with ``allow_tiny`` (a smoke run of this script)."""
    s = qs.Settings.from_dir(quickstart, seeds=seeds, workers=1)
    if s.tiny and not allow_tiny:
        raise SystemExit(f"{quickstart} is a --tiny quick start: the comparison is on the real model")
    qs.check_settings(s)  # the same settings the directory was made with, or a clear refusal
    if not (quickstart / "sft" / "sft_summary.json").is_file():
        raise SystemExit(f"{quickstart} has no finished SFT: run the quick start there first")
    return s


def one(s: qs.Settings, algorithm: str, seed: int, runs_dir: Path) -> dict[str, Any]:
    """Train (or find) one run and evaluate it; what the table needs."""
    sft_dir = s.out / "sft"
    base, _ = qs.models_of(s, sft_dir)
    if algorithm in QUICKSTART_RUNS:
        name, where = f"seed{seed}-{QUICKSTART_RUNS[algorithm]}", None  # the quick start's own directory
    else:
        name, where = f"{slug(algorithm)}-seed{seed}", runs_dir
    started, cpu_before = time.perf_counter(), _children_cpu_s()
    run = qs.train_run(s, sft_dir, name, seed, OVERRIDES[algorithm], runs_dir=where)
    wall, cpu = time.perf_counter() - started, _children_cpu_s() - cpu_before
    result = qs.evaluate(s, name if where is None else f"algorithms-{name}", base, run / "final")
    summary = json.loads((run / "train_summary.json").read_text())
    history = summary["log_history"]
    curves = qs.training_curves(run)
    extra = [h["dynamic_sampling/extra_rollouts"] for h in history if "dynamic_sampling/extra_rollouts" in h]
    return {"algorithm": algorithm, "seed": seed, "run": str(run), "overrides": OVERRIDES[algorithm],
            "em": result["metrics"]["em"], "f1": result["metrics"]["f1"],
            "well_formed": metric_value(result["metrics"], "well_formed"),
            "searches_per_question": result["searches_per_question"],
            "entropy_last": curves["entropy"][-1] if curves["entropy"] else None,
            "searches_per_trajectory_last": curves["searches"][-1] if curves["searches"] else None,
            "train_runtime_s": summary.get("train_runtime_s"), "process_wall_s": wall if wall > 5 else None,
            "process_cpu_s": cpu if wall > 5 else None,
            "peak_rss_mb": summary.get("peak_rss_mb"), "extra_rollouts": sum(extra) if extra else 0,
            "curves": curves}


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished children: a training run's own CPU time, which
    another job on the machine changes far less than its wall clock."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def aggregate(records: list[dict[str, Any]], em_sft: float) -> list[dict[str, Any]]:
    rows = []
    for algorithm in dict.fromkeys(r["algorithm"] for r in records):
        rs = sorted((r for r in records if r["algorithm"] == algorithm), key=lambda r: r["seed"])
        rows.append({"algorithm": algorithm, "seeds": [r["seed"] for r in rs], "em_per_seed": [r["em"] for r in rs],
                     "em_mean": mean([r["em"] for r in rs]), "gain_over_sft_mean": mean([r["em"] - em_sft for r in rs]),
                     "searches_per_question": mean([r["searches_per_question"] for r in rs]),
                     "entropy_last": mean([r["entropy_last"] for r in rs]),
                     "searches_per_trajectory_last": mean([r["searches_per_trajectory_last"] for r in rs]),
                     "train_runtime_s": mean([r["train_runtime_s"] for r in rs]),
                     "process_cpu_s": mean([r.get("process_cpu_s") for r in rs]),
                     "extra_rollouts": mean([r["extra_rollouts"] for r in rs])})
    return rows


def markdown(rows: list[dict[str, Any]], em_sft: float) -> str:
    def f(x, digits=3):
        return "" if x is None else f"{x:.{digits}f}"

    lines = [f"SFT start: held-out EM {em_sft:.3f}.", "",
             "| algorithm | EM mean | EM per seed | gain over SFT | searches / question | entropy (last step) | "
             "searches / trajectory (last step) | training s | CPU s | extra rollouts |", "|---" * 10 + "|"]
    for r in rows:
        lines.append(f"| {r['algorithm']} | {f(r['em_mean'])} | {', '.join(f(x) for x in r['em_per_seed'])} | "
                     f"{f(r['gain_over_sft_mean'], 3)} | {f(r['searches_per_question'], 2)} | {f(r['entropy_last'])} "
                     f"| {f(r['searches_per_trajectory_last'], 2)} | {f(r['train_runtime_s'], 0)} | "
                     f"{f(r['process_cpu_s'], 0)} | {f(r['extra_rollouts'], 0)} |")
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("reward", "reward (mean of the step's rollouts)"), ("searches", "searches per trajectory"),
              ("entropy", "entropy of the policy's tokens (nats)"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for algorithm in dict.fromkeys(r["algorithm"] for r in records):
        rs = [r for r in records if r["algorithm"] == algorithm]
        for ax, (key, title) in zip(axes, panels, strict=True):
            curves = [r["curves"][key] for r in rs if r["curves"][key]]
            if not curves:
                continue
            steps = min(len(c) for c in curves)
            ax.plot(range(1, steps + 1), [statistics.fmean(c[i] for c in curves) for i in range(steps)],
                    marker="o", ms=3, label=f"{algorithm} ({len(curves)} seeds)")
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quickstart", type=Path, required=True, help="a real-model quick start's output directory")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--algorithms", default=",".join(DEFAULT), help=f"of {', '.join(OVERRIDES)}")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "outputs" / "algorithms",
                    help="where the runs train (their checkpoints and logs)")
    ap.add_argument("--record", type=Path, default=ROOT / "experiments" / "algorithms",
                    help="where each finished run's record, the table and the plot go")
    ap.add_argument("--allow-tiny", action="store_true",
                    help="accept a --tiny quick start (a smoke run of this script: the tiny model's numbers mean "
                         "nothing)")
    args = ap.parse_args(argv)
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in algorithms if a not in OVERRIDES]
    if unknown:
        ap.error(f"unknown algorithm(s) {unknown}; choose from {', '.join(OVERRIDES)}")
    seeds = [int(x) for x in args.seeds.split(",")]
    s = settings_of(args.quickstart, seeds, args.allow_tiny)
    qs.build_task(s)
    runs_dir = args.runs_dir / f"world{s.world_seed}"
    done_dir = args.record / "runs" / f"world{s.world_seed}"
    done_dir.mkdir(parents=True, exist_ok=True)
    em_sft = qs.evaluate(s, "sft", *qs.models_of(s, s.out / "sft"))["metrics"]["em"]
    records = []
    for seed in seeds:  # seed-major: an interrupted comparison has every algorithm's first seeds
        for algorithm in algorithms:
            path = done_dir / f"{slug(algorithm)}-seed{seed}.json"
            if path.is_file():
                records.append(json.loads(path.read_text()))
                continue
            print(f"== {algorithm}, seed {seed}", flush=True)
            record = one(s, algorithm, seed, runs_dir)
            record["command"] = " ".join(["python", "experiments/algorithms/compare.py", *(argv or sys.argv[1:])])
            path.write_text(json.dumps(record, indent=1) + "\n")
            records.append(record)
            print(f"   EM {record['em']:.3f}, searches/question {record['searches_per_question']:.2f}, entropy "
                  f"{record['entropy_last']}, {record['train_runtime_s']:.0f} s", flush=True)
    rows = aggregate(records, em_sft)
    out = args.record / f"world{s.world_seed}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(markdown(rows, em_sft))
    (out / "results.json").write_text(json.dumps({"em_sft": em_sft, "rows": rows}, indent=1) + "\n")
    plot(records, out / "curves.png")
    print(markdown(rows, em_sft))
    print(json.dumps({"world_seed": s.world_seed, "em_sft": em_sft, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
