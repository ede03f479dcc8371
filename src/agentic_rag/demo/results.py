"""``agentic-rag report RUN_DIR``: a quick start's results as plots and as claims with their uncertainty.

From a world or wiki quick start's folder (its ``summary.json``, and the per-question records of its evaluations
under ``eval/``: ``sft``, ``seedN-grpo``, ``seedN-control``) it writes, next to them:

* ``validation_em.png``: greedy validation EM per step of each seed's GRPO run and its control (the SFT start at
  step 0, the runs' own validations where they made them, each final adapter at its last step);
* ``em_by_kind.png``: EM per question kind (the wiki task's yes/no, pick-one, multi-hop; the world's one-hop and
  two-hop) of the SFT start, each GRPO seed and each control;
* ``searches_entropy.png``: searches per trajectory and the entropy of the model's tokens, per training step;
* ``report.md`` and ``report.json``: every "GRPO beats SFT" and "GRPO beats its control", per seed and pooled over
  seeds, overall and per kind: questions better / worse, McNemar's exact p (per seed), the difference of the means
  and its paired 95% bootstrap interval (:mod:`agentic_rag.evaluation.paired`), and whether the interval excludes
  zero. A run whose per-question records are gone (an older record that kept only ``summary.json``) gets its plots and
  a line saying its intervals cannot be computed.

The quick starts call :func:`render` at their end. The plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..evaluation.paired import distinguishable, paired, pooled, predictions

Record = Mapping[str, Any]


def _kind(record: Record) -> str | None:
    """A question's kind: the wiki task's ``kind``, or the world's one-hop / two-hop."""
    meta = record.get("meta") or {}
    if meta.get("kind"):
        return str(meta["kind"])
    if meta.get("hops") is not None:
        return {1: "one_hop", 2: "two_hop"}.get(int(meta["hops"]), f"{meta['hops']}_hop")
    return None


def _records(run_dir: Path, name: str) -> dict[str, dict[str, Any]] | None:
    folder = run_dir / "eval" / name
    return predictions(folder) if (folder / "predictions.jsonl").is_file() else None


def comparisons(run_dir: Path, seeds: list[int]) -> dict[str, Any]:
    """GRPO against its SFT start and against its control, per seed and pooled, overall and per kind."""
    found = {name: _records(run_dir, name)
             for name in ["sft"] + [f"seed{seed}-{kind}" for seed in seeds for kind in ("grpo", "control")]}
    missing = [name for name, records in found.items() if records is None]
    if missing:
        return {"missing": missing}
    sft = found["sft"]
    runs = {seed: (found[f"seed{seed}-grpo"], found[f"seed{seed}-control"]) for seed in seeds}
    kinds = sorted({k for r in sft.values() if (k := _kind(r))})
    groups: dict[str, Callable[[Record], bool] | None] = {"all": None}
    groups.update({kind: (lambda r, kind=kind: _kind(r) == kind) for kind in kinds})
    out: dict[str, Any] = {"questions": len(sft), "kinds": kinds, "claims": []}
    pairs = {"GRPO vs SFT": {seed: (grpo, sft) for seed, (grpo, _) in runs.items()},
             "GRPO vs control": {seed: (grpo, control) for seed, (grpo, control) in runs.items()},
             "control vs SFT": {seed: (control, sft) for seed, (_, control) in runs.items()}}
    for claim, by_seed in pairs.items():
        for group, where in groups.items():
            out["claims"].append({"claim": claim, "group": group,
                                  "per_seed": {seed: paired(a, b, where=where) for seed, (a, b) in by_seed.items()},
                                  "pooled": pooled(list(by_seed.values()), where=where)})
    return out


def _fmt(result: Mapping[str, Any]) -> str:
    low, high = result["ci95"]
    if result["difference"] is None:
        return "no questions"
    mark = "**" if distinguishable(result) else ""
    p = f", p = {result['p']:.3g}" if "p" in result else ""
    flips = f"{result['better']} / {result['worse']}{p}"
    return f"{mark}{result['difference']:+.3f} [{low:+.3f}, {high:+.3f}]{mark} ({flips})"


