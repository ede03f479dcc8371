"""The wiki recipe search's split (experiments/wiki/recipes.py): the SFT half and the GRPO half of the training
questions are disjoint, cover the file, and keep each kind's share; the rejection-sampling experiment's choice of
samples (experiments/wiki/rft.py); the longer-observation experiment's config (experiments/wiki/observations.py)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "wiki"))

import recipes  # noqa: E402

from agentic_rag.demo import wiki  # noqa: E402


def test_split_halves_are_disjoint_and_stratified(tmp_path: Path) -> None:
    kinds = ["multi_hop"] * 7 + ["pick_one"] * 4 + ["yes_no"] * 3
    rows = [{"id": f"q{i}", "kind": k, "question": f"question {i}?"} for i, k in enumerate(kinds)]
    (tmp_path / "data").mkdir()
    s = wiki.WikiSettings(out=tmp_path, seeds=[0])
    s.train_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft_half, grpo_half = recipes.split_halves(s)
    ids = [[json.loads(line)["id"] for line in half] for half in (sft_half, grpo_half)]
    assert not set(ids[0]) & set(ids[1]) and sorted(ids[0] + ids[1]) == sorted(r["id"] for r in rows)
    count = [Counter(json.loads(line)["kind"] for line in half) for half in (sft_half, grpo_half)]
    assert count[0] == Counter(multi_hop=4, pick_one=2, yes_no=2)
    assert count[1] == Counter(multi_hop=3, pick_one=2, yes_no=1)
    assert ids[0][:3] == ["q0", "q2", "q4"]  # every other question of a kind, in file order


def test_split_recipe_trains_on_the_grpo_half_of_its_kinds(tmp_path: Path) -> None:
    kinds = ["multi_hop", "pick_one", "multi_hop", "yes_no", "multi_hop", "multi_hop"]
    (tmp_path / "data").mkdir()
    s = wiki.WikiSettings(out=tmp_path, seeds=[0])
    s.train_file.write_text("".join(json.dumps({"id": f"q{i}", "kind": k}) + "\n" for i, k in enumerate(kinds)))
    recipes.grpo_half_file(s).write_text("".join(recipes.split_halves(s)[1]))
    sets = recipes.recipe_sets(s, "split_answer_branch_multi_lr3e4")
    assert [json.loads(line)["id"] for line in open(sets["data.train_file"])] == ["q2", "q5"]
    assert Path(recipes.recipe_sets(s, "split_shipped")["data.train_file"]).name == "train_grpo_half.jsonl"
    assert "data.train_file" not in recipes.recipe_sets(s, "shipped")


def test_rejection_sampling_keeps_right_distinct_searching_samples_and_the_control_as_many(tmp_path: Path) -> None:
    import rft

    def sample(answer: str, em: float, queries: list[str], finish: str = "answer") -> dict:
        return {"prediction": answer, "metrics": {"em": em}, "finish_reason": finish, "queries": queries}

    recs = [
        {"id": "a", "meta": {"kind": "multi_hop"}, "samples": [
            sample("Paris", 1.0, ["X", "Y"]), sample("Paris", 1.0, ["X", "Y"]),  # the same search and answer: once
            sample("Paris", 1.0, ["X", "Z"]), sample("Lyon", 0.0, ["X"])]},
        {"id": "b", "meta": {"kind": "pick_one"}, "samples": [
            sample("Bob", 1.0, []),  # right without searching: not kept
            sample("Bob", 1.0, ["B"], finish="max_turns"), sample("Al", 0.0, ["A"]), sample("Al", 0.0, ["A"])]},
        {"id": "c", "meta": {"kind": "multi_hop"}, "samples": [sample("1900", 1.0, ["C"])]},
    ]
    preds = tmp_path / "predictions.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in recs))
    picks = rft.chosen(preds, control=False)
    assert [(rec["id"], [(x["prediction"], x["queries"]) for x in keep]) for rec, keep in picks] == [
        ("a", [("Paris", ["X", "Y"]), ("Paris", ["X", "Z"])]), ("c", [("1900", ["C"])])]
    control = rft.chosen(preds, control=True)  # as many per question, drawn among its answered samples that searched
    assert [(rec["id"], len(keep)) for rec, keep in control] == [("a", 2), ("c", 1)]
    assert all(x in [y for y in rec["samples"] if y["queries"] and y["finish_reason"] == "answer"]
               for rec, keep in control for x in keep)
    assert rft.chosen(preds, control=True) == control  # seeded

    (tmp_path / "data").mkdir()
    s = wiki.WikiSettings(out=tmp_path, seeds=[0])
    train = [{"id": i, "question": f"Question {i}?", "answer": "gold", "kind": "multi_hop", "type": "compositional"}
             for i in "abc"]
    s.train_file.write_text("".join(json.dumps(r) + "\n" for r in train))
    out = tmp_path / "questions.jsonl"
    assert rft.scripted_questions(s, picks, out) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"id": "a-s0", "question": "Question a?", "answer": "Paris", "kind": "multi_hop",
                       "type": "compositional", "hop_queries": ["X", "Y"]}
    assert [(r["id"], r["hop_queries"], r["answer"]) for r in rows[1:]] == [("a-s1", ["X", "Z"], "Paris"),
                                                                         ("c-s0", ["C"], "1900")]


def test_longer_observation_config_keeps_room_for_four_searches_and_drives_the_pipeline(tmp_path: Path) -> None:
    import observations

    from agentic_rag.training.config import load_config

    path = observations.write_config(256, tmp_path / "obs256" / "wiki_grpo.yaml")
    shipped = load_config(wiki.WIKI_CONFIG, env={}, check_files=False)
    cfg = load_config(path, env={}, check_files=False)
    assert shipped.rollout.max_observation_tokens == 128
    assert cfg.rollout.max_observation_tokens == 256
    assert cfg.rollout.max_completion_tokens == shipped.rollout.max_completion_tokens + 4 * 128
    assert cfg.algorithm.learning_rate == shipped.algorithm.learning_rate and cfg.rewards == shipped.rewards
    # trajectories, SFT, evaluations and training runs all take their rollout limits from the settings' config
    s = observations.ObservationSettings(out=tmp_path, seeds=[0], config=path)
    assert s.train_config == path and wiki._rollout(s).max_observation_tokens == 256
    assert wiki._rollout(wiki.WikiSettings(out=tmp_path, seeds=[0], fast=True)).max_observation_tokens == 128
    # the quick start's default is the best measured recipe: 256-token observations, token F1, 16 steps
    best = wiki.WikiSettings(out=tmp_path, seeds=[0])
    assert best.train_config == wiki.WIKI_BEST_CONFIG and wiki._rollout(best).max_observation_tokens == 256
    cfg = load_config(best.train_config, env={}, check_files=False)
    assert [r.name for r in cfg.rewards] == ["f1", "format"] and cfg.algorithm.max_steps == 16
    assert cfg.model.gradient_checkpointing and cfg.sampling.max_batch_size == 32
    assert cfg.rollout.max_completion_tokens == shipped.rollout.max_completion_tokens + 4 * 128


def test_a_longer_observation_run_goes_on_from_the_shorter_runs_checkpoint(tmp_path: Path) -> None:
    import observations
    import pytest

    from agentic_rag.training.checkpoints import COMPLETE_MARKER, latest_complete_checkpoint

    runs = tmp_path / "runs"
    with pytest.raises(SystemExit, match="grpo-seed1/checkpoint-8 is not a complete checkpoint"):
        observations.continue_run(runs, "grpo", 1, 8, 12)
    short = runs / "grpo-seed1"
    (short / "checkpoint-8").mkdir(parents=True)
    (short / "checkpoint-8" / "trainer_state.json").write_text(json.dumps({"global_step": 8}))
    with pytest.raises(SystemExit, match="checkpoint-8 is not a complete checkpoint"):  # no completion marker yet
        observations.continue_run(runs, "grpo", 1, 8, 12)
    (short / "checkpoint-8" / COMPLETE_MARKER).write_text("")
    (short / "checkpoint-6").mkdir()
    (short / "checkpoint-6" / COMPLETE_MARKER).write_text("")
    (runs / "grpo-12steps-seed1" / "checkpoint-8.partial").mkdir(parents=True)  # a copy killed half way
    (short / "validation").mkdir()
    (short / "validation" / "step8.jsonl").write_text("{}\n")
    (short / "validation.jsonl").write_text('{"step": 8}\n')
    (short / "final").mkdir()
    observations.continue_run(runs, "grpo", 1, 8, 12)
    longer = runs / "grpo-12steps-seed1"
    # the step-8 checkpoint (what train_run resumes from) and the validations so far; not the finished adapter
    assert latest_complete_checkpoint(longer, quarantine=False) == str(longer / "checkpoint-8")
    assert sorted(p.name for p in longer.iterdir()) == ["checkpoint-8", "validation", "validation.jsonl"]
    assert (longer / "validation" / "step8.jsonl").is_file()
    assert (longer / "checkpoint-8" / "trainer_state.json").read_text() == '{"global_step": 8}'
    # once the longer run has checkpoints of its own, they are left alone
    (longer / "checkpoint-10").mkdir()
    (longer / "checkpoint-10" / COMPLETE_MARKER).write_text("")
    (longer / "validation.jsonl").write_text('{"step": 8}\n{"step": 10}\n')
    observations.continue_run(runs, "grpo", 1, 8, 12)
    assert (longer / "validation.jsonl").read_text().count("step") == 2
    with pytest.raises(SystemExit, match="must lie between"):
        observations.continue_run(runs, "grpo", 1, 12, 12)
    assert observations.run_folder("control", 8, 2) == "control-seed2"
    # another reward's runs live in folders of their own, and go on from their own shorter runs
    assert observations.run_folder("grpo", 8, 1, "f1") == "grpo-f1-seed1"
    assert observations.run_folder("control", 12, 0, "f1") == "control-f1-12steps-seed0"
    with pytest.raises(SystemExit, match="grpo-f1-seed1/checkpoint-8 is not a complete checkpoint"):
        observations.continue_run(runs, "grpo", 1, 8, 12, "f1")


def test_the_f1_observation_runs_are_rewarded_by_f1_and_format() -> None:
    import observations

    from agentic_rag.training.config import load_config

    sets = {"rewards": observations.REWARDS["f1"]["rewards"]}
    cfg = load_config(observations.wiki.WIKI_CONFIG, overrides=[f"{k}={v}" for k, v in sets.items()],
                      check_files=False)
    assert [(r.name, r.weight) for r in cfg.rewards] == [("f1", 1.0), ("format", 0.2)]
    assert observations.REWARDS["em"] == {}


def test_std_scaled_observation_runs_train_with_the_grpo_papers_advantage_in_folders_of_their_own() -> None:
    import observations

    from agentic_rag.training.algorithms import algorithm_args
    from agentic_rag.training.config import load_config

    assert observations.run_folder("grpo", 12, 0, "f1", 1, "group") == "grpo-f1-stdgroup-12steps-seed0"
    assert observations.run_folder("control", 8, 1, "f1", 3, "group") == "control-f1-mh3-stdgroup-seed1"
    assert observations.run_folder("grpo", 12, 0, "f1", 1, "none") == "grpo-f1-12steps-seed0"  # the recipe's: as before
    sets = {**observations.REWARDS["f1"], "algorithm.scale_rewards": "group"}
    cfg = load_config(observations.wiki.WIKI_CONFIG, overrides=[f"{k}={v}" for k, v in sets.items()],
                      check_files=False)
    shipped = load_config(observations.wiki.WIKI_CONFIG, check_files=False)
    assert shipped.algorithm.scale_rewards == "none" and cfg.algorithm.scale_rewards == "group"
    assert algorithm_args(cfg.algorithm.name, scale_rewards=cfg.algorithm.scale_rewards)["scale_rewards"] == "group"


def test_low_memory_observation_runs_checkpoint_and_cap_only_the_validations_rows() -> None:
    import observations

    from agentic_rag.training.config import load_config
    from agentic_rag.training.trainer import VALIDATION_ROWS

    path = observations.wiki.WIKI_CONFIG
    cfg = load_config(path, overrides=[f"{k}={v}" for k, v in observations.LOW_MEMORY.items()], check_files=False)
    shipped = load_config(path, check_files=False)
    assert not shipped.model.gradient_checkpointing and shipped.sampling.max_batch_size is None
    assert cfg.model.gradient_checkpointing
    # a step's rollouts still decode as one batch; the greedy validation decodes fewer rows at once than it would
    step_rollouts = cfg.algorithm.per_device_train_batch_size * cfg.algorithm.gradient_accumulation_steps
    assert step_rollouts <= cfg.sampling.max_batch_size < VALIDATION_ROWS


def test_the_f1_ragas_observation_runs_also_pay_for_finding_the_hop_two_passage() -> None:
    import observations

    from agentic_rag.rewards.rag import RetrievalQuality, RetrievedContext
    from agentic_rag.training.config import load_config

    sets = {"rewards": observations.REWARDS["f1_ragas"]["rewards"]}
    cfg = load_config(observations.wiki.WIKI_CONFIG, overrides=[f"{k}={v}" for k, v in sets.items()],
                      check_files=False)
    assert [(r.name, r.weight, dict(r.params)) for r in cfg.rewards] == [
        ("f1", 1.0, {}), ("format", 0.2, {}), ("ragas", 0.5, {"metric": "id_recall"})]
    assert observations.run_folder("grpo", 8, 2, "f1_ragas") == "grpo-f1_ragas-seed2"
    # a real 2Wiki training question's gold titles: the hop-1 passage alone earns half, both hops all of it
    gold = ["Charles Mathew", "James Charles Mathew"]
    one_hop = RetrievedContext("Where was the place of burial of Charles Mathew's father?", "Cork",
                               ["Charles Mathew"], ["..."], gold)
    two_hops = RetrievedContext(one_hop.question, "Cork", ["Charles Mathew", "James Charles Mathew"], ["...", "..."],
                                gold)
    assert RetrievalQuality("id_recall").score_batch([one_hop, two_hops]) == [0.5, 1.0]


def test_an_observation_record_gives_the_settings_a_run_trained_with(tmp_path: Path) -> None:
    import observations
    import yaml

    run = tmp_path / "grpo-f1-seed1"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"logging": {"validation_every": 4}, "algorithm": {"max_steps": 8},
                                                     "rewards": [{"name": "f1", "weight": 1.0}]}))
    # a later call with --validate-every 8 found the run finished: the record keeps what it ran with
    sets = {"logging.validation_every": 8, "algorithm.max_steps": 8, "algorithm.shuffle_rewards": "true"}
    assert observations.run_settings(run, sets) == {
        "logging.validation_every": "4", "algorithm.max_steps": "8", "algorithm.shuffle_rewards": "None"}
    assert observations.run_settings(run, ["rewards"]) == {"rewards": "[{'name': 'f1', 'weight': 1.0}]"}


def test_the_multi_hop_weighted_pool_repeats_only_multi_hop_questions(tmp_path: Path) -> None:
    import observations
    import pytest

    from agentic_rag.data.questions import read_questions

    rows = [{"id": f"q{i}", "question": f"Question {i}?", "answers": [f"a{i}"], "kind": kind}
            for i, kind in enumerate(["multi_hop", "pick_one", "yes_no", "multi_hop"])]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert observations.weighted_train_file(train, 1) == train
    path = observations.weighted_train_file(train, 3)
    assert path == tmp_path / "train_mh3.jsonl"
    # what the trainer reads: each multi-hop question three times, the others once, in the file's order
    ids = [q.id for q in read_questions(str(path))]
    assert ids == ["q0", "q0", "q0", "q1", "q2", "q3", "q3", "q3"]
    assert Counter(json.loads(line)["kind"] for line in path.read_text().splitlines()) == {
        "multi_hop": 6, "pick_one": 1, "yes_no": 1}
    # its runs and records are named apart from the unweighted ones
    assert observations.run_folder("grpo", 12, 1, "f1", 2) == "grpo-f1-mh2-12steps-seed1"
    assert observations.run_folder("control", 8, 0, "em", 2) == "control-mh2-seed0"
    # the record's stem carries the same tags: obs256_f1_mh3.json; the EM runs' none (obs256.json)
    assert observations.variant("f1", 3) == ["f1", "mh3"] and observations.variant() == []
    with pytest.raises(SystemExit, match="grpo-f1-mh2-seed1/checkpoint-8 is not a complete checkpoint"):
        observations.continue_run(tmp_path / "runs", "grpo", 1, 8, 12, "f1", 2)


def test_the_gpu_screen_recipes_load_and_its_256_token_runs_are_the_cpu_runs(tmp_path: Path, monkeypatch) -> None:
    """Every recipe of the GPU screen (experiments/wiki/device/sweep.py) is a set of overrides the real config loader
    accepts, and the o256 recipes train with the 256-token observation config and F1 reward of observations.py, so
    the screen's runs are the CPU runs' recipe (its training files are placeholders filled on the device)."""
    monkeypatch.syspath_prepend(str(ROOT / "experiments" / "wiki" / "device"))  # sweep.py, for this test only
    import observations
    import sweep
    import yaml

    from agentic_rag.training.config import load_config

    for sets in sweep.RECIPES.values():
        overrides = [f"{k}={v}" for k, v in sets.items() if k != "data.train_file"]
        load_config(wiki.WIKI_CONFIG, overrides=overrides, check_files=False)  # raises on a key or value it refuses
    cpu = yaml.safe_load(observations.write_config(256, tmp_path / "wiki_grpo.yaml").read_text())
    gpu = load_config(wiki.WIKI_CONFIG, overrides=[f"{k}={v}" for k, v in sweep.RECIPES["o256_f1"].items()],
                      check_files=False)
    assert gpu.rollout.max_observation_tokens == cpu["rollout"]["max_observation_tokens"] == 256
    assert gpu.rollout.max_completion_tokens == cpu["rollout"]["max_completion_tokens"]
    assert [(r.name, r.weight) for r in gpu.rewards] == [("f1", 1.0), ("format", 0.2)]
    assert gpu.algorithm.learning_rate == 1e-4 and gpu.algorithm.num_generations == 4
    assert sweep.RECIPES["o256_f1_control"]["algorithm.shuffle_rewards"] == "true"
