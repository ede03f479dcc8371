"""The experiment config: every problem reported at once, with the field and the fix, before any model loads."""

from __future__ import annotations

import logging

import pytest
import yaml

from agentic_rag.settings import describe
from agentic_rag.training.config import ConfigError, ExperimentConfig, config_from_dict, load_config


@pytest.fixture()
def good(world_dir, tiny_model_dir):
    return {
        "model": {"name_or_path": str(tiny_model_dir)},
        "data": {"train_file": str(world_dir / "world" / "train.jsonl")},
        "search": {"index": str(world_dir / "index")},
    }


def test_a_good_config_loads_with_defaults(good):
    cfg = config_from_dict(good, env={})
    assert cfg.algorithm.name == "grpo" and [r.name for r in cfg.rewards] == ["f1", "format"]
    assert cfg.logging.swanlab_mode == "auto"


def problems_of(data, env=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, env=env or {})
    return info.value.problems


def test_unknown_keys_and_wrong_types_are_all_reported(good):
    data = {**good, "algoritm": {}, "rollout": {"max_turns": "five"}, "sampling": {"temperatur": 0.7},
            "algorithm": {"num_generations": 2.5}, "rewards": "f1"}
    found = problems_of(data)
    assert "algoritm is not a setting; did you mean 'algorithm'?" in found
    assert "sampling.temperatur is not a setting; did you mean 'temperature'?" in found
    assert "rollout.max_turns must be an integer, got 'five'" in found
    assert "algorithm.num_generations must be an integer, got 2.5" in found
    assert "rewards must be a list, got str" in found
    assert len(found) == 5


