"""The quick start's report: the table of evaluated models, the reward curves (a plot and one SwanLab dashboard
with every run side by side), and the per-step training curves a run's log history holds."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..rewards.registry import metric_value

# the table's reward column: the training reward (exact match + 0.2 x format) as evaluation measures it
REWARD_WEIGHTS = {"em": 1.0, "well_formed": 0.2}


def dashboard(out: Path, runs: dict[str, Path], evals: dict[str, list[dict[str, Any]]] | None = None) -> Path:
    """One SwanLab dashboard with every run side by side: each run's logged metrics (its trainer's log history,
    the numbers TRL handed to SwanLab during training) written again, one experiment per run, into a fresh
    local-mode log directory. Each run's own log, written live, stays in ``runs/<name>/swanlog``. ``evals``: per run,
    validation points measured outside its trainer (``step`` and ``eval/*`` numbers, e.g. the SFT start at step 0
    and the evaluation of its final adapter), logged at their steps beside the trainer's own validations."""
    import swanlab

    log_dir = out / "swanlog"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    settings = json.loads((out / "settings.json").read_text())
    chatter = io.StringIO()  # SwanLab announces every run it starts and finishes; the quick start says it once
    with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
        for name, run_dir in runs.items():
            history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
            swanlab.init(project="quickstart", name=name, mode="local", log_dir=str(log_dir), config=settings)
            extra = (evals or {}).get(name, [])
            for entry in sorted([*history, *extra], key=lambda e: e.get("step", 0)):
                scalars = {k: v for k, v in entry.items() if k not in ("step", "epoch")
                           and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
                if "step" in entry and scalars:
                    swanlab.log(scalars, step=int(entry["step"]))
            swanlab.finish()
    return log_dir


def reward_curve(run_dir: Path) -> list[float]:
    """The logged mean reward per step (shuffling keeps the mean: the control's curve is its true reward)."""
    history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
    return [h["reward"] for h in history if "reward" in h]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def row(name: str, summary: dict[str, Any]) -> dict[str, Any]:
    m = summary["metrics"]  # a run written before the rename has well_formed under its old name, format
    return {"model": name, "em": m["em"], "f1": m["f1"], "well_formed": metric_value(m, "well_formed"),
            "searches": summary["searches_per_question"],
            "reward": sum(w * (metric_value(m, k) or 0.0) for k, w in REWARD_WEIGHTS.items())}


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = f"{'model':<22}{'EM':>7}{'F1':>7}{'well-formed':>13}{'searches/q':>12}{'reward':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:<22}{r['em']:>7.3f}{r['f1']:>7.3f}{r['well_formed']:>13.3f}{r['searches']:>12.2f}"
                     f"{r['reward']:>8.3f}")
    return "\n".join(lines)


def plot(curves: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, ys) in enumerate(curves.items()):
        steps = range(1, len(ys) + 1)
        style = "--" if "control" in name else "-"
        color = colors[i % len(colors)]
        # each step's batch holds only a few questions: the raw curve is faint, a 5-step mean drawn over it
        ax.plot(steps, ys, linestyle=style, color=color, alpha=0.25, linewidth=1)
        smooth = [_mean(ys[max(0, j - 4):j + 1]) for j in range(len(ys))]
        ax.plot(steps, smooth, linestyle=style, color=color, label=name)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward of the batch (EM + 0.2 format)")
    ax.set_title("Quick start: GRPO vs shuffled-reward control")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def training_curves(run_dir: Path) -> dict[str, list[float]]:
    """Per-step curves from a run's logged history: reward, searches per trajectory, entropy of model tokens."""
    history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
    keys = {"reward": "reward", "searches": "agentic/searches_per_trajectory", "entropy": "entropy"}
    return {name: [h[key] for h in history if key in h] for name, key in keys.items()}
