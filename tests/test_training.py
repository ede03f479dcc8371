"""The trainer on a tiny random-init model on CPU: real optimizer steps, masks, branched scoring, QLoRA."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

from agentic_rag.rollout import AgentRollout, RolloutSettings
from agentic_rag.training.algorithms import algorithm_args
from agentic_rag.training.trainer import AgenticGRPOTrainer
from agentic_rag.training.tree import TreeLayout
from test_rollout import FakeSearcher, ForcedHFPolicy, prompts


def varied_reward(prompts, completions, completion_ids, **kw):
    """Differs between completions of one group, so advantages are not all zero."""
    return [float(len(set(ids)) % 5) + 0.1 * (sum(ids) % 7) for ids in completion_ids]


def make_trainer(model_dir, world_dir, tmp_path, *, beta=0.0, algorithm="grpo", quantization="none",
                 reward=varied_reward, max_steps=2, dialect="agentic", rows=None, **trainer_kwargs):
    from datasets import Dataset
    from trl import GRPOConfig

    from agentic_rag.data.questions import read_questions
    from agentic_rag.models import load_tokenizer
    from agentic_rag.search import open_searcher
    from agentic_rag.tools import SearchTool
    from agentic_rag.training.config import ModelConfig
    from agentic_rag.training.model import load_base_model, lora_config

    tok = load_tokenizer(str(model_dir))
    cfg = ModelConfig(name_or_path=str(model_dir), quantization=quantization, lora_r=4, lora_alpha=8,
                      lora_dropout=0.0, gradient_checkpointing=False)
    model = load_base_model(cfg)
    if rows is None:
        rows = [{"prompt": r.question, "answers": r.answers}
                for r in read_questions(world_dir / "world" / "train.jsonl", limit=8)]
    data = Dataset.from_list(rows)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=96, max_steps=max_steps, learning_rate=5e-2, beta=beta, report_to=[],
                      use_cpu=True, save_strategy="no", logging_steps=1, seed=0, disable_dropout=True,
                      **algorithm_args(algorithm))
    settings = trainer_kwargs.pop("settings", None) or RolloutSettings(
        max_turns=2, max_tokens_per_turn=12, max_completion_tokens=96, passages_per_search=1, max_observation_tokens=48)
    tools = trainer_kwargs.pop("tools", None) or SearchTool(open_searcher(world_dir / "index"))
    return AgenticGRPOTrainer(model, tokenizer=tok, reward_funcs=[reward], args=args, train_dataset=data,
                              tools=tools, settings=dataclasses.replace(settings, dialect=dialect),
                              algorithm=algorithm, peft_config=lora_config(cfg), **trainer_kwargs)


def lora_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_two_grpo_steps_change_the_adapter_and_nothing_else(tiny_model_dir, world_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, beta=0.05)
    before = lora_state(trainer.model)
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    assert before and all(not p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" not in n)
    trainer.train()
    assert trainer.state.global_step == 2
    after = lora_state(trainer.model)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) >= len(before) // 2, "the LoRA weights must move"
    for n, p in trainer.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(base_before[n], p.detach()), f"base weight {n} changed"
    logs = trainer.state.log_history[0]
    for key in ("rewards/varied_reward/mean", "kl", "agentic/searches_per_trajectory", "agentic/env_tokens_masked",
                "clip_ratio/region_mean", "completions/mean_length"):
        assert key in logs, key


class WentAway:
    """A search target that has fallen over: every search raises, as a dead server's client does."""

    def search(self, query, k=10):
        raise ConnectionError("search server went away")

    def batch_search(self, queries, k=10):
        raise ConnectionError("search server went away")


def test_training_stops_when_its_searches_fail(tiny_model_dir, world_dir, tmp_path):
    """Rewards earned with error observations instead of passages would train on a broken search target: a rollout
    batch whose every search failed stops the run, naming the counts (the last checkpoint stays for --resume)."""
    from agentic_rag.errors import SearchFailuresError
    from agentic_rag.models import load_tokenizer
    from agentic_rag.tools import SearchTool

    search = load_tokenizer(str(tiny_model_dir))("<search>who</search>", add_special_tokens=False)["input_ids"]

    def always_search(scores, rows):  # the policy writes a search tag every turn; its searches all fail
        out = torch.full_like(scores, float("-inf"))
        for j, row in enumerate(rows):
            step = len(row.generated)
            out[j, search[step] if step < len(search) else 0] = 0
        return out

    settings = RolloutSettings(max_turns=4, max_tokens_per_turn=12, max_completion_tokens=96, passages_per_search=1,
                               max_observation_tokens=48)
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, tools=SearchTool(WentAway()), settings=settings,
                           processors=[always_search])
    with pytest.raises(SearchFailuresError, match=r"training stopped at step 0: 12 of 12 searches of the last "
                                                  r"rollout batch failed") as info:
        trainer.train()
    assert info.value.exit_code == 3