EVERY_RULE = [
    ({"model": {"name_or_path": ""}}, "model.name_or_path is empty: set it in the config or MODEL_PATH in .env"),
    ({"model": {"quantization": "nf8"}},
     "model.quantization must be one of none, nf4; got 'nf8' (did you mean 'nf4'?)"),
    ({"model": {"dtype": "fp16"}}, "model.dtype must be one of auto, bfloat16, float16, float32; got 'fp16'"),
    ({"model": {"lora_r": 0}}, "model.lora_r must be >= 1, got 0"),
    ({"model": {"lora_dropout": 1.5}}, "model.lora_dropout must be in [0, 1), got 1.5"),
    ({"data": {"train_file": "/nope.jsonl"}}, "data.train_file: no such file /nope.jsonl"),
    ({"prompt": {"language": "fr"}}, "prompt.language must be one of en, zh; got 'fr'"),
    ({"search": {"index": ""}}, "search.index is empty"),
    ({"search": {"index": "/no/index"}}, "search.index: no index at /no/index (build one: agentic-rag index build"),
    ({"search": {"retriever": "splade"}}, "search.retriever must be one of bm25, dense, hybrid, random; got 'splade'"),
    ({"rollout": {"dialect": "search_r1"}}, "rollout.dialect must be one of agentic, search-r1, r1-searcher, native; "
                                           "got 'search_r1' (did you mean 'search-r1'?)"),
    ({"rollout": {"max_tokens_per_turn": 2048}}, "rollout.max_tokens_per_turn (2048) exceeds rollout.max_completion_"),
    ({"sampling": {"temperature": 0}}, "sampling.temperature must be > 0 (GRPO samples its rollouts), got 0.0"),
    ({"rollout": {"max_observation_tokens": 8}}, "rollout.max_observation_tokens must be >= 16, got 8"),
    ({"algorithm": {"name": "ppo"}},
     "algorithm.name must be one of grpo, dr_grpo, dapo, gspo, cispo, sapo, bnpo, reinforce_pp, "
     "reinforce_pp_baseline; got 'ppo'"),
    ({"sampling": {"top_k": -1}}, "sampling.top_k must be >= 0, got -1"),
    ({"sampling": {"repetition_penalty": 0}}, "sampling.repetition_penalty must be > 0, got 0.0"),
    ({"algorithm": {"num_generations": 1}}, "algorithm.num_generations must be >= 2"),
    ({"algorithm": {"num_generations": 3, "per_device_train_batch_size": 4}},
     "must be a multiple of algorithm.num_generations (3)"),
    ({"algorithm": {"beta": -1.0}}, "algorithm.beta must be >= 0, got -1"),
    ({"rewards": []}, "rewards is empty"),
    ({"rewards": [{"name": "bleu"}]}, "rewards[0].name is unknown reward 'bleu'; known rewards: em, f1, cover_em, "
                                       "cover_em_tokens, judge, choice, format"),
    ({"rewards": [{"name": "exact_match"}]}, "rewards[0].name is unknown reward 'exact_match' ('exact_match' was "
                                             "renamed 'em'); known rewards: em, f1"),
    ({"rewards": [{"name": "judge"}]}, "rewards lists the LLM judge but judge.base_url is empty"),
    ({"judge": {"base_url": "http://x/v1"}}, "judge.model is empty while judge.base_url is set"),
    ({"logging": {"swanlab_mode": "cloud"}}, "logging.swanlab_mode is cloud but SWANLAB_API_KEY is not set"),
    ({"checkpoint": {"save_steps": 0}}, "checkpoint.save_steps must be >= 1, got 0"),
    ({"model": {"attn_implementation": "flash"}},
     "model.attn_implementation must be one of sdpa, eager, flash_attention_2; got 'flash'"),
    ({"model": {"lora_target_modules": []}}, "model.lora_target_modules must name modules (e.g. [q_proj, v_proj]) "
                                             "or be [all-linear], got []"),
    ({"model": {"lora_target_modules": ["all-linear", "q_proj"]}},
     "model.lora_target_modules: all-linear already means every linear layer; list it alone"),
    ({"model": {"adapter": "/no/adapter"}}, "model.adapter: no LoRA adapter at /no/adapter (a peft directory with "
                                            "adapter_config.json"),
    ({"rollout": {"summary_mode": "drop"}}, "rollout.summary_mode must be one of replace, keep; got 'drop'"),
    ({"sampling": {"top_p": 1.5}}, "sampling.top_p must be in (0, 1], got 1.5"),
    ({"rollout": {"max_searches": -1}}, "rollout.max_searches must be >= 0, got -1"),
    ({"algorithm": {"learning_rate": 0}}, "algorithm.learning_rate must be > 0, got 0.0"),
    ({"algorithm": {"max_steps": 0}}, "algorithm.max_steps must be >= 1, got 0"),
    ({"algorithm": {"num_iterations": 0}}, "algorithm.num_iterations must be >= 1, got 0"),
    ({"algorithm": {"gradient_accumulation_steps": 0}},
     "algorithm.gradient_accumulation_steps must be >= 1, got 0"),
    ({"algorithm": {"per_device_train_batch_size": 0}},
     "algorithm.per_device_train_batch_size must be >= 1, got 0"),
    ({"algorithm": {"warmup_ratio": 1.0}}, "algorithm.warmup_ratio must be in [0, 1), got 1.0"),
    ({"algorithm": {"lr_scheduler": "step"}}, "algorithm.lr_scheduler must be one of linear, cosine, constant; "
                                               "got 'step'"),
    ({"algorithm": {"warmup_ratio": -0.1}}, "algorithm.warmup_ratio must be in [0, 1), got -0.1"),
    ({"algorithm": {"epsilon": 0}}, "algorithm.epsilon must be in (0, 1), got 0.0"),
    ({"algorithm": {"epsilon_high": 0}}, "algorithm.epsilon_high must be > 0, got 0.0"),
    ({"algorithm": {"max_grad_norm": -1}}, "algorithm.max_grad_norm must be >= 0, got -1"),
    ({"algorithm": {"scale_rewards": "grup"}},
     "algorithm.scale_rewards must be one of group, batch, none; got 'grup' (did you mean 'group'?)"),
    ({"algorithm": {"name": "reinforce_pp", "scale_rewards": "none"}},
     "algorithm.scale_rewards does not apply to reinforce_pp"),
    ({"data": {"train_file": ""}}, "data.train_file is empty: point it at a question file"),
    ({"judge": {"fallback": "judge"}},
     "judge.fallback must be one of em, f1, cover_em, cover_em_tokens; got 'judge'"),
    ({"logging": {"swanlab_mode": "online"}},
     "logging.swanlab_mode must be one of auto, offline, cloud, local, disabled; got 'online'"),
    ({"model": "Qwen/Qwen2.5-7B"}, "model must be a mapping of settings (key: value lines), got str"),
    ({"rewards": [{"name": "f1"}, {"name": "f1", "weight": 0.5}]},
     "rewards[1].name 'f1' repeats rewards[0]: rewards are logged by name, so list each one once"),
    ({"rewards": [{"name": "format", "params": {"partal": True}}]},
     "rewards[0].params.partal is not a setting of the format reward; it takes partial"),
    ({"rewards": [{"name": "f1", "params": {"partial": True}}]},
     "rewards[0].params.partial is not a setting of the f1 reward; it takes none"),
    ({"rewards": [{"name": "format", "params": {"partial": "yes"}}]}, "rewards[0].params.partial must be bool"),
    ({"rewards": [{"name": "ragas", "params": {"metric": "recall"}}]},
     "rewards[0].params.metric must be one of id_recall, id_precision, text_recall, context_relevance"),
    ({"rewards": [{"name": "ragas", "params": {"metric": "faithfulness"}}]},
     "rewards[0].params.metric faithfulness is judged by an LLM but judge.base_url is empty (JUDGE_BASE_URL in .env)"
     "; or use a metric without one: id_recall, id_precision"),
    ({"rewards": [{"name": "ragas", "params": {"metric": "text_recall"}}]},
     "rewards[0].params.metric text_recall needs reference passages, which training questions do not carry"),
    ({"rewards": [{"name": "ragas", "params": {"fallback": "faithfulness"}}]},
     "rewards[0].params.fallback must be one of id_recall, id_precision; got 'faithfulness'"),
    ({"curriculum": {"enabled": True, "stage": 3}},
     "curriculum.stage must be 1 or 2, got 3"),
    ({"curriculum": {"stage": 2}}, "curriculum.stage is set but curriculum.enabled is false: enable the curriculum"),
    ({"curriculum": {"enabled": True, "stage2_step": -1}}, "curriculum.stage2_step must be >= 0, got -1"),
    ({"curriculum": {"enabled": True, "format_penalty": 2.0}},
     "curriculum.format_penalty is paid for a malformed trajectory and must be <= 0, got 2.0"),
    ({"curriculum": {"enabled": True, "retrieval_bonus": -0.5}}, "curriculum.retrieval_bonus must be >= 0, got -0.5"),
]


