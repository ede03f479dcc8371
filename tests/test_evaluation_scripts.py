"""The evaluation scripts (script/evaluation/*.sh) run as a user runs them: bash in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, shared

SCRIPTS = ROOT / "script" / "evaluation"


def bash(script: str, *args: str, env: dict[str, str] | None = None, root: Path = ROOT,
         timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "script" / "evaluation" / script), *args], capture_output=True,
                          text=True, timeout=timeout, env=env if env is not None else dict(os.environ))


def test_score_sh_rescores_the_released_r1_searcher_rollouts():
    path = shared("r1-searcher/eval_results/hotpotqa_llama.jsonl")
    r = bash("score.sh", str(path), "--pred-field", "pred_ans", "--answer-field", "answer")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["file"] == str(path) and out["n"] == 500
    assert (out["pred_field"], out["answer_field"]) == ("pred_ans", "answer")
    assert round(out["em"], 3) == 0.582 and round(out["cover_em"], 3) == 0.634


def test_eval_sh_without_arguments_prints_its_usage():
    r = bash("eval.sh")
    assert r.returncode == 2
    assert "usage: bash script/evaluation/eval.sh CONFIG [options]" in r.stderr and r.stdout == ""


def test_eval_sh_lists_every_problem_of_a_bad_config(tmp_path):
    bad = {"dataset": {"path": str(tmp_path / "missing.jsonl"), "limit": 0},
           "policy": {"type": "endpoint", "model": "m", "base_url": "localhost:8000"},
           "search": {"index": "none"},
           "rollout": {"dialect": "agentik", "passages_per_search": 0}}
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(bad))
    r = bash("eval.sh", str(cfg), "--no-progress")
    assert r.returncode == 2, r.stderr
    assert f"{cfg}: " in r.stderr and "problem(s)" in r.stderr
    for expected in (f"dataset.path: no such file {tmp_path / 'missing.jsonl'}",
                     "dataset.limit must be >= 1, got 0",
                     "policy.base_url must be the endpoint's http(s) URL",
                     "rollout.passages_per_search must be >= 1, got 0",
                     "rollout.dialect must be one of agentic, search-r1, r1-searcher, native; got 'agentik' "
                     "(did you mean 'agentic'?)"):
        assert expected in r.stderr, expected


def test_eval_sh_runs_in_the_users_folder(tmp_path):
    """A relative config is the user's, not the checkout's: the script once cd'ed into the repository, where
    "bad.yaml" is no file. (The config is bad on purpose: its problems are listed, so it was found and read.)"""
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"dataset": {"path": "missing.jsonl"},
                                                       "policy": {"type": "endpoint", "model": "m",
                                                                  "base_url": "localhost:8000"},
                                                       "search": {"index": "none"}}))
    r = subprocess.run(["bash", str(SCRIPTS / "eval.sh"), "bad.yaml", "--no-progress"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env=dict(os.environ))
    assert r.returncode == 2, r.stderr
    assert "bad.yaml: " in r.stderr and "dataset.path: no such file missing.jsonl" in r.stderr, r.stderr


@pytest.mark.parametrize("script,args,expected", [
    ("eval.sh", ["c.yaml", "--limit", "3"], "-m agentic_rag.cli eval --config c.yaml --limit 3"),
    ("score.sh", ["p.jsonl"], "-m agentic_rag.cli score --predictions p.jsonl"),
    ("report.sh", ["r.md", "a", "b"], "-m agentic_rag.cli eval-report --out r.md --runs a b"),
])
def test_every_evaluation_script_reads_dotenv(tmp_path, script, args, expected):
    """A copy of the scripts under a project root with a .env and a stand-in interpreter that prints what
    it got: each script passes the .env variable on; the environment wins over the file."""
    (tmp_path / "script" / "evaluation").mkdir(parents=True)
    shutil.copy(ROOT / "script" / "_common.sh", tmp_path / "script" / "_common.sh")
    shutil.copy(SCRIPTS / script, tmp_path / "script" / "evaluation" / script)
    (tmp_path / ".env").write_text("EVAL_DOTENV_MARKER=from-dotenv\nEVAL_DOTENV_OTHER=file\n")
    fake = tmp_path / "fake-python"
    fake.write_text('#!/usr/bin/env bash\necho "$EVAL_DOTENV_MARKER|$EVAL_DOTENV_OTHER|$*"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVAL_DOTENV_")}
    env.update(PYTHON=str(fake), AGENTIC_RAG_NO_VENV="1", EVAL_DOTENV_OTHER="environment")
    r = bash(script, *args, env=env, root=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"from-dotenv|environment|{expected}"
