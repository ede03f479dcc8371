"""How the trainer scores trajectories: the same position ids and attention whatever shares a micro-batch, only the
completion budget counts as a length cut, and attention kernels or windows a tree mask cannot serve are refused."""

from __future__ import annotations

import pytest
import torch

from agentic_rag.rollout import AgentRollout, RolloutSettings
from agentic_rag.rollout.scripted import ScriptedPolicy
from agentic_rag.training import trainer as trainer_module
from agentic_rag.training.algorithms import ORDER_NEUTRAL_LOSSES
from agentic_rag.training.micro_batches import group_by_length, used_columns
from agentic_rag.training.tree import TreeLayout
from test_rollout import FakeSearcher, ForcedHFPolicy, prompts
from test_training import make_trainer


def _padded(trajs, pad_id):
    """TRL's layout: prompts left-padded to the longest, completions right-padded."""
    P = max(len(t.prompt_ids) for t in trajs)
    C = max(len(t.completion_ids) for t in trajs)
    ids = torch.full((len(trajs), P + C), pad_id)
    mask = torch.zeros((len(trajs), P + C), dtype=torch.long)
    for i, t in enumerate(trajs):
        ids[i, P - len(t.prompt_ids):P] = torch.tensor(t.prompt_ids)
        ids[i, P:P + len(t.completion_ids)] = torch.tensor(t.completion_ids)
        mask[i, P - len(t.prompt_ids):P + len(t.completion_ids)] = 1
    return ids, mask, C


def test_a_plain_row_scores_the_same_alone_and_beside_a_branched_row(tiny_model_dir, world_dir, tmp_path):
    """A plain trajectory's log-probabilities do not depend on what shares its micro-batch: bitwise equal in
    float32 whether it is scored alone (a 2D mask) or beside a branched trajectory (the 4D tree mask), and every
    forward pass gets the real position ids (0 at the first real token), never the model's default arange over
    the left padding."""
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, beta=0.0)
    tok = trainer.processing_class
    # the branched row's question is the longer one, so the plain row is left-padded
    scripts = {"Which way, after a long and winding detour through the hills?": [
        "<search>wrong</search>", "<backtrack>off topic</backtrack>", "<search>right</search>", "<answer>r</answer>"],
        "Straight?": ["<search>alpha</search>", "<answer>a</answer>"]}
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.eval()
    trajs = AgentRollout(ForcedHFPolicy(model, tok, scripts), tok, FakeSearcher(),
                         RolloutSettings(passages_per_search=1)).run(prompts(tok, list(scripts)), list(scripts))
    assert not trajs[0].is_linear and trajs[1].is_linear
    ids, mask, C = _padded(trajs, tok.pad_token_id)
    assert mask[1, 0] == 0, "the plain row must be left-padded for the test to mean anything"

    calls: list[dict] = []
    handle = model.register_forward_pre_hook(lambda _m, _a, kwargs: calls.append(dict(kwargs)), with_kwargs=True)
    try:
        trainer._active_layouts = [TreeLayout(trajs[0]), None]
        with torch.no_grad():
            alone, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C, batch_size=1)
            beside, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C, batch_size=2)
        trainer._active_layouts = None  # no layouts at all (a caller outside a generation batch)
        with torch.no_grad():
            unlaid, _, _ = trainer._get_per_token_logps_and_entropies(model, ids[1:], mask[1:], C)
    finally:
        handle.remove()
        trainer._active_layouts = None

    assert len(calls) == 4
    assert all(call.get("position_ids") is not None for call in calls), [sorted(c) for c in calls]
    expected = torch.arange(int(mask[1].sum()))
    # the plain row in each call; each call holds only its micro-batch's used columns (trainer.used_columns)
    for call, row, rows in ((calls[1], 0, slice(1, 2)), (calls[2], 1, slice(0, 2)), (calls[3], 0, slice(1, 2))):
        first, last = used_columns(mask[rows], mask.size(1) - C)
        assert call["input_ids"].size(1) == last - first
        real = mask[1, first:last].bool()
        assert torch.equal(call["position_ids"][row][real].cpu(), expected)
    assert calls[1]["attention_mask"].dim() == 2 and calls[2]["attention_mask"].dim() == 4
    n = len(trajs[1].completion_ids)
    assert torch.equal(alone[1, :n], beside[1, :n]), (alone[1, :n] - beside[1, :n]).abs().max()
    assert torch.equal(unlaid[0, :n], alone[1, :n])