@pytest.mark.parametrize("patch, message", EVERY_RULE)
def test_every_rule_names_the_field_and_the_fix(good, patch, message):
    data = {k: dict(v) for k, v in good.items()}
    for section, values in patch.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    found = problems_of(data)
    assert any(message in p for p in found), found


def test_all_rule_problems_come_at_once(good):
    data = {**good, "model": {"name_or_path": "", "lora_r": 0}, "algorithm": {"name": "ppo", "beta": -1.0},
            "rewards": [{"name": "bleu"}]}
    assert len(problems_of(data)) == 5


def test_type_errors_and_rule_problems_come_together(good):
    """A typo in one place does not hide a broken rule elsewhere; an unusable value is reported once."""
    data = {**good, "model": {**good["model"], "lora_r": "sixteen"}, "algoritm": {},
            "rollout": {"max_tokens_per_turn": 2048}, "rewards": [{"name": "ragas", "params": {"metric": "bleu"}}],
            "data": {"train_file": True}}
    found = problems_of(data)
    assert "model.lora_r must be an integer, got 'sixteen'" in found
    assert "algoritm is not a setting; did you mean 'algorithm'?" in found
    assert any(p.startswith("rollout.max_tokens_per_turn (2048) exceeds") for p in found)
    assert any(p.startswith("rewards[0].params.metric must be one of id_recall") for p in found)
    assert "data.train_file must be text, got True" in found
    assert not any(p.startswith("data.train_file is empty") for p in found), found  # not reported twice
    assert len(found) == 5, found
    # a file that is not a mapping at all says only that
    assert problems_of(["model", "data"]) == ["the config must be a mapping of settings (key: value lines), got list"]


