"""The quick start's pieces and the whole pipeline, small: tokenizer, expert data, the reward-shuffling control."""

from __future__ import annotations

import collections
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentic_rag.data.world import generate_world, questions
from agentic_rag.demo.experts import expert_questions, write_expert_trajectories
from agentic_rag.demo.quickstart import SYSTEM_PROMPT, task_texts
from agentic_rag.demo.tiny import build_word_tokenizer, dialect_tags, init_tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def world_tok(tmp_path_factory, world_dir):
    world = generate_world(0)
    train, _ = questions(world)
    d = tmp_path_factory.mktemp("tok")
    tok = build_word_tokenizer(task_texts(world), d / "tokenizer")
    model_dir = init_tiny_model(tok, d / "model")
    return world, train, tok, model_dir


def test_word_tokenizer_round_trips_and_reloads_from_a_model_directory(world_tok):
    from agentic_rag.models import load_tokenizer

    world, train, tok, model_dir = world_tok
    text = "<search> Amber Iron Guild </search> Where was Dovan Kell born? born in Brouford."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert all(len(tok(tag, add_special_tokens=False)["input_ids"]) == 1 for tag in dialect_tags())
    for q in train[:20]:
        assert tok.decode(tok(q["question"], add_special_tokens=False)["input_ids"]) == q["question"]
    # a model directory with a qwen2 config: the word-level tokenizer must come back, not a byte-level BPE
    again = load_tokenizer(str(model_dir))
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    assert again.decode(ids).startswith("<search> Amber Iron Guild </search> Where was")


def test_expert_trajectories_mask_observations_and_mix_two_hop_behaviour(world_tok, world_dir, tmp_path):
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.rollout import RolloutSettings
    from agentic_rag.search import open_searcher

    world, train, tok, _ = world_tok
    people = sorted({q["supporting_facts"][0] for q in train})[:40]
    rows = expert_questions(world, people, two_hop_correct=0.25, two_hop_samples=3, seed=0)
    kinds = [r["kind"] for r in rows]
    two = [k for k in kinds if k.startswith("guild_town")]
    assert len(two) == 120 and 0.1 < kinds.count("guild_town/two_searches") / len(two) < 0.4
    info = write_expert_trajectories(
        rows, tmp_path / "sft.jsonl", tokenizer=tok, searcher=open_searcher(world_dir / "index"),
        prompt_ids=lambda q: build_prompt(tok, q, "agentic", chat=False, system=SYSTEM_PROMPT),
        settings=RolloutSettings(max_turns=4, max_searches=3, max_tokens_per_turn=24, max_completion_tokens=160,
                                 passages_per_search=1, max_observation_tokens=64))
    assert info["not_ending_as_scripted"] == 0 and info["unknown_tokens"] == 0
    lines = [json.loads(line) for line in open(tmp_path / "sft.jsonl")]
    obs_open, obs_close = (tok.convert_tokens_to_ids(t) for t in ("<observation>", "</observation>"))
    for line in lines:
        ids, mask = line["completion_ids"], line["env_mask"]
        inside = False
        for i, m in zip(ids, mask, strict=True):
            if i == obs_open:
                inside = True
            assert m == (0 if inside else 1), "observation tokens masked, every other token trained"
            if i == obs_close:
                inside = False
        searches = tok.decode(ids).count("</search>")
        assert searches == (2 if line["kind"] == "guild_town/two_searches" else 1)


