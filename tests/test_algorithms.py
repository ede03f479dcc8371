"""REINFORCE++ as Hu et al. (2025) define it, and R1-Searcher's group-baseline variant: golden per-token advantages
on a hand-made batch, the KL in the return and not in the loss, and the group means subtracted."""

from __future__ import annotations

import copy

import pytest
import torch

from agentic_rag.training.reinforce_pp import kl_shaped_returns, whiten_over_tokens
from test_training import _current_logps, _loss_inputs, make_trainer

# Two groups of two completions, four completion positions each. mask: the model's tokens (completion_mask *
# env_mask); position 2 of row 0 is an observation, row 1 ends in an environment EOS, row 3 in padding.
MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0]])
# k1 KL per token, log pi_old - log pi_ref; 9.0 marks positions that are not the model's and must not count
OLD = torch.tensor([[-1.0, -2.0, -3.0, -1.5], [-0.5, -1.0, -2.0, -4.0], [-2.0, -1.0, -1.0, -3.0],
                    [-1.0, -1.0, -2.0, -2.0]])
KL = torch.tensor([[0.1, 0.2, 9.0, 0.3], [0.0, 0.1, 0.2, 9.0], [0.2, 9.0, 0.0, 0.1], [0.3, 0.3, 9.0, 9.0]])
REF = OLD - KL
REWARDS = torch.tensor([1.0, 0.0, 2.0, 1.0])
BETA = 0.5

# r_t = -0.5 * KL_t on model tokens, the reward added at each row's last model token, G_t = sum_{s >= t} r_s:
#   row 0: r = [-0.05, -0.1, ., 1 - 0.15]  -> G = [0.70, 0.75, 0, 0.85]
#   row 1: r = [0, -0.05, 0 - 0.1, .]      -> G = [-0.15, -0.15, -0.10, 0]
#   row 2: r = [-0.1, ., 0, 2 - 0.05]      -> G = [1.85, 0, 1.95, 1.95]
#   row 3: r = [-0.15, 1 - 0.15, ., .]     -> G = [0.70, 0.85, 0, 0]
RETURNS = torch.tensor([[0.70, 0.75, 0.0, 0.85], [-0.15, -0.15, -0.10, 0.0], [1.85, 0.0, 1.95, 1.95],
                        [0.70, 0.85, 0.0, 0.0]])
# whitened over the 11 model tokens: mean 9.2 / 11 = 0.836364, population variance 0.579587
ADVANTAGES = torch.tensor([[-0.17912, -0.11344, 0.0, 0.01791], [-1.29562, -1.29562, -1.22994, 0.0],
                           [1.33144, 0.0, 1.46280, 1.46280], [-0.17912, 0.01791, 0.0, 0.0]])
# the baseline variant: rewards minus their group's mean first ([0.5, -0.5, 0.5, -0.5]), then the same steps:
#   G = [[0.20, 0.25, 0, 0.35], [-0.65, -0.65, -0.60, 0], [0.35, 0, 0.45, 0.45], [-0.80, -0.65, 0, 0]]
BASELINE_ADVANTAGES = torch.tensor([[0.62331, 0.72126, 0.0, 0.91716], [-1.04182, -1.04182, -0.94387, 0.0],
                                    [0.91716, 0.0, 1.11306, 1.11306], [-1.33567, -1.04182, 0.0, 0.0]])


def test_returns_and_whitening_golden_values():
    returns = kl_shaped_returns(REWARDS, MASK, KL, BETA)
    assert torch.allclose(returns, RETURNS, atol=1e-6), returns
    assert torch.allclose(whiten_over_tokens(returns, MASK), ADVANTAGES, atol=1e-5)
    # beta = 0: the outcome reward broadcast to every model token of its completion
    plain = kl_shaped_returns(REWARDS, MASK, KL, 0.0)
    assert torch.equal(plain, REWARDS[:, None] * MASK)


@pytest.fixture(scope="module")
def trainers(tiny_model_dir, world_dir, tmp_path_factory):
    """One trainer per algorithm on the tiny model (groups of two, beta 0.5), built once for this module."""
    out = {}
    for name in ("reinforce_pp", "reinforce_pp_baseline", "grpo"):
        out[name] = make_trainer(tiny_model_dir, world_dir, tmp_path_factory.mktemp(name), beta=BETA,
                                 algorithm=name, max_steps=1)
    return out


@pytest.mark.parametrize("algorithm, expected", [("reinforce_pp", ADVANTAGES),
                                                 ("reinforce_pp_baseline", BASELINE_ADVANTAGES)])
def test_trainer_per_token_advantages_golden_values(trainers, algorithm, expected):
    trainer = trainers[algorithm]
    adv = trainer._reinforce_pp_advantages(REWARDS, MASK, OLD - REF, group_size=2)
    assert adv.shape == MASK.shape
    assert torch.allclose(adv, expected, atol=1e-5), adv
    assert torch.all(adv[MASK == 0] == 0), "environment tokens and padding get no advantage"


