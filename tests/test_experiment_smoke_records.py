"""Smoke runs of the experiment scripts that remake records from a quick start's output, a replayed model, the 2Wiki
pipeline, the retrieval grid and the reliability matrix (issue 59: a record is only as good as the script that
remakes it).

Each script runs in a fresh interpreter at a tiny shape, end to end through its real code, and its record is parsed:
its last stdout line as JSON where it prints one, else the file it writes (always pointed at a temporary folder,
never at the records under experiments/). The scripts that read a real-model quick start share one tiny quick start
(``--tiny``, 1 seed, 2 GRPO steps, 1 SFT epoch: tests/test_quickstart.py's shape), made once for this file: about
two minutes on 2 cores, so those tests are marked slow. The numbers of such runs mean nothing; that the scripts run
and write the keys their records use is the point.

Not run here: ``experiments/quickstart/native_runs.py`` needs a native quick start, which only the real model
(SmolLM2-135M) makes (the tiny word tokenizer has no chat template for tool calls): its SFT, a GRPO step and a greedy
evaluation of the held-out questions are minutes each on 2 CPU cores. It keeps its ``--help`` test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rag.data.wiki import shared_data_dir
from conftest import ROOT, SHARED, free_port, shared

needs_shared = pytest.mark.skipif(not (shared_data_dir() / "hipporag").is_dir(), reason="needs ../shared/data")


def run(args: list[str], timeout: int = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def ok(out: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return out


def last_json(out: subprocess.CompletedProcess) -> dict:
    return json.loads(ok(out).stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------- scripts on a quick start's output


@pytest.fixture(scope="module")
def tiny_quickstart(tmp_path_factory) -> Path:
    """A finished tiny quick start: world 0, its index, the tiny SFT model, GRPO seed 0 and its control (2 steps)."""
    out = tmp_path_factory.mktemp("quickstart") / "qs"
    ok(run(["-m", "agentic_rag.demo.quickstart", "--tiny", "--out", str(out), "--seeds", "1", "--steps", "2",
            "--sft-epochs", "1"], timeout=900))
    return out


@pytest.mark.slow
def test_record_copies_a_quick_start(tiny_quickstart: Path, tmp_path: Path) -> None:
    result = last_json(run(["experiments/quickstart/record.py", "--qs", str(tiny_quickstart),
                            "--record", str(tmp_path)]))
    assert set(result) == {"seed0-grpo", "seed0-control"}
    assert set(result["seed0-grpo"]) == {"reward", "em", "searches_per_trajectory", "model_tokens"}
    curves = json.loads((tmp_path / "training_curves.json").read_text())
    assert len(curves["seed0-grpo"]["reward"]) == 2  # two GRPO steps
    for name in ("summary.json", "reward_curve.png", "sft_sampled_behaviour.json"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.slow
def test_greedy_over_steps(tiny_quickstart: Path) -> None:
    """The quick start's GRPO (2 steps) again with a checkpoint every 2 steps: the SFT start and step 2."""
    result = last_json(run(["experiments/quickstart/greedy_over_steps.py", "--qs", str(tiny_quickstart),
                            "--every", "2"]))
    assert [p["step"] for p in result["points"]] == [0, 2] and result["seed"] == 0
    assert all(0 <= p["em"] <= 1 and p["searches_per_question"] >= 0 for p in result["points"])
    assert "first_step_past_half_the_gain" in result
    # the SFT start scores as the quick start scored it
    sft = json.loads((tiny_quickstart / "eval" / "sft" / "summary.json").read_text())
    assert result["points"][0]["em"] == sft["metrics"]["em"]


@pytest.mark.slow
def test_algorithms_compare(tiny_quickstart: Path, tmp_path: Path) -> None:
    """One preset trained (dr_grpo, the quick start's 2 steps) beside the quick start's own GRPO run (read, not
    trained again); ``--allow-tiny`` because the comparison proper is on the real model."""
    record = tmp_path / "record"
    result = last_json(run(["experiments/algorithms/compare.py", "--quickstart", str(tiny_quickstart), "--seeds", "0",
                            "--algorithms", "grpo (recipe),dr_grpo", "--runs-dir", str(tmp_path / "runs"),
                            "--record", str(record), "--allow-tiny"]))
    assert result["world_seed"] == 0 and 0 <= result["em_sft"] <= 1
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert set(rows) == {"grpo (recipe)", "dr_grpo"}
    for row in rows.values():
        assert row["seeds"] == [0] and 0 <= row["em_mean"] <= 1 and row["searches_per_question"] >= 0
        assert {"gain_over_sft_mean", "entropy_last", "searches_per_trajectory_last", "train_runtime_s",
                "extra_rollouts"} <= set(row)
    assert (tmp_path / "runs" / "world0" / "dr_grpo-seed0" / "final" / "adapter_config.json").is_file()
    done = json.loads((record / "runs" / "world0" / "dr_grpo-seed0.json").read_text())
    assert done["overrides"] == {"algorithm.scale_rewards": "null", "algorithm.name": "dr_grpo"}
    table = (record / "world0" / "table.md").read_text()
    assert "| grpo (recipe) |" in table and "| dr_grpo |" in table
    assert (record / "world0" / "curves.png").stat().st_size > 0
    # without --allow-tiny the tiny quick start is refused in one line
    refused = run(["experiments/algorithms/compare.py", "--quickstart", str(tiny_quickstart), "--seeds", "0",
                   "--runs-dir", str(tmp_path / "runs"), "--record", str(record)])
    assert refused.returncode != 0 and "--tiny quick start" in refused.stderr