def claims_markdown(found: Mapping[str, Any], seeds: list[int]) -> str:
    """The claims as a Markdown table: each cell the difference of the means, its 95% interval (bold when it
    excludes zero), and questions better / worse with McNemar's p."""
    if "missing" in found:
        return ("Paired intervals cannot be computed: these evaluations kept no per-question records: "
                + ", ".join(found["missing"]) + ".")
    head = "| claim | questions | " + " | ".join(f"seed {s}" for s in seeds) + " | pooled over seeds |"
    lines = [head, "|---|---|" + "---|" * (len(seeds) + 1)]
    for c in found["claims"]:
        n = c["pooled"]["questions"]
        cells = " | ".join(_fmt(c["per_seed"][s]) for s in seeds)
        lines.append(f"| {c['claim']}, {c['group'].replace('_', '-')} | {n} | {cells} | {_fmt(c['pooled'])} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(name: str) -> dict[str, Any]:
    """One colour per seed (a GRPO run and its control share it), dashed for the control."""
    seed = name.rsplit(" ", 1)[-1]
    color = f"C{int(seed) % 10}" if seed.isdigit() else None
    return {"linestyle": "--" if name.startswith("control") else "-", "marker": "o", "markersize": 3, "color": color}


def plot_validation(summary: Mapping[str, Any], path: Path) -> Path:
    """Greedy validation EM per step of each run (the wiki task's validation curves; the world's SFT start and
    final evaluations, which are all its runs have)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    curves = summary.get("validation_curves")
    steps = summary.get("settings", {}).get("grpo_steps") or 1
    if curves:
        for name, points in curves.items():
            ax.plot([p["step"] for p in points], [p["eval/em"] for p in points], label=name, **_style(name))
    else:
        before = summary["em_before"]
        for i, seed in enumerate(summary["seeds"]):
            for name, values in ((f"GRPO seed {seed}", summary["em_after"]), (f"control seed {seed}",
                                                                           summary["em_control"])):
                ax.plot([0, steps], [before[i], values[i]], label=name, **_style(name))
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("greedy validation EM")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    ax.set_title("Greedy validation EM per step (step 0: the SFT start)" if curves else
                 "Greedy EM: the SFT start (step 0) and each final adapter")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _kind_em(kinds: list[str], records: dict[str, Any] | None) -> dict[str, float]:
    """EM per kind of one evaluation, from its records (the world's kinds are not in its summary)."""
    if records is None:
        return {}
    out = {}
    for kind in kinds:
        values = [float(r["metrics"]["em"]) for r in records.values() if _kind(r) == kind]
        if values:
            out[kind] = sum(values) / len(values)
    return out


def plot_by_kind(run_dir: Path, summary: Mapping[str, Any], path: Path) -> Path | None:
    """EM per kind of the SFT start, each GRPO seed and each control (bars)."""
    sft = _records(run_dir, "sft")
    if sft is None:
        return None
    kinds = sorted({k for r in sft.values() if (k := _kind(r))})
    rows = {"SFT": _kind_em(kinds, sft)}
    for seed in summary["seeds"]:
        rows[f"GRPO seed {seed}"] = _kind_em(kinds, _records(run_dir, f"seed{seed}-grpo"))
        rows[f"control seed {seed}"] = _kind_em(kinds, _records(run_dir, f"seed{seed}-control"))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    width = 0.8 / len(rows)
    for i, (name, ems) in enumerate(rows.items()):
        xs = [k + i * width for k in range(len(kinds))]
        ax.bar(xs, [ems.get(kind, 0.0) for kind in kinds], width, label=name,
               hatch="//" if name.startswith("control") else None)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))], [k.replace("_", "-") for k in kinds])
    ax.set_ylabel("greedy EM")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    ax.set_title("EM per question kind, before (SFT) and after")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_searches_entropy(summary: Mapping[str, Any], path: Path) -> Path:
    """Searches per trajectory and entropy of the model's tokens per training step, every run."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, curves in summary.get("training_curves", {}).items():
        for ax, key in ((left, "searches"), (right, "entropy")):
            values = curves.get(key) or []
            ax.plot(range(1, len(values) + 1), values, label=name, **_style(name))
    left.set(xlabel="GRPO step", ylabel="searches per trajectory", title="Searches per trajectory (sampled)")
    right.set(xlabel="GRPO step", ylabel="nats per model token", title="Entropy of the model's tokens")
    left.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------------ report


def render(run_dir: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Writes the plots, ``report.md`` and ``report.json`` of a quick start's folder (into ``out``, default the
    folder itself) and returns the report."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise UserError(f"{summary_path} not found: RUN_DIR is a quick start's output folder (it writes "
                        f"summary.json when it finishes)")
    summary = json.loads(summary_path.read_text())
    out = Path(out) if out else run_dir
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(summary["seeds"])
    plots = [plot_validation(summary, out / "validation_em.png"),
             plot_by_kind(run_dir, summary, out / "em_by_kind.png"),
             plot_searches_entropy(summary, out / "searches_entropy.png")]
    found = comparisons(run_dir, seeds)
    table = claims_markdown(found, seeds)
    task = summary.get("task", "world")
    md = [f"# {task} quick start: {run_dir.name}", "",
          f"SFT EM {summary['em_before'][0]:.3f}; GRPO " + ", ".join(f"{e:.3f}" for e in summary["em_after"])
          + "; controls " + ", ".join(f"{e:.3f}" for e in summary["em_control"]) + ".", "",
          "Each cell: the difference of the means, its paired 95% bootstrap interval (bold when it excludes zero), "
          "questions better / worse, and McNemar's exact p (per seed).", "", table, ""]
    md += [f"![{p.stem}]({p.name})" for p in plots if p is not None]
    (out / "report.md").write_text("\n".join(md) + "\n")
    report = {"run": str(run_dir), "task": task, "seeds": seeds, "plots": [str(p) for p in plots if p],
              **found}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def cmd_report(args: argparse.Namespace) -> int:
    report = render(args.run_dir, args.out)
    print((Path(args.out or args.run_dir) / "report.md").read_text())
    print("plots: " + ", ".join(report["plots"]))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="a quick start's results as plots (validation EM, EM per kind, searches and "
                                      "entropy per step) and paired claims with 95% intervals")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a quick start's output folder (outputs/quickstart, ...)")
    p.add_argument("--out", default=None, help="where to write the plots and report.md (default RUN_DIR)")
    p.set_defaults(func=cmd_report)
