"""Smoke runs of the wiki task's experiment scripts (experiments/wiki, issue 59): each runs its real code path end to
end on one tiny wiki quick start (8 training and 8 validation questions of the real 2Wiki data, the tiny
from-scratch model, one SFT epoch, one GRPO step) and its last line is parsed as the JSON object its records use.

The numbers mean nothing (the tiny model never answers right); that each script runs against a quick start's real
outputs, and prints and records the keys experiments/wiki/README.md reads, is the point. The scripts that train or
evaluate take ``--tiny`` for such a quick start and write their records under tmp_path, never into experiments/.

Not run here: ``device/sweep.py`` (the real model hardcoded, its search the bm25s stand-in of
``device/sitecustomize.py``, which needs bm25s and PyStemmer, not installed; a real-model GRPO step is minutes on 2
cores) and ``device/part_sft.py`` (the real model's SFT hardcoded, and ``/tmp`` paths; it does run on a CPU, but its
one smallest step took over a minute here, beyond this file's budget). Both keep their compile check in
test_experiment_scripts.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rag.data.wiki import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT / "experiments" / "wiki"

pytestmark = pytest.mark.skipif(not (shared_data_dir() / "hipporag").is_dir(), reason="needs ../shared/data")


def run(args: list[str], cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


def last_json(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def view(quickstart: Path, at: Path, names: tuple[str, ...]) -> Path:
    """A folder that shows the quick start's ``names`` (linked, read only by the script) and keeps what the script
    writes apart from the shared quick start."""
    at.mkdir()
    for name in names:
        (at / name).symlink_to(quickstart / name)
    return at


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    """The tiny wiki quick start (no ablation rows: no script here reads them)."""
    out = tmp_path_factory.mktemp("wiki_smoke") / "qs"
    proc = run(["-m", "agentic_rag.demo.quickstart", "--task", "wiki", "--tiny", "--questions", "8", "--steps", "1",
                "--sft-epochs", "1", "--no-ablations", "--out", out], timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def recipe_run(quickstart, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """recipes.py's shipped recipe cut to one step: (the process, its runs folder, its record folder)."""
    where = tmp_path_factory.mktemp("wiki_recipes")
    runs, record = where / "runs", where / "record"
    proc = run([WIKI / "recipes.py", "--quickstart", quickstart, "--tiny", "--recipes", "shipped", "--seeds", "0",
                "--steps", "1", "--runs-dir", runs, "--record", record])
    return proc, runs, record


def test_recipes(recipe_run, quickstart: Path) -> None:
    proc, runs, record = recipe_run
    result = last_json(proc)
    assert set(result) == {"sft_start", "runs", "mean_final_em"}
    assert {"em", "f1", "searches", "em_multi_hop"} <= set(result["sft_start"])
    assert [(r["recipe"], r["seed"], list(r["em"])) for r in result["runs"]] == [("shipped", 0, ["1"])]
    saved = json.loads((record / "runs" / "shipped-1steps-seed0.json").read_text())
    assert saved["sets"]["algorithm.max_steps"] == "1" and saved["run"] == str(runs / "shipped-1steps-seed0")
    assert [v["step"] for v in saved["validation"]] == [1] and 0.0 <= saved["validation"][0]["eval/em"] <= 1.0
    assert len(saved["curves"]["reward"]) == 1 and "sft_start" in saved and "command" in saved
    assert (runs / "shipped-1steps-seed0" / "final").is_dir()
    # a tiny quick start is refused without --tiny (its numbers must not land among the real records)
    refused = run([WIKI / "recipes.py", "--quickstart", quickstart, "--record", record.parent / "none"])
    assert refused.returncode != 0 and "is not a real-model wiki quick start" in refused.stderr


def test_failures(quickstart: Path, recipe_run) -> None:
    """On the SFT's evaluation (observations and all) and on a training run's per-question validation file."""
    validation = quickstart / "data" / "validation.jsonl"
    multi_hop = sum(q["kind"] == "multi_hop" for q in jsonl(validation))
    counts = last_json(run([WIKI / "failures.py", quickstart / "eval" / "sft" / "predictions.jsonl", validation]))
    assert counts["questions"] == multi_hop > 0
    assert sum(v for k, v in counts.items() if k.startswith("searches_")) == multi_hop
    assert {"right", "hop1_passage_found", "answer_visible"} <= set(counts)
    _, runs, _ = recipe_run
    step = runs / "shipped-1steps-seed0" / "validation" / "step1.jsonl"
    counts = last_json(run([WIKI / "failures.py", step, validation]))
    assert counts["questions"] == multi_hop and "second_query_is_hop2" in counts and "answer_visible" not in counts


def test_headroom(quickstart: Path) -> None:
    sampled = jsonl(quickstart / "eval" / "sft_sampled_multi_hop" / "predictions.jsonl")
    result = last_json(run([WIKI / "headroom.py", quickstart / "eval" / "sft" / "predictions.jsonl",
                            quickstart / "eval" / "sft_sampled_multi_hop" / "predictions.jsonl"]))
    assert result["questions"] == len(sampled) > 0 and result["samples"] == [4]
    assert sum(result["table"].values()) == len(sampled)
    assert {"greedy_right", "greedy_wrong_some_sample_right", "greedy_right_no_sample_right"} <= set(result)