def test_shuffled_rewards_keep_the_batch_distribution_and_lose_the_pairing(monkeypatch):
    from trl import GRPOTrainer

    from agentic_rag.training.trainer import AgenticGRPOTrainer

    rewards = torch.tensor([[float(i), float(10 * i)] for i in range(16)])
    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", lambda self, *a: rewards.clone())

    def trainer(shuffle: bool, seed: int):
        t = object.__new__(AgenticGRPOTrainer)
        t.agent = type("A", (), {"shuffle_rewards": shuffle})()
        t.args = type("Args", (), {"seed": seed})()
        t.state = type("State", (), {"global_step": 0})()
        t._shuffle_step, t._shuffle_calls = -1, 0
        t.reward_func_names = ["em", "format"]  # the mixed-group metric reads the first accuracy reward
        t.num_generations, t.num_generations_eval = 4, 4
        t.model = type("M", (), {"training": True})()
        t._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
        return t

    plain = trainer(False, 0)
    assert torch.equal(plain._calculate_rewards(None, [], [], []), rewards)
    # the mixed-group share is logged before any shuffling: every group of 4 has differing em rewards here
    assert plain._metrics["train"]["agentic/em_mixed_groups"] == [1.0]
    mixed_then_not = [[1.0, 0.2], [1.0, 0.2], [0.0, 0.2], [1.0, 0.2]] + [[0.0, 0.2]] * 3 + [[0.0, 0.0]]
    plain._log_mixed_groups(torch.tensor(mixed_then_not))
    assert plain._metrics["train"]["agentic/em_mixed_groups"][-1] == 0.5  # format differs, em does not: not mixed
    t = trainer(True, 0)
    first, second = (t._calculate_rewards(None, [], [], []) for _ in range(2))
    for out in (first, second):
        assert not torch.equal(out, rewards)
        assert torch.equal(out[:, 1], 10 * out[:, 0]), "all reward functions permuted together"
        assert sorted(out[:, 0].tolist()) == rewards[:, 0].tolist(), "the same rewards, so the same mean"
    assert not torch.equal(first, second), "a new permutation every batch"
    assert torch.equal(trainer(True, 0)._calculate_rewards(None, [], [], []), first), "reproducible from the seed"
    # keyed by the optimizer step, not by calls since the process started: a run resumed at step 3 draws what the
    # uninterrupted run draws at step 3 (a call counter restarting at 0 would repeat step 0's permutation)
    uninterrupted = trainer(True, 0)
    drawn = []
    for step in range(4):
        uninterrupted.state.global_step = step
        drawn.append(uninterrupted._calculate_rewards(None, [], [], []))
    resumed = trainer(True, 0)
    resumed.state.global_step = 3
    assert torch.equal(resumed._calculate_rewards(None, [], [], []), drawn[3])
    assert not torch.equal(drawn[3], drawn[0])


