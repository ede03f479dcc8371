"""The 2026 presets (GSPO, CISPO, SAPO, BNPO), DAPO's dynamic sampling and overlong shaping, and the collapse guard,
on the tiny model: each loss against its paper's formula computed by hand from the same batch's log-probabilities,
dynamic sampling dropping exactly the zero-variance groups and refilling, a real optimizer step with it."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch

from agentic_rag.settings import to_dict
from agentic_rag.training.algorithms import algorithm_args, algorithm_names
from agentic_rag.training.config import ConfigError, ExperimentConfig, GuardsConfig, RewardSpec, config_from_dict
from agentic_rag.training.dynamic_sampling import informative_groups, select_rows
from agentic_rag.training.monitoring import CollapseGuard
from agentic_rag.training.rewards import OverlongPenalty, make_reward
from test_training import _current_logps, _loss_inputs, lora_state, make_trainer


def test_presets_carry_their_papers_defaults_and_overrides_win():
    gspo = algorithm_args("gspo")
    assert gspo["importance_sampling_level"] == "sequence" and gspo["loss_type"] == "grpo"
    assert (gspo["epsilon"], gspo["epsilon_high"]) == (3e-4, 4e-4)
    assert algorithm_args("cispo")["loss_type"] == "cispo" and algorithm_args("cispo")["epsilon_high"] == 5.0
    sapo = algorithm_args("sapo")
    assert (sapo["loss_type"], sapo["sapo_temperature_pos"], sapo["sapo_temperature_neg"]) == ("sapo", 1.0, 1.05)
    assert algorithm_args("bnpo")["loss_type"] == "bnpo"
    for name in algorithm_names():
        args = algorithm_args(name)
        if name != "gspo":
            assert args["importance_sampling_level"] == "token" and args["epsilon"] == 0.2, name
    assert algorithm_args("gspo", epsilon=1e-3)["epsilon"] == 1e-3
    assert algorithm_args("cispo", epsilon_high=2.0)["epsilon_high"] == 2.0


def problems_of(cfg: ExperimentConfig) -> list[str]:
    """The problems the config check finds in ``cfg`` (built in code), files aside."""
    try:
        config_from_dict(to_dict(cfg), env={}, check_files=False)
    except ConfigError as exc:
        return exc.problems
    return []


def test_the_config_knows_the_presets_and_refuses_what_cannot_work():
    for name in ("gspo", "cispo", "sapo", "bnpo"):
        cfg = ExperimentConfig()
        cfg.algorithm.name = name
        assert not [p for p in problems_of(cfg) if p.startswith("algorithm")], name
    cfg = ExperimentConfig()
    cfg.algorithm.name, cfg.algorithm.dynamic_sampling = "reinforce_pp", True
    assert any("dynamic_sampling does not apply to reinforce_pp" in p for p in problems_of(cfg))
    cfg = ExperimentConfig()
    cfg.algorithm.name, cfg.algorithm.num_generations, cfg.algorithm.per_device_train_batch_size = "dapo", 3, 4
    cfg.algorithm.gradient_accumulation_steps = 3  # 12 rollouts: groups fit, so no problem
    assert not [p for p in problems_of(cfg) if "dynamic_sampling" in p]
    cfg.algorithm.gradient_accumulation_steps = 1  # 4 rollouts a process: a group of 3 straddles processes
    assert any("dynamic_sampling drops and refills whole groups" in p
               for p in problems_of(cfg))
    cfg = ExperimentConfig()
    cfg.algorithm.max_extra_rollouts = -1
    cfg.guards = GuardsConfig(min_searches=2.0, max_searches=1.0, action="halt", patience=0)
    problems = problems_of(cfg)
    for needle in ("algorithm.max_extra_rollouts must be >= 0, got -1", "guards.action must be one of warn, stop; "
                   "got 'halt'", "guards.patience must be >= 1, got 0", "guards.min_searches (2.0) exceeds"):
        assert any(needle in p for p in problems), (needle, problems)


# ------------------------------------------------------------------------------------------------ losses

@pytest.fixture(scope="module")
def preset_trainers(tiny_model_dir, world_dir, tmp_path_factory):
    return {name: make_trainer(tiny_model_dir, world_dir, tmp_path_factory.mktemp(name), algorithm=name, max_steps=1)
            for name in ("grpo", "gspo", "cispo", "sapo", "bnpo")}


def _batch(trainer, shift: float):
    """The hand-made two-row batch, its current log-probabilities, and old log-probabilities ``shift`` away from
    them on alternate model tokens (an off-policy batch: the ratios move both ways, some past any clip)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs, _, _, _ = _loss_inputs(trainer, trainer.processing_class)
    logps = _current_logps(trainer, inputs)
    sign = torch.tensor([1.0, -1.0]).repeat(logps.size(1) // 2 + 1)[:logps.size(1)]
    inputs["old_per_token_logps"] = logps - shift * sign
    inputs.pop("ref_per_token_logps")
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).float()
    return inputs, logps, mask


