"""A trained adapter is served and evaluated with the settings it was trained with (``agentic_rag.json`` beside
its weights) unless the user sets them, and the chat server's default reply length fits the model's context."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentic_rag.rollout.trained_settings import SETTINGS_FILE, TrainedSettings, find_trained_settings
from conftest import ROOT, free_port, tiny_qwen_config
from test_chat_service import clean_env, process
from test_launch import config

SYSTEM = "Answer the question by searching."
TRAINED = TrainedSettings(dialect="search-r1", language="en", system_prompt=SYSTEM, chat_template=False,
                          summary_mode="keep", max_turns=3, max_searches=2, max_tokens_per_turn=40,
                          max_completion_tokens=200, passages_per_search=1, max_observation_tokens=64,
                          on_search_limit="end", written_by="grpo")
QUESTION = "Where was Grorfeik Feil born?"


@pytest.fixture(scope="module")
def short_model_dir(qwen_tokenizer, tmp_path_factory) -> Path:
    """A tiny random-init Qwen2 whose context is 512 positions (SmolLM2-sized quick-start runs use 512)."""
    import torch
    from transformers import Qwen2ForCausalLM

    cfg = tiny_qwen_config(len(qwen_tokenizer))
    cfg.max_position_embeddings = 512
    d = tmp_path_factory.mktemp("short_model")
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def short_adapter_dir(short_model_dir, tmp_path_factory) -> Path:
    """A LoRA adapter on it, saved with settings as SFT writes them: the prompt, no rollout limits."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("short_adapter") / "final"
    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(short_model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(d)
    TrainedSettings(dialect="agentic", language="en", system_prompt=SYSTEM, chat_template=False, passages_per_search=1,
                    max_observation_tokens=64, max_turns=4, written_by="sft").write(d)
    return d


# ------------------------------------------------------------------------------------------- the file


def test_settings_file_round_trip_and_errors(tmp_path):
    path = TRAINED.write(tmp_path)
    assert path == tmp_path / SETTINGS_FILE
    assert TrainedSettings.read(path) == TRAINED
    assert json.loads(path.read_text())["format"] == 1
    other = tmp_path / "model"
    other.mkdir()
    assert find_trained_settings(None, tmp_path / "none", other) is None
    assert find_trained_settings(other, tmp_path) == (TRAINED, path)
    path.write_text('{"max_turns": "four"}')
    with pytest.raises(ValueError, match="max_turns must be int, got 'four'"):
        TrainedSettings.read(path)


# ------------------------------------------------------------------------------------------- writers


def test_grpo_writes_its_settings_into_every_checkpoint_and_final(tmp_path, tiny_model_dir, world_dir):
    from agentic_rag.config import load_config
    from agentic_rag.training.train import run

    cfg = load_config(config(tmp_path, tiny_model_dir, world_dir, data__system_prompt=SYSTEM,
                             rollout__max_searches=2))
    run(cfg)
    out = Path(cfg.checkpoint.output_dir)
    expected = TrainedSettings(dialect="agentic", language="en", system_prompt=SYSTEM, chat_template=True,
                               summary_mode="replace", max_turns=2, max_searches=2, max_tokens_per_turn=16,
                               max_completion_tokens=96, passages_per_search=1, max_observation_tokens=48,
                               on_search_limit="observe", written_by="grpo")
    for name in ("checkpoint-1", "checkpoint-2", "final"):
        assert TrainedSettings.read(out / name / SETTINGS_FILE) == expected, name
        assert (out / name / "adapter_config.json").is_file()


def test_grpo_writes_the_dialects_own_system_prompt_when_none_is_configured():
    from agentic_rag.data.prompts import system_prompt
    from agentic_rag.rollout import RolloutLimits
    from agentic_rag.training.trainer import AgentSettings, trained_settings

    agent = AgentSettings(tools=None, dialect="search-r1", limits=RolloutLimits(), language="zh", chat=None,
                          algorithm="grpo", max_batch_size=None, summary_mode="replace", processors=[])

    class NoTemplate:
        chat_template = None

    s = trained_settings(agent, NoTemplate())
    assert s.system_prompt == system_prompt("search-r1", "zh") and s.chat_template is False
    assert (s.max_turns, s.passages_per_search) == (RolloutLimits().max_turns, RolloutLimits().passages_per_search)


def test_sft_writes_what_it_knows(tmp_path, tiny_model_dir, qwen_tokenizer):
    from agentic_rag.data.prompts import system_prompt
    from agentic_rag.training.sft import run_sft

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"question": f"Q{i}?", "completion": "<answer>y</answer>"}) + "\n"
                            for i in range(4)))
    run_sft(model=str(tiny_model_dir), data=str(data), output_dir=str(tmp_path / "text"), epochs=1, batch_size=4,
            lora_r=4, lora_alpha=8)
    got = TrainedSettings.read(tmp_path / "text" / SETTINGS_FILE)
    assert got == TrainedSettings(dialect="agentic", language="en", system_prompt=system_prompt("agentic", "en"),
                                  chat_template=True, written_by="sft")
    # token-level trajectories carry their own prompts: SFT knows only what the caller tells it
    with open(data, "w") as f:
        ids = qwen_tokenizer("hello", add_special_tokens=False)["input_ids"]
        for _ in range(4):
            f.write(json.dumps({"prompt_ids": ids, "completion_ids": ids, "env_mask": [1] * len(ids)}) + "\n")
    run_sft(model=str(tiny_model_dir), data=str(data), output_dir=str(tmp_path / "tokens"), epochs=1, batch_size=4,
            lora_r=4, lora_alpha=8, settings=TrainedSettings(system_prompt=SYSTEM, chat_template=True, max_turns=4))
    got = TrainedSettings.read(tmp_path / "tokens" / SETTINGS_FILE)
    assert got == TrainedSettings(dialect="agentic", system_prompt=SYSTEM, chat_template=True, max_turns=4,
                                  written_by="sft")


