"""The real pretrained model end to end, on a CPU: SmolLM2-135M-Instruct from the packaged GGUF
(``smollm2-135m-instruct``, :mod:`agentic_rag.models`), loaded once for the module.

It answers a plain question through its chat template; LoRA SFT on a few expert trajectories of the quick
start's world (the scripted experts of :mod:`agentic_rag.demo.experts`, played through the real engine and index)
teaches it to search; its adapter saves and loads back onto the GGUF base exactly; one GRPO step of the project's
trainer rolls out with search and moves the adapter; the evaluation runner scores held-out questions greedily; the
merged model saves as a plain model directory. Zero-shot the model never writes a search tag (issue 12), so the
SFT here is strong (a high learning rate, two epochs) on purpose: what is tested is that every stage runs on the
real model and does its job, not a recipe.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from agentic_rag.rollout import RolloutSettings

SMOL = "smollm2-135m-instruct"
SYSTEM = "Answer the question by searching."  # the quick start's system prompt
# the quick start's rollout budgets (src/agentic_rag/resources/configs/world_grpo_smollm2.yaml)
LIMITS = RolloutSettings(max_turns=4, max_searches=3, max_tokens_per_turn=24, max_completion_tokens=200,
                       passages_per_search=1, max_observation_tokens=64)


@pytest.fixture(scope="module")
def smol():
    """The tokenizer and the base model (float32, as training loads it), once for the module."""
    from agentic_rag.models import load_tokenizer
    from agentic_rag.training.config import ModelConfig
    from agentic_rag.training.model import load_base_model

    tok = load_tokenizer(SMOL)
    model = load_base_model(ModelConfig(name_or_path=SMOL, dtype="float32"))
    return tok, model


def test_the_packaged_gguf_loads_as_a_plain_chat_model_and_knows_paris(smol):
    tok, model = smol
    assert "<|im_start|>" in (tok.chat_template or "") and tok.pad_token_id is not None
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model.config, "quantization_config", None)
    assert model.name_or_path == SMOL and model.dtype == torch.float32
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    reply = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in reply, reply


@dataclass
class Run:
    """What the pipeline did, stage by stage, for the tests to check."""

    seconds: dict[str, float] = field(default_factory=dict)
    sft_losses: list[float] = field(default_factory=list)
    adapter_config: dict[str, Any] = field(default_factory=dict)
    reload_logits_diff: float = float("nan")
    grpo_logs: dict[str, float] = field(default_factory=dict)
    lora_changed: int = 0
    lora_total: int = 0
    eval_summary: dict[str, Any] = field(default_factory=dict)
    eval_records: list[dict[str, Any]] = field(default_factory=list)
    merged_logits_diff: float = float("nan")
    merged_dir: Path | None = None


def _lora(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.fixture(scope="module")
def run(smol, world_dir, tmp_path_factory) -> Run:
    """SFT (LoRA) -> save and reload the adapter -> one GRPO step -> greedy evaluation -> merge and save."""
    from datasets import Dataset
    from peft import PeftModel
    from trl import GRPOConfig

    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.data.questions import read_questions
    from agentic_rag.data.world import generate_world, questions
    from agentic_rag.demo.experts import expert_questions, write_expert_trajectories
    from agentic_rag.evaluation.config import DatasetSection, EvalConfig, PolicySection
    from agentic_rag.evaluation.runner import run_evaluation
    from agentic_rag.models import load_causal_lm, save_model
    from agentic_rag.rollout import HFPolicy, SamplingParams
    from agentic_rag.rollout.settings import PromptSettings
    from agentic_rag.search import open_searcher
    from agentic_rag.search.settings import SearchSettings
    from agentic_rag.tools import SearchTool
    from agentic_rag.training.algorithms import algorithm_args
    from agentic_rag.training.rewards import FormatReward, MetricReward
    from agentic_rag.training.sft import build_sft_trainer
    from agentic_rag.training.trainer import AgenticGRPOTrainer

    tok, base = smol
    out = tmp_path_factory.mktemp("real_model")
    searcher = open_searcher(world_dir / "index")
    r = Run()
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        r.seconds[stage] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()

    # expert trajectories of the quick start's world (seed 0): every kind of training question, searched
    world = generate_world(0)
    train, _ = questions(world)
    people = sorted({q["supporting_facts"][0] for q in train})[:24]
    rows = expert_questions(world, people, two_hop_correct=1.0, two_hop_samples=1, seed=0)
    rows = random.Random(0).sample(rows, 16)
    info = write_expert_trajectories(
        rows, out / "experts.jsonl", tokenizer=tok, searcher=searcher, settings=LIMITS,
        prompt_ids=lambda q: build_prompt(tok, q, "agentic", chat=True, system=SYSTEM))
    assert info["not_ending_as_scripted"] == 0, info

    # SFT: a LoRA adapter on the GGUF base, saved by PEFT, loaded back onto the same base
    trainer, _, _ = build_sft_trainer(model=SMOL, data=str(out / "experts.jsonl"), output_dir=str(out / "sft"),
                                      rollout=LIMITS, prompt=PromptSettings(system_prompt=SYSTEM, chat_template=True),
                                      epochs=2, learning_rate=2e-3, batch_size=8, seed=0,
                                      base_model=base, tokenizer=tok)
    trainer.train()
    r.sft_losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    lap("sft")
    adapter = out / "sft"
    trainer.save_model(str(adapter))
    r.adapter_config = json.loads((adapter / "adapter_config.json").read_text())
    probe = torch.tensor([build_prompt(tok, "Where was Dive Drouk born?", "agentic", chat=True, system=SYSTEM)])
    sft_model = trainer.model.eval()
    with torch.no_grad():
        before = sft_model(input_ids=probe).logits
        policy_model = PeftModel.from_pretrained(sft_model.unload(), str(adapter), is_trainable=True)
        r.reload_logits_diff = float((policy_model(input_ids=probe).logits - before).abs().max())
    del trainer, sft_model
    lap("save_and_reload_adapter")

    # one GRPO step of the project's trainer: 2 training questions x 4 sampled rollouts, searching mid-rollout
    # At a tenth of the recipe's rate: Adam's first step moves every LoRA weight by about the learning rate
    # whatever its gradient, and at 3e-4 one step on 8 rollouts swung the greedy policy to searching until out of
    # budget (in CI and here on 2026-11-24; earlier machines passed: float rounding picks the direction). The
    # evaluation below needs a policy that still answers, as the SFT start does (3 of the 4 held-out questions).
    rows = [{"prompt": q.question, "answers": q.answers}
            for q in read_questions(world_dir / "world" / "train.jsonl", limit=3)[1:]]  # a one-hop, a two-hop
    args = GRPOConfig(output_dir=str(out / "grpo"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=LIMITS.max_completion_tokens, max_steps=1, learning_rate=3e-5,
                      beta=0.0, temperature=1.0, use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
                      report_to=[], **algorithm_args("grpo"))
    grpo = AgenticGRPOTrainer(policy_model, tokenizer=tok, args=args, train_dataset=Dataset.from_list(rows),
                              reward_funcs=[MetricReward("em"), FormatReward("agentic", eos_tokens=[
                                  tok.eos_token])], tools=SearchTool(searcher), settings=LIMITS,
                              prompt=PromptSettings(system_prompt=SYSTEM, chat_template=True))
    start = _lora(grpo.model)
    grpo.train()
    after = _lora(grpo.model)
    r.lora_total = len(start)
    r.lora_changed = sum(not torch.equal(start[n], after[n]) for n in start)
    r.grpo_logs = dict(grpo.state.log_history[0])
    policy_model = grpo.model.eval()
    del grpo
    lap("grpo_step")

    # greedy evaluation of held-out questions through the evaluation runner
    cfg = EvalConfig(
        name="real-model", dataset=DatasetSection(path=str(world_dir / "world" / "test.jsonl"), limit=4),
        policy=PolicySection(type="local", model=SMOL, tokenizer=SMOL, device="cpu"),
        search=SearchSettings(index=str(world_dir / "index")), rollout=LIMITS,
        prompt=PromptSettings(system_prompt=SYSTEM, chat_template=True), batch_size=4,
        metrics=["em", "f1", "well_formed"], output_dir=str(out / "eval"), seed=0)
    policy = HFPolicy(policy_model, tok, SamplingParams(do_sample=False), return_logprobs=False)
    r.eval_summary = run_evaluation(cfg, policy=policy, tokenizer=tok, searcher=searcher, progress=False,
                                    overwrite=True)
    r.eval_records = [json.loads(line) for line in (out / "eval" / "predictions.jsonl").read_text().splitlines()]
    lap("evaluation")

    # the merged model (what `agentic-rag sft --merge` writes) saves as a plain directory and loads back
    merged = policy_model.merge_and_unload()
    r.merged_dir = save_model(merged, out / "merged", tokenizer=tok)
    with torch.no_grad():
        want = merged(input_ids=probe).logits
        r.merged_logits_diff = float((load_causal_lm(str(r.merged_dir), device="cpu")(input_ids=probe).logits
                                      - want).abs().max())
    lap("merge_save_load")
    print("real-model stage seconds:", r.seconds)
    return r


def test_sft_on_expert_trajectories_trains_an_adapter_that_reloads_onto_the_gguf_base(run):
    assert run.sft_losses[-1] < run.sft_losses[0] / 2, run.sft_losses
    # the adapter names a base that resolves again (not the site-packages directory transformers read)
    assert run.adapter_config["base_model_name_or_path"] == SMOL
    assert run.reload_logits_diff < 1e-5


def test_one_grpo_step_searches_and_moves_the_adapter(run):
    logs = run.grpo_logs
    assert logs["agentic/searches_per_trajectory"] > 0, logs  # at least one of the 8 rollouts searched
    assert run.lora_changed >= run.lora_total // 2, (run.lora_changed, run.lora_total)


def test_greedy_evaluation_of_held_out_questions(run):
    s, records = run.eval_summary, run.eval_records
    assert len(records) == 4 and all(r["num_searches"] >= 1 for r in records), records
    # every prediction is scored, and the SFT'd model (4 SFT steps: the search habit, not yet the task) answers
    # some: zero-shot it neither searches nor writes an answer tag
    assert all({"em", "f1", "well_formed"} <= set(r["metrics"]) for r in records)
    assert all(0.0 <= r["metrics"][m] <= 1.0 for r in records for m in ("em", "f1", "well_formed"))
    assert any(r["prediction"] for r in records), records
    assert s["this_session"]["examples"] == 4


def test_the_merged_model_saves_as_a_plain_directory_and_loads_back(run):
    from agentic_rag.models import load_tokenizer

    assert (run.merged_dir / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((run.merged_dir / "config.json").read_text())
    assert run.merged_logits_diff < 1e-4
    assert "<|im_start|>" in load_tokenizer(str(run.merged_dir)).chat_template