def _loss(trainer, inputs) -> float:
    return float(trainer._compute_loss(trainer.model, copy.deepcopy(inputs)).detach())


def _token_mean(per_token, mask):
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


@pytest.mark.parametrize("shift", [0.0, 0.3])
def test_each_loss_is_its_papers_formula_on_the_same_batch(preset_trainers, shift):
    losses = {}
    for name, trainer in preset_trainers.items():
        inputs, logps, mask = _batch(trainer, shift)
        adv = inputs["advantages"][:, None]
        ratio = torch.exp(logps - inputs["old_per_token_logps"])
        if name in ("grpo", "bnpo"):  # PPO's token clip, [1 - 0.2, 1 + 0.2]
            per_token = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            expected = _token_mean(per_token, mask) if name == "grpo" else (per_token * mask).sum() / mask.sum()
        elif name == "gspo":  # one length-normalised ratio per sequence, clipped to [1 - 3e-4, 1 + 4e-4]
            seq = torch.exp(((logps - inputs["old_per_token_logps"]) * mask).sum(-1) / mask.sum(-1))[:, None]
            expected = (-torch.min(seq * adv, seq.clamp(1 - 3e-4, 1 + 4e-4) * adv)).mean()
        elif name == "cispo":  # -sg(min(ratio, 5)) * A * log pi, over all model tokens of the batch
            per_token = -ratio.clamp(max=5.0) * adv * logps
            expected = (per_token * mask).sum() / inputs["num_items_in_batch"]
        else:  # sapo: the soft gate (4 / tau) sigmoid(tau (ratio - 1)), tau 1.0 (A > 0) or 1.05
            tau = torch.where(adv > 0, 1.0, 1.05)
            expected = _token_mean(-(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * adv, mask)
        losses[name] = _loss(trainer, inputs)
        assert losses[name] == pytest.approx(float(expected), rel=1e-4, abs=1e-6), name
    if shift == 0.0:  # on-policy every ratio is 1: GSPO's loss is GRPO's
        assert losses["gspo"] == pytest.approx(losses["grpo"], rel=1e-6)
    else:
        assert abs(losses["gspo"] - losses["grpo"]) > 1e-4
        assert abs(losses["sapo"] - losses["grpo"]) > 1e-4


def test_on_policy_gspo_has_grpos_gradient_and_cispo_keeps_clipped_tokens(preset_trainers):
    """On-policy the sequence ratio's gradient is the mean of the tokens' log-probability gradients: GSPO's
    gradient equals GRPO's. Off-policy, a token whose ratio is past GRPO's clip gives GRPO no gradient and CISPO
    one (its weight is clipped, not its gradient)."""
    grads = {}
    for name in ("grpo", "gspo"):
        trainer = preset_trainers[name]
        inputs, _, _ = _batch(trainer, 0.0)
        trainer.model.zero_grad()
        trainer._compute_loss(trainer.model, copy.deepcopy(inputs)).backward()
        grads[name] = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.model.zero_grad()
    assert grads["grpo"].keys() == grads["gspo"].keys() and grads["grpo"]
    for n in grads["grpo"]:
        assert torch.allclose(grads["grpo"][n], grads["gspo"][n], atol=1e-6, rtol=1e-4), n
    for name, clipped_has_gradient in (("grpo", False), ("cispo", True)):
        trainer = preset_trainers[name]
        inputs, _, _ = _batch(trainer, 0.0)
        inputs["old_per_token_logps"] = inputs["old_per_token_logps"] - 1.0  # every ratio e > 1.2
        inputs["advantages"] = torch.tensor([1.0, 1.0])  # positive: GRPO's upper clip binds everywhere
        trainer.model.zero_grad()
        trainer._compute_loss(trainer.model, copy.deepcopy(inputs)).backward()
        norm = sum(float(p.grad.abs().sum()) for p in trainer.model.parameters() if p.grad is not None)
        trainer.model.zero_grad()
        assert (norm > 0) == clipped_has_gradient, (name, norm)


# ------------------------------------------------------------------------------------------ dynamic sampling

def test_informative_groups_and_row_selection():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, float("nan"), 2.0, float("nan"), float("nan"), 0.5, 0.5 + 1e-9])
    assert informative_groups(rewards, 2).tolist() == [False, True, False, False, False]
    a = {"prompt_ids": torch.tensor([[9, 1], [2, 3]]), "prompt_mask": torch.tensor([[0, 1], [1, 1]]),
         "completion_ids": torch.tensor([[4, 9], [5, 6]]), "completion_mask": torch.tensor([[1, 0], [1, 1]]),
         "advantages": torch.tensor([0.5, -0.5]), "num_items_in_batch": torch.tensor(3.0), "agentic_layout": ["a", "b"]}
    b = {"prompt_ids": torch.tensor([[7, 7, 7]]), "prompt_mask": torch.tensor([[1, 1, 1]]),
         "completion_ids": torch.tensor([[8]]), "completion_mask": torch.tensor([[1]]),
         "advantages": torch.tensor([1.0]), "num_items_in_batch": torch.tensor(1.0), "agentic_layout": ["c"]}
    out = select_rows([(a, [1]), (b, [0])], pad_token_id=9)
    assert out["prompt_ids"].tolist() == [[9, 2, 3], [7, 7, 7]]  # left-padded with the pad token
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["completion_ids"].tolist() == [[5, 6], [8, 9]]  # right-padded
    assert out["completion_mask"].tolist() == [[1, 1], [1, 0]]
    assert out["advantages"].tolist() == [-0.5, 1.0] and out["agentic_layout"] == ["b", "c"]
    assert "num_items_in_batch" not in out
    with pytest.raises(ValueError, match="cannot join"):
        select_rows([({**a, "pixel_values": object()}, [0])], 9)


