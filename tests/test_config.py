"""The experiment config: every problem reported at once, with the field and the fix, before any model loads."""

from __future__ import annotations

import pytest
import yaml

from agentic_rag.config import ConfigError, config_from_dict, describe, load_config


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
    assert cfg.logging.swanlab_mode == "offline"


def problems_of(data, env=None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, env=env or {})
    return info.value.problems


def test_unknown_keys_and_wrong_types_are_all_reported(good):
    data = {**good, "algoritm": {}, "rollout": {"max_turns": "five", "temperatur": 0.7},
            "algorithm": {"num_generations": 2.5}, "rewards": "f1"}
    found = problems_of(data)
    assert "algoritm is not a setting; did you mean 'algorithm'?" in found
    assert "rollout.temperatur is not a setting; did you mean 'temperature'?" in found
    assert "rollout.max_turns must be int, got 'five'" in found
    assert any(p.startswith("algorithm.num_generations must be int") for p in found)
    assert "rewards must be a list, got str" in found
    assert len(found) == 5


EVERY_RULE = [
    ({"model": {"name_or_path": ""}}, "model.name_or_path is empty: set it in the config or MODEL_PATH in .env"),
    ({"model": {"quantization": "nf8"}},
     "model.quantization must be one of none, nf4; got 'nf8' (did you mean 'nf4'?)"),
    ({"model": {"dtype": "fp16"}}, "model.dtype must be one of auto, bfloat16, float16, float32; got 'fp16'"),
    ({"model": {"lora_r": 0}}, "model.lora_r must be a positive integer, got 0"),
    ({"model": {"lora_dropout": 1.5}}, "model.lora_dropout must be in [0, 1), got 1.5"),
    ({"data": {"train_file": "/nope.jsonl"}}, "data.train_file: no such file /nope.jsonl"),
    ({"data": {"language": "fr"}}, "data.language must be one of en, zh; got 'fr'"),
    ({"search": {"index": ""}}, "search.index is empty"),
    ({"search": {"index": "/no/index"}}, "search.index: no index at /no/index (build one: agentic-rag index build"),
    ({"search": {"retriever": "splade"}}, "search.retriever must be one of bm25, dense, hybrid; got 'splade'"),
    ({"rollout": {"dialect": "search_r1"}}, "rollout.dialect must be one of agentic, search-r1, r1-searcher; "
                                           "got 'search_r1' (did you mean 'search-r1'?)"),
    ({"rollout": {"max_tokens_per_turn": 2048}}, "rollout.max_tokens_per_turn (2048) exceeds rollout.max_completion_"),
    ({"rollout": {"temperature": 0}}, "rollout.temperature must be > 0, got 0.0"),
    ({"rollout": {"max_observation_tokens": 8}}, "rollout.max_observation_tokens must be >= 16, got 8"),
    ({"algorithm": {"name": "ppo"}}, "algorithm.name must be one of grpo, dr_grpo, dapo, reinforce_pp; got 'ppo'"),
    ({"algorithm": {"num_generations": 1}}, "algorithm.num_generations must be >= 2"),
    ({"algorithm": {"num_generations": 3, "per_device_train_batch_size": 4}},
     "must be a multiple of algorithm.num_generations (3)"),
    ({"algorithm": {"beta": -1.0}}, "algorithm.beta must be >= 0, got -1.0"),
    ({"rewards": []}, "rewards is empty"),
    ({"rewards": [{"name": "bleu"}]}, "rewards[0].name must be one of exact_match, f1, cover_em"),
    ({"rewards": [{"name": "judge"}]}, "rewards[0] is the LLM judge but judge.base_url is empty"),
    ({"judge": {"base_url": "http://x/v1"}}, "judge.model is empty while judge.base_url is set"),
    ({"logging": {"swanlab_mode": "cloud"}}, "logging.swanlab_mode is cloud but SWANLAB_API_KEY is not set"),
    ({"checkpoint": {"save_steps": 0}}, "checkpoint.save_steps must be a positive integer, got 0"),
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


def test_environment_overrides_and_set(good, tmp_path, world_dir):
    data = {**good, "model": {"name_or_path": ""}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path, env={"MODEL_PATH": good["model"]["name_or_path"], "SWANLAB_MODE": "disabled"},
                      overrides={"algorithm.max_steps": "7", "rollout.top_p": "0.9"})
    assert cfg.model.name_or_path == good["model"]["name_or_path"]
    assert cfg.logging.swanlab_mode == "disabled" and cfg.algorithm.max_steps == 7 and cfg.rollout.top_p == 0.9
    assert cfg.logging.run_name == "c"
    with pytest.raises(ConfigError, match="no such setting"):
        load_config(path, env={"MODEL_PATH": "x"}, overrides={"algorithm.nope": "1"})
    with pytest.raises(ConfigError, match="not valid YAML"):
        bad = tmp_path / "bad.yaml"
        bad.write_text("model: [unclosed")
        load_config(bad)


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


def test_every_setting_has_help():
    rows = describe()
    assert len(rows) > 50
    missing = [name for name, _, help_ in rows if not help_]
    assert not missing, missing


def test_shipped_training_configs_are_valid(tmp_path):
    from conftest import ROOT

    for path in sorted((ROOT / "experiments" / "training").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        data.setdefault("model", {})["name_or_path"] = data["model"].get("name_or_path") or "placeholder"
        cfg = config_from_dict(data, source=str(path), env={}, check_files=False)
        assert cfg.algorithm.max_steps >= 1, path