def _loss_inputs(trainer, tok):
    """Two completions in TRL's padded layout: model tokens, an observation, model tokens, and (row 0) a
    trailing observation that no model token follows."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    p0, p1 = enc("Question one?"), enc("Q2 is longer than the first one?")
    m1, obs, m2, tail = enc("<search>x</search>"), enc("\n<observation>\nsome text\n</observation>\n"), \
        enc("<answer>y</answer>"), enc("\n<observation>\ncut here\n</observation>")
    c0 = m1 + obs + m2 + tail
    e0 = [1] * len(m1) + [0] * len(obs) + [1] * len(m2) + [0] * len(tail)
    c1 = m1 + obs + m2
    e1 = [1] * len(m1) + [0] * len(obs) + [1] * len(m2)
    P, C = max(len(p0), len(p1)), max(len(c0), len(c1))
    pad = tok.pad_token_id

    def left(x, n):
        return [pad] * (n - len(x)) + x

    def right(x, n, v):
        return x + [v] * (n - len(x))

    inputs = {
        "prompt_ids": torch.tensor([left(p0, P), left(p1, P)]),
        "prompt_mask": torch.tensor([[0] * (P - len(p0)) + [1] * len(p0), [0] * (P - len(p1)) + [1] * len(p1)]),
        "completion_ids": torch.tensor([right(c0, C, pad), right(c1, C, pad)]),
        "completion_mask": torch.tensor([right([1] * len(c0), C, 0), right([1] * len(c1), C, 0)]),
        "tool_mask": torch.tensor([right(e0, C, 1), right(e1, C, 1)]),
        "advantages": torch.tensor([1.0, -0.5]),
        "num_items_in_batch": torch.tensor(float(sum(e0) + sum(e1))),
        "agentic_layout": [None, None],
    }
    g = torch.Generator().manual_seed(0)
    inputs["old_per_token_logps"] = -torch.rand((2, C), generator=g) * 3
    inputs["ref_per_token_logps"] = -torch.rand((2, C), generator=g) * 3
    env = (inputs["tool_mask"] == 0) & (inputs["completion_mask"] == 1)
    return inputs, env, len(m1), len(m1) + len(obs) + len(m2)


def _current_logps(trainer, inputs) -> torch.Tensor:
    """The policy's per-token log-probabilities of a loss batch's completions now, without a gradient."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention,
                                                                 inputs["completion_ids"].size(1))
    return logps


def _loss_and_grads(trainer, inputs):
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, copy.deepcopy(inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("algorithm", ["grpo", "dapo"])
def test_environment_tokens_never_reach_the_loss_kl_or_gradients(tiny_model_dir, world_dir, tmp_path, algorithm):
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, beta=0.1, algorithm=algorithm)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; here we call the loss directly
    # a non-zero adapter, so gradients reach every LoRA weight
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    tok = trainer.processing_class
    inputs, env, _, tail_start = _loss_inputs(trainer, tok)
    # old and reference log-probabilities near the model's own, so ratios sit inside the clip range
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        actual, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, ids.size(1) -
                                                                  inputs["prompt_ids"].size(1))
    inputs["old_per_token_logps"] = actual + 0.05 * inputs["old_per_token_logps"]
    inputs["ref_per_token_logps"] = actual + 0.05 * inputs["ref_per_token_logps"]
    loss0, grads0 = _loss_and_grads(trainer, inputs)
    assert loss0.abs() > 0 and grads0

    # 1. the old and reference log-probabilities at environment positions are irrelevant
    perturbed = copy.deepcopy(inputs)
    perturbed["old_per_token_logps"][env] += 50.0
    perturbed["ref_per_token_logps"][env] -= 50.0
    # 2. so are the ids of environment tokens that no model token reads (row 0's trailing observation)
    g = torch.Generator().manual_seed(1)
    tail = perturbed["completion_ids"][0, tail_start:]
    real_tail = perturbed["completion_mask"][0, tail_start:].bool()
    tail[real_tail] = torch.randint(1000, 20000, (int(real_tail.sum()),), generator=g)
    loss1, grads1 = _loss_and_grads(trainer, perturbed)
    assert torch.allclose(loss0, loss1, atol=1e-7, rtol=0)
    for n in grads0:
        assert torch.allclose(grads0[n], grads1[n], atol=1e-7, rtol=1e-5), n

    # the test has teeth: the same perturbation at a model position changes the loss
    control = copy.deepcopy(inputs)
    control["ref_per_token_logps"][0, 1] -= 5.0
    assert (loss0 - _loss_and_grads(trainer, control)[0]).abs() > 1e-6
    # and an observation that later model tokens read is context: changing it changes their log-probs
    context = copy.deepcopy(inputs)
    first_obs = env[0].nonzero()[0, 0]  # row 0: positive advantage, its ratio term is not clipped flat
    context["completion_ids"][0, first_obs] = 12345
    assert (loss0 - _loss_and_grads(trainer, context)[0]).abs() > 1e-6