def _rows(world_dir, n=8):
    from agentic_rag.data.questions import read_questions

    return [{"prompt": r.question, "answers": r.answers}
            for r in read_questions(world_dir / "world" / "train.jsonl", limit=n)]


def _split_reward(flat: set[str]):
    """1.0 for every rollout of a question in ``flat`` (a zero-variance group); 0 and 1 alternating otherwise."""
    def reward(prompts, completions, completion_ids, **kw):
        return [1.0 if p in flat else float(i % 2) for i, p in enumerate(prompts)]
    return reward


def _questions_of(trainer, output) -> list[str]:
    """The training question each row's prompt ids were built from."""
    by_ids = {tuple(trainer._prompt_ids(r["prompt"])): r["prompt"] for r in trainer.train_dataset}
    rows = zip(output["prompt_ids"], output["prompt_mask"], strict=True)
    return [by_ids[tuple(ids[mask.bool()].tolist())] for ids, mask in rows]


def test_dynamic_sampling_drops_exactly_the_zero_variance_groups_and_refills(tiny_model_dir, world_dir, tmp_path):
    rows = _rows(world_dir)
    flat = {rows[0]["prompt"]}
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, algorithm="dapo", rows=rows, max_steps=1,
                           reward=_split_reward(flat))
    assert trainer.agent.dynamic_sampling and trainer.agent.max_extra_rollouts == 4  # dapo's default; one batch
    trainer.model.train()
    batch = [dict(rows[i]) for i in (0, 0, 1, 1)]  # one zero-variance group, one informative
    out = trainer._generate_and_score_completions(batch)
    questions = _questions_of(trainer, out)
    assert len(questions) == 4 and out["advantages"].shape == (4,) and len(out["agentic_layout"]) == 4
    assert questions[:2] == [rows[1]["prompt"]] * 2, "the informative group is kept, first"
    assert questions[2] == questions[3] and questions[2] not in flat, "its place is a refilled informative group"
    assert torch.all(out["advantages"] != 0)
    mask = out["completion_mask"] * out["tool_mask"]
    assert float(out["num_items_in_batch"]) == float(mask.sum())
    m = trainer._metrics["train"]
    assert m["dynamic_sampling/zero_variance_groups"][-1] >= 1 and m["dynamic_sampling/filled"][-1] == 0
    # one group missing, half the groups seen informative: ceil(1 / 0.5) = 2 groups drawn, in one round
    assert m["dynamic_sampling/extra_rollouts"][-1] == 4 and m["dynamic_sampling/rounds"][-1] == 1

    # no informative question anywhere: the cap ends the search, and the batch keeps its size with the dropped groups
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path / "flat", algorithm="dapo", rows=rows, max_steps=1,
                           reward=_split_reward({r["prompt"] for r in rows}), max_extra_rollouts=6)
    trainer.model.train()
    out = trainer._generate_and_score_completions([dict(rows[i]) for i in (0, 0, 2, 2)])
    assert _questions_of(trainer, out) == [rows[0]["prompt"]] * 2 + [rows[2]["prompt"]] * 2
    m = trainer._metrics["train"]
    assert m["dynamic_sampling/extra_rollouts"][-1] == 6 and m["dynamic_sampling/filled"][-1] == 2
    assert torch.all(out["advantages"] == 0)

    # off (grpo's default): the batch as drawn
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path / "off", algorithm="grpo", rows=rows, max_steps=1,
                           reward=_split_reward(flat))
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    assert _questions_of(trainer, out) == [rows[0]["prompt"]] * 2 + [rows[1]["prompt"]] * 2
    assert "dynamic_sampling/extra_rollouts" not in trainer._metrics["train"]


