"""The scripts under experiments/ cannot rot unnoticed: a record is only as good as the script that remakes it.

Every Python script answers ``--help`` in a fresh interpreter (its imports and argument parser still work) and every
shell script parses (``bash -n``). The benchmarks that need no quick start output run for real at a tiny shape, and
their last line is parsed as the JSON object their README promises (the numbers of such a run mean nothing; that it
runs, and prints the keys the records use, is the point).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

EXPERIMENTS = ROOT / "experiments"
PYTHON_SCRIPTS = sorted(p for p in EXPERIMENTS.rglob("*.py")
                        if p.name != "sitecustomize.py" and "__pycache__" not in p.parts)
SHELL_SCRIPTS = sorted(EXPERIMENTS.rglob("*.sh"))
# scripts with no command line of their own: imported by others, or run as a whole on a lent GPU
NO_HELP = {"experiments/wiki/device/part_sft.py", "experiments/wiki/device/greedy_misses.py",
           "experiments/wiki/device/sweep.py", "experiments/reliability/hostile.py"}


def _rel(path) -> str:
    return str(path.relative_to(ROOT))


def run(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def last_json(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("script", [p for p in PYTHON_SCRIPTS if _rel(p) not in NO_HELP], ids=_rel)
def test_every_experiment_script_answers_help(script):
    out = run([str(script), "--help"], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "usage" in out.stdout.lower(), out.stdout[:500]


@pytest.mark.parametrize("script", [p for p in PYTHON_SCRIPTS if _rel(p) in NO_HELP], ids=_rel)
def test_scripts_without_a_command_line_compile(script):
    compile(script.read_text(), str(script), "exec")


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=_rel)
def test_every_experiment_shell_script_parses(script):
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_train_step_benchmark_runs():
    """The script the settings layer's rename broke (``limits``): ours against vanilla TRL, two tiny steps."""
    result = last_json(run(["experiments/benchmarks/train_step.py", "--steps", "2", "--model-tokens", "34",
                            "--obs", "16"]))
    assert result["prompt_ids_identical"] is True and result["steps"] == 2
    assert result["step_time_ratio"] > 0 and result["tokens"]["ours"]["model"] == 34


def test_rollout_benchmark_runs():
    result = last_json(run(["experiments/benchmarks/rollout.py", "--batch", "4", "--reps", "1"]))
    assert {"engine_vs_generate", "engine_vs_per_sample"} <= set(result)


def test_decode_cache_benchmark_runs():
    result = last_json(run(["experiments/benchmarks/decode_cache.py", "--rows", "2", "--prompt", "32", "--new", "4",
                            "--turns", "1", "--repeats", "1"]))
    assert result


def test_memory_fit_table_runs(tmp_path):
    result = last_json(run(["experiments/memory/fit_table.py", "--out", str(tmp_path / "fit.md")]))
    assert result and (tmp_path / "fit.md").read_text().count("|") > 50
