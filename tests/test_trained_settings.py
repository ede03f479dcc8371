"""A trained adapter is served and evaluated with the settings it was trained with (``agentic_rag.json`` beside
its weights: its ``rollout`` and ``prompt`` sections) unless the user sets them, each override logged; and the chat
server's default reply length fits the model's context."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentic_rag.rollout.settings import PromptSettings, RolloutSettings
from agentic_rag.rollout.trained_settings import (
    SETTINGS_FILE,
    find_settings,
    read_settings,
    resolved_prompt,
    write_settings,
)
from agentic_rag.settings import SettingsError
from conftest import ROOT, free_port, tiny_qwen_config
from test_chat_service import clean_env, process

SYSTEM = "Answer the question by searching."
ROLLOUT = RolloutSettings(dialect="search-r1", max_turns=3, max_searches=2, on_search_limit="end",
                          max_tokens_per_turn=40, max_completion_tokens=200, passages_per_search=1,
                          max_observation_tokens=64, summary_mode="keep", dedup_passages=False)
PROMPT = PromptSettings(language="en", system_prompt=SYSTEM, chat_template=False)
QUESTION = "Where was Grorfeik Feil born?"


def flat(rollout: RolloutSettings, prompt: PromptSettings) -> dict:
    """The settings by dotted name, as :func:`read_settings` returns them."""
    return {**{f"rollout.{k}": v for k, v in dataclasses.asdict(rollout).items()},
            **{f"prompt.{k}": v for k, v in dataclasses.asdict(prompt).items()}}


def parsed(argv: list[str], env: dict[str, str]):
    """The chat server's config and its trained-settings lines, as ``agentic-rag serve`` resolves them."""
    from agentic_rag.serving.config import build_parser, resolve

    parser, dests = build_parser()
    cfg, _, lines = resolve(parser.parse_args(argv), dests, env, check_files=False)
    return cfg, lines


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
    """A LoRA adapter on it, saved with its settings as SFT writes them (format 2, every setting)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("short_adapter") / "final"
    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(short_model_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(d)
    write_settings(d, RolloutSettings(dialect="agentic", passages_per_search=1, max_observation_tokens=64,
                                      max_turns=4), PROMPT, written_by="sft")
    return d


# ------------------------------------------------------------------------------------------- the file


def test_settings_file_round_trip(tmp_path):
    path = write_settings(tmp_path, ROLLOUT, PROMPT, written_by="grpo")
    assert path == tmp_path / SETTINGS_FILE
    data = json.loads(path.read_text())
    assert data == {"format": 2, "written_by": "grpo", "rollout": dataclasses.asdict(ROLLOUT),
                    "prompt": dataclasses.asdict(PROMPT)}
    assert read_settings(path) == flat(ROLLOUT, PROMPT)
    other = tmp_path / "model"
    other.mkdir()
    assert find_settings(None, tmp_path / "none", other) is None
    assert find_settings(other, tmp_path) == (flat(ROLLOUT, PROMPT), path)  # the first directory that has one
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_format_1_files_of_earlier_versions_still_load(tmp_path):
    """Earlier versions wrote flat names (format 1): GRPO every setting but dedup_passages, SFT the dialect alone
    (or what it knew)."""
    grpo = tmp_path / "grpo"
    grpo.mkdir()
    (grpo / SETTINGS_FILE).write_text(json.dumps({
        "format": 1, "written_by": "grpo", "dialect": "search-r1", "language": "en", "system_prompt": SYSTEM,
        "chat_template": False, "summary_mode": "keep", "max_turns": 3, "max_searches": 2, "max_tokens_per_turn": 40,
        "max_completion_tokens": 200, "passages_per_search": 1, "max_observation_tokens": 64,
        "on_search_limit": "end"}))
    got = read_settings(grpo / SETTINGS_FILE)
    assert got == {k: v for k, v in flat(ROLLOUT, PROMPT).items() if k != "rollout.dedup_passages"}
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / SETTINGS_FILE).write_text(json.dumps({"format": 1, "written_by": "sft", "dialect": "r1-searcher"}))
    assert read_settings(sft / SETTINGS_FILE) == {"rollout.dialect": "r1-searcher"}
    # no "format" at all: the first files had none
    (sft / SETTINGS_FILE).write_text(json.dumps({"dialect": "r1-searcher", "max_turns": 5}))
    assert read_settings(sft / SETTINGS_FILE) == {"rollout.dialect": "r1-searcher", "rollout.max_turns": 5}
    # such a file fills what it knows; the rest keeps its default
    cfg, lines = parsed(["--model", "/m", "--adapter", str(sft), "--index", "/i"], {})
    assert cfg.rollout == RolloutSettings(dialect="r1-searcher", max_turns=5) and cfg.prompt == PromptSettings()
    assert lines == [f"trained settings from {sft / SETTINGS_FILE}: 2 taken, 0 overridden"]


@pytest.mark.parametrize("text,said", [
    ('{"format": 2, "rollout": {"max_turns": "four"}}', "rollout.max_turns must be an integer, got 'four'"),
    ('{"format": 2, "rollout": {"dialect": "agentik"}}', "rollout.dialect must be one of"),
    ('{"format": 2, "rollout": {"max_turn": 4}}', "rollout.max_turn is not a setting; did you mean 'max_turns'?"),
    ('{"format": 2, "sampling": {"temperature": 1}}', "unknown section(s) sampling in the trained settings"),
    ('{"max_turns": 0}', "rollout.max_turns must be >= 1, got 0"),
    ('{"format": 3, "rollout": {}}', "trained settings format 3, newer than this version of agentic-rag reads (2): "
                                     "upgrade agentic-rag"),
    ('{"format": "2"}', "trained settings format '2'"),
    ('{"format": 2, "rollout": {"max_tur', "cannot read the trained settings"),
    ("[1, 2]", "the trained settings must be a JSON object, got list"),
])
def test_a_newer_or_damaged_file_is_refused_naming_the_file(tmp_path, text, said):
    path = tmp_path / SETTINGS_FILE
    path.write_text(text)
    with pytest.raises(SettingsError) as err:
        read_settings(path)
    assert said in str(err.value) and str(path) in str(err.value)
    # the commands that read it say the same, naming the file and what it is
    with pytest.raises(SettingsError) as err:
        parsed(["--model", "/m", "--adapter", str(tmp_path), "--index", "/i"], {})
    assert f"--adapter: {path}: {said}" in str(err.value)
    from agentic_rag.evaluation.config import config_from_dict

    with pytest.raises(SettingsError) as err:
        config_from_dict({"policy": {"model": "/m", "adapter": str(tmp_path)}}, env={}, check_files=False)
    assert f"policy.adapter: {path}: {said}" in str(err.value)


# ------------------------------------------------------------------------------------------- writers


def test_the_prompt_is_saved_as_applied():
    """The dialect's own system prompt is written out (a later change of the default does not change what a trained
    model is shown), and the chat template as the tokenizer made of "when it has one"."""
    from agentic_rag.rollout.protocol import get_dialect

    class NoTemplate:
        chat_template = None

    class Template:
        chat_template = "{{ messages }}"

    got = resolved_prompt(PromptSettings(language="zh"), "search-r1", NoTemplate())
    assert got == PromptSettings(language="zh", system_prompt=get_dialect("search-r1").system_prompt("zh"),
                                 chat_template=False)
    assert resolved_prompt(PromptSettings(), "agentic", Template()).chat_template is True
    assert resolved_prompt(PROMPT, "agentic", Template()) == PROMPT  # set ones are kept


def test_sft_records_every_setting(tmp_path, tiny_model_dir):
    from agentic_rag.rollout.protocol import get_dialect
    from agentic_rag.training.sft import run_sft

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"question": f"Q{i}?", "completion": "<answer>y</answer>"}) + "\n"
                            for i in range(2)))
    rollout = dataclasses.replace(ROLLOUT, dialect="agentic")
    run_sft(model=str(tiny_model_dir), data=str(data), output_dir=str(tmp_path / "out"), epochs=1, batch_size=2,
            lora_r=4, lora_alpha=8, max_length=256, gradient_checkpointing=False, report_to=[],
            rollout=rollout, prompt=PromptSettings(language="zh"))
    path = tmp_path / "out" / SETTINGS_FILE
    written = json.loads(path.read_text())
    assert written["format"] == 2 and written["written_by"] == "sft"
    assert written["rollout"] == dataclasses.asdict(rollout)  # every rollout setting, as given
    # the prompt as applied: the dialect's system prompt in the language given, written out; the template resolved
    prompt = PromptSettings(language="zh", system_prompt=get_dialect("agentic").system_prompt("zh"), chat_template=True)
    assert read_settings(path) == flat(rollout, prompt)


# ------------------------------------------------- trained once, then evaluated and served as trained


TRAINED_ROLLOUT = RolloutSettings(max_turns=2, max_tokens_per_turn=16, max_completion_tokens=128,
                                  max_observation_tokens=100, passages_per_search=2, max_searches=2)
TRAINED_PROMPT = PromptSettings(system_prompt="Search, then answer in a few words. (trained)", chat_template=True)


@pytest.fixture(scope="module")
def trained_adapter(tiny_model_dir, world_dir, tmp_path_factory) -> Path:
    """ONE GRPO step of the tiny model with non-default rollout and prompt settings; the final adapter."""
    from agentic_rag.training.config import config_from_dict
    from agentic_rag.training.train import run

    out = tmp_path_factory.mktemp("grpo") / "out"
    cfg = config_from_dict({
        "model": {"name_or_path": str(tiny_model_dir), "lora_r": 4, "lora_alpha": 8, "gradient_checkpointing": False},
        "data": {"train_file": str(world_dir / "world" / "train.jsonl"), "limit": 2},
        "search": {"index": str(world_dir / "index")},
        "rollout": {k: v for k, v in dataclasses.asdict(TRAINED_ROLLOUT).items()
                    if v != getattr(RolloutSettings(), k)},
        "prompt": {"system_prompt": TRAINED_PROMPT.system_prompt},
        "rewards": [{"name": "f1", "weight": 1.0}],
        "algorithm": {"num_generations": 2, "per_device_train_batch_size": 2, "max_steps": 1,
                      "learning_rate": 0.001},
        "logging": {"swanlab_mode": "disabled", "sample_table_every": 0},
        "checkpoint": {"output_dir": str(out), "save_steps": 1, "save_total_limit": None},
    }, env={})
    assert cfg.rollout == TRAINED_ROLLOUT
    run(cfg)
    return out / "final"


def test_grpo_records_its_settings_in_every_checkpoint_and_final(trained_adapter):
    for directory in (trained_adapter, trained_adapter.parent / "checkpoint-1"):
        written = json.loads((directory / SETTINGS_FILE).read_text())
        assert written == {"format": 2, "written_by": "grpo", "rollout": dataclasses.asdict(TRAINED_ROLLOUT),
                           "prompt": dataclasses.asdict(TRAINED_PROMPT), "tools": ["search"]}, directory
        assert (directory / "adapter_config.json").is_file()


def test_evaluation_runs_the_adapter_as_trained_unless_told_otherwise(trained_adapter, tiny_model_dir, world_dir,
                                                                      qwen_tokenizer, tmp_path, monkeypatch, caplog):
    """The evaluation runner's engine holds exactly the trained rollout settings and builds the trained prompt;
    ``--set rollout.max_searches=3`` wins, and the log says it overrides the trained 2."""
    import agentic_rag.rollout as rollout_pkg
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.data.questions import read_questions
    from agentic_rag.evaluation.config import config_from_dict
    from agentic_rag.evaluation.runner import run_evaluation
    from agentic_rag.rollout.scripted import ScriptedPolicy

    questions = world_dir / "world" / "test.jsonl"
    question = read_questions(questions, limit=1)[0].question
    data = {"dataset": {"path": str(questions), "limit": 1},
            "policy": {"model": str(tiny_model_dir), "adapter": str(trained_adapter)},
            "search": {"index": str(world_dir / "index")}, "output_dir": str(tmp_path / "eval"), "batch_size": 1}
    settings_path = trained_adapter / SETTINGS_FILE
    with caplog.at_level(logging.INFO, logger="agentic_rag.evaluation"):
        cfg = config_from_dict(data, env={})
    assert cfg.rollout == TRAINED_ROLLOUT and cfg.prompt == TRAINED_PROMPT
    assert f"trained settings from {settings_path}: 14 taken, 0 overridden" in caplog.messages

    engines = []

    class Recording(rollout_pkg.AgentRollout):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            engines.append(self)

    class Policy(ScriptedPolicy):
        def generate(self, contexts, **kw):
            self.seen = getattr(self, "seen", []) + [list(c) for c in contexts]
            return super().generate(contexts, **kw)

    policy = Policy(qwen_tokenizer, {question: ["<answer>somewhere</answer>"]})
    monkeypatch.setattr(rollout_pkg, "AgentRollout", Recording)  # the runner builds its engine from the package
    summary = run_evaluation(cfg, policy=policy, tokenizer=qwen_tokenizer, progress=False)
    assert summary["n"] == 1
    assert len(engines) == 1 and engines[0].settings == TRAINED_ROLLOUT
    assert policy.seen[0] == build_prompt(qwen_tokenizer, question, "agentic", chat=True,
                                          system=TRAINED_PROMPT.system_prompt)
    assert summary["config"]["rollout"] == dataclasses.asdict(TRAINED_ROLLOUT)

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agentic_rag.evaluation"):
        cfg = config_from_dict(data, env={}, overrides=["rollout.max_searches=3"])
    assert cfg.rollout == dataclasses.replace(TRAINED_ROLLOUT, max_searches=3) and cfg.prompt == TRAINED_PROMPT
    assert f"trained settings from {settings_path}: 13 taken, 1 overridden" in caplog.messages
    assert (f"rollout.max_searches = 3 (--set rollout.max_searches) overrides the 2 the model was trained with "
            f"({settings_path})") in caplog.messages


def test_the_chat_server_serves_the_adapter_as_trained_unless_told_otherwise(trained_adapter, tiny_model_dir,
                                                                             world_dir, caplog):
    """The chat server's agent (the model and adapter really loaded) holds exactly the trained settings and builds
    the trained prompt; ``--max-searches 3``, AGENTIC_RAG_CHAT_MAX_SEARCHES=3 or ``rollout.max_searches=3`` wins,
    and the log says it overrides the trained 2."""
    from peft import PeftModel

    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.serving.agent import ChatAgent
    from agentic_rag.serving.config import config_for
    from agentic_rag.serving.conversation import prompt_ids

    settings_path = trained_adapter / SETTINGS_FILE
    base = [f"model.model={tiny_model_dir}", f"model.adapter={trained_adapter}", f"search.index={world_dir / 'index'}"]
    with caplog.at_level(logging.INFO, logger="agentic_rag.serving"):
        config = config_for(base)
    assert config.rollout == TRAINED_ROLLOUT and config.prompt == TRAINED_PROMPT
    assert f"trained settings from {settings_path}: 14 taken, 0 overridden" in caplog.messages
    agent = ChatAgent.load(config)
    assert isinstance(agent.policy.model, PeftModel)
    assert agent.settings == TRAINED_ROLLOUT and agent.prompt == TRAINED_PROMPT
    assert agent.engine().settings == TRAINED_ROLLOUT
    messages = [{"role": "user", "content": QUESTION}]
    assert prompt_ids(agent.tokenizer, messages, agent.settings.dialect, agent.prompt) == \
        build_prompt(agent.tokenizer, QUESTION, "agentic", chat=True, system=TRAINED_PROMPT.system_prompt)

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="agentic_rag.serving"):
        config = config_for([*base, "rollout.max_searches=3"])
    assert config.rollout == dataclasses.replace(TRAINED_ROLLOUT, max_searches=3) and config.prompt == TRAINED_PROMPT
    assert (f"rollout.max_searches = 3 (--set rollout.max_searches) overrides the 2 the model was trained with "
            f"({settings_path})") in caplog.messages
    assert f"trained settings from {settings_path}: 13 taken, 1 overridden" in caplog.messages

    argv = ["--model", str(tiny_model_dir), "--adapter", str(trained_adapter), "--index", str(world_dir / "index")]
    cfg, lines = parsed([*argv, "--max-searches", "3"], {})
    assert cfg.rollout.max_searches == 3 and cfg.prompt == TRAINED_PROMPT
    assert [line for line in lines if line.startswith("rollout.max_searches = 3")] == \
        [f"rollout.max_searches = 3 (--set rollout.max_searches) overrides the 2 the model was trained with "
         f"({settings_path})"]
    cfg, lines = parsed(argv, {"AGENTIC_RAG_CHAT_MAX_SEARCHES": "3"})
    assert cfg.rollout == dataclasses.replace(TRAINED_ROLLOUT, max_searches=3)
    assert (f"rollout.max_searches = 3 (AGENTIC_RAG_CHAT_MAX_SEARCHES in the environment or .env) overrides the 2 "
            f"the model was trained with ({settings_path})") in lines
    cfg, lines = parsed([*argv, "--max-searches", "2"], {})  # set to what it was trained with: nothing to say
    assert cfg.rollout == TRAINED_ROLLOUT
    assert lines == [f"trained settings from {settings_path}: 13 taken, 0 overridden"]


# ------------------------------------------------------------------------------------------- readers


def test_server_config_takes_the_adapters_settings_unless_set(tmp_path):
    adapter = tmp_path / "final"
    adapter.mkdir()
    path = write_settings(adapter, ROLLOUT, PROMPT, written_by="grpo")
    argv = ["--model", "/m", "--adapter", str(adapter), "--index", "/i", "--max-turns", "6"]
    cfg, lines = parsed(argv, {"AGENTIC_RAG_CHAT_PASSAGES_PER_SEARCH": "5"})
    assert cfg.prompt == PROMPT
    # a flag and an environment variable win; the rest is as trained
    assert cfg.rollout == dataclasses.replace(ROLLOUT, max_turns=6, passages_per_search=5)
    assert lines[0] == f"trained settings from {path}: 11 taken, 2 overridden"
    assert set(lines[1:]) == {
        f"rollout.max_turns = 6 (--set rollout.max_turns) overrides the 3 the model was trained with ({path})",
        f"rollout.passages_per_search = 5 (AGENTIC_RAG_CHAT_PASSAGES_PER_SEARCH in the environment or .env) "
        f"overrides the 1 the model was trained with ({path})"}
    # a merged SFT model directory carries its own (here an earlier version's, the dialect alone)
    model = tmp_path / "merged"
    model.mkdir()
    (model / SETTINGS_FILE).write_text(json.dumps({"format": 1, "written_by": "sft", "dialect": "r1-searcher"}))
    assert parsed(["--model", str(model), "--index", "/i"], {})[0].rollout.dialect == "r1-searcher"
    # the adapter's file before the model's
    assert parsed(["--model", str(model), "--adapter", str(adapter), "--index", "/i"], {})[0].rollout == ROLLOUT
    # without any file nothing changes
    plain, lines = parsed(["--model", "/m", "--index", "/i"], {})
    assert (plain.rollout, plain.prompt, lines) == (RolloutSettings(), PromptSettings(), [])


def test_eval_config_takes_the_adapters_settings_unless_set(tmp_path, world_dir, caplog):
    from agentic_rag.evaluation.config import config_from_dict

    adapter = tmp_path / "final"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    path = write_settings(adapter, ROLLOUT, PROMPT, written_by="grpo")
    data = {"dataset": {"path": str(world_dir / "world" / "test.jsonl")},
            "policy": {"model": str(tmp_path), "adapter": str(adapter)},
            "search": {"index": str(world_dir / "index")}, "rollout": {"max_turns": 6}}
    with caplog.at_level(logging.INFO, logger="agentic_rag.evaluation"):
        cfg = config_from_dict(data, overrides=["prompt.language=zh"], env={}, check_files=False)
    assert cfg.rollout == dataclasses.replace(ROLLOUT, max_turns=6)  # the config file wins
    assert cfg.prompt == dataclasses.replace(PROMPT, language="zh")  # and --set
    assert f"trained settings from {path}: 11 taken, 2 overridden" in caplog.messages
    assert f"rollout.max_turns = 6 (the config file) overrides the 3 the model was trained with ({path})" \
        in caplog.messages
    assert f"prompt.language = 'zh' (--set prompt.language) overrides the 'en' the model was trained with ({path})" \
        in caplog.messages
    data["policy"]["adapter"] = ""
    assert config_from_dict(data, env={}, check_files=False).rollout.dialect == "agentic"


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
        health = httpx.get(url + "/health").json()
        rollout, limits = health["rollout"], health["limits"]
        assert rollout["max_turns"] == 4 and rollout["passages_per_search"] == 2  # the flag beat the adapter's 1
        assert rollout["max_observation_tokens"] == 64 and limits["context_length"] == 512
        assert health["system_prompt"] == SYSTEM and health["chat_template"] is False and health["dialect"] == "agentic"
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
    path = short_adapter_dir / SETTINGS_FILE
    assert f"trained settings from {path}: 12 taken, 1 overridden" in text, text
    assert (f"rollout.passages_per_search = 2 (--set rollout.passages_per_search) overrides the 1 the model was "
            f"trained with ({path})") in text, text
