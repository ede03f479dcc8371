"""Smoke runs of the benchmarks under experiments/benchmarks/ that had only ``--help`` (issue 59).

Each script runs end to end, in a subprocess as a user starts it, at a tiny shape: the tiny random Qwen2 of conftest
(2 layers, the real Qwen vocabulary and chat template) wherever a script trains or decodes, a handful of questions,
one step. Its last stdout line is parsed as the JSON object its README records, and a few of the keys those records
use are checked. The numbers of such a run mean nothing; that the script still runs, and prints what the records
read, is the point. Everything a script writes goes under ``tmp_path``, never into experiments/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rag.data.wiki import shared_data_dir
from conftest import ROOT

BENCH = ROOT / "experiments" / "benchmarks"

pytestmark = pytest.mark.skipif(not (shared_data_dir() / "hipporag").is_dir(), reason="needs ../shared/data")


def run(script: str, args: list[str], timeout: int = 600, env: dict[str, str] | None = None) -> dict:
    """``python experiments/benchmarks/SCRIPT ARGS``; its last stdout line as JSON (the run must succeed)."""
    out = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ shared inputs


@pytest.fixture(scope="module")
def questions20(tmp_path_factory, dev_questions: Path) -> Path:
    """The first 20 2Wiki dev questions, as the dev file holds them."""
    rows = json.loads(dev_questions.read_text())[:20]
    path = tmp_path_factory.mktemp("questions") / "dev20.json"
    path.write_text(json.dumps(rows))
    return path


@pytest.fixture(scope="module")
def lora_adapter(tmp_path_factory, tiny_model_dir) -> Path:
    """A LoRA adapter (random, untrained) on the tiny model: what an SFT start is to the scripts that load one."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    out = tmp_path_factory.mktemp("adapter") / "sft"
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                     task_type="CAUSAL_LM")).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def wiki_task(tmp_path_factory, lora_adapter) -> Path:
    """A wiki quick start's folder as the scripts read it: the task (the merged 2Wiki corpus, its BM25 index, the
    splits cut to 8 questions each, built by the quick start's own ``build_task``) and ``sft``, an adapter on the
    tiny model."""
    import shutil

    from agentic_rag.demo.wiki import WikiSettings, build_task

    out = tmp_path_factory.mktemp("wiki") / "qs"
    build_task(WikiSettings(out=out, seeds=[0], questions=8, fast=True))
    shutil.copytree(lora_adapter, out / "sft")
    return out


# ------------------------------------------------------------------------------------------------ the scripts


def test_retrieval_benchmark_runs(tmp_path, corpus_file, questions20):
    """60 passages and 20 questions: fewer than the 100 its standard-library client sends (scaled by the count)."""
    result = run("retrieval.py", ["--corpus", str(corpus_file), "--questions", str(questions20),
                                  "--index", str(tmp_path / "index")])
    assert result["queries"] == 20 and result["k"] == 5
    for key in ("qps_inprocess", "qps_inprocess_batch64", "qps_server_1client", "qps_server_4clients",
                "qps_server_1client_stdlib_no_nodelay", "p50_ms", "p99_ms", "cache_speedup"):
        assert result[key] > 0, key
    assert result["server_queries"] >= 20


def test_retrieval_scale_benchmark_runs(tmp_path):
    """64 real passages grown to 128 rows, 8 queries, HNSW alone (its efSearch grid, its server)."""
    result = run("retrieval_scale.py", ["--n", "128", "--real", "64", "--queries", "8", "--types", "hnsw",
                                        "--ef-search", "16", "--threads", "2", "--out", str(tmp_path / "scale")])
    assert result["n"] == 128 and result["queries"] == 8 and result["dim"] == 384
    hnsw = result["types"]["hnsw"]
    assert [s["ef_search"] for s in hnsw["settings"]] == [16] and 0 <= hnsw["settings"][0]["recall_at10"] <= 1
    assert hnsw["server"]["server_queries"] > 0 and hnsw["server"]["qps_batch1"] > 0
    assert result["per_passage_bytes"]["hnsw"] > 0 and "dim384_gb" in result["extrapolation_21m"]["hnsw"]
    assert result["data"]["real_passages"] == 64


def test_chat_load_benchmark_runs(index_dir):
    """Two clients, one request each (one streamed, one not), one phase, against the real server process."""
    result = run("chat_load.py", ["--index", str(index_dir), "--clients", "2", "--requests-per-client", "1",
                                  "--phases", "1", "--questions", "2", "--time-limit", "120",
                                  "--request-timeout", "120"])
    assert result["requests"] == 2 and result["errors_5xx"] == 0 and result["status_counts"] == {"200": 2}
    assert result["answers_correct"] == 2 and result["searches_per_reply"] == 1  # forced: one search, then the gold
    assert result["latency_s"]["p50"] > 0 and len(result["phases"]) == 1
    assert result["scheduler"]["completed"] >= 2 and result["server_rss_mb_after"] > 0