def test_quickstart_end_to_end_small(tmp_path):
    """The real pipeline on the tiny model (``--tiny``), shortened (1 seed, 2 GRPO steps, 1 SFT epoch): every artefact
    the README promises. The real model's pipeline is the same code; tests/test_real_model.py runs its model steps."""
    out = tmp_path / "qs"
    proc = subprocess.run([sys.executable, "-m", "agentic_rag.demo.quickstart", "--out", str(out), "--tiny",
                           "--seeds", "1", "--steps", "2", "--sft-epochs", "1"], capture_output=True, text=True,
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("em_before", "em_after", "em_control"):
        assert len(summary[key]) == 1 and 0.0 <= summary[key][0] <= 1.0
    assert summary["seeds"] == [0] and summary["settings"]["grpo_steps"] == 2
    assert 0 <= summary["sft_sampled_two_hop"]["two_searches_rate"] <= 1
    assert (out / "reward_curve.png").stat().st_size > 10_000
    for run in ("seed0-grpo", "seed0-control"):  # each run's own live log, in local (dashboard) mode
        assert (out / "runs" / run / "swanlog" / "runs.swanlab").is_file()
    assert_dashboard_serves(out / "swanlog", {"GRPO seed 0", "control seed 0"})
    for line in ("SFT (before)", "GRPO seed 0", "control seed 0", "swanlab watch", str(out / "summary.json")):
        assert line in proc.stdout
    # each training run's step lines reach the console as they happen (and its whole output its train.log)
    for run in ("seed0-grpo", "seed0-control"):
        assert f"{run} [grpo] step 1/2" in proc.stderr and f"{run} [grpo] step 2/2" in proc.stderr
        assert "[grpo] step 2/2" in (out / "runs" / run / "train.log").read_text()
    for run in ("seed0-grpo", "seed0-control"):
        assert (out / "runs" / run / "final" / "adapter_config.json").is_file()
    # a second run finds everything done and does not train again
    again = subprocess.run([sys.executable, "-m", "agentic_rag.demo.quickstart", "--out", str(out), "--tiny",
                            "--seeds", "1", "--steps", "2", "--sft-epochs", "1"], capture_output=True, text=True,
                           cwd=ROOT, timeout=300)
    assert again.returncode == 0 and json.loads((out / "summary.json").read_text())["em_after"] == summary["em_after"]
    assert "steps in" not in again.stdout


def assert_dashboard_serves(log_dir: Path, experiments: set[str]) -> None:
    """`swanlab watch LOG_DIR` (the command the quick start prints) on 127.0.0.1 lists exactly these
    experiments, each with logged metrics."""
    import socket
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    swanlab_cli = Path(sys.executable).with_name("swanlab")
    proc = subprocess.Popen([str(swanlab_cli), "watch", str(log_dir), "-h", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline, project = time.time() + 60, None
        while time.time() < deadline and project is None:
            try:
                project = httpx.get(f"http://127.0.0.1:{port}/api/v1/project", timeout=2).json()["data"]
            except (httpx.HTTPError, KeyError, ValueError):
                assert proc.poll() is None, "swanlab watch exited"
                time.sleep(0.5)
        assert project is not None, "the dashboard did not answer"
        assert {e["name"] for e in project["experiments"]} == experiments
        for e in project["experiments"]:
            charts = httpx.get(f"http://127.0.0.1:{port}/api/v1/experiment/{e['id']}/chart", timeout=5)
            assert charts.status_code == 200 and "reward" in charts.text, charts.text[:300]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_two_hop_correct_flag_reaches_the_settings_and_is_checked(tmp_path, capsys, monkeypatch):
    """``--two-hop-correct`` sets the SFT mix; out of [0, 1] it is refused, and an output directory made with
    another mix is refused by name before anything runs."""
    import os

    from agentic_rag.demo import quickstart

    # run() sets the JVM heap for its own process; keep that from leaking into the tests after this one
    monkeypatch.setenv("AGENTIC_RAG_JVM_HEAP", os.environ.get("AGENTIC_RAG_JVM_HEAP", quickstart.JVM_HEAP))

    with pytest.raises(SystemExit) as bad:
        quickstart.main(["--out", str(tmp_path / "a"), "--tiny", "--two-hop-correct", "1.5"])
    assert bad.value.code == 2 and "--two-hop-correct must be between 0 and 1" in capsys.readouterr().err
    out = tmp_path / "b"
    quickstart.check_settings(quickstart.Settings.for_tiny(out=out, seeds=[0]))  # writes settings.json: 0.25
    assert json.loads((out / "settings.json").read_text())["two_hop_correct"] == 0.25
    with pytest.raises(SystemExit) as other:
        quickstart.main(["--out", str(out), "--tiny", "--two-hop-correct", "0.4"])
    assert "two_hop_correct" in str(other.value.code) and not (out / "world").exists()


def test_the_native_format_defaults_to_its_own_sft_mix_and_16_grpo_steps(tmp_path, monkeypatch):
    """``--dialect native`` starts from the 0.15 SFT mix and trains 16 GRPO steps (the recipe whose 3 seeds each beat
    SFT with no control gaining); the tag dialect and the tiny model keep 0.25 and the config's steps; ``--steps`` and
    ``--two-hop-correct`` still override them. The steps are read off the training command the run would start."""
    from agentic_rag.demo import quickstart

    native = quickstart.Settings(out=tmp_path / "n", seeds=[0], dialect="native")
    tags = quickstart.Settings(out=tmp_path / "t", seeds=[0])
    assert (native.two_hop_correct, tags.two_hop_correct) == (0.15, 0.25)
    assert quickstart.Settings.for_tiny(out=tmp_path / "x", seeds=[0]).two_hop_correct == 0.25
    assert quickstart.Settings(out=tmp_path / "o", seeds=[0], dialect="native", two_hop_correct=0.3).two_hop_correct \
        == 0.3

    commands: list[list[str]] = []

    def fake_run(cmd, env, log, name):  # the training process, not started: its command is what is checked
        commands.append(cmd)
        Path(log).write_text("not run\n")
        return 1

    monkeypatch.setattr(quickstart, "run_logged", fake_run)
    monkeypatch.setattr(quickstart, "models_of", lambda s, sft_dir: ("base", "adapter"))
    for s in (native, tags, dataclasses.replace(native, grpo_steps=5)):
        with pytest.raises(RuntimeError, match="failed"):
            quickstart.grpo(s, tmp_path / "sft", 0, control=False)
    steps = [[a for a in cmd if a.startswith("algorithm.max_steps=")] for cmd in commands]
    assert steps == [["algorithm.max_steps=16"], [], ["algorithm.max_steps=5"]]


@pytest.mark.parametrize("make", ["tiny", "native"])
def test_settings_from_a_quick_starts_directory_are_the_ones_it_was_made_with(tmp_path, make):
    """Scripts that train more from a quick start rebuild its settings from its settings.json (``from_dir``): the
    same settings the directory was checked with, so ``check_settings`` accepts them; overrides go on top."""
    from agentic_rag.demo import quickstart

    made = tmp_path / make
    s = (dataclasses.replace(quickstart.Settings.for_tiny(out=made, seeds=[0], world_seed=2), sft_epochs=3)
         if make == "tiny" else
         quickstart.Settings(out=made, seeds=[0], dialect="native", sft_examples=64, sft_batches="by_length"))
    quickstart.check_settings(s)
    again = quickstart.Settings.from_dir(made, seeds=[1, 2], workers=s.workers)
    assert again == dataclasses.replace(s, seeds=[1, 2])
    quickstart.check_settings(again)  # accepted: nothing differs
    elsewhere = quickstart.Settings.from_dir(made, out=tmp_path / "other", sft_learning_rate=1e-4)
    assert elsewhere.out == tmp_path / "other" and elsewhere.sft_learning_rate == 1e-4 and elsewhere.tiny == s.tiny
    with pytest.raises(SystemExit, match="not a finished quick start's output"):
        quickstart.Settings.from_dir(tmp_path / "nothing")
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "settings.json").write_text(json.dumps({"task": "wiki", "tiny": True}))
    with pytest.raises(SystemExit, match="of the wiki task, not of the world task"):
        quickstart.Settings.from_dir(tmp_path / "wiki")


def test_a_directory_made_before_random_sft_batches_is_refused(tmp_path):
    """An output directory whose settings predate ``sft_batches`` (its SFT was batched by length) is refused,
    not silently reused with an SFT made the other way."""
    from agentic_rag.demo import quickstart

    out = tmp_path / "old"
    s = quickstart.Settings(out=out, seeds=[0])
    quickstart.check_settings(s)
    settings = json.loads((out / "settings.json").read_text())
    assert settings["sft_batches"] == "random"
    del settings["sft_batches"]
    (out / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(SystemExit) as old:
        quickstart.check_settings(s)
    assert "sft_batches" in str(old.value.code)


def test_sft_batches_flag_reaches_the_settings_and_bad_values_are_refused(tmp_path, capsys, monkeypatch):
    """``--sft-batches by_length`` (the SFT as it was) is a setting of its own: a directory made with random batches
    refuses it by name before anything runs; values other than the two are refused."""
    import os

    from agentic_rag.demo import quickstart

    monkeypatch.setenv("AGENTIC_RAG_JVM_HEAP", os.environ.get("AGENTIC_RAG_JVM_HEAP", quickstart.JVM_HEAP))

    with pytest.raises(ValueError, match="sft_batches"):
        quickstart.Settings(out=tmp_path / "x", seeds=[0], sft_batches="sorted")
    with pytest.raises(SystemExit) as bad:
        quickstart.main(["--out", str(tmp_path / "a"), "--sft-batches", "sorted"])
    assert bad.value.code == 2 and "--sft-batches" in capsys.readouterr().err
    with pytest.raises(SystemExit) as tiny:
        quickstart.main(["--out", str(tmp_path / "t"), "--tiny", "--sft-batches", "by_length"])
    assert tiny.value.code == 2 and "tiny model's SFT always batches at random" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
    out = tmp_path / "b"
    quickstart.check_settings(quickstart.Settings(out=out, seeds=[0]))
    with pytest.raises(SystemExit) as other:
        quickstart.main(["--out", str(out), "--sft-batches", "by_length"])
    assert "sft_batches" in str(other.value.code) and not (out / "world").exists()


def test_console_lines_are_found_behind_the_progress_bar():
    """A training process's step line often arrives glued to tqdm's bar (which ends with no newline): the quick
    start's console still shows it, from its prefix on; other output stays in train.log only."""
    from agentic_rag.demo.console import console_part

    glued = "\r 50%|#####     | 1/2 [00:08<00:08,  8.13s/it][grpo] step 1/2  reward 0.5  8.1 s/step  left 8s\n"
    assert console_part(glued) == "[grpo] step 1/2  reward 0.5  8.1 s/step  left 8s"
    assert console_part("[validation] step 4  em 0.450\n") == "[validation] step 4  em 0.450"
    assert console_part("WARNING collapse guard: entropy 0.01\n") == "WARNING collapse guard: entropy 0.01"
    assert console_part("{'loss': '0.1', 'grad_norm': '0.05'}\n") == ""


def test_dashboard_adds_the_validation_points_measured_outside_the_trainer(tmp_path):
    """The wiki runs validate neither their SFT start nor their final adapter (the quick start evaluates both):
    the dashboard logs those evaluations at steps 0 and N beside the trainer's own validation at step 2, so
    SwanLab shows the whole greedy curve."""
    from agentic_rag.demo.report import dashboard

    (tmp_path / "settings.json").write_text("{}")
    run = tmp_path / "runs" / "seed0-grpo"
    run.mkdir(parents=True)
    history = [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.6, "eval/em": 0.4}, {"step": 3, "reward": 0.7}]
    (run / "train_summary.json").write_text(json.dumps({"log_history": history}))
    evals = [{"step": 0, "eval/em": 0.3, "source": "eval/sft"}, {"step": 3, "eval/em": 0.5, "source": "eval/run"}]
    log_dir = dashboard(tmp_path, {"GRPO seed 0": run}, evals={"GRPO seed 0": evals})
    series = []
    for log in log_dir.glob("run-*/logs/*/*.log"):
        series.append([(e["index"], e["data"]) for e in map(json.loads, log.read_text().splitlines())])
    assert sorted(series) == [[(0, 0.3), (2, 0.4), (3, 0.5)], [(1, 0.5), (2, 0.6), (3, 0.7)]]


@pytest.mark.parametrize("dialect", ["native", "agentic"])
def test_the_native_quick_start_trains_with_its_own_recipe_and_room(tmp_path, monkeypatch, dialect):
    """The native format's GRPO takes 1e-4 with a 30% warm-up and wider limits (the config's 3e-4 collapsed it); a
    run's own overrides still win; the tag dialect keeps the config's settings."""
    from agentic_rag.demo import quickstart

    class Started(Exception):
        pass

    commands = []

    def started(cmd, env, log, name):
        commands.append(cmd)
        raise Started

    monkeypatch.setattr(quickstart, "run_logged", started)
    s = quickstart.Settings(out=tmp_path, seeds=[0], dialect=dialect)
    for overrides in ({}, {"algorithm.learning_rate": 3e-4}):
        with pytest.raises(Started):
            quickstart.train_run(s, tmp_path / "sft", "seed0-grpo", 0, overrides)
    sets = [dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--set") for cmd in commands]
    if dialect == "native":
        assert sets[0]["algorithm.learning_rate"] == "0.0001" and sets[0]["algorithm.warmup_ratio"] == "0.3"
        assert sets[0]["rollout.max_tokens_per_turn"] == "48" and sets[0]["rollout.max_completion_tokens"] == "320"
        assert sets[1]["algorithm.learning_rate"] == "0.0003" and sets[1]["algorithm.warmup_ratio"] == "0.3"
    else:
        assert not any(k.startswith(("algorithm.learning_rate", "algorithm.warmup", "rollout.max")) for k in sets[0])


@pytest.mark.parametrize("argv, says", [
    (["--task", "wiki", "--dialect", "native"], "--task wiki runs in the tag dialect"),
    (["--tiny", "--dialect", "native"], "--dialect native is for the world task's real model")])
def test_the_native_dialect_where_the_quick_start_cannot_run_it_is_refused_before_anything_runs(
        tmp_path, capsys, argv, says):
    """--dialect native with --task wiki used to be dropped without a word (the wiki run went on in tags)."""
    from agentic_rag.demo import quickstart

    with pytest.raises(SystemExit) as refused:
        quickstart.main(["--out", str(tmp_path / "q"), *argv])
    assert refused.value.code == 2 and says in capsys.readouterr().err and not (tmp_path / "q").exists()