def test_only_model_tokens_go_through_the_lm_head(tiny_model_dir, world_dir, tmp_path, monkeypatch):
    """The fused LM head projects exactly the positions that predict a model token: not the prompt, not the
    padding, not the observations (labels -100), on a CPU as on a GPU (compact_lm_head_scoring)."""
    import trl.trainer.utils as trl_utils

    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, beta=0.0)
    trainer.current_gradient_accumulation_steps = 1
    inputs, env, _, _ = _loss_inputs(trainer, trainer.processing_class)
    projected = []
    original = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        projected.append(hidden.shape[0])
        return original(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    trainer._compute_loss(trainer.model, copy.deepcopy(inputs))
    model_tokens = int((inputs["completion_mask"] * inputs["tool_mask"]).sum())
    assert projected == [model_tokens], (projected, model_tokens)
    assert int(env.sum()) > 0 and model_tokens < int(inputs["completion_mask"].sum()), "observations were skipped"


def test_branched_trajectories_are_scored_under_their_own_contexts(tiny_model_dir, world_dir, tmp_path):
    """The trainer's log-probabilities (TRL's fused head, our tree mask) equal the rollout's after a backtrack."""
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, beta=0.0)
    tok = trainer.processing_class
    scripts = {"Branch?": ["<search>wrong</search>", "<backtrack>off topic</backtrack>", "<search>right</search>",
                           "<answer>r</answer>"],
               "Straight?": ["<search>alpha</search>", "<answer>a</answer>"]}
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.eval()
    policy = ForcedHFPolicy(model, tok, scripts)
    trajs = AgentRollout(policy, tok, FakeSearcher(), RolloutSettings(passages_per_search=1)).run(
        prompts(tok, list(scripts)), list(scripts))
    assert not trajs[0].is_linear and trajs[1].is_linear
    P = max(len(t.prompt_ids) for t in trajs)
    C = max(len(t.completion_ids) for t in trajs)
    ids = torch.full((2, P + C), tok.pad_token_id)
    mask = torch.zeros((2, P + C), dtype=torch.long)
    for i, t in enumerate(trajs):
        ids[i, P - len(t.prompt_ids):P] = torch.tensor(t.prompt_ids)
        ids[i, P:P + len(t.completion_ids)] = torch.tensor(t.completion_ids)
        mask[i, P - len(t.prompt_ids):P + len(t.completion_ids)] = 1
    trainer._active_layouts = [TreeLayout(trajs[0]), None]
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C)
    trainer._active_layouts = None
    for i, t in enumerate(trajs):
        model_pos = torch.tensor(t.env_mask, dtype=torch.bool)
        got = logps[i, :len(t.completion_ids)][model_pos]
        # TRL's fused, chunked LM head sums a 150k-word softmax in another order than the decoder: float32
        # noise of ~1e-3 on values near -12; a wrong context is off by far more (checked below)
        assert torch.allclose(got, torch.tensor(t.logprobs)[model_pos], atol=2e-3), (got - torch.tensor(
            t.logprobs)[model_pos]).abs().max()
    # the plain TRL path (no tree mask) gets the branched row wrong
    with torch.no_grad():
        plain, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C)
    model_pos = torch.tensor(trajs[0].env_mask, dtype=torch.bool)
    assert (plain[0, :len(trajs[0].completion_ids)][model_pos] - torch.tensor(trajs[0].logprobs)[model_pos]).abs(
    ).max() > 2e-2