def test_memory_check_runs():
    """Qwen2.5-0.5B's real widths and vocabulary at 1 layer, one 32-token row, two steps (one child process)."""
    result = run("memory_check.py", ["--layers", "1", "--micro-batch", "1", "--prompt", "16", "--completion", "16",
                                     "--steps", "2"])
    (only,) = result["runs"]
    assert only["layers"] == 1 and only["steps"] == 2
    assert set(only["terms"]) == {"weights", "lora", "optimizer", "step_transient", "peak"}
    assert only["parameters"] == only["estimated_parameters"]
    assert only["terms"]["weights"]["measured_mib"] > 0 and isinstance(result["within_target"], bool)


def test_sft_memory_benchmark_runs(tmp_path, wiki_task, tiny_model_dir):
    """The three allocator settings' SFT runs on the tiny model (``--model``), 4 gold trajectories at batch 2."""
    from agentic_rag.demo.wiki import WikiSettings, trajectories

    s = WikiSettings(out=wiki_task, seeds=[0], questions=8, fast=True)
    first = tmp_path / "train4.jsonl"
    first.write_text("".join(s.train_file.read_text().splitlines(keepends=True)[:4]))
    data = tmp_path / "sft_data.jsonl"
    trajectories(s, str(tiny_model_dir), questions=first, out=data)
    result = run("sft_memory.py", ["--data", str(data), "--model", str(tiny_model_dir), "--batch-size", "2"])
    for run_name in ("glibc_default", "fixed_threshold", "fixed_threshold_hugetlb"):
        assert result[run_name]["peak_rss_gib"] > 0 and result[run_name]["user_s"] > 0, run_name
    assert result["peak_rss_ratio"] > 0 and result["cpu_s_ratio"] > 0 and result["hugetlb_wall_ratio"] > 0
    assert result["model"] == str(tiny_model_dir)


def test_grpo_step_real_benchmark_runs(wiki_task, tiny_model_dir, tmp_path):
    """The wiki step as shipped (``--compare none``, as its wiki records), from the folder's adapter on the tiny model:
    one optimizer step of 2 questions x 2 rollouts in micro-batches of 2."""
    result = run("grpo_step_real.py", [
        "--task", "wiki", "--quickstart", str(wiki_task), "--compare", "none", "--steps", "1", "--threads", "2",
        "--set", f"model.name_or_path={tiny_model_dir}", "--set", "algorithm.num_generations=2",
        "--set", "algorithm.per_device_train_batch_size=2", "--set", "algorithm.gradient_accumulation_steps=2"],
        env={"TMPDIR": str(tmp_path)})  # the script's training output folder (a mkdtemp) stays under tmp_path
    step = result["by_length"]
    assert result["task"] == "wiki" and step["steps"] == 1
    for key in ("generation_s", "scoring_forward_s", "training_step_s", "backward_and_rest_of_training_step_s"):
        assert key in step, key
    assert step["rollout_s"] > 0 and step["scoring_forward_s"] > 0 and step["peak_rss_gb"] > 0
    assert sum(m["rows"] for m in step["micro_batches"]) == 4 and 0 <= step["padding_fraction"] < 1


def test_decoding_heap_benchmark_runs(wiki_task, tiny_model_dir):
    """Greedy evaluation of 2 validation questions from the folder's adapter on the tiny model (``--model``), in the
    shipped, one stretched (256 MiB) and glibc's variant."""
    result = run("decoding_heap.py", ["--quickstart", str(wiki_task), "--model", str(tiny_model_dir),
                                      "--questions", "2", "--thresholds", "256"])
    assert set(result["variants"]) == {"mapped", "stretch_256", "glibc"}
    for v in result["variants"].values():
        assert len(v["evaluations"]) == 2 and v["peak_rss_gb"] > 0 and v["heap_resident_after_mb"] >= 0
    assert result["variants"]["mapped"]["threshold_applied"] is True
    assert set(result["time_ratio"]) == set(result["peak_rss_ratio"]) == {"stretch_256"}


def test_vs_trl_tools_benchmark_runs(wiki_task, tiny_model_dir, tmp_path):
    """Ours and plain TRL from one adapter on the tiny model (``--model``, ``--sft``): 1 step of 2 questions x 2
    rollouts, 2 evaluation questions. A random model writes to its budget, so the budgets are cut (``--set``)."""
    out = tmp_path / "vs_trl"
    result = run("vs_trl_tools.py", [
        "--out", str(out), "--task-dir", str(wiki_task), "--sft", str(wiki_task / "sft"),
        "--model", str(tiny_model_dir), "--questions", "8", "--steps", "1", "--seeds", "1", "--systems", "ours", "trl",
        "--questions-per-step", "2", "--generations", "2", "--micro-batch", "2", "--eval-questions", "2",
        "--threads", "2", "--set", "rollout.max_completion_tokens=48", "--set", "rollout.max_tokens_per_turn=24"])
    for key in ("generation_ratio", "training_ratio", "step_ratio"):
        assert result[key] > 0, key
    assert result["mask_agreement"] == 1.0 and result["steps"] == 1 and result["seeds"] == 1
    assert result["em_ours"] is not None and result["em_trl"] is not None and result["em_trl_cb"] is None
    record = json.loads((out / "vs_trl_tools.json").read_text())
    trl = record["runs"]["trl"][0]
    assert trl["prompt_ids_identical"] is True and trl["mask_check"]["trajectories"] > 0
    assert record["spec"]["base"] == str(tiny_model_dir)
