"""GRPO steps with gradient checkpointing on, as the config's default has it: LoRA on a tiny model, rollouts that
backtrack so the loss goes through the tree-shaped 4D attention mask, and the same gradients as without it."""

from __future__ import annotations

import torch

from agentic_rag.rollout import RolloutSettings
from test_rollout import FakeSearcher
from test_training import lora_state, varied_reward

QUESTIONS = ["Who founded the Amber Guild?", "Where was Dovan Kell born?", "Which river runs through Brouford?",
             "When did the Iron Guild close?"]
FREE = 3  # freely sampled tokens before each turn's forced tag: completions of a group differ


class Backtracking:
    """A logits processor that makes a random model search, backtrack, search again and answer: each turn it
    samples ``FREE`` tokens freely, then forces the turn's tag, then end-of-sequence."""

    def __init__(self, tok):
        self.tok = tok
        self.tags = {name: tok(text, add_special_tokens=False)["input_ids"] for name, text in (
            ("wrong", "<search>wrong</search>"), ("backtrack", "<backtrack>off</backtrack>"),
            ("right", "<search>right</search>"), ("answer", "<answer>r</answer>"))}
        self.plans: dict[int, list[int]] = {}
        self.banned = sorted(set(tok.all_special_ids))

    def plan(self, row) -> list[int]:
        key = hash(tuple(row.context[:row.turn_start]))
        if key not in self.plans:
            text = self.tok.decode(row.context[:row.turn_start])
            if "<search>right</search>" in text:
                step = "answer"
            elif "Backtracked:" in text:  # the environment's note after a backtrack
                step = "right"
            elif "<search>wrong</search>" in text:
                step = "backtrack"
            else:
                step = "wrong"
            self.plans[key] = self.tags[step]
        return self.plans[key]

    def __call__(self, scores, rows):
        for j, row in enumerate(rows):
            step = len(row.generated)
            if step < FREE:
                scores[j, self.banned] = float("-inf")
                continue
            tag = self.plan(row)
            k = step - FREE
            token = tag[k] if k < len(tag) else self.tok.eos_token_id
            scores[j].fill_(float("-inf"))
            scores[j, token] = 0.0
        return scores


def make_trainer(model_dir, tmp_path, *, max_steps=2):
    from datasets import Dataset
    from trl import GRPOConfig

    from agentic_rag.models import load_tokenizer
    from agentic_rag.tools import SearchTool
    from agentic_rag.training.config import ModelConfig
    from agentic_rag.training.model import load_base_model, lora_config
    from agentic_rag.training.trainer import AgenticGRPOTrainer

    tok = load_tokenizer(str(model_dir))
    cfg = ModelConfig(name_or_path=str(model_dir), lora_r=4, lora_alpha=8, lora_dropout=0.0,
                      gradient_checkpointing=True)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=192, max_steps=max_steps, learning_rate=5e-2, report_to=[],
                      use_cpu=True, save_strategy="no", logging_steps=1, seed=0, disable_dropout=True,
                      gradient_checkpointing=cfg.gradient_checkpointing)
    settings = RolloutSettings(max_turns=5, max_searches=3, max_tokens_per_turn=24, max_completion_tokens=192,
                               passages_per_search=1, max_observation_tokens=32)
    return AgenticGRPOTrainer(load_base_model(cfg), tokenizer=tok, reward_funcs=[varied_reward], args=args,
                              train_dataset=Dataset.from_list([{"prompt": q} for q in QUESTIONS]),
                              tools=SearchTool(FakeSearcher()), settings=settings, processors=[Backtracking(tok)],
                              peft_config=lora_config(cfg))


def decoder_layers(model):
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def count_checkpoints(monkeypatch) -> list[int]:
    """Count calls of torch's checkpoint function as transformers binds it whenever checkpointing is (re-)enabled
    (TRL turns it off for each rollout and back on after)."""
    import transformers.modeling_utils as mu

    calls = [0]
    inner = mu.checkpoint

    def counted(*a, **kw):
        calls[0] += 1
        return inner(*a, **kw)

    monkeypatch.setattr(mu, "checkpoint", counted)
    return calls


def test_two_steps_with_gradient_checkpointing_train_the_adapter_through_the_tree_mask(tiny_model_dir,
                                                                                       tmp_path, monkeypatch):
    calls = count_checkpoints(monkeypatch)
    trainer = make_trainer(tiny_model_dir, tmp_path)
    before = lora_state(trainer.model)
    trainer.train()
    assert trainer.state.global_step == 2
    layers = decoder_layers(trainer.model)
    assert layers and all(layer.gradient_checkpointing for layer in layers)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    # every trajectory backtracked: the loss went through the branched (4D mask) path
    assert all(h["agentic/branched_fraction"] == 1.0 for h in logs), logs
    # the loss forwards ran through the checkpointed layers (the rollouts run in eval mode: no checkpointing)
    assert calls[0] >= 2 * len(layers)
    after = lora_state(trainer.model)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) >= len(before) // 2, "the LoRA weights must move with gradient checkpointing on"


def test_gradient_checkpointing_gives_the_same_gradients_on_branched_rows(tiny_model_dir, tmp_path, monkeypatch):
    import copy

    calls = count_checkpoints(monkeypatch)
    trainer = make_trainer(tiny_model_dir, tmp_path, max_steps=1)
    model = trainer.model
    with torch.no_grad():  # a non-zero adapter, so gradients reach every LoRA weight
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    model.eval()
    inputs = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in (0, 0, 1, 1)])
    assert all(lay is not None for lay in inputs["agentic_layout"])  # all branched
    assert inputs["advantages"].abs().sum() > 0
    trainer.current_gradient_accumulation_steps = 1
    model.train()

    def grads():
        model.zero_grad()
        loss = trainer._compute_loss(model, copy.deepcopy(inputs))
        loss.backward()
        return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls[0] = 0
    loss_gc, with_gc = grads()
    assert calls[0] == len(decoder_layers(model))  # one checkpointed forward per layer
    model.base_model.model.gradient_checkpointing_disable()
    loss_plain, plain = grads()
    assert calls[0] == len(decoder_layers(model))  # no more
    assert with_gc and set(with_gc) == set(plain) and all("lora_" in n for n in with_gc)
    assert any(g.abs().sum() > 0 for g in with_gc.values())
    assert torch.allclose(loss_gc, loss_plain, atol=1e-6)
    for n in plain:
        assert torch.allclose(with_gc[n], plain[n], atol=1e-6, rtol=1e-4), n