def test_answer_headroom(quickstart: Path, tmp_path: Path) -> None:
    """The tiny model never ends a rollout with an answer, so its greedy multi-hop records get one (a wrong answer
    after their own searches; the first with the gold answer in an observation): the branching then samples from
    real prefixes."""
    qs = view(quickstart, tmp_path / "qs", ("data", "index", "sft", "settings.json"))
    rows, multi_hop = [], 0
    for p in jsonl(quickstart / "eval" / "sft" / "predictions.jsonl"):
        if p["meta"]["kind"] == "multi_hop":
            seen = f" <observation> {p['gold'][0]} </observation>" if not multi_hop else ""
            p.update(finish_reason="answer", prediction="nobody", metrics={**p["metrics"], "em": 0.0},
                     trajectory=f"{p['trajectory']}{seen} <answer> nobody </answer>")
            multi_hop += 1
        rows.append(p)
    (qs / "eval" / "sft").mkdir(parents=True)
    (qs / "eval" / "sft" / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = last_json(run([WIKI / "answer_headroom.py", qs, "--tiny", "--samples", "2"]))
    assert result["questions"] == multi_hop > 1 and result["samples"] == 2
    assert result["visible"]["questions"] == 1 and result["not_visible"]["questions"] == multi_hop - 1
    assert 0 <= result["greedy_reproduced"] <= multi_hop
    assert all(0.0 <= result[g]["right_share"] <= 1.0 for g in ("visible", "not_visible"))


def test_native_sft(quickstart: Path, tmp_path: Path) -> None:
    """The tag dialect only: the tiny model's tokenizer has no chat template for the native one. The quick start's
    task and initial model are reused (linked), so the run makes its own gold trajectories, SFT and evaluation."""
    out = view(quickstart, tmp_path / "native", ("data", "index", "init"))
    result = last_json(run([WIKI / "native_sft.py", "--out", out, "--tiny", "--questions", "8", "--train-questions",
                            "4", "--sft-epochs", "1", "--dialects", "agentic"]))
    assert result["train_questions"] == 4 and list(result["rows"]) == ["agentic"]
    row = result["rows"]["agentic"]
    assert row["trajectories"] == 4 and 0.0 <= row["em"] <= 1.0 and row["sft_train_loss"] > 0
    assert {"em_multi_hop", "f1", "well_formed", "searches_per_question", "mean_completion_tokens"} <= set(row)
    assert (out / "eval" / "sft_agentic_ep1" / "summary.json").is_file()


def test_rft(quickstart: Path, tmp_path: Path) -> None:
    """Two samples a question; the tiny model answers none right, so nothing is kept and the second SFT trains on
    the SFT half's gold trajectories alone."""
    result = last_json(run([WIKI / "rft.py", "--quickstart", quickstart, "--tiny", "--samples", "2", "--record",
                            tmp_path]))
    assert result["recipe"] == "rft_samples2" and len(result["start"]) == len(result["after"]) == 2
    assert set(result["kept"]) == {"trajectories", "questions", "by_kind"}
    saved = json.loads((tmp_path / "runs" / "rft_samples2.json").read_text())
    assert saved["samples_per_question"] == 2 and saved["sampled"]["n"] == 2
    assert set(saved["sampled_by_kind"]) <= {"multi_hop", "pick_one"} and saved["sampled_by_kind"]
    assert {"flips_vs_start", "replay", "sft_start", "after", "command"} <= set(saved)
    assert (quickstart / "sft_split" / "sft_summary.json").is_file()


def test_observations(quickstart: Path, tmp_path: Path) -> None:
    """64-token observations (the config's room cut to match), one GRPO step validated at its end."""
    result = last_json(run([WIKI / "observations.py", "--quickstart", quickstart, "--tiny", "--tokens", "64",
                            "--grpo", "--steps", "1", "--validate-every", "0", "--record", tmp_path]))
    assert result["recipe"] == "obs64" and len(result["start"]) == 2
    assert list(result["runs"]) == ["grpo"] and list(result["runs"]["grpo"]) == ["1"]
    saved = json.loads((tmp_path / "runs" / "obs64_1steps.json").read_text())
    assert saved["tokens"] == 64 and saved["trajectories"]["trajectories"] == 8
    assert {"shipped_sft", "flips_vs_shipped_sft", "sft_start", "wall_s", "command"} <= set(saved)
    grpo = saved["runs"]["grpo"]
    assert grpo["sets"]["algorithm.max_steps"] == "1" and [v["step"] for v in grpo["validation"]] == [1]
    assert len(grpo["curves"]["reward"]) == 1
    config = (quickstart / "obs64" / "wiki_grpo.yaml").read_text()
    assert "max_observation_tokens: 64" in config


def test_greedy_misses(quickstart: Path) -> None:
    """Its output is the missed questions' records on stdout and their count per kind on stderr (the JSON line)."""
    predictions = quickstart / "eval" / "sft" / "predictions.jsonl"
    questions = quickstart / "data" / "validation.jsonl"
    proc = run([WIKI / "device" / "greedy_misses.py", predictions, questions])
    assert proc.returncode == 0, proc.stderr[-3000:]
    em = {p["id"]: p["metrics"]["em"] for p in jsonl(predictions)}
    rows = jsonl(questions)
    assert [json.loads(line)["id"] for line in proc.stdout.splitlines()] == [r["id"] for r in rows if em[r["id"]] < 1]
    counts = json.loads(proc.stderr.strip().splitlines()[-1])
    assert set(counts) == {r["kind"] for r in rows}
    assert sum(int(v.split(" of ")[1]) for v in counts.values()) == len(rows)