def test_environment_and_set_problems_name_their_source(good, tmp_path):
    found = problems_of(good, env={"SWANLAB_MODE": "clod"})
    assert found == ["logging.swanlab_mode must be one of auto, offline, cloud, local, disabled; got 'clod' "
                     "(did you mean 'cloud'?) (from SWANLAB_MODE in the environment or .env)"]
    with pytest.raises(ConfigError) as info:
        config_from_dict(good, env={}, overrides={"algorithm.max_steps": "many", "sampling.top_p": "2"})
    assert info.value.problems == [
        "algorithm.max_steps must be an integer, got 'many' (from --set algorithm.max_steps)",
        "sampling.top_p must be in (0, 1], got 2.0 (from --set sampling.top_p)"]
    # sections and the reward list are built like the file's, never stored as raw YAML
    cfg = config_from_dict(good, env={}, overrides={"rewards": "[{name: cover_em, weight: 2}]"})
    assert cfg.rewards[0].name == "cover_em" and cfg.rewards[0].weight == 2.0
    with pytest.raises(ConfigError) as info:
        config_from_dict(good, env={}, overrides={"rewards": "[{nme: f1}]"})
    assert "rewards[0].nme is not a setting; did you mean 'name'? (from --set rewards)" in info.value.problems
    # an optional text setting is unset by null (back to its default), a required one keeps the text
    data = {**good, "algorithm": {**good.get("algorithm", {}), "scale_rewards": "none"}}
    cfg = config_from_dict(data, env={}, overrides={"algorithm.scale_rewards": "null", "prompt.system_prompt": "~"})
    assert cfg.algorithm.scale_rewards is None and cfg.prompt.system_prompt == "~"


