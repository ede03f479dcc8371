"""The one settings layer, seen from the command line: training, evaluation and the chat server read settings the
same way, report every problem of a file at once before any model loads, and describe every setting the same way;
the settings shared by all three have one declaration, one default and one name."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

SRC = ROOT / "src" / "agentic_rag"
# three mistakes: an unknown key, a wrong type, a value out of range (and a misspelt section key for good measure)
MISTAKES = {"rollout": {"max_serches": 2, "max_turns": "eight", "max_observation_tokens": 4}}
EXPECTED = ("rollout.max_serches is not a setting; did you mean 'max_searches'?",
            "rollout.max_turns must be an integer, got 'eight'",
            "rollout.max_observation_tokens must be >= 16, got 4")


def command(entry: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "agentic_rag.cli", entry, *args]


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIC_RAG_CHAT_")}
    full.update(HF_HUB_OFFLINE="1", AGENTIC_RAG_LOG_LEVEL="WARNING", **env)
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=full, timeout=180)


@pytest.mark.parametrize("entry", ["train", "eval", "serve"])
def test_a_file_with_three_mistakes_gets_one_error_naming_all_three_before_any_model_loads(entry, tmp_path):
    cfg = tmp_path / "settings.yaml"
    cfg.write_text(yaml.safe_dump(MISTAKES))
    # a model that would take a minute to load if anything got that far: not a model at all
    out = run(command(entry, "--config", str(cfg)), tmp_path)
    assert out.returncode == 2, out.stderr
    for text in EXPECTED:
        assert text in out.stderr, (text, out.stderr)
    assert "Traceback" not in out.stderr
    assert "Loading weights" not in out.stderr and "loaded model" not in out.stderr


def describe(entry: str, tmp_path: Path) -> dict[str, str]:
    out = run(command(entry, "--describe"), tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        name, value = line.split()[:2]
        rows[name] = value
    return rows


def test_describe_prints_the_same_rollout_defaults_for_train_eval_and_serve(tmp_path):
    """``--describe`` without a config: every setting, one per line, and the shared sections are one shape with
    one default (before, evaluation observed 512 tokens where training and serving observed 384)."""
    train, evaluate, serve = (describe(e, tmp_path) for e in ("train", "eval", "serve"))
    assert train["rollout.max_observation_tokens"] == evaluate["rollout.max_observation_tokens"] \
        == serve["rollout.max_observation_tokens"] == "384"
    shared = {k for k in train if k.startswith(("rollout.", "prompt.", "search."))}
    assert shared and shared <= set(evaluate) and shared <= set(serve)
    for name in shared:
        if name not in ("search.index",):
            assert train[name] == evaluate[name] == serve[name], name
    assert evaluate["sampling.temperature"] == "0.0" and train["sampling.temperature"] == "1.0"


def test_describe_resolves_the_file_the_environment_and_set(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"rollout": {"max_searches": 2}}))
    out = run(command("train", "--describe", "--config", str(cfg), "--set", "rollout.max_turns=3"), tmp_path,
              OUTPUT_DIR="elsewhere")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()}
    assert "2" in lines["rollout.max_searches"].split() and "[from the config file]" in lines["rollout.max_searches"]
    assert "[from --set rollout.max_turns]" in lines["rollout.max_turns"]
    assert "'elsewhere'" in lines["checkpoint.output_dir"] and "OUTPUT_DIR" in lines["checkpoint.output_dir"]


def _field_declarations(name: str) -> list[str]:
    """Where a dataclass field called ``name`` is declared in src/ (an annotated assignment in a class body)."""
    found = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                    found.append(f"{path.relative_to(SRC)}:{cls.name}")
    return found


@pytest.mark.parametrize("name", ["max_observation_tokens", "passages_per_search", "max_searches"])
def test_a_rollout_setting_is_declared_once(name):
    declared = _field_declarations(name)
    assert [d for d in declared if d.startswith("rollout/settings.py")] == ["rollout/settings.py:RolloutSettings"]
    # the guards' bound on searches per trajectory is another setting (a float, an alert threshold)
    others = [d for d in declared if not d.startswith("rollout/settings.py")]
    assert others in ([], ["training/config.py:GuardsConfig"]), declared


def test_the_settings_modules_load_no_torch():
    code = ("import sys\nimport agentic_rag.training.config, agentic_rag.evaluation.config, "
            "agentic_rag.serving.config, agentic_rag.rollout.settings, agentic_rag.search.settings\n"
            "heavy = [m for m in ('torch', 'transformers', 'trl', 'faiss') if m in sys.modules]\n"
            "assert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_command_line_choices_come_from_the_registries():
    """The CLI offers the names the registries hold, nothing copied (a new dialect or retriever shows up here)."""
    from agentic_rag.cli import build_parser
    from agentic_rag.rollout.protocol import DIALECTS
    from agentic_rag.search.settings import RETRIEVERS

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    search = next(a for a in sub["search"]._actions if a.dest == "retriever")
    assert tuple(search.choices) == tuple(RETRIEVERS)
    sft_help = sub["sft"].format_help()
    assert "--dialect" in sft_help and "--max-observation-tokens" in sft_help
    out = subprocess.run(command("sft", "--model", "m", "--data", "d", "--out", "o", "--dialect", "nope"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and all(name in out.stderr for name in DIALECTS), out.stderr
