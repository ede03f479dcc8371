"""Real launches: the ZeRO-2/ZeRO-3 scripts with two CPU processes, SIGKILL and resume, SwanLab offline logs, SFT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT


def config(tmp_path: Path, model_dir: Path, world_dir: Path, **over) -> Path:
    cfg = {
        "model": {"name_or_path": str(model_dir), "lora_r": 4, "lora_alpha": 8, "gradient_checkpointing": False},
        "data": {"train_file": str(world_dir / "world" / "train.jsonl"), "limit": 32},
        "search": {"index": str(world_dir / "index")},
        "rollout": {"max_turns": 2, "max_tokens_per_turn": 16, "max_completion_tokens": 96,
                    "max_observation_tokens": 48, "passages_per_search": 1},
        "rewards": [{"name": "f1", "weight": 1.0}, {"name": "format", "weight": 0.2}],
        "algorithm": {"num_generations": 2, "per_device_train_batch_size": 2, "max_steps": 2,
                      "learning_rate": 0.001},
        "logging": {"swanlab_mode": "disabled", "sample_table_every": 1},
        "checkpoint": {"output_dir": str(tmp_path / "out"), "save_steps": 1, "save_total_limit": None},
    }
    for dotted, value in over.items():
        section, key = dotted.split("__")
        cfg[section][key] = value
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SWANLAB_", "ACCELERATE_"))}
    e.update(USE_CPU="1", NUM_PROCESSES="2", AGENTIC_RAG_LOG_LEVEL="WARNING", ENV_FILE="/nonexistent",
             PYTHON=sys.executable, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    return e


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_scripts_run_two_steps_with_two_cpu_processes(tmp_path, tiny_model_dir, world_dir, stage):
    cfg = config(tmp_path, tiny_model_dir, world_dir)
    script = ROOT / "script" / "training" / f"train_zero{stage}.sh"
    e = env()
    e["AGENTIC_RAG_NO_VENV"] = "" if (ROOT / ".venv").exists() else "1"
    out = subprocess.run(["bash", str(script), str(cfg)], capture_output=True, text=True, timeout=900, env=e,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"ZeRO-{stage} on 2 CPU process(es)" in out.stderr
    summary = json.loads((tmp_path / "out" / "train_summary.json").read_text())
    assert summary["global_step"] == 2 and summary["world_size"] == 2
    assert (tmp_path / "out" / "final" / "adapter_config.json").is_file()
    assert (tmp_path / "out" / "checkpoint-2" / ".complete").is_file()
    steps = [h for h in summary["log_history"] if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]


def _complete(out: Path) -> set[str]:
    return {p.name for p in out.glob("checkpoint-*") if (p / ".complete").is_file()}


@pytest.mark.slow
def test_sigkill_then_resume_loses_no_checkpoint_and_continues_the_step_count(tmp_path, tiny_model_dir, world_dir):
    cfg = config(tmp_path, tiny_model_dir, world_dir, algorithm__max_steps=5, algorithm__beta=0.01,
                 logging__swanlab_mode="offline")
    out = tmp_path / "out"
    e = env()
    e["SWANLAB_LOG_DIR"] = str(tmp_path / "swanlog")
    cmd = [sys.executable, "-m", "agentic_rag.training.train", "--config", str(cfg)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=e, cwd=ROOT,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and "checkpoint-2" not in _complete(out):
        if proc.poll() is not None:
            pytest.fail("training ended before it could be killed:\n" + proc.stderr.read()[-3000:])
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    survived = _complete(out)
    assert "checkpoint-2" in survived and not (out / "final").exists()
    # a checkpoint left half-written by a kill during saving is not mistaken for one
    (out / "checkpoint-99").mkdir()
    (out / "checkpoint-99" / "adapter_config.json").write_text("{}")

    resumed = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=e, cwd=ROOT, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = json.loads((out / "train_summary.json").read_text())
    latest = max(survived, key=lambda n: int(n.split("-")[1]))
    assert summary["resumed_from"] == str(out / latest)
    assert summary["global_step"] == 5
    assert survived <= _complete(out), "a checkpoint completed before the kill was lost"
    assert any(p.name.startswith("checkpoint-99.incomplete-") for p in out.iterdir())
    # the history restored from the checkpoint plus the steps after it: each step once, the count continued
    logged = [h["step"] for h in summary["log_history"] if "loss" in h]
    assert logged == [1, 2, 3, 4, 5]

    # SwanLab offline logs of both runs, with our metrics in them
    runs = list((tmp_path / "swanlog").glob("run-*"))
    assert len(runs) == 2
    blob = b"".join(p.read_bytes() for r in runs for p in r.rglob("*.swanlab"))
    for key in (b"train/agentic/searches_per_trajectory", b"train/rewards/f1/mean", b"train/kl",
                b"train/agentic/env_tokens_masked", b"train/clip_ratio/region_mean", b"samples/table"):
        assert key in blob, key
    assert "swanlab watch" in resumed.stderr


def test_sft_masks_environment_tokens_and_trains(tmp_path, tiny_model_dir, world_dir, qwen_tokenizer):
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.data.questions import read_questions
    from agentic_rag.rollout import AgentRollout
    from agentic_rag.rollout.scripted import ScriptedPolicy
    from agentic_rag.search import open_searcher
    from agentic_rag.training.sft import read_examples, run_sft

    tok = qwen_tokenizer
    rows = [r for r in read_questions(world_dir / "world" / "train.jsonl") if len(r.gold_titles) == 1][:6]
    scripts = {r.question: [f"<search>{r.gold_titles[0]}</search>", f"<answer>{r.answers[0]}</answer>"] for r in rows}
    trajs = AgentRollout(ScriptedPolicy(tok, scripts), tok, open_searcher(world_dir / "index")).run(
        [build_prompt(tok, r.question) for r in rows], [r.question for r in rows])
    data = tmp_path / "sft.jsonl"
    with data.open("w") as f:
        for t in trajs:
            f.write(json.dumps({"prompt_ids": t.prompt_ids, "completion_ids": t.completion_ids,
                                "env_mask": t.env_mask, "segments": [vars(s) for s in t.segments]}) + "\n")
        f.write(json.dumps({"question": rows[0].question,
                            "completion": "<search>x</search>\n\n<observation>\ntext\n</observation>\n\n"
                                          "<answer>y</answer>"}) + "\n")
    examples, skipped = read_examples(data, tok)
    assert len(examples) == 7 and skipped == 0
    ex = examples[0]
    t = trajs[0]
    assert ex.input_ids == t.prompt_ids + t.completion_ids
    assert ex.completion_mask == [0] * len(t.prompt_ids) + t.env_mask
    text_ex = examples[-1]
    start = len(build_prompt(tok, rows[0].question))
    pairs = list(zip(text_ex.input_ids[start:], text_ex.completion_mask[start:], strict=True))
    masked = tok.decode([i for i, m in pairs if m == 0])
    trained = tok.decode([i for i, m in pairs if m == 1])
    assert masked.strip() == "<observation>\ntext\n</observation>" and set(text_ex.completion_mask[:start]) == {0}
    assert trained == "<search>x</search><answer>y</answer>" + tok.eos_token

    summary = run_sft(model=str(tiny_model_dir), data=str(data), output_dir=str(tmp_path / "sft"), epochs=2,
                      learning_rate=5e-3, batch_size=4, lora_r=4, lora_alpha=8, merge=True)
    assert summary["examples"] == 7 and summary["merged"] and 0.5 < summary["masked_fraction"] < 1
    from agentic_rag.models import load_causal_lm

    merged = load_causal_lm(str(tmp_path / "sft"))
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with pytest.raises(ValueError, match="sft.jsonl:1: a line needs"):
        (tmp_path / "sft.jsonl").write_text('{"foo": 1}\n')
        read_examples(tmp_path / "sft.jsonl", tok)