def test_algorithm_presets_use_trl_options():
    token = {"importance_sampling_level": "token", "epsilon": 0.2}
    assert algorithm_args("grpo") == {**token, "loss_type": "grpo", "scale_rewards": "group"}
    assert algorithm_args("dr_grpo") == {**token, "loss_type": "dr_grpo", "scale_rewards": "none"}
    dapo = algorithm_args("dapo")
    assert dapo["loss_type"] == "dapo" and dapo["epsilon_high"] == 0.28 and dapo["mask_truncated_completions"]
    assert algorithm_args("dapo", epsilon_high=0.3)["epsilon_high"] == 0.3
    with pytest.raises(ValueError, match="unknown algorithm"):
        algorithm_args("ppo")


def test_qlora_nf4_trains_on_cpu(tiny_model_dir, world_dir, tmp_path):
    from bitsandbytes.nn import Linear4bit

    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, quantization="nf4")
    layers = [m for m in trainer.model.modules() if isinstance(m, Linear4bit)]
    assert layers and all(m.support_avx512bf16_for_cpu is False for m in layers)
    assert all(m.weight.quant_state.quant_type == "nf4" for m in layers)
    before = lora_state(trainer.model)
    trainer.train()  # generation (eval-mode forwards) then training steps: the repacking bug would fail here
    after = lora_state(trainer.model)
    assert sum(not torch.equal(before[n], after[n]) for n in before) >= len(before) // 2


