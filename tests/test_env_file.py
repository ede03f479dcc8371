"""Every script that reads .env honours ENV_FILE, refuses an ENV_FILE that does not exist, and stops at a malformed
line, naming the file and the line number but never the line (it may be a secret pasted without its name).

The scripts run for real; only the interpreter they end in is a stub that prints what it was given, so each case
takes milliseconds."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPTS = {  # script -> the arguments it needs to reach its interpreter
    "script/run_server.sh": [],
    "script/evaluation/eval.sh": ["config.yaml"],
    "script/evaluation/score.sh": ["predictions.jsonl"],
    "script/evaluation/report.sh": ["report.md", "run"],
    "script/training/train_zero2.sh": ["c.yaml"],
    "script/training/train_zero3.sh": ["c.yaml"],
}
SECRET = "sk-pasted-without-a-name-77aa"


def run(script: str, tmp_path: Path, **env_vars: str) -> subprocess.CompletedProcess:
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\necho "FROM_FILE=$FROM_FILE"\n')
    stub.chmod(0o755)
    (tmp_path / "c.yaml").write_text("{}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ENV_FILE", "FROM_FILE")}
    env.update(AGENTIC_RAG_NO_VENV="1", PYTHON=str(stub), USE_CPU="1", **env_vars)
    args = [str(tmp_path / a) for a in SCRIPTS[script]]  # the scripts cd to the project root
    return subprocess.run(["bash", str(ROOT / script), *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_env_file_is_read_by_every_script(script, tmp_path):
    env_file = tmp_path / "other.env"
    env_file.write_text("# settings for another machine\nexport FROM_FILE=other-env\n\nUNUSED = spaced\n")
    out = run(script, tmp_path, ENV_FILE=str(env_file))
    assert out.returncode == 0, out.stderr
    assert "FROM_FILE=other-env" in out.stdout


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_missing_env_file_and_a_malformed_line_stop_the_script(script, tmp_path):
    out = run(script, tmp_path, ENV_FILE=str(tmp_path / "missing.env"))
    assert out.returncode == 2 and "missing.env, which is not a file" in out.stderr
    assert "FROM_FILE=" not in out.stdout  # the interpreter never ran

    env_file = tmp_path / "bad.env"
    env_file.write_text(f"FROM_FILE=ok\n# a comment\n{SECRET}\n")
    out = run(script, tmp_path, ENV_FILE=str(env_file))
    assert out.returncode == 2
    assert f"{env_file} line 3 is not KEY=VALUE" in out.stderr
    assert SECRET not in out.stderr + out.stdout
    assert "FROM_FILE=" not in out.stdout


def test_a_copy_of_the_template_runs_every_default(tmp_path):
    """``cp .env_format .env`` is what a new user does first: every KEY= line must mean "unset, use the default", not
    an empty value (an empty AGENTIC_RAG_LOG_LEVEL stopped every command with a traceback; an empty
    AGENTIC_RAG_JVM_HEAP killed the JVM). The real score command runs, through the real interpreter."""
    env_file = tmp_path / ".env"
    env_file.write_text((ROOT / ".env_format").read_text())
    predictions = tmp_path / "p.jsonl"
    predictions.write_text('{"prediction": "Paris", "answer": "Paris"}\n')
    env = {k: v for k, v in os.environ.items() if k not in ("ENV_FILE", "AGENTIC_RAG_LOG_LEVEL", "PYTHON")}
    env["ENV_FILE"] = str(env_file)
    out = subprocess.run(["bash", str(ROOT / "script/evaluation/score.sh"), str(predictions)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert '"em": 1.0' in out.stdout and "Traceback" not in out.stderr
    # and a blank value never reaches the environment, while the environment still wins over the file
    env_file.write_text("FROM_FILE=\nOTHER=  \nSET_HERE=from-file\n")
    probe = subprocess.run(["bash", "-c", f'source {ROOT}/script/_common.sh && load_dotenv {env_file} && '
                            'echo "${FROM_FILE-unset} ${OTHER-unset} $SET_HERE"'],
                           capture_output=True, text=True, env={**env, "SET_HERE": "from-env"}, timeout=60)
    assert probe.stdout.strip() == "unset unset from-env", probe.stderr