def _score_generation(monkeypatch, trainer, scripts):
    """TRL's generation and scoring of one batch, rolled out by a scripted policy (two samples per question)."""
    monkeypatch.setattr(trainer_module, "HFPolicy", lambda model, tok, *args, **kw: ScriptedPolicy(tok, scripts))
    batch = [{"prompt": q, "answers": ["x"]} for q in scripts for _ in range(2)]
    trainer.model.eval()
    return trainer._generate_and_score_completions(batch)


def test_turn_token_limit_stays_in_the_dapo_loss_and_only_the_completion_budget_is_a_length_cut(
        tiny_model_dir, world_dir, tmp_path, monkeypatch):
    """Under dapo (mask_truncated_completions), a trajectory whose turn ran out of tokens without closing its tag
    ended on its own: it stays in the loss (and its reward, usually 0, teaches). Only the global completion
    budget (max_completion_tokens) cuts a trajectory short: that one is masked out."""
    rows = [{"prompt": "Unclosed?", "answers": ["x"]}, {"prompt": "Budget?", "answers": ["x"]}]
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, algorithm="dapo", rows=rows)
    assert trainer.mask_truncated_completions
    trainer.agent.settings = RolloutSettings(max_turns=4, max_tokens_per_turn=12, max_completion_tokens=24,
                                             passages_per_search=1, max_observation_tokens=48)
    scripts = {"Unclosed?": ["<think>" + "word " * 40], "Budget?": ["<search>alpha</search>", "word " * 40]}
    out = _score_generation(monkeypatch, trainer, scripts)
    reasons = [t.finish_reason for t in trainer._last_trajectories]
    assert reasons == ["turn_token_limit"] * 2 + ["max_completion_tokens"] * 2, reasons
    kept = out["completion_mask"].sum(dim=1)
    assert (kept[:2] > 0).all(), "a turn_token_limit ending must stay in the loss"
    assert (kept[2:] == 0).all(), "a max_completion_tokens ending is a length cut and is masked"
    eos = trainer.processing_class.eos_token_id
    for t in trainer._last_trajectories[:2]:
        assert t.completion_ids[-1] == eos and t.env_mask[-1] == 0, "closed by an environment EOS"


# ------------------------------------------------------------------- attention a tree mask cannot serve