def test_medqa_training_shows_the_options_and_the_choice_reward_scores_letters(tiny_model_dir, world_dir, tmp_path):
    """Training prompts a multiple-choice question as evaluation does; the choice reward gets its columns."""
    from agentic_rag.training.config import ExperimentConfig
    from agentic_rag.training.rewards import ChoiceReward
    from agentic_rag.training.train import training_rows
    from conftest import shared

    cfg = ExperimentConfig()
    cfg.data.train_file, cfg.data.limit = str(shared("medqa/medqa_us_4opt_test.jsonl")), 2
    rows = training_rows(cfg)
    assert rows[0]["answer_idx"] == "B" and "\n\nOptions:\nA. Disclose the error" in rows[0]["prompt"]
    seen = {}
    choice = ChoiceReward()

    def spy(prompts, completions, completion_ids, trajectory, **kw):
        seen.update(prompts=prompts, trajectory=trajectory, kw=kw)
        return choice(prompts, completions, completion_ids, trajectory, **kw)

    spy.__name__ = "choice"
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, reward=spy, max_steps=1, rows=rows)
    trainer.model.eval()
    out = trainer._generate_and_score_completions([rows[0], rows[0], rows[1], rows[1]])
    # the model was shown the options: in the prompt tokens and in what the rewards see as the question
    prompt_text = trainer.processing_class.decode(out["prompt_ids"][0], skip_special_tokens=True)
    assert "Options:\nA. Disclose the error" in prompt_text and prompt_text.count("\nD. ") == 1
    assert all("Options:\nA. " in t["question"] for t in seen["trajectory"])
    assert seen["kw"]["answer_idx"] == ["B", "B", rows[1]["answer_idx"], rows[1]["answer_idx"]]
    assert set(seen["kw"]["options"][0]) == {"A", "B", "C", "D"}
    # and the reward pays the gold letter (or the gold option's text), nothing else
    kw = {k: seen["kw"][k][:1] for k in ("options", "answer_idx")}
    gold_text = rows[0]["options"]["B"]
    pay = [choice(None, None, None, [{"answer": a}], **kw)[0] for a in ("B", "b", gold_text, "A", None)]
    assert pay == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_a_stage_two_config_starts_from_the_stage_one_adapter_and_pays_stage_two(tiny_model_dir, world_dir,
                                                                                 tmp_path):
    """R1-Searcher's curriculum as two configs: stage 2 loads the stage-1 adapter (model.adapter), trains it on
    with the stage-2 reward from step 0 (curriculum.stage: 2), and saves it."""
    from peft import get_peft_model
    from safetensors.torch import load_file

    from agentic_rag.training.config import ModelConfig, config_from_dict
    from agentic_rag.training.model import load_base_model, lora_config
    from agentic_rag.training.train import policy_model, run

    # a stage-1 adapter, as a stage-1 run leaves it in OUTPUT_DIR/final: non-zero LoRA weights, peft format
    mcfg = ModelConfig(name_or_path=str(tiny_model_dir), lora_r=4, lora_alpha=8, lora_dropout=0.0,
                       lora_target_modules=["q_proj", "v_proj"], gradient_checkpointing=False)
    torch.manual_seed(0)
    stage1 = get_peft_model(load_base_model(mcfg), lora_config(mcfg))
    with torch.no_grad():
        for n, p in stage1.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    stage1.save_pretrained(tmp_path / "stage1")
    stage1_weights = lora_state(stage1)

    data = {"model": {"name_or_path": str(tiny_model_dir), "adapter": str(tmp_path / "stage1"),
                      "gradient_checkpointing": False, "lora_r": 16},  # the adapter's rank wins
            "data": {"train_file": str(world_dir / "world" / "train.jsonl"), "limit": 4},
            "search": {"index": str(world_dir / "index")},
            "rollout": {"max_turns": 2, "max_tokens_per_turn": 12, "max_completion_tokens": 96,
                        "passages_per_search": 1, "max_observation_tokens": 48},
            "curriculum": {"enabled": True, "stage": 2, "stage2_step": 1000},
            "algorithm": {"num_generations": 2, "per_device_train_batch_size": 4, "max_steps": 1,
                          "learning_rate": 5e-2, "beta": 0.001},  # the recipe's KL: to the stage-1 adapter
            "logging": {"swanlab_mode": "disabled"},
            "checkpoint": {"output_dir": str(tmp_path / "stage2")}}
    cfg = config_from_dict(data, env={})
    model, peft_config = policy_model(cfg)
    assert peft_config is None  # the trainer must not put a fresh adapter on top
    loaded = lora_state(model)
    assert loaded.keys() == stage1_weights.keys()
    assert all(torch.equal(loaded[n], stage1_weights[n]) for n in loaded)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    assert model.peft_config["default"].r == 4
    del model

    result = run(cfg)
    summary = json.loads((tmp_path / "stage2" / "train_summary.json").read_text())
    logs = summary["log_history"][0]
    assert result["global_step"] == 1
    assert logs["curriculum/stage"] == 2.0  # stage 2 from step 0, though stage2_step is 1000
    # a random model's output is malformed: stage 2 pays the format penalty (stage 1 never pays below 0)
    assert logs["rewards/curriculum/mean"] == -2.0
    assert logs["kl"] == 0.0  # the reference is the loaded adapter itself (TRL's frozen "ref" copy of it)
    # the adapter it saved is the stage-1 adapter carried on (same modules and rank, its non-zero weights;
    # a constant reward gives zero advantages, so this step left them where they were), not a fresh one
    final_dir = tmp_path / "stage2" / "final"
    assert json.loads((final_dir / "adapter_config.json").read_text())["r"] == 4
    final = load_file(str(final_dir / "adapter_model.safetensors"))
    stage1_by_key = {n.replace(".default", ""): w for n, w in stage1_weights.items()}  # peft drops the name
    assert set(final) == set(stage1_by_key)
    assert all(torch.allclose(final[k], stage1_by_key[k]) for k in final)
    assert any(k.endswith("lora_B.weight") and final[k].abs().sum() > 0 for k in final)


def test_per_rollout_tools_get_the_training_rows_fields(tiny_model_dir, world_dir, tmp_path):
    """A class tool's ``reset(**row)`` gets the dataset row's fields in training (question, answers, id), as in
    evaluation, once per rollout."""
    from agentic_rag.search import open_searcher
    from agentic_rag.tools.build import build_tools

    seen = tmp_path / "seen.jsonl"
    (tmp_path / "recorder.py").write_text(f'''
import json


class Recorder:
    """Writes down the row each rollout starts with."""

    def reset(self, **row):
        with open({str(seen)!r}, "a") as f:
            f.write(json.dumps(row) + "\\n")

    def note(self, text: str) -> str:
        """Note something.

        Args:
            text: What to note.
        """
        return text
''')
    tools = build_tools(["search", {"python": f"{tmp_path / 'recorder.py'}:Recorder"}],
                        searcher=open_searcher(world_dir / "index"))
    rows = [{"prompt": f"question {i}", "answers": [f"answer {i}"], "id": f"q{i}"} for i in range(4)]
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, rows=rows, max_steps=1, tools=tools)
    trainer.train()
    got = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(got) == 4  # one step: 2 questions x 2 generations, one instance each
    for row in got:
        i = int(row["question"].split()[-1])
        assert row == {"question": f"question {i}", "answers": [f"answer {i}"], "id": f"q{i}"}