@pytest.mark.slow
def test_sampling_temperature(tiny_quickstart: Path) -> None:
    out = ok(run(["experiments/real_model/sampling_temperature.py", "--quickstart", str(tiny_quickstart),
                  "--world-seed", "0", "--temperatures", "1.0,1.3", "--questions", "2", "--samples", "2"]))
    lines = [json.loads(line) for line in out.stdout.strip().splitlines() if line.startswith("{")]
    assert [r["temperature"] for r in lines] == [1.0, 1.3]
    for r in lines:
        assert r["rollouts"] == 4
        for key in ("two_searches_rate", "em_sampled", "answered", "questions_with_a_right_sample"):
            assert 0 <= r[key] <= 1


@pytest.mark.slow
def test_sft_batching(tiny_quickstart: Path, tmp_path: Path) -> None:
    """The SFT again from the quick start's world (the tiny model's: 16 expert trajectories), measured greedily and
    sampled (1 sample of each two-hop question); no GRPO seed."""
    out = tmp_path / "sft_batching"
    result = last_json(run(["experiments/real_model/sft_batching.py", "--quickstart", str(tiny_quickstart),
                            "--world-seed", "0", "--out", str(out), "--seeds", "", "--sft-examples", "16",
                            "--behaviour-samples", "1"]))
    assert result["runs"] == {} and result["sft_s"] > 0 and 0 <= result["sft_greedy_em"] <= 1
    assert result["sft_sampled_two_hop"]["samples_per_question"] == 1
    assert 0 <= result["sft_sampled_two_hop"]["two_searches_rate"] <= 1
    assert json.loads((out / "sft" / "sft_summary.json").read_text())["expert_trajectories"]["trajectories"] == 16


@needs_shared
@pytest.mark.slow
def test_results_table(tiny_quickstart: Path, index_dir: Path, tmp_path: Path) -> None:
    """The table's four rows on 2 world and 2 2Wiki questions, the 2Wiki ones over a 60-passage index."""
    record = tmp_path / "record"
    ok(run(["experiments/real_model/table.py", "--quickstart", str(tiny_quickstart), "--record", str(record),
            "--wiki-index", str(index_dir), "--limit-world", "2", "--limit-2wiki", "2", "--data", str(SHARED)]))
    table = json.loads((record / "table.json").read_text())
    assert len(table["results"]) == 4 and table["limit_2wiki"] == 2 and table["seed"] == 0
    for per in table["results"].values():
        assert set(per) == {"world held-out", "2WikiMultiHopQA dev"}
        for r in per.values():
            assert r["n"] == 2 and {"em", "f1", "well_formed", "searches"} <= set(r)
    assert (record / "table.md").read_text().count("\n") == 6  # header, rule, 4 rows


# ------------------------------------------------------------------------------------------ evaluation, pipelines