def test_command_line_and_file_problems_name_the_fix(good, tmp_path, capsys):
    from agentic_rag.training.train import main

    with pytest.raises(ConfigError) as info:  # --set values reach the config as a list of NAME=VALUE
        config_from_dict(good, env={}, overrides=["algorithm.max_steps"])
    assert info.value.problems == ["--set 'algorithm.max_steps': expected NAME=VALUE, e.g. rollout.max_searches=2"]
    cfg = config_from_dict(good, env={}, overrides=["sampling.top_p=0.9", "prompt.system_prompt=a=b"])
    assert (cfg.sampling.top_p, cfg.prompt.system_prompt) == (0.9, "a=b")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert info.value.problems == [f"no such config file: {tmp_path / 'missing.yaml'} (the shipped ones are "
                                   f"experiments/training/*.yaml and src/agentic_rag/resources/configs/*.yaml)"]
    # train.py's data check: a question file with no questions, found by --check before any model loads
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**good, "data": {"train_file": str(empty)}}))
    assert main(["--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"data.train_file {empty} holds no questions: point it at a question file" in err
    # ... and a malformed one, with its line, and no traceback
    blank = tmp_path / "blank.jsonl"
    blank.write_text("")
    path.write_text(yaml.safe_dump({**good, "data": {"train_file": str(blank)}}))
    assert main(["--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{blank}:1: the file is empty" in err and "Traceback" not in err


def test_environment_overrides_and_set(good, tmp_path, world_dir):
    data = {**good, "model": {"name_or_path": ""}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path, env={"MODEL_PATH": good["model"]["name_or_path"], "SWANLAB_MODE": "disabled"},
                      overrides={"algorithm.max_steps": "7", "sampling.top_p": "0.9"})
    assert cfg.model.name_or_path == good["model"]["name_or_path"]
    assert cfg.logging.swanlab_mode == "disabled" and cfg.algorithm.max_steps == 7 and cfg.sampling.top_p == 0.9
    assert cfg.logging.run_name == "c"
    with pytest.raises(ConfigError, match="no such setting"):
        load_config(path, env={"MODEL_PATH": "x"}, overrides={"algorithm.nope": "1"})
    with pytest.raises(ConfigError, match="not valid YAML"):
        bad = tmp_path / "bad.yaml"
        bad.write_text("model: [unclosed")
        load_config(bad)


def test_a_key_written_twice_is_refused_with_its_lines(good, tmp_path):
    """PyYAML keeps the last of two equal keys silently: a second ``rollout:`` section would drop the first's
    settings. The loader refuses it, naming the key and both lines (here a second ``model:``); a key that a merge
    (``<<``) brings in may still be overridden, and every shipped config reads."""
    from agentic_rag.demo.quickstart import CONFIGS
    from agentic_rag.settings import read_yaml

    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(good, sort_keys=False) + "model:\n  dtype: float32\n")
    with pytest.raises(ConfigError, match=r"'model' is written twice .*first on line \d+") as err:
        load_config(path, check_files=False)
    assert f'"{path}", line {len(path.read_text().splitlines()) - 1}' in str(err.value)
    merged = tmp_path / "merge.yaml"
    merged.write_text("base: &b {max_turns: 3, max_searches: 2}\nrollout:\n  <<: *b\n  max_turns: 4\n")
    assert read_yaml(merged)["rollout"] == {"max_turns": 4, "max_searches": 2}
    for shipped in sorted(CONFIGS.glob("*.yaml")):
        assert read_yaml(shipped)["model"]["name_or_path"], shipped


def test_train_check_reports_before_loading_anything(good, tmp_path, capsys):
    from agentic_rag.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**good, "algorithm": {"name": "ppo"}}))
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "algorithm.name must be one of" in err and "Traceback" not in err
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(good))
    assert main(["train", "--config", str(ok), "--check"]) == 0
    assert "OK (" in capsys.readouterr().out
    # rules that used to wait for the model to load are --check's now
    late = tmp_path / "late.yaml"
    late.write_text(yaml.safe_dump({**good, "rewards": [{"name": "ragas", "params": {"metric": "faithfulness"}},
                                                        {"name": "ragas"}]}))
    assert main(["train", "--config", str(late), "--check"]) == 2
    err = capsys.readouterr().err
    assert "rewards[0].params.metric faithfulness is judged by an LLM but judge.base_url is empty" in err
    assert "rewards[1].name 'ragas' repeats rewards[0]" in err


def test_every_setting_has_help():
    rows = describe(ExperimentConfig())  # "dotted  value  help": a row without help ends in the padding
    assert len(rows) > 50
    missing = [row.split()[0] for row in rows if row.endswith(" ")]
    assert not missing, missing


def test_shipped_training_configs_are_valid(tmp_path):
    from conftest import ROOT

    shipped = sorted((ROOT / "experiments" / "training").glob("*.yaml")) + sorted(
        (ROOT / "src" / "agentic_rag" / "resources" / "configs").glob("*.yaml"))
    assert len(shipped) >= 6
    for path in shipped:
        data = yaml.safe_load(path.read_text())
        data.setdefault("model", {})["name_or_path"] = data["model"].get("name_or_path") or "placeholder"
        cfg = config_from_dict(data, source=str(path), env={}, check_files=False)
        assert cfg.algorithm.max_steps >= 1, path