# ------------------------------------------------------------------------------------------- readers


def test_server_config_takes_the_adapters_settings_unless_set(tmp_path):
    from agentic_rag.serving.server import resolve_config

    adapter = tmp_path / "final"
    adapter.mkdir()
    TRAINED.write(adapter)
    argv = ["--model", "/m", "--adapter", str(adapter), "--index", "/i", "--max-turns", "6"]
    cfg, _, line = resolve_config(argv, {"AGENTIC_RAG_CHAT_PASSAGES": "5"})
    assert (cfg.dialect, cfg.language, cfg.system_prompt, cfg.chat_template, cfg.summary_mode) == \
        ("search-r1", "en", SYSTEM, "off", "keep")
    assert (cfg.max_searches, cfg.max_tokens_per_turn, cfg.max_tokens, cfg.max_observation_tokens) == (2, 40, 200, 64)
    assert cfg.on_search_limit == "end"
    assert cfg.max_turns == 6 and cfg.passages_per_search == 5  # a flag and an environment variable win
    assert line.startswith(f"trained settings from {adapter / SETTINGS_FILE}: ")
    assert "max_searches=2" in line and line.endswith("(set by you, kept: max_turns, passages_per_search)")
    assert cfg.problems() == []
    # a merged SFT model directory carries its own; without any file nothing changes
    model = tmp_path / "merged"
    model.mkdir()
    TrainedSettings(dialect="r1-searcher", written_by="sft").write(model)
    assert resolve_config(["--model", str(model), "--index", "/i"], {})[0].dialect == "r1-searcher"
    plain, _, line = resolve_config(["--model", "/m", "--index", "/i"], {})
    assert (plain.dialect, plain.system_prompt, plain.max_tokens, line) == ("agentic", "", 1024, None)


def test_eval_config_takes_the_adapters_settings_unless_set(tmp_path, world_dir, caplog):
    from agentic_rag.evaluation.config import config_from_dict

    adapter = tmp_path / "final"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    TRAINED.write(adapter)
    data = {"dataset": {"path": str(world_dir / "world" / "test.jsonl")},
            "policy": {"model": str(tmp_path), "adapter": str(adapter)},
            "search": {"index": str(world_dir / "index")}, "rollout": {"max_turns": 6}}
    with caplog.at_level(logging.INFO, logger="agentic_rag.evaluation"):
        cfg = config_from_dict(data, overrides=["rollout.language=zh"])
    r = cfg.rollout
    assert (r.dialect, r.system_prompt, r.chat_template, r.summary_mode) == ("search-r1", SYSTEM, False, "keep")
    assert (r.max_searches, r.max_tokens_per_turn, r.max_completion_tokens, r.max_observation_tokens) == \
        (2, 40, 200, 64)
    assert cfg.search.k == 1 and r.on_search_limit == "end"
    assert r.max_turns == 6 and r.language == "zh"  # the config file and --set win
    lines = [r.getMessage() for r in caplog.records if "trained settings" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith("(set by you, kept: rollout.language, rollout.max_turns)")
    assert "rollout.dialect='search-r1'" in lines[0] and "search.k=1" in lines[0]
    data["policy"]["adapter"] = ""
    assert config_from_dict(data).rollout.dialect == "agentic"


# --------------------------------------------------------------------- a 512-token model over real HTTP


def test_the_served_adapter_uses_its_settings_and_the_default_length_fits_the_context(
        short_model_dir, short_adapter_dir, world_dir, qwen_tokenizer, tmp_path):
    """The quick start's failure: ``chat_client.py --once`` against a 512-context model answered HTTP 400 (the
    server's default max_tokens 1024 does not fit). Now it answers; only an explicit max_tokens that cannot fit
    is refused, saying how much fits."""
    from agentic_rag.data.prompts import build_prompt

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    argv = [sys.executable, str(ROOT / "service" / "chat_server.py"), "--model", str(short_model_dir), "--adapter",
            str(short_adapter_dir), "--index", str(world_dir / "index"), "--port", str(port),
            "--passages-per-search", "2"]
    with process(argv, url + "/health", log):
        limits = httpx.get(url + "/health").json()["limits"]
        assert limits["max_turns"] == 4 and limits["passages_per_search"] == 2  # the flag beat the adapter's 1
        assert limits["max_observation_tokens"] == 64 and limits["context_length"] == 512
        client = subprocess.run([sys.executable, str(ROOT / "service" / "chat_client.py"), "--url", url, "--once",
                                 QUESTION, "--temperature", "0"], capture_output=True, text=True, timeout=300,
                                env=clean_env())
        assert client.returncode == 0, client.stdout + client.stderr
        body = httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "model": "final", "messages": [{"role": "user", "content": QUESTION}], "temperature": 0}).json()
        prompt = build_prompt(qwen_tokenizer, QUESTION, "agentic", chat=False, system=SYSTEM)
        assert body["usage"]["prompt_tokens"] == len(prompt)  # the trained prompt: its system text, no template
        used = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] + \
            body["agent_trace"]["observation_tokens"]
        assert used <= 512
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "final", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 1024})
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert "512" in message and f"at most {512 - len(prompt)}" in message, message
    text = log.read_text()
    assert f"trained settings from {short_adapter_dir / SETTINGS_FILE}" in text, text
    assert "kept: passages_per_search" in text, text
