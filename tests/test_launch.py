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
        "prompt": {"language": "en"},
        "sampling": {"temperature": 1.0},
        "rewards": [{"name": "f1", "weight": 1.0}, {"name": "format", "weight": 0.2}],
        "algorithm": {"num_generations": 2, "per_device_train_batch_size": 2, "max_steps": 2,
                      "learning_rate": 0.001},
        "logging": {"swanlab_mode": "disabled", "sample_table_every": 1},
        "checkpoint": {"output_dir": str(tmp_path / "out"), "save_steps": 1, "save_total_limit": None},
    }
    for dotted, value in over.items():
        if "__" not in dotted:  # a top-level setting, e.g. gpu_memory_gb
            cfg[dotted] = value
            continue
        section, key = dotted.split("__")  # e.g. prompt__system_prompt, sampling__top_p
        cfg.setdefault(section, {})[key] = value
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SWANLAB_", "ACCELERATE_"))}
    e.update(USE_CPU="1", NUM_PROCESSES="2", AGENTIC_RAG_LOG_LEVEL="WARNING", ENV_FILE="/dev/null",
             PYTHON=sys.executable, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    return e


# Secrets a user may have in the environment or .env: none may reach a log, the saved config or the summary.
SECRETS = {"SWANLAB_API_KEY": "swl-secret-5c1e7a", "JUDGE_API_KEY": "judge-secret-9d2b44",
           "OPENAI_API_KEY": "sk-secret-openai-31f0"}
DOTENV_SECRET = "sk-pasted-without-a-name-77aa"  # a value in the env file: the launch script must not echo it


def with_secrets(e: dict[str, str], tmp_path: Path) -> dict[str, str]:
    dotenv = tmp_path / "secrets.env"
    dotenv.write_text(f"# a comment\nexport OTHER_SETTING={DOTENV_SECRET}\nJUDGE_API_KEY=file-value\n")
    return {**e, **SECRETS, "ENV_FILE": str(dotenv)}


def assert_no_secret(*texts: str, roots: tuple[Path, ...] = ()) -> None:
    blobs = [t.encode() for t in texts] + [p.read_bytes() for r in roots for p in r.rglob("*") if p.is_file()]
    assert blobs
    for secret in [*SECRETS.values(), DOTENV_SECRET]:
        assert not any(secret.encode() in b for b in blobs), secret


def lora_tensors(adapter_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(adapter_dir / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def word_model_dir(tmp_path_factory) -> Path:
    """A random-init tiny model over the world's 235-word vocabulary, every tag one token: its random samples
    contain tags, answers and malformed ones often enough that rewards differ within a group, so a GRPO step
    has a signal (the Qwen-vocabulary model's random text all scores the same, and its adapter never moves)."""
    from agentic_rag.data.world import generate_world
    from agentic_rag.demo.quickstart import task_texts
    from agentic_rag.demo.tiny import build_word_tokenizer, init_tiny_model

    d = tmp_path_factory.mktemp("word_model")
    return init_tiny_model(build_word_tokenizer(task_texts(generate_world(0)), d / "tokenizer"), d / "model")


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_scripts_run_two_steps_with_two_cpu_processes(tmp_path, word_model_dir, world_dir, stage):
    # gpu_memory_gb: a tiny budget, so the pre-load memory estimate runs (and warns) on this CPU-only machine
    cfg = config(tmp_path, word_model_dir, world_dir, gpu_memory_gb=0.001, checkpoint__output_dir="out",
                 rewards=[{"name": "f1", "weight": 1.0}, {"name": "format", "weight": 1.0,
                                                         "params": {"partial": True}}])
    script = ROOT / "script" / "training" / f"train_zero{stage}.sh"
    e = with_secrets(env(), tmp_path)
    e["AGENTIC_RAG_NO_VENV"] = "" if (ROOT / ".venv").exists() else "1"
    # run from the user's own folder, the config and the output named relative to it: they are the user's paths,
    # not the checkout's (the script once cd'ed into the repository and refused "train.yaml")
    out = subprocess.run(["bash", str(script), cfg.name], capture_output=True, text=True, timeout=900, env=e,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"ZeRO-{stage} on 2 CPU process(es)" in out.stderr
    summary = json.loads((tmp_path / "out" / "train_summary.json").read_text())
    assert summary["global_step"] == 2 and summary["world_size"] == 2
    # DeepSpeed really ran this stage, and the memory estimate assumed it (and both processes)
    assert summary["deepspeed_zero_stage"] == stage
    assert summary["memory_estimate"]["zero"] == stage and summary["memory_estimate"]["gpus"] == 2
    assert f"2 process(es) with DeepSpeed ZeRO-{stage}" in out.stderr
    assert (tmp_path / "out" / "final" / "adapter_config.json").is_file()
    assert (tmp_path / "out" / "checkpoint-2" / ".complete").is_file()
    steps = [h for h in summary["log_history"] if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]
    # the saved adapter holds the full, trained weights (ZeRO-3: gathered, not the empty local shards): LoRA B
    # starts at zero, and step 2 moved the weights saved at step 1
    final = lora_tensors(tmp_path / "out" / "final")
    first = lora_tensors(tmp_path / "out" / "checkpoint-1")
    assert final and set(final) == set(first)
    r = json.loads((tmp_path / "out" / "final" / "adapter_config.json").read_text())["r"]
    for name, t in final.items():
        assert t.numel() > 0 and r in t.shape, (name, t.shape)
        if "lora_B" in name:
            assert t.abs().sum() > 0, f"{name} is still at its zero initialisation"
    assert sum(not bool((final[n] == first[n]).all()) for n in final) >= len(final) // 2
    assert_no_secret(out.stdout, out.stderr, roots=(tmp_path / "out",))


def _complete(out: Path) -> set[str]:
    return {p.name for p in out.glob("checkpoint-*") if (p / ".complete").is_file()}


@pytest.mark.slow
def test_sigkill_then_resume_loses_no_checkpoint_and_continues_the_step_count(tmp_path, tiny_model_dir, world_dir):
    cfg = config(tmp_path, tiny_model_dir, world_dir, algorithm__max_steps=5, algorithm__beta=0.01,
                 logging__swanlab_mode="offline")
    out = tmp_path / "out"
    e = with_secrets(env(), tmp_path)
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
    killed_stderr = proc.stderr.read()
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
    assert_no_secret(killed_stderr, resumed.stdout, resumed.stderr, roots=(out, tmp_path / "swanlog"))


def sft_file(tmp_path, tok, world_dir):
    """Six scripted trajectories (search the gold title, read, answer) at token level, and one at text level."""
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.data.questions import read_questions
    from agentic_rag.rollout import AgentRollout
    from agentic_rag.rollout.scripted import ScriptedPolicy
    from agentic_rag.search import open_searcher

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
    return data, rows, trajs


def test_sft_masks_environment_tokens_and_trains(tmp_path, tiny_model_dir, world_dir, qwen_tokenizer):
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.training.sft import read_examples, run_sft

    tok = qwen_tokenizer
    data, rows, trajs = sft_file(tmp_path, tok, world_dir)
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


def test_sft_apart_trains_in_a_fresh_process_and_reports_its_errors(tmp_path, monkeypatch, capfd, tiny_model_dir,
                                                                     world_dir, qwen_tokenizer):
    """run_sft_apart: the same SFT in a spawned process (the wiki quick start's, whose heap would otherwise stay with
    its evaluations); this process's run_sft is never called, and a child's user error is its one line there and a
    UserError here."""
    from agentic_rag.errors import UserError
    from agentic_rag.training import sft as sft_module

    data, _, _ = sft_file(tmp_path, qwen_tokenizer, world_dir)
    monkeypatch.setattr(sft_module, "run_sft", lambda **kw: pytest.fail("ran in this process"))
    kw = dict(model=str(tiny_model_dir), output_dir=str(tmp_path / "sft"), epochs=1, learning_rate=5e-3,
              batch_size=4, lora_r=4, lora_alpha=8, save_steps=0, progress=False)
    summary = sft_module.run_sft_apart(data=str(data), **kw)
    assert summary["examples"] == 7 and summary["steps"] == 2
    assert (tmp_path / "sft" / "adapter_config.json").is_file()
    assert summary == json.loads((tmp_path / "sft" / "sft_summary.json").read_text())
    with pytest.raises(UserError, match=r"the SFT process stopped \(exit 2\)"):
        sft_module.run_sft_apart(data=str(tmp_path / "missing.jsonl"), **kw)
    assert "sft: error:" in capfd.readouterr().err


def test_sft_trainer_batches_put_no_label_on_environment_tokens(tmp_path, tiny_model_dir, world_dir, qwen_tokenizer):
    """What SFTTrainer really trains on: its collated batch has label -100 on the prompt, on every observation
    token and on padding, the token itself everywhere else; its loss is the cross-entropy of the model-written
    tokens alone."""
    import torch
    import torch.nn.functional as F

    from agentic_rag.training.sft import build_sft_trainer

    data, _, _ = sft_file(tmp_path, qwen_tokenizer, world_dir)
    trainer, examples, _ = build_sft_trainer(model=str(tiny_model_dir), data=str(data),
                                             output_dir=str(tmp_path / "sft"), batch_size=4, lora_r=4, lora_alpha=8)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(examples))])
    labels = batch["labels"]
    env_positions = 0
    for i, ex in enumerate(examples):
        n = len(ex.input_ids)
        assert batch["input_ids"][i, :n].tolist() == ex.input_ids
        assert labels[i, :n].tolist() == [t if m else -100 for t, m in zip(ex.input_ids, ex.completion_mask,
                                                                           strict=True)]
        assert (labels[i, n:] == -100).all()
        prompt = ex.completion_mask.index(1)
        env_positions += ex.completion_mask[prompt:].count(0)  # observations inside the completion
    assert env_positions > 50

    model = trainer.model
    model.train()
    with torch.no_grad():
        loss = trainer.compute_loss(model, {k: v.clone() for k, v in batch.items()})
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    target = labels[:, 1:]
    trained = target != -100
    expected = F.cross_entropy(logits[:, :-1][trained], target[trained])
    assert torch.allclose(loss, expected, atol=1e-4), (loss, expected)
    # the masking matters: the loss over every real token (observations included) is another number
    everything = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
    real = everything != -100
    assert (F.cross_entropy(logits[:, :-1][real], everything[real]) - expected).abs() > 1e-3


def test_sft_batches_by_length_without_checkpointing_when_asked(tmp_path, qwen_tokenizer, tiny_model_dir, world_dir):
    """The quick start's SFT: transformers' length-grouped sampler (each batch holds trajectories of similar
    length) and no gradient checkpointing; the batches the trainer draws are less padded than random ones."""
    from agentic_rag.training.sft import build_sft_trainer

    data, _, _ = sft_file(tmp_path, qwen_tokenizer, world_dir)
    widths = {}
    for grouped in (False, True):
        trainer, examples, _ = build_sft_trainer(model=str(tiny_model_dir), data=str(data), batch_size=2,
                                                 output_dir=str(tmp_path / f"sft{grouped}"), lora_r=4, lora_alpha=8,
                                                 gradient_checkpointing=not grouped, group_by_length=grouped)
        assert trainer.args.gradient_checkpointing is (not grouped)
        assert trainer.args.train_sampling_strategy == ("group_by_length" if grouped else "random")
        batches = list(trainer.get_train_dataloader())
        assert sum(len(b["input_ids"]) for b in batches) == len(examples)
        widths[grouped] = sum(b["input_ids"].numel() for b in batches)
    assert widths[True] <= widths[False], widths
