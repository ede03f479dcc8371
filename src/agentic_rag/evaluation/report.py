"""A report comparing evaluation runs side by side (e.g. the base model against the trained adapter).

``agentic-rag eval-report --runs DIR1 DIR2 --out report.md`` reads each run's ``summary.json`` and writes

* ``report.md``: one table row per run (every metric, searches and turns per question, latency), what
  each run was (model, adapter, dataset, index), the judge's failure counts, and - for runs that share
  example ids with the first run - how many examples each later run fixed and broke on each metric; when
  runs broke their questions down by kind or type (``by_kind`` / ``by_type`` in their summaries), one more
  table per grouping (a row per run and group: n, each accuracy metric, searches per question), and when runs
  drew several samples per question, a table of pass@n, the mean over samples and the mixed share;
* ``report.png`` (next to it): a grouped bar chart of the accuracy metrics and well_formed, one bar per run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..jsonl import iter_jsonl
from ..outputs import atomic_write_text, check_output_file
from ..rewards.registry import metric_names, metric_value
from .metrics import ACCURACY
from .runner import PREDICTIONS, SUMMARY

LABELS = {"em": "EM", "f1": "F1", "cover_em": "cover-EM (ACC_R)", "judge": "judge (ACC_L)", "choice": "choice acc",
          "well_formed": "well-formed"}  # a metric without a label shows its name
ORDER = metric_names()


class Run:
    def __init__(self, path: str | os.PathLike, name: str | None = None):
        path = Path(path)
        if not path.exists():
            raise UserError(f"--runs {path}: no such run folder or summary file")
        self.dir = path.parent if path.is_file() else path
        summary_path = path if path.is_file() else path / SUMMARY
        if not summary_path.is_file():
            raise UserError(f"--runs {path}: no {SUMMARY} in {self.dir}: run agentic-rag eval first")
        self.summary_path = summary_path
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"{summary_path} is not a readable evaluation summary ({exc}); run the evaluation "
                            f"again to rewrite it") from None
        if not isinstance(summary, dict) or not isinstance(summary.get("metrics", {}), dict):
            raise UserError(f"{summary_path} is not an evaluation summary (no metrics object); run the evaluation "
                            f"again to rewrite it")
        self.summary: dict[str, Any] = summary
        self.name = name or self.summary.get("run") or self.dir.name

    def metric(self, name: str) -> float | None:
        """The metric's mean; a run written before ``well_formed`` was renamed has it as ``format``."""
        return metric_value(self.summary.get("metrics") or {}, name)

    def per_example(self) -> dict[str, dict[str, Any]]:
        path = self.dir / PREDICTIONS
        if not path.is_file():
            return {}
        out = {}
        for n, rec in iter_jsonl(path):
            if not isinstance(rec, dict) or "id" not in rec:
                raise UserError(f"{path}:{n}: not a record of agentic-rag eval (no 'id')")
            out[str(rec["id"])] = rec.get("metrics", {})
        return out


def label(metric: str) -> str:
    return LABELS.get(metric, metric)


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _metrics_present(runs: list[Run]) -> list[str]:
    return [m for m in ORDER if any(r.metric(m) is not None for r in runs)]