def test_no_config_exists_twice():
    """A shipped config lives in one place (the package's resources/configs/); experiments/ points at it, so no
    copy can drift."""
    from conftest import ROOT

    packaged = {p.read_bytes(): p.name for p in (ROOT / "src" / "agentic_rag" / "resources" / "configs").glob("*")}
    copies = [str(p.relative_to(ROOT)) for p in (ROOT / "experiments").rglob("*.yaml")
              if p.read_bytes() in packaged or p.name in packaged.values()]
    assert not copies, f"copies of packaged configs under experiments/: {copies}"


# ------------------------------------------------------------------ sampling that the loss does not describe

OFF_POLICY = [({"top_p": 0.9}, "sampling.top_p=0.9", "sampling.top_p: 1.0"),
              ({"top_k": 50}, "sampling.top_k=50", "sampling.top_k: 0"),
              ({"repetition_penalty": 1.1}, "sampling.repetition_penalty=1.1", "sampling.repetition_penalty: 1.0")]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("setting, named, fix", OFF_POLICY)
def test_off_policy_sampling_warns_once_with_the_consequence_and_the_fix(good, caplog, setting, named, fix):
    with caplog.at_level(logging.WARNING):
        cfg = config_from_dict({**good, "sampling": setting}, env={})
    found = _warnings(caplog)
    assert len(found) == 1, found
    assert named in found[0] and "importance ratio" in found[0] and "biased" in found[0] and fix in found[0]
    key, value = next(iter(setting.items()))
    assert getattr(cfg.sampling, key) == value


def test_default_sampling_warns_nothing_and_only_the_main_process_warns(good, caplog):
    with caplog.at_level(logging.WARNING):
        config_from_dict(good, env={})
        assert _warnings(caplog) == []
        # under accelerate every process reads the config: one warning per run, from rank 0
        config_from_dict({**good, "sampling": {"top_p": 0.9, "top_k": 20}}, env={"RANK": "1"})
        assert _warnings(caplog) == []
        config_from_dict({**good, "sampling": {"top_p": 0.9, "top_k": 20}}, env={"RANK": "0"})
        assert len(_warnings(caplog)) == 2


def test_the_repetition_penalty_is_explained_once_per_run_not_again_by_every_rollout(good, caplog, tiny_model_dir):
    from agentic_rag.models import load_causal_lm, load_tokenizer
    from agentic_rag.rollout import HFPolicy, SamplingParams

    model, tok = load_causal_lm(str(tiny_model_dir), device="cpu"), load_tokenizer(str(tiny_model_dir))
    with caplog.at_level(logging.WARNING):
        for rank in ("0", "1"):  # the main process warns; every process's rollout stays quiet
            config_from_dict({**good, "sampling": {"repetition_penalty": 1.37}}, env={"RANK": rank})
            HFPolicy(model, tok, SamplingParams(repetition_penalty=1.37)).open_session([])
        # without a config check in front of it, the policy still says it (library use)
        HFPolicy(model, tok, SamplingParams(repetition_penalty=1.41)).open_session([])
    found = _warnings(caplog)
    assert sum("1.37" in w for w in found) == 1 and sum("repetition_penalty=1.41" in w for w in found) == 1, found


def test_sampling_settings_reach_the_trainer(good):
    from agentic_rag.training.train import grpo_args

    cfg = config_from_dict({**good, "sampling": {"top_k": 40, "repetition_penalty": 1.2, "top_p": 0.8}}, env={})
    args = grpo_args(cfg, use_cpu=True)
    assert (args.top_k, args.repetition_penalty, args.top_p) == (40, 1.2, 0.8)
    assert args.ds3_gather_for_generation is True


# ----------------------------------------------------------------------- launches the rollout cannot run under

def test_fsdp_launch_is_refused_before_any_model_loads(good, tmp_path, capsys, monkeypatch):
    from agentic_rag.training import train

    found = problems_of(good, env={"ACCELERATE_USE_FSDP": "true"})
    assert len(found) == 1 and "FSDP" in found[0] and "train_zero2.sh" in found[0], found
    assert "ranks" in found[0]  # the reason: sharded weights need every rank in every decode step
    # through the entry point: exit 2, nothing loaded
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(good))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setattr(train, "run", lambda *a, **k: pytest.fail("the model must not load"))
    assert train.main(["--config", str(path)]) == 2
    assert "FSDP" in capsys.readouterr().err