def test_a_dapo_step_with_dynamic_sampling_trains_the_adapter(tiny_model_dir, world_dir, tmp_path):
    """Two questions, one of them zero-variance: the step's batch holds both (two groups), so the flat one is
    dropped, two groups are drawn in its place (half the groups seen were informative), and the step trains on
    four rollouts whatever those draws were."""
    rows = _rows(world_dir, n=2)
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, algorithm="dapo", rows=rows, max_steps=1,
                           reward=_split_reward({rows[0]["prompt"]}))
    before = lora_state(trainer.model)
    trainer.train()
    after = lora_state(trainer.model)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    [logged] = [h for h in trainer.state.log_history if "dynamic_sampling/extra_rollouts" in h]
    assert logged["dynamic_sampling/extra_rollouts"] == 4 and logged["dynamic_sampling/zero_variance_groups"] >= 1


def test_dynamic_sampling_is_refused_where_it_cannot_work(tiny_model_dir, world_dir, tmp_path):
    with pytest.raises(ValueError, match="does not apply to reinforce_pp"):
        make_trainer(tiny_model_dir, world_dir, tmp_path, algorithm="reinforce_pp", dynamic_sampling=True)


# ---------------------------------------------------------------------------------------- overlong, guards

def test_overlong_penalty_is_dapos_soft_punishment():
    r = OverlongPenalty(max_tokens=100, cache_tokens=20)
    assert [r.penalty(n) for n in (0, 80, 90, 100, 101)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    cfg = ExperimentConfig()
    cfg.rollout.max_completion_tokens = 500
    reward = make_reward(RewardSpec("overlong", 0.5), cfg)
    assert (reward.max_tokens, reward.cache_tokens) == (500, 100)
    assert reward(None, None, [[1] * 399, [1] * 450, [1] * 500], [{}] * 3) == [0.0, -0.5, -1.0]
    cfg.rewards = [RewardSpec("f1"), RewardSpec("overlong", 1.0, {"max_tokens": 600, "cache_tokens": 0})]
    problems = problems_of(cfg)
    assert any("exceeds rollout.max_completion_tokens" in p for p in problems)
    assert any("cache_tokens must be in 1..max_tokens" in p for p in problems)
    with pytest.raises(ValueError):
        OverlongPenalty(10, 11)


def test_the_collapse_guard_warns_once_a_spell_and_can_stop(tmp_path, caplog):
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    guard = CollapseGuard(GuardsConfig(min_entropy=0.05, max_searches=2.5, patience=2), tmp_path)
    control = SimpleNamespace(should_training_stop=False)
    seq = [(0.1, 1.0), (0.04, 1.0), (0.03, 1.0), (0.02, 3.0), (0.1, 3.0), (0.01, 1.0), (0.01, 1.0)]
    for step, (entropy, searches) in enumerate(seq, 1):
        state.global_step = step
        guard.on_log(None, state, control, logs={"entropy": entropy, "agentic/searches_per_trajectory": searches})
    assert [(a["step"], a["metric"]) for a in guard.alerts] == [(3, "entropy"), (5, "agentic/searches_per_trajectory"),
                                                                (7, "entropy")]
    lines = [json.loads(x) for x in (tmp_path / "guards.jsonl").read_text().splitlines()]
    assert lines == guard.alerts and not control.should_training_stop and guard.stopped_at is None
    assert "collapse guard: entropy has been below 0.05 for 2 logged steps" in caplog.text

    stop = CollapseGuard(GuardsConfig(min_searches=1.5, patience=1, action="stop"), tmp_path / "s")
    assert not CollapseGuard(GuardsConfig(), tmp_path).active and stop.active
    state.global_step = 4
    stop.on_log(None, state, control, logs={"agentic/searches_per_trajectory": 1.0})
    assert control.should_training_stop and stop.stopped_at == 4


def test_a_stop_guard_ends_a_real_training_run(tiny_model_dir, world_dir, tmp_path):
    """In a real run: the random-init tiny model's entropy (about 12 nats) is below a bound of 100, so a guard with
    patience 1 and action stop ends training after its first logged step of two, and says so in guards.jsonl."""
    guard = CollapseGuard(GuardsConfig(min_entropy=100.0, patience=1, action="stop"), tmp_path / "out")
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, max_steps=2, callbacks=[guard])
    trainer.train()
    assert trainer.state.global_step == 1 and guard.stopped_at == 1
    [alert] = [json.loads(x) for x in (tmp_path / "out" / "guards.jsonl").read_text().splitlines()]
    assert alert["metric"] == "entropy" and alert["value"] < 100.0 and alert["action"] == "stop"