def _tiny_model(**overrides):
    """The conftest's tiny Qwen2 (vocabulary cut to 512) with ``overrides`` applied through the config's own
    logic (which layers slide is derived from use_sliding_window and max_window_layers)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from conftest import tiny_qwen_config

    cfg = Qwen2Config(**{**tiny_qwen_config(vocab_size=512).to_dict(), "layer_types": None, **overrides})
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def test_the_trainer_refuses_flash_attention_with_branching_dialects():
    """The programmatic path (no config check): the trainer refuses before TRL starts, and accepts the same model
    with a dialect that never branches, or with sdpa."""
    from agentic_rag.training.launch_checks import refuse_tree_masks_it_cannot_serve

    model = _tiny_model()
    assert model.config._attn_implementation in ("sdpa", "eager")
    refuse_tree_masks_it_cannot_serve(model, "agentic", "replace")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"flash_attention_2.*4D.*sdpa or eager"):
        refuse_tree_masks_it_cannot_serve(model, "agentic", "replace")
    with pytest.raises(ValueError, match=r"backtrack"):
        refuse_tree_masks_it_cannot_serve(model, "agentic", "keep")  # summaries keep the context; backtracks not
    refuse_tree_masks_it_cannot_serve(model, "search-r1", "replace")


def test_the_trainer_refuses_a_sliding_window_model_with_branching_dialects():
    """A tiny Qwen2 whose layers slide over a 64-token window: a branched trajectory's tree mask would replace the
    window, so the trainer refuses; with the window off, or a dialect that never branches, it accepts."""
    sliding = _tiny_model(use_sliding_window=True, sliding_window=64, max_window_layers=0)
    assert "sliding_attention" in sliding.config.layer_types
    from agentic_rag.training.launch_checks import refuse_tree_masks_it_cannot_serve

    with pytest.raises(ValueError, match=r"sliding attention window of 64 tokens"):
        refuse_tree_masks_it_cannot_serve(sliding, "agentic", "replace")
    refuse_tree_masks_it_cannot_serve(sliding, "r1-searcher", "replace")
    refuse_tree_masks_it_cannot_serve(_tiny_model(use_sliding_window=False), "agentic", "replace")
    # the window starts after the last layer: no layer slides
    refuse_tree_masks_it_cannot_serve(_tiny_model(use_sliding_window=True, sliding_window=64, max_window_layers=2),
                                      "agentic", "replace")


@pytest.mark.parametrize("config, window", [
    ({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768}, 4096),
    ({"model_type": "mistral", "sliding_window": None, "max_position_embeddings": 32768}, None),
    ({"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28,
      "num_hidden_layers": 28}, None),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28,
      "num_hidden_layers": 28}, None),  # the window starts at layer 28 of 28: no layer slides
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20,
      "num_hidden_layers": 28}, 4096),
    ({"model_type": "gemma3", "text_config": {"sliding_window": 1024, "layer_types": ["sliding_attention",
                                                                                      "full_attention"]}}, 1024),
    ({"model_type": "llama", "max_position_embeddings": 131072}, None),
])
def test_sliding_windows_are_read_from_config_json(config, window):
    from agentic_rag.training.launch_checks import model_sliding_window

    assert model_sliding_window(config) == window


def test_the_config_check_and_the_trainer_agree_on_which_dialects_branch():
    from agentic_rag.rollout.protocol import DIALECTS, get_dialect, memory_actions
    from agentic_rag.training.launch_checks import branching_actions

    actual = {name: tuple(a for a in ("backtrack", "summary") if getattr(get_dialect(name), a)) for name in DIALECTS}
    assert {name: memory_actions(name) for name in DIALECTS} == actual and any(actual.values())
    # the config check and the trainer's refusal both ask branching_actions: a backtrack always branches, a
    # summary only when it replaces the context
    for name in DIALECTS:
        assert branching_actions(name, "replace") == actual[name]
        assert branching_actions(name, "keep") == tuple(a for a in actual[name] if a != "summary")


def test_completion_logprobs_refuses_attention_that_ignores_its_tree_mask(qwen_tokenizer, tiny_qwen):
    from agentic_rag.rollout.scoring import completion_logprobs
    from agentic_rag.rollout.trajectory import Trajectory

    t = Trajectory(prompt_ids=[1, 2, 3], question="q")
    previous = tiny_qwen.config._attn_implementation
    tiny_qwen.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="flash_attention_2"):
            completion_logprobs(tiny_qwen, [t], pad_id=0)
    finally:
        tiny_qwen.config._attn_implementation = previous



def test_the_rollout_and_the_config_check_name_the_same_tree_mask_kernels():
    from agentic_rag.rollout.scoring import TREE_MASK_ATTENTION as SCORED
    from agentic_rag.training.launch_checks import TREE_MASK_ATTENTION as CHECKED

    assert set(CHECKED) == set(SCORED)


# ------------------------------------------------------------------- micro-batches dealt by length


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "dr_grpo"])
def test_rows_dealt_by_length_keep_each_optimizer_steps_rows_and_gradient(
        tiny_model_dir, world_dir, tmp_path, monkeypatch, algorithm):
    """group_by_length re-deals an optimizer step's rows shortest first; each step keeps exactly its rows, and the
    gradient summed over its micro-batches is the one TRL's own order gives, for every order-neutral loss. Each
    micro-batch then reaches the model no wider than its own longest row."""
    from trl.trainer.utils import split_tensor_dict

    scripts = {"Long?": ["<search>alpha</search>", "<search>beta</search>", "<search>gamma</search>",
                         "<answer>l</answer>"],
               "Short?": ["<answer>s</answer>"],
               "Mid?": ["<search>alpha</search>", "<answer>m</answer>"],
               "Tiny?": ["<answer>t</answer>"]}
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, algorithm=algorithm,
                           rows=[{"prompt": q, "answers": ["x"]} for q in scripts])
    assert algorithm in ORDER_NEUTRAL_LOSSES
    out = _score_generation(monkeypatch, trainer, scripts)  # 8 rows: two per question, in script order
    out["advantages"] = torch.randn(8, generator=torch.Generator().manual_seed(0))  # any advantages will do
    batches = split_tensor_dict(out, 4)  # TRL's split: micro-batches of 2
    dealt = group_by_length(batches, 2)  # two optimizer steps of two micro-batches each
    assert [len(b["completion_ids"]) for b in dealt] == [2, 2, 2, 2]

    def rows(group):
        return sorted(tuple(r[m.bool()].tolist()) for b in group for r, m in zip(b["completion_ids"],
                                                                              b["completion_mask"], strict=True))

    def length(b):
        return (b["prompt_mask"].sum(1) + b["completion_mask"].sum(1)).tolist()

    for step in (slice(0, 2), slice(2, 4)):
        assert rows(dealt[step]) == rows(batches[step])
        both = length(dealt[step][0]) + length(dealt[step][1])
        assert both == sorted(both)
    assert max(length(dealt[0])) < max(length(batches[0])), "the test must move a long row out of a micro-batch"

    widths: list[int] = []
    model = trainer.model
    handle = model.register_forward_pre_hook(lambda _m, _a, kw: widths.append(kw["input_ids"].size(1)),
                                             with_kwargs=True)
    trainer.current_gradient_accumulation_steps = 2

    def gradient(micro_batches):
        model.train()
        model.zero_grad()
        for b in micro_batches:
            trainer._compute_loss(model, b).backward()
        return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    try:
        for step in (slice(0, 2), slice(2, 4)):
            widths.clear()
            g_trl, g_dealt = gradient(batches[step]), gradient(dealt[step])
            assert g_trl and g_trl.keys() == g_dealt.keys()
            for name in g_trl:
                torch.testing.assert_close(g_dealt[name], g_trl[name], rtol=1e-4, atol=1e-7, msg=name)
            for b, w in zip(batches[step] + dealt[step], widths, strict=True):
                first, last = used_columns(torch.cat([b["prompt_mask"], b["completion_mask"]], 1),
                                                          b["prompt_mask"].size(1))
                assert w == last - first
    finally:
        handle.remove()


@pytest.mark.parametrize("loss_type, dealt", [("grpo", True), ("bnpo", False)])
def test_training_deals_each_steps_rows_by_length_unless_the_loss_forbids_it(
        tiny_model_dir, world_dir, tmp_path, monkeypatch, loss_type, dealt):
    """_prepare_inputs in training: a fresh generation batch is re-dealt by length within each optimizer step
    for an order-neutral loss; bnpo divides by each micro-batch's own token count, so its rows keep TRL's order."""
    scripts = {"Long?": ["<search>alpha</search>", "<search>beta</search>", "<answer>l</answer>"],
               "Short?": ["<answer>s</answer>"],
               "Mid?": ["<search>alpha</search>", "<answer>m</answer>"],
               "Tiny?": ["<answer>t</answer>"]}
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, rows=[{"prompt": q, "answers": ["x"]} for q in scripts])
    monkeypatch.setattr(trainer_module, "HFPolicy", lambda model, tok, *args, **kw: ScriptedPolicy(tok, scripts))
    trainer.loss_type = loss_type
    trainer.args.gradient_accumulation_steps = trainer.args.steps_per_generation = 2
    calls = []
    deal = group_by_length
    monkeypatch.setattr(trainer_module, "group_by_length", lambda b, n: calls.append(n) or deal(b, n))
    trainer.model.train()
    first = trainer._prepare_inputs([{"prompt": q, "answers": ["x"]} for q in scripts for _ in range(2)])
    assert calls == ([2] if dealt else [])
    assert first is trainer._buffered_inputs[0] and len(trainer._buffered_inputs) == 2
    if dealt:
        lengths = [n for b in trainer._buffered_inputs
                   for n in (b["prompt_mask"].sum(1) + b["completion_mask"].sum(1)).tolist()]
        assert lengths == sorted(lengths) and lengths[0] < lengths[-1]


def test_used_columns_keep_every_real_token_and_one_completion_column():
    m = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 0]])
    assert used_columns(m, 4) == (1, 6)
    assert used_columns(torch.tensor([[0, 1, 1, 0, 0]]), 3) == (1, 4)  # no completion token at all