def test_baseline_variant_subtracts_each_groups_mean(trainers):
    """Shifting one question's rewards by a constant changes nothing for the baseline variant (its group mean
    absorbs it), and changes REINFORCE++'s advantages, which have no group baseline."""
    shifted = REWARDS + torch.tensor([3.0, 3.0, 0.0, 0.0])
    base = trainers["reinforce_pp_baseline"]
    assert torch.allclose(base._reinforce_pp_advantages(shifted, MASK, KL, group_size=2), BASELINE_ADVANTAGES,
                          atol=1e-5)
    plain = trainers["reinforce_pp"]
    assert not torch.allclose(plain._reinforce_pp_advantages(shifted, MASK, KL, group_size=2), ADVANTAGES, atol=1e-2)


def test_unscorable_completions_get_no_advantage_and_do_not_count(trainers):
    rewards = torch.tensor([1.0, float("nan"), 2.0, 1.0])
    adv = trainers["reinforce_pp"]._reinforce_pp_advantages(rewards, MASK, KL, group_size=2)
    assert torch.all(adv[1] == 0)
    kept = MASK.clone()
    kept[1] = 0
    expected = whiten_over_tokens(kl_shaped_returns(torch.tensor([1.0, 0.0, 2.0, 1.0]), kept, KL, BETA), kept)
    assert torch.allclose(adv, expected, atol=1e-6)


def _loss(trainer, inputs):
    return trainer._compute_loss(trainer.model, copy.deepcopy(inputs)).detach()


@pytest.mark.parametrize("algorithm, kl_in_loss", [("reinforce_pp", False), ("reinforce_pp_baseline", False),
                                                   ("grpo", True)])
def test_the_kl_is_in_the_return_not_in_the_loss(trainers, algorithm, kl_in_loss):
    trainer = trainers[algorithm]
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs, env, _, _ = _loss_inputs(trainer, trainer.processing_class)
    actual = _current_logps(trainer, inputs)
    inputs["old_per_token_logps"] = actual
    inputs["advantages"] = torch.linspace(-1, 1, actual.numel()).view_as(actual)  # per token
    inputs["ref_per_token_logps"] = actual.clone()
    near = _loss(trainer, inputs)
    far = copy.deepcopy(inputs)
    far["ref_per_token_logps"] = actual - 3.0  # a reference far from the policy: a large KL at every token
    trainer._metrics["train"].pop("kl", None)
    if kl_in_loss:
        assert (_loss(trainer, far) - near).abs() > 1e-3
        assert "kl" in trainer._metrics["train"]
    else:
        assert torch.equal(_loss(trainer, far), near)
        assert "kl" not in trainer._metrics["train"], "no KL term in the loss, so none is logged from it"
    assert trainer.beta == BETA, "the KL coefficient stays set for the reference log-probabilities"


def test_generation_gives_per_token_advantages_and_the_k1_kl(trainers):
    """End to end on the tiny model: rollouts, rewards, reference and old log-probabilities, advantages [B, T].
    With a fresh adapter (LoRA B = 0) the policy is the reference, so the KL is exactly 0 and the advantages are
    the whitened outcome rewards; with a moved adapter the KL enters the return."""
    trainer = trainers["reinforce_pp"]
    batch = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]
    trainer.model.eval()
    out = trainer._generate_and_score_completions(batch)
    model_mask = out["completion_mask"] * out["tool_mask"]
    assert out["advantages"].shape == model_mask.shape and "ref_per_token_logps" in out
    assert len(out["agentic_layout"]) == 4
    assert torch.all(out["advantages"][model_mask == 0] == 0)
    rewards = trainer._rewards_per_func[:, 0]
    expected = whiten_over_tokens(kl_shaped_returns(rewards, model_mask), model_mask)
    assert torch.allclose(out["advantages"], expected, atol=1e-5)
    assert trainer._metrics["eval"]["kl"][-1] == 0.0

    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    out = trainer._generate_and_score_completions(batch)
    model_mask = out["completion_mask"] * out["tool_mask"]
    assert trainer._metrics["eval"]["kl"][-1] != 0.0
    rewards = trainer._rewards_per_func[:, 0]
    plain = whiten_over_tokens(kl_shaped_returns(rewards, model_mask), model_mask)
    assert not torch.allclose(out["advantages"], plain, atol=1e-4), "the KL penalty must shape the return"


def test_a_reinforce_pp_baseline_step_trains_the_adapter(tiny_model_dir, world_dir, tmp_path):
    """Per-token advantages go through TRL's batching, shuffling and loss in a real optimizer step."""
    from test_training import lora_state

    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, beta=BETA, algorithm="reinforce_pp_baseline",
                           max_steps=1)
    before = lora_state(trainer.model)
    trainer.train()
    after = lora_state(trainer.model)
    assert any(not torch.equal(before[n], after[n]) for n in before), "the LoRA weights must move"
    logs = trainer.state.log_history[0]
    assert "kl" in logs and "clip_ratio/region_mean" in logs
