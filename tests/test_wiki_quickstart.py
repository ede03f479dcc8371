"""``quickstart --task wiki`` end to end on a handful of real 2Wiki questions with the tiny model (issue 31).

The real pipeline on the real shared data (corpus merge, BM25 index, splits, gold trajectories, baselines in the
three evaluation modes, SFT, GRPO with greedy validation every 2 steps, its control, ablations), cut to 8 training and
8 validation questions and 3 GRPO steps. The real model runs the same code (experiments/wiki/README.md).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rag.data.wiki import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not (shared_data_dir() / "hipporag").is_dir(), reason="needs ../shared/data")


def test_wiki_quickstart_end_to_end_small(tmp_path):
    out = tmp_path / "wiki"
    cmd = [sys.executable, "-m", "agentic_rag.demo.quickstart", "--task", "wiki", "--tiny", "--questions", "8",
           "--steps", "3", "--sft-epochs", "2", "--random-passages", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    # the world task's keys, and the wiki task's own
    for key in ("seeds", "em_prompted", "em_before", "em_after", "em_control", "table", "reward_first5_last5",
                "training_curves", "held_out_questions", "settings", "reward_curve", "swanlab_log_dir",
                "model", "index", "adapters", "em_multi_hop", "validation_curves", "trajectories"):
        assert key in summary, key
    assert summary["held_out_questions"] == 8 and summary["settings"]["grpo_steps"] == 3
    assert summary["trajectories"]["trajectories"] == 8
    assert json.loads((out / "sft" / "sft_summary.json").read_text())["cpu_bf16_autocast"] is False  # tiny: fp32
    assert Path(summary["index"], "manifest.json").is_file()
    adapters = summary["adapters"]
    assert Path(adapters["sft"], "config.json").is_file()  # the tiny model's SFT is a whole model
    for key in ("grpo", "control"):
        assert len(adapters[key]) == 1 and Path(adapters[key][0], "adapter_config.json").is_file()
    models = [r["model"] for r in summary["table"]]
    assert models == ["Direct (closed book)", "naive RAG", "prompted agent", "SFT", "SFT + GRPO seed 0",
                      "control seed 0", "GRPO, search off", "SFT, search off", "GRPO, random passages",
                      "SFT, random passages"]
    for r in summary["table"]:
        assert 0.0 <= r["em"] <= 1.0 and "em_multi_hop" in r
    # the baselines ran in their modes: no searches closed book or with naive RAG's passages in the prompt
    direct = json.loads((out / "eval" / "direct" / "summary.json").read_text())
    naive = json.loads((out / "eval" / "naive_rag" / "summary.json").read_text())
    assert direct["mode"] == "direct" and naive["mode"] == "naive_rag"
    assert direct["searches_per_question"] == 0 and naive["searches_per_question"] == 0
    assert set(direct["by_kind"]) <= {"yes_no", "pick_one", "multi_hop"}
    # the SFT model sampled on the multi-hop questions (eval --samples)
    sampled = summary["sft_sampled_two_hop"]
    assert sampled["n"] == 4 and 0.0 <= sampled["mixed_share"] <= 1.0
    # greedy validation after every validation_every (2) steps, in the log and the run's file; the curve starts at
    # the SFT evaluation and ends at the evaluation of final/ (the runs validate neither again:
    # logging.validation_at_start and validation_at_end false)
    run = out / "runs" / "seed0-grpo"
    curve = summary["validation_curves"]["GRPO seed 0"]
    assert [v["step"] for v in curve] == [0, 2, 3]
    assert curve[0]["source"] == "eval/sft" and curve[0]["eval/em"] == summary["em_before"][0]
    assert curve[-1]["source"] == "eval/seed0-grpo" and curve[-1]["eval/em"] == summary["em_after"][0]
    assert [json.loads(line)["step"] for line in open(run / "validation.jsonl")] == [2]
    answers = [json.loads(line) for line in open(run / "validation" / "step2.jsonl")]  # question by question
    assert len(answers) == 8 and {"question", "kind", "gold", "answer", "queries", "em"} <= set(answers[0])
    assert sum(a["em"] for a in answers) / 8 == curve[1]["eval/em"]
    assert all(0.0 <= v["eval/em"] <= 1.0 for v in curve)
    assert [v["step"] for v in summary["validation_curves"]["control seed 0"]] == [0, 3]
    log = (run / "train.log").read_text()
    assert "[grpo] step 1/3" in log and "[grpo] step 3/3" in log and "left" in log
    assert "[validation] step 2" in log and "[validation] step 3" not in log
    # a console line per SFT and GRPO step, per validation and per evaluated batch (progress lines go to stderr)
    assert "[sft] step 1/" in proc.stderr
    assert "seed0-grpo [grpo] step 3/3" in proc.stderr and "seed0-grpo [validation] step 2" in proc.stderr
    assert "seed0-control [grpo] step 3/3" in proc.stderr and "seed0-control [validation]" not in proc.stderr
    assert "eval direct: 8/8 questions, em" in proc.stderr and "eval sft: 8/8 questions" in proc.stderr
    assert re.search(r"SFT greedy EM \d\.\d{3} \(multi-hop (\d\.\d{3}|none in the split)\)", proc.stdout)
    assert "Unable to fetch remote file" not in proc.stdout + proc.stderr + log
    # a second run finds every step done
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["em_after"] == summary["em_after"]
    assert "steps in" not in again.stdout