def markdown_table(runs: list[Run]) -> str:
    metrics = _metrics_present(runs)
    head = ["run", "n"] + [label(m) for m in metrics] + ["searches/q", "turns/q", "latency p50 (s)", "p99 (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        s = r.summary
        lat = s.get("latency_s") or {}
        cells = [r.name, str(s.get("n", 0))] + [_fmt(r.metric(m)) for m in metrics] + [
            _fmt(s.get("searches_per_question"), 2), _fmt(s.get("turns_per_question"), 2),
            _fmt(lat.get("p50"), 2), _fmt(lat.get("p99"), 2)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def group_table(runs: list[Run], key: str) -> str | None:
    """The ``by_{key}`` breakdown of the runs that have one (a row per run and group), or None when none has."""
    having = [r for r in runs if isinstance(r.summary.get(f"by_{key}"), dict)]
    if not having:
        return None
    metrics = [m for m in ACCURACY if any(m in (g.get("metrics") or {}) for r in having
                                          for g in r.summary[f"by_{key}"].values())]
    head = ["run", key, "n"] + [label(m) for m in metrics] + ["searches/q"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in having:
        for name, g in r.summary[f"by_{key}"].items():
            cells = [r.name, str(name), str(g.get("n", 0))] + [_fmt((g.get("metrics") or {}).get(m)) for m in metrics]
            lines.append("| " + " | ".join(cells + [_fmt(g.get("searches_per_question"), 2)]) + " |")
    return "\n".join(lines)


def samples_table(runs: list[Run]) -> str | None:
    """pass@n and the mean over samples per accuracy metric, and the mixed share, of the runs that drew several
    samples per question; None when none did."""
    having = [r for r in runs if isinstance(r.summary.get("samples"), dict)]
    if not having:
        return None
    metrics = [m for m in ACCURACY if any(r.summary["samples"].get("pass_at_n", {}).get(m) is not None
                                          for r in having)]
    head = (["run", "samples/q"] + [f"pass@n {label(m)}" for m in metrics]
            + [f"mean {label(m)}" for m in metrics] + ["mixed share"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in having:
        s = r.summary["samples"]
        cells = ([r.name, str(s.get("n"))] + [_fmt(s.get("pass_at_n", {}).get(m)) for m in metrics]
                 + [_fmt(s.get("mean_over_samples", {}).get(m)) for m in metrics] + [_fmt(s.get("mixed_share"))])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: list[Run], path: str | os.PathLike) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = _metrics_present(runs)
    width = 0.8 / max(1, len(runs))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(metrics) + 2), 3.6))
    for i, r in enumerate(runs):
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(metrics))]
        ys = [r.metric(m) or 0.0 for m in metrics]
        bars = ax.bar(xs, ys, width, label=r.name)
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(f"{y:.2f}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(metrics)), [label(m) for m in metrics], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("score")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("evaluation runs compared", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def paired_lines(runs: list[Run]) -> list[str]:
    """For each later run vs the first, on shared ids: examples fixed (0 -> 1) and broken (1 -> 0)."""
    if len(runs) < 2:
        return []
    base = runs[0].per_example()
    lines = []
    for r in runs[1:]:
        other = r.per_example()
        shared = sorted(base.keys() & other.keys())
        if not shared:
            continue
        parts = []
        for m in ACCURACY:
            pairs = [(metric_value(base[i], m), metric_value(other[i], m)) for i in shared]
            pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
            if pairs:
                fixed = sum(1 for a, b in pairs if b > a)
                broken = sum(1 for a, b in pairs if b < a)
                parts.append(f"{label(m)} +{fixed} / -{broken}")
        lines.append(f"- **{r.name}** vs **{runs[0].name}** on {len(shared)} shared questions: " + "; ".join(parts))
    return lines


def write_report(paths: list[str | os.PathLike], out: str | os.PathLike, names: list[str] | None = None) -> Path:
    if names and len(names) != len(paths):
        raise ValueError(f"{len(names)} names for {len(paths)} runs")
    runs = [Run(p, names[i] if names else None) for i, p in enumerate(paths)]
    out = Path(out)
    inputs: dict[str, Any] = {}
    for r in runs:
        inputs[f"--runs {r.dir} ({SUMMARY})"] = r.summary_path
        inputs[f"--runs {r.dir} ({PREDICTIONS})"] = r.dir / PREDICTIONS
    check_output_file(out, inputs)
    check_output_file(out.with_suffix(".png"), inputs, flag="--out (its chart)")
    if out.suffix == ".png":
        raise UserError(f"--out {out}: the report is markdown and its chart goes next to it as .png; name a .md file")
    out.parent.mkdir(parents=True, exist_ok=True)
    png = plot(runs, out.with_suffix(".png"))
    md = ["# Evaluation report", "", markdown_table(runs), "", f"![metrics by run]({png.name})", "", "## Runs", ""]
    for r in runs:
        s = r.summary
        pol = s.get("policy") or {}
        search = s.get("search") or {}
        what = f"model `{pol.get('model', '?')}`" + (f" + adapter `{pol['adapter']}`" if pol.get("adapter") else "")
        if pol.get("type") == "endpoint":
            what += f" at {pol.get('base_url')}"
        mode = s.get("mode", "agent")
        where = ("no search (closed book)" if mode == "direct" else
                 f"search {search.get('retriever')} over `{search.get('index')}` (k={search.get('k')})")
        md.append(f"- **{r.name}** ({r.dir}): {what}; dataset `{s.get('dataset')}`; mode {mode}; dialect "
                  f"{s.get('dialect')}; {where}; finish reasons {s.get('finish_reasons')}")
        judge = s.get("judge")
        if judge:
            md.append(f"  - judge: {judge.get('judged', 0)} judged ({judge.get('yes', 0)} yes, {judge.get('no', 0)} "
                      f"no), {judge.get('failed', 0)} failed, {judge.get('garbage', 0)} garbage replies")
    for title, table in (("Samples", samples_table(runs)), ("By kind", group_table(runs, "kind")),
                         ("By type", group_table(runs, "type"))):
        if table:
            md += ["", f"## {title}", "", table]
    paired = paired_lines(runs)
    if paired:
        md += ["", "## Per-question changes", "", *paired]
    md += ["", "EM, F1 and cover-EM use SQuAD normalisation (agentic_rag.rewards.accuracy); latency is per question "
           "within its batch.", ""]
    atomic_write_text(out, "\n".join(md))
    return out
