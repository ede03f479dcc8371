"""Train a search agent with GRPO: the run manual, top to bottom.

    accelerate launch --config_file experiments/training/accelerate/zero2.yaml \\
        -m agentic_rag.training.train --config experiments/training/CONFIG.yaml [--resume] [--set KEY=VALUE ...]

(``script/training/train_zero2.sh`` / ``train_zero3.sh`` do this from ``.env``; ``agentic-rag train`` runs it in
one process.) The steps:

1. load the experiment config and check all of it, before anything heavy happens;
2. warn when the memory estimate says the model will not fit the GPUs;
3. open the searcher (an index directory or a search server URL) behind an LRU cache;
4. read the training questions;
5. load the tokenizer and the base model (NF4 for QLoRA) and describe the LoRA adapter;
6. start SwanLab on the main process (offline unless configured);
7. build the AgenticGRPOTrainer and train, resuming from the latest complete checkpoint with ``--resume``;
8. save the final adapter (peft format), the tokenizer and the resolved config in OUTPUT_DIR/final.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from ..config import ConfigError, ExperimentConfig, config_to_dict, load_config

log = logging.getLogger("agentic_rag.train")


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError([f"--set expects KEY=VALUE, got {item!r}"], "command line")
        key, value = item.split("=", 1)
        out[key.strip()] = value
    return out


def grpo_args(cfg: ExperimentConfig, *, use_cpu: bool):
    import torch
    from trl import GRPOConfig

    from .trainer import algorithm_args

    a = cfg.algorithm
    bf16 = False
    if not use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        bf16 = cfg.model.quantization == "nf4" or cfg.model.dtype in ("auto", "bfloat16")
    kwargs: dict[str, Any] = dict(
        output_dir=cfg.checkpoint.output_dir, seed=cfg.seed, data_seed=cfg.seed,
        learning_rate=a.learning_rate, max_steps=a.max_steps, warmup_steps=a.warmup_ratio,
        per_device_train_batch_size=a.per_device_train_batch_size,
        gradient_accumulation_steps=a.gradient_accumulation_steps, max_grad_norm=a.max_grad_norm,
        num_generations=a.num_generations, beta=a.beta, epsilon=a.epsilon, num_iterations=a.num_iterations,
        max_completion_length=cfg.rollout.max_completion_tokens, temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p, gradient_checkpointing=cfg.model.gradient_checkpointing,
        logging_steps=cfg.logging.logging_steps, save_strategy="steps", save_steps=cfg.checkpoint.save_steps,
        save_total_limit=cfg.checkpoint.save_total_limit, report_to=[] if cfg.logging.swanlab_mode == "disabled"
        else ["swanlab"], run_name=cfg.logging.run_name or None, use_cpu=use_cpu, bf16=bf16,
        remove_unused_columns=False, log_completions=False, disable_dropout=True,
    )
    kwargs.update(algorithm_args(a.name, epsilon_high=a.epsilon_high, mask_truncated=a.mask_truncated_completions))
    return GRPOConfig(**kwargs)


def training_rows(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    from ..data.questions import read_questions

    rows = read_questions(cfg.data.train_file, limit=cfg.data.limit)
    if not rows:
        raise ConfigError([f"data.train_file {cfg.data.train_file} holds no questions"])
    out = []
    for r in rows:
        row = {"prompt": r.question, "answers": r.answers, "gold_titles": r.gold_titles, "id": r.id}
        if "options" in r.meta:
            row["options"] = r.meta["options"]
            row["answer_idx"] = r.meta.get("answer_idx", "")
        out.append(row)
    return out


def fit_warning(cfg: ExperimentConfig) -> str | None:
    """The memory estimator's warning when the model will not fit (None on CPU or when it fits)."""
    from .memory import EstimateInputs, TrainingSetup, check_fits, gpu_memory_gb

    budget = cfg.gpu_memory_gb or gpu_memory_gb()
    if budget is None:
        return None
    a = cfg.algorithm
    world = int(os.environ.get("WORLD_SIZE", "1"))
    zero = int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2") or 2)
    per_gpu_prompts = max(1, a.per_device_train_batch_size * a.gradient_accumulation_steps // a.num_generations)
    setup = TrainingSetup(gpus=world, zero=zero if zero in (2, 3) else 2,
                          quant="nf4" if cfg.model.quantization == "nf4" else "none", lora_rank=cfg.model.lora_r,
                          batch=per_gpu_prompts, num_generations=a.num_generations,
                          micro_batch=a.per_device_train_batch_size, max_prompt=512,
                          max_completion=cfg.rollout.max_completion_tokens,
                          gradient_checkpointing=cfg.model.gradient_checkpointing)
    try:
        return check_fits(EstimateInputs(cfg.model.name_or_path, setup), budget)
    except Exception as exc:  # noqa: BLE001 - an estimate that cannot be made must not stop training
        log.info("no memory estimate (%s)", exc)
        return None


def run(cfg: ExperimentConfig, *, resume: bool | None = None) -> dict[str, Any]:
    import torch
    from accelerate import PartialState
    from datasets import Dataset
    from transformers import set_seed

    from ..models import load_tokenizer
    from ..rollout import RolloutLimits
    from ..search import open_searcher
    from ..tools import SearchTool
    from .model import load_base_model, lora_config
    from .monitoring import SampleTrajectories, init_swanlab, watch_hint
    from .rewards import build_rewards
    from .trainer import AgenticGRPOTrainer, latest_complete_checkpoint

    state = PartialState()
    set_seed(cfg.seed)
    warning = fit_warning(cfg)
    if warning:
        log.warning(warning)

    searcher = open_searcher(cfg.search.index, cfg.search.retriever, cache_size=cfg.search.cache_size,
                             timeout=cfg.search.timeout_s)
    dataset = Dataset.from_list(training_rows(cfg))
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.name_or_path)
    use_cpu = not torch.cuda.is_available()
    args = grpo_args(cfg, use_cpu=use_cpu)
    model = load_base_model(cfg.model)
    limits = RolloutLimits(max_turns=cfg.rollout.max_turns, max_searches=cfg.rollout.max_searches,
                           max_tokens_per_turn=cfg.rollout.max_tokens_per_turn,
                           max_completion_tokens=cfg.rollout.max_completion_tokens,
                           passages_per_search=cfg.rollout.passages_per_search,
                           max_observation_tokens=cfg.rollout.max_observation_tokens,
                           search_timeout_s=cfg.search.timeout_s)
    eos_tokens = [tokenizer.eos_token] if tokenizer.eos_token else []
    reward_funcs, weights = build_rewards(cfg, eos_tokens)
    args.reward_weights = weights

    out = Path(cfg.checkpoint.output_dir)
    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    log_dir = init_swanlab(cfg.logging, str(out), config_to_dict(cfg), is_main=state.is_main_process)
    trainer_ref: list = []
    trainer = AgenticGRPOTrainer(
        model, tokenizer=tokenizer, reward_funcs=reward_funcs, args=args, train_dataset=dataset,
        tools=SearchTool(searcher), dialect=cfg.rollout.dialect, limits=limits, language=cfg.data.language,
        chat=cfg.model.chat_template, algorithm=cfg.algorithm.name, max_batch_size=cfg.rollout.max_batch_size,
        summary_mode=cfg.rollout.summary_mode, system=cfg.data.system_prompt or None,
        shuffle_rewards=cfg.algorithm.shuffle_rewards, peft_config=lora_config(cfg.model),
        callbacks=[SampleTrajectories(trainer_ref, cfg.logging.sample_table_every, cfg.logging.sample_table_rows)]
        if log_dir else [])
    trainer_ref.append(trainer)

    resume = cfg.checkpoint.resume if resume is None else resume
    checkpoint = None
    if resume:
        checkpoint = latest_complete_checkpoint(out, quarantine=state.is_main_process)
        state.wait_for_everyone()
        log.info("resuming from %s", checkpoint) if checkpoint else log.info("no checkpoint to resume from")
    result = trainer.train(resume_from_checkpoint=checkpoint)
    final = out / "final"
    trainer.save_model(str(final))
    if state.is_main_process:
        tokenizer.save_pretrained(str(final))
        summary = {"global_step": trainer.state.global_step, "train_loss": result.training_loss,
                   "world_size": state.num_processes,
                   "resumed_from": checkpoint, "adapter": str(final), "swanlab_log_dir": log_dir,
                   "log_history": trainer.state.log_history}
        (out / "train_summary.json").write_text(json.dumps(summary, indent=1, default=str))
        print(watch_hint(log_dir), file=sys.stderr)
    if log_dir:
        import swanlab

        swanlab.finish()
    return {"global_step": trainer.state.global_step, "adapter": str(final), "swanlab_log_dir": log_dir}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Train a search agent with GRPO (see the module docstring).")
    ap.add_argument("--config", required=True, help="experiment YAML (experiments/training/*.yaml)")
    ap.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a setting by its dotted name, e.g. --set algorithm.max_steps=2")
    ap.add_argument("--check", action="store_true", help="validate the config and exit")
    ap.add_argument("--log-level", default=os.environ.get("AGENTIC_RAG_LOG_LEVEL", "INFO"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, overrides=parse_overrides(args.set))
    except ConfigError as exc:
        print(f"agentic-rag train: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: OK")
        return 0
    run(cfg, resume=args.resume or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