@needs_shared
def test_tiny_model(tmp_path: Path) -> None:
    result = last_json(run(["experiments/evaluation/tiny_model.py", "--out", str(tmp_path / "tiny")]))
    config = json.loads(Path(result["model"], "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    adapter = json.loads(Path(result["adapter"], "adapter_config.json").read_text())
    assert adapter["r"] == 8 and set(adapter["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}


@needs_shared
def test_replay_server_through_the_evaluation(tmp_path: Path, tiny_model_dir: Path, index_dir: Path) -> None:
    """R1-Searcher's first 3 recorded rollouts served by the replay and evaluated as run_replay.sh does: the
    model's turns are fixed, so the answers are the released ones (2 of 3 exact)."""
    rows = shared("r1-searcher/eval_results/hotpotqa_llama.jsonl").read_text().splitlines()[:3]
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("\n".join(rows) + "\n")
    port = free_port()
    server = subprocess.Popen([sys.executable, "experiments/evaluation/replay_server.py", "--rollouts",
                               str(rollouts), "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None and "replaying 3 rollouts" in server.stdout.readline()
        out = ok(run(["-m", "agentic_rag.cli", "--log-level", "WARNING", "eval", "--config",
                      "experiments/evaluation/replay_r1searcher.yaml", "--no-progress",
                      "--set", f"dataset.path={rollouts}", "--set", f"policy.base_url=http://127.0.0.1:{port}/v1",
                      "--set", f"policy.tokenizer={tiny_model_dir}", "--set", f"search.index={index_dir}",
                      "--output-dir", str(tmp_path / "eval")]))
    finally:
        server.terminate()
        server.wait(timeout=30)
    summary = json.loads(next(line for line in reversed(out.stdout.splitlines()) if line.startswith("{")))
    released = [json.loads(r) for r in rows]
    assert summary["n"] == 3 and summary["answered"] == 3
    assert summary["metrics"]["em"] == pytest.approx(sum(r["pred_ans"] == r["answer"] for r in released) / 3)
    predictions = [json.loads(line) for line in (tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["prediction"] for p in predictions) == sorted(r["pred_ans"] for r in released)


@needs_shared
def test_pipeline_2wiki_prepare(tmp_path: Path, index_dir: Path) -> None:
    out = tmp_path / "prep"
    result = last_json(run(["experiments/pipeline_2wiki/prepare.py", "--data", str(SHARED), "--index",
                            str(index_dir), "--out", str(out), "--train", "4", "--dev", "2"]))
    assert result["train"] == 4 and result["dev"] == 2
    assert result["experts"]["trajectories"] == 4 and result["experts"]["not_ending_as_scripted"] == 0
    assert len((out / "sft_data.jsonl").read_text().splitlines()) == 4
    assert (out / "init" / "config.json").is_file() and len((out / "dev.jsonl").read_text().splitlines()) == 2


@needs_shared
def test_hybrid_grid(tmp_path: Path, wiki_index: Path, dev_questions: Path) -> None:
    """The grid on the first 20 dev questions (whose gold passages the test index holds), 10 to tune on."""
    questions = tmp_path / "dev20.json"
    questions.write_text(json.dumps(json.loads(dev_questions.read_text())[:20]))
    out = ok(run(["experiments/retrieval/hybrid_grid.py", "--index", str(wiki_index), "--questions", str(questions),
                  "--tune", "10"]))
    lines = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert len(lines) == 2 * (2 + 18)  # per split: bm25, dense, and 2 fusions x 3 alphas x 3 depths
    assert {r["split"] for r in lines} == {"tune_first10", "heldout_last10"}
    assert all(0 <= r[k] <= 1 for r in lines for k in ("k5", "k10", "k20"))
    assert {"fusion", "alpha", "depth"} <= set(lines[-1]) and lines[-1]["retriever"] == "hybrid"


# ------------------------------------------------------------------------------------------------- reliability


@needs_shared
@pytest.mark.slow
def test_reliability_cases(tmp_path: Path) -> None:
    """Two cheap cases, a user slip's control and one of round 4 (``hostile.py``'s work-folder class), on fixtures
    built from scratch in a temporary cache."""
    listed = ok(run(["experiments/reliability/cases.py", "--list", "--only", "round4"])).stdout.splitlines()
    assert listed[-1].startswith("32 cases;")  # hostile.py's round 4
    out = tmp_path / "cases.json"
    done = ok(run(["experiments/reliability/cases.py", "--src", str(ROOT / "src"), "--out", str(out),
                   "--cache", str(tmp_path / "cache"), "--python", sys.executable,
                   "--only", "score/control,corpus-build/partial-user-file"]))
    result = json.loads(out.read_text())
    assert json.loads(done.stderr.strip().splitlines()[-1]) == result["meta"]["verdicts"] == {"ok": 2}
    cases = {c["id"]: c for c in result["cases"]}
    assert set(cases) == {"score/control", "corpus-build/partial-user-file"}
    assert cases["corpus-build/partial-user-file"]["class"] == "work-folder"
    assert cases["corpus-build/partial-user-file"]["files_intact"] is True
    assert result["meta"]["fixtures_changed"] == []


@needs_shared
@pytest.mark.slow
def test_shutdown_under_load(tmp_path: Path) -> None:
    """Both servers, 2 clients each, SIGTERM 1 s in, replies of 8 tokens: every request answered or refused in the
    API's shape and a clean exit, as the record says."""
    result = last_json(run(["experiments/reliability/shutdown_load.py", "--servers", "search,chat", "--clients", "2",
                            "--sigterm-after", "1", "--grace-s", "3", "--chat-max-tokens", "8"]))
    assert result["benchmark"] == "shutdown_load"
    for server in ("search", "chat"):
        r = result[server]
        assert r["exit_code"] == 0 and r["sigterm_to_exit_s"] is not None
        assert r["totals"]["ok"] > 0 and r["totals"]["improper_error"] == 0 and r["totals"]["reset"] == 0
        assert r["in_flight_at_sigterm"] == sum(r["in_flight"].values())
