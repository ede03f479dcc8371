"""``agentic-rag report RUN_DIR``: a quick start's plots and its claims with paired intervals, from a folder laid out
as the quick starts write it (summary.json, eval/<name>/predictions.jsonl)."""

from __future__ import annotations

import json

import pytest

from agentic_rag.cli import main
from agentic_rag.demo.results import render


def write_run(root, seeds=(0, 1), with_records=True, task="world"):
    """A world run of 20 questions (10 one-hop, 10 two-hop): the SFT start right on the one-hop ones only; each GRPO
    seed also right on 8 two-hop ones; each control wrong on 3 one-hop ones."""
    ids = [f"q{i}" for i in range(20)]
    hops = [1] * 10 + [2] * 10

    def records(right):
        return [{"id": q, "metrics": {"em": float(q in right)}, "meta": {"hops": h}} for q, h in zip(ids, hops,
                                                                                                     strict=True)]

    sft = set(ids[:10])
    runs = {"sft": sft}
    for seed in seeds:
        runs[f"seed{seed}-grpo"] = sft | set(ids[10 + seed:18 + seed])
        runs[f"seed{seed}-control"] = sft - set(ids[:3])
    if with_records:
        for name, right in runs.items():
            (root / "eval" / name).mkdir(parents=True)
            (root / "eval" / name / "predictions.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in records(right)))
    curves = {f"{kind} seed {s}": {"reward": [0.5, 0.6, 0.7], "searches": [1.2, 1.5, 1.6],
                                   "entropy": [0.05, 0.04, 0.03]} for s in seeds for kind in ("GRPO", "control")}
    summary = {"task": task, "seeds": list(seeds), "em_before": [0.5] * len(seeds), "em_after": [0.9] * len(seeds),
               "em_control": [0.35] * len(seeds), "training_curves": curves, "settings": {"grpo_steps": 3}}
    (root / "summary.json").write_text(json.dumps(summary))
    return root


def test_report_writes_the_plots_and_every_claim_with_its_interval(tmp_path):
    report = render(write_run(tmp_path))
    for name in ("validation_em.png", "em_by_kind.png", "searches_entropy.png", "report.md", "report.json"):
        assert (tmp_path / name).stat().st_size > 1000 or name.endswith((".md", ".json")), name
    assert report["kinds"] == ["one_hop", "two_hop"] and report["questions"] == 20
    claims = {(c["claim"], c["group"]): c for c in report["claims"]}
    gain = claims["GRPO vs SFT", "all"]
    assert gain["per_seed"][0]["better"] == 8 and gain["per_seed"][0]["worse"] == 0
    assert gain["per_seed"][0]["difference"] == pytest.approx(0.4) and gain["per_seed"][0]["ci95"][0] > 0
    assert gain["pooled"]["seeds"] == 2 and gain["pooled"]["difference"] == pytest.approx(0.4)
    # the gain is all on two-hop questions; on one-hop ones nothing moved (an interval of zero width)
    assert claims["GRPO vs SFT", "one_hop"]["pooled"]["ci95"] == [0.0, 0.0]
    assert claims["GRPO vs SFT", "two_hop"]["pooled"]["difference"] == pytest.approx(0.8)
    assert claims["control vs SFT", "one_hop"]["per_seed"][1]["worse"] == 3
    md = (tmp_path / "report.md").read_text()
    assert "| GRPO vs SFT, two-hop | 10 |" in md and "**+0.800" in md and "p = 0.00781" in md


def test_report_of_a_run_without_per_question_records_says_so_and_still_plots(tmp_path, capsys):
    write_run(tmp_path, with_records=False)
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "cannot be computed" in printed and "sft, seed0-grpo" in printed
    assert (tmp_path / "out" / "validation_em.png").is_file() and not (tmp_path / "out" / "em_by_kind.png").exists()


def test_report_refuses_a_folder_that_is_not_a_quick_start(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) != 0
    assert "summary.json not found" in capsys.readouterr().err