def test_zero3_without_gathering_for_generation_is_refused(tmp_path):
    from agentic_rag.training.launch_checks import launch_from_env, launch_problems

    (problem,) = launch_problems(zero_stage=3, fsdp=False, ds3_gather_for_generation=False)
    assert "ds3_gather_for_generation" in problem and "hang" in problem and "ZeRO-3" in problem
    assert launch_problems(zero_stage=3, fsdp=False, ds3_gather_for_generation=True) == []
    assert launch_problems(zero_stage=2, fsdp=False, ds3_gather_for_generation=False) == []
    assert launch_problems(zero_stage=None, fsdp=False) == []
    # the launch as accelerate describes it to the processes it starts: the exported stage, else the JSON's
    from conftest import ROOT

    zero3 = str(ROOT / "experiments" / "training" / "deepspeed" / "zero3.json")
    assert launch_from_env({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": zero3}) == \
        {"zero_stage": 3, "fsdp": False}
    assert launch_from_env({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}) == \
        {"zero_stage": 2, "fsdp": False}
    assert launch_from_env({"ACCELERATE_USE_FSDP": "true"}) == {"zero_stage": None, "fsdp": True}
    assert launch_from_env({}) == {"zero_stage": None, "fsdp": False}


def test_the_trainer_refuses_zero3_without_gathering_before_deepspeed_starts():
    from types import SimpleNamespace

    from agentic_rag.training.launch_checks import refuse_unsupported_launch

    plugin = SimpleNamespace(zero_stage=3)
    with pytest.raises(ValueError, match="ds3_gather_for_generation"):
        refuse_unsupported_launch(SimpleNamespace(deepspeed_plugin=plugin, fsdp=None, ds3_gather_for_generation=False),
                                  env={})
    with pytest.raises(ValueError, match="FSDP"):
        refuse_unsupported_launch(SimpleNamespace(deepspeed_plugin=None, fsdp="full_shard",
                                                  ds3_gather_for_generation=True), env={})
    refuse_unsupported_launch(SimpleNamespace(deepspeed_plugin=plugin, fsdp=None, ds3_gather_for_generation=True),
                              env={})


# ------------------------------------------------------------------ attention that a tree mask cannot serve


def test_flash_attention_with_memory_actions_is_refused_before_any_model_loads(good):
    """Backtrack and summary branch a trajectory's context; a micro-batch holding one is scored with a 4D tree mask,
    which flash attention reads as a 2D padding mask. The check names the values, the reason and the fix."""
    data = {**good, "model": {**good["model"], "attn_implementation": "flash_attention_2"}}
    found = [p for p in problems_of(data) if p.startswith("model.attn_implementation")]
    assert len(found) == 1, found
    message = found[0]
    for part in ("flash_attention_2", "rollout.dialect agentic", "backtrack", "4D", "padding mask", "sdpa",
                 "search-r1"):
        assert part in message, (part, message)
    # a dialect without memory actions never branches: flash attention is fine there
    config_from_dict({**data, "rollout": {"dialect": "search-r1"}}, env={})


def _sliding_model_dir(path, **overrides):
    """A tiny Qwen2 config.json as transformers writes it (no weights: the check reads the config only)."""
    from transformers import Qwen2Config

    from conftest import tiny_qwen_config

    Qwen2Config(**{**tiny_qwen_config(vocab_size=512).to_dict(), "layer_types": None, **overrides}).save_pretrained(
        path)
    return str(path)


def test_a_sliding_window_model_with_memory_actions_is_refused(good, tmp_path):
    model = _sliding_model_dir(tmp_path / "swa", use_sliding_window=True, sliding_window=64, max_window_layers=0)
    found = [p for p in problems_of({**good, "model": {"name_or_path": model}}) if p.startswith("model.name_or_path")]
    assert len(found) == 1, found
    for part in ("sliding attention window of 64 tokens", "rollout.dialect agentic", "use_sliding_window",
                 "r1-searcher"):
        assert part in found[0], (part, found[0])
    config_from_dict({**good, "model": {"name_or_path": model}, "rollout": {"dialect": "r1-searcher"}}, env={})
    full = _sliding_model_dir(tmp_path / "full", use_sliding_window=False)
    config_from_dict({**good, "model": {"name_or_path": full}}, env={})


def test_a_cached_hub_model_config_is_read_without_the_network(tmp_path):
    from agentic_rag.training.launch_checks import local_model_config

    snapshot = tmp_path / "models--org--swa" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"sliding_window": 8}')
    (tmp_path / "models--org--swa" / "refs").mkdir()
    (tmp_path / "models--org--swa" / "refs" / "main").write_text("abc123")
    assert local_model_config("org/swa", cache_dir=str(tmp_path)) == {"sliding_window": 8}
    assert local_model_config("org/not-downloaded", cache_dir=str(tmp_path)) is None
    assert local_model_config(str(snapshot)) == {"sliding_window": 8}  # a local directory
    assert local_model_config(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("name, scale, expected", [("grpo", None, "group"), ("grpo", "none", "none"),
                                                   ("dr_grpo", None, "none"), ("dapo", "batch", "batch")])
def test_scale_rewards_reaches_trls_config(name, scale, expected):
    from agentic_rag.training.algorithms import algorithm_args

    assert algorithm_args(name, scale_rewards=scale)["scale_rewards"] == expected


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_the_learning_rate_schedule_reaches_the_trainer(good, schedule):
    """algorithm.lr_scheduler, through transformers' own scheduler: constant holds the peak rate to the last step
    (a five-step run does not spend its last steps near zero); linear decays towards 0."""
    import torch
    from transformers import get_scheduler

    from agentic_rag.training.train import grpo_args

    cfg = config_from_dict({**good, "algorithm": {**good.get("algorithm", {}), "lr_scheduler": schedule,
                                                  "max_steps": 5, "learning_rate": 3e-4}}, env={})
    args = grpo_args(cfg, use_cpu=True)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    sched = get_scheduler(args.lr_scheduler_type, opt, num_warmup_steps=args.get_warmup_steps(args.max_steps),
                          num_training_steps=args.max_steps)
    rates = []
    for _ in range(args.max_steps):
        rates.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    if schedule == "constant":
        assert rates == pytest.approx([3e-4] * 5)
    else:
        assert rates == pytest.approx([3e-4, 2.4e-4, 1.8e-4, 1.2e-4, 0.6e-4])


def test_scientific_notation_is_a_number_in_files_and_set(good):
    """PyYAML reads YAML 1.1, where ``1e-5`` (no dot) is text: a learning rate written as Hugging Face configs write
    it, or passed as ``--set algorithm.learning_rate=3e-5`` (what Python prints for 0.00003), was refused as 'not a
    number'. A float setting takes scientific notation; text in it is still refused, and an integer setting still
    takes integers only."""
    data = {**good, "algorithm": {**good.get("algorithm", {}), "learning_rate": "1e-5"}}
    assert config_from_dict(data, env={}).algorithm.learning_rate == 1e-5
    cfg = config_from_dict(good, env={}, overrides={"algorithm.learning_rate": "3e-05", "sampling.top_p": ".9E0"})
    assert cfg.algorithm.learning_rate == 3e-5 and cfg.sampling.top_p == 0.9
    with pytest.raises(ConfigError) as info:
        config_from_dict(good, env={}, overrides={"algorithm.learning_rate": "1e-5x", "algorithm.max_steps": "1e2"})
    assert info.value.problems == [
        "algorithm.learning_rate must be a number, got '1e-5x' (from --set algorithm.learning_rate)",
        "algorithm.max_steps must be an integer, got '1e2' (from --set algorithm.max_steps)"]
