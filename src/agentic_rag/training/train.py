"""Train a search agent with GRPO: the run manual, top to bottom.

    accelerate launch --config_file experiments/training/accelerate/zero2.yaml \\
        -m agentic_rag.training.train --config experiments/training/CONFIG.yaml [--resume] [--set KEY=VALUE ...]

(``script/training/train_zero2.sh`` / ``train_zero3.sh`` do this from ``.env``; ``agentic-rag train`` runs it in
one process.) The steps:

1. load the experiment config (:mod:`.config`) and check all of it, before anything heavy happens (``--check``
   stops after reading the training questions, probing the search target and checking the output directory;
   ``--describe`` prints every setting);
2. read the training questions (a multiple-choice question shows its options, as in evaluation) and load the
   tokenizer;
3. warn when the memory estimate says the model will not fit the GPUs;
4. open the searcher (an index directory or a search server URL) and ask it a probe query, build the reward
   functions;
5. load the base model (NF4 for QLoRA) and describe a fresh LoRA adapter, or load ``model.adapter`` to go
   on training an existing one (R1-Searcher's stage 2 from the stage-1 adapter);
6. start SwanLab on the main process (cloud when SWANLAB_API_KEY is set, local otherwise, unless configured);
7. build the AgenticGRPOTrainer and train, resuming from the latest complete checkpoint with ``--resume``;
8. save the final adapter (peft format), the tokenizer and the resolved config in OUTPUT_DIR/final, with the
   settings it was trained with (``agentic_rag.json``: the ``rollout`` and ``prompt`` sections; as in every
   checkpoint),
   which the chat server and the evaluation runner apply unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import yaml

from ..argtypes import Parser
from ..errors import UserError, guarded
from ..logs import configure_logging
from ..outputs import add_move_aside, aside_path, check_apart, claim_dir, mark_dir, output_lock
from ..settings import SettingsError, describe, to_dict
from .config import ExperimentConfig, load_config, resolve_config

log = logging.getLogger("agentic_rag.train")


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB (the JVM of an in-process Lucene searcher included): the
    kernel's high-water mark of this address space (``VmHWM``). Not ``ru_maxrss``: Linux carries that across
    fork and exec, so a run started by a large parent (the quick start, holding its evaluation models) would
    report the parent's size instead of its own. ``ru_maxrss`` only where there is no ``/proc``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def grpo_args(cfg: ExperimentConfig, *, use_cpu: bool):
    import torch
    from trl import GRPOConfig

    from .algorithms import algorithm_args
    from .machine import cpu_bf16

    a = cfg.algorithm
    bf16 = False
    if not use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        bf16 = cfg.model.quantization == "nf4" or cfg.model.dtype in ("auto", "bfloat16")
    elif use_cpu:
        bf16 = cpu_bf16(cfg.model.cpu_autocast)  # autocast on the CPU: the fp32 weights stay as they are
    kwargs: dict[str, Any] = dict(
        output_dir=cfg.checkpoint.output_dir, seed=cfg.seed, data_seed=cfg.seed,
        learning_rate=a.learning_rate, max_steps=a.max_steps, warmup_steps=a.warmup_ratio,
        # "constant" holds the peak rate after the warm-up (transformers' constant_with_warmup; no warm-up: constant)
        lr_scheduler_type="constant_with_warmup" if a.lr_scheduler == "constant" else a.lr_scheduler,
        per_device_train_batch_size=a.per_device_train_batch_size,
        gradient_accumulation_steps=a.gradient_accumulation_steps, max_grad_norm=a.max_grad_norm,
        num_generations=a.num_generations, beta=a.beta, num_iterations=a.num_iterations,
        max_completion_length=cfg.rollout.max_completion_tokens, temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p, top_k=cfg.sampling.top_k, repetition_penalty=cfg.sampling.repetition_penalty,
        # the rollout decodes each process's trajectories on its own: ZeRO-3 must gather the weights for it
        ds3_gather_for_generation=True, activation_checkpointing=cfg.model.gradient_checkpointing,
        logging_steps=cfg.logging.logging_steps, save_strategy="steps", save_steps=cfg.checkpoint.save_steps,
        save_total_limit=cfg.checkpoint.save_total_limit, report_to=[] if cfg.logging.swanlab_mode == "disabled"
        else ["swanlab"], run_name=cfg.logging.run_name or None, use_cpu=use_cpu, bf16=bf16,
        remove_unused_columns=False, log_completions=False, disable_dropout=True,
    )
    kwargs.update(algorithm_args(a.name, epsilon=a.epsilon, epsilon_high=a.epsilon_high,
                                 mask_truncated=a.mask_truncated_completions, scale_rewards=a.scale_rewards))
    return GRPOConfig(**kwargs)


def training_rows(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """The training dataset's rows. The prompt is the question as evaluation shows it (``prompt_question``:
    a MedQA question lists its options and asks for the letter); the other columns go to the rewards."""
    from ..data.questions import prompt_question, read_questions

    rows = read_questions(cfg.data.train_file, limit=cfg.data.limit, require_answers=needs_answers(cfg))
    if not rows:
        raise SettingsError([f"data.train_file {cfg.data.train_file} holds no questions: point it at a question "
                           f"file (JSONL, one question a line, or a JSON list)"])
    out = []
    for r in rows:
        row = {"prompt": prompt_question(r), "answers": r.answers, "gold_titles": r.gold_titles, "id": r.id}
        if "options" in r.meta:
            row["options"] = r.meta["options"]
            row["answer_idx"] = r.meta.get("answer_idx", "")
        out.append(row)
    return out


def check_questions_fit(cfg: ExperimentConfig, rows: list[dict[str, Any]], tokenizer: Any,
                        tools: list[dict[str, Any]] | None = None) -> None:
    """Refuse training questions whose prompts do not fit the model's context (:mod:`agentic_rag.data.context`),
    before the model loads. ``tools``: the tools' schemas, which the native dialect's prompt lists."""
    from ..data.context import check_prompt_lengths, context_length
    from ..data.prompts import build_prompt

    p = cfg.prompt
    check_prompt_lengths(((str(r["id"]), r["prompt"]) for r in rows),
                         lambda q: build_prompt(tokenizer, q, cfg.rollout.dialect, language=p.language,
                                                chat=p.chat_template, system=p.system_prompt or None, tools=tools),
                         context_length(cfg.model.name_or_path), source=f"data.train_file {cfg.data.train_file}",
                         budget=cfg.rollout.max_completion_tokens)


def needs_answers(cfg: ExperimentConfig) -> bool:
    """Whether the run's rewards compare answers with gold ones (a question without a gold answer would be scored
    0 in every rollout, teaching nothing): the curriculum's F1 stage, or any accuracy reward of the registry."""
    from ..rewards.registry import accuracy_names

    return cfg.curriculum.enabled or any(spec.name in accuracy_names() for spec in cfg.rewards)


def policy_model(cfg: ExperimentConfig):
    """The model to train and the trainer's peft config: the base model (NF4 for QLoRA) with a fresh LoRA adapter
    described by ``model.lora_*``, or with the existing ``model.adapter`` loaded trainable (no peft config then:
    the adapter's own rank and targets apply)."""
    from .model import load_base_model, lora_config

    model = load_base_model(cfg.model)
    if not cfg.model.adapter:
        return model, lora_config(cfg.model)
    from ..models import load_adapter

    return load_adapter(model, cfg.model.adapter, is_trainable=True), None


def longest_prompt_tokens(cfg: ExperimentConfig, *, sample: int = 64, rows: list[dict[str, Any]] | None = None,
                          tokenizer: Any = None, tools: list[dict[str, Any]] | None = None) -> int:
    """Tokens of the longest templated training prompt (system prompt, chat template, question), the prompt length
    of a rollout batch at worst. The template is the same for every question, so only the ``sample`` longest
    questions (by characters) are templated and tokenized: cheap even for a large training file. ``rows`` and
    ``tokenizer``, when the caller has them, are not read again; ``tools``: the schemas the native prompt lists."""
    from ..data.prompts import build_prompt
    from ..models import load_tokenizer

    tokenizer = tokenizer or load_tokenizer(cfg.model.tokenizer or cfg.model.name_or_path)
    rows = training_rows(cfg) if rows is None else rows
    longest = sorted({r["prompt"] for r in rows}, key=len, reverse=True)[:sample]
    p = cfg.prompt
    return max(len(build_prompt(tokenizer, q, cfg.rollout.dialect, language=p.language, chat=p.chat_template,
                                system=p.system_prompt or None, tools=tools))
               for q in longest)


def memory_setup(cfg: ExperimentConfig, *, rows: list[dict[str, Any]] | None = None, tokenizer: Any = None,
                 tools: list[dict[str, Any]] | None = None):
    """The :class:`~agentic_rag.training.memory.TrainingSetup` of this run, as the estimator needs it: the launch's
    processes (``WORLD_SIZE``) and ZeRO stage (``ACCELERATE_DEEPSPEED_ZERO_STAGE``, which the launch scripts export
    for the stage they launch; ZeRO-2, the larger estimate, when unknown), the config's quantisation, LoRA rank,
    targets and dropout, batch and lengths, and the longest templated prompt of the training questions."""
    from .memory import TrainingSetup

    a, m = cfg.algorithm, cfg.model
    rank, targets, dropout = m.lora_r, list(m.lora_target_modules), m.lora_dropout
    if m.adapter:  # an existing adapter brings its own rank and targets
        adapter = json.loads((Path(m.adapter) / "adapter_config.json").read_text())
        rank, dropout = adapter.get("r", rank), adapter.get("lora_dropout", dropout)
        found = adapter.get("target_modules")
        if isinstance(found, list) or found == "all-linear":
            targets = sorted(found) if isinstance(found, list) else [found]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    zero = int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2") or 2)
    # TRL generates per_device_train_batch_size * steps_per_generation (= gradient_accumulation_steps) completions
    # per GPU per round; num_generations of them share a prompt (a group may straddle GPUs: then count completions)
    completions = a.per_device_train_batch_size * a.gradient_accumulation_steps
    batch, group = (completions // a.num_generations, a.num_generations) if completions % a.num_generations == 0 \
        else (1, completions)
    decoded = min(cfg.sampling.max_batch_size, completions) if cfg.sampling.max_batch_size else None
    return TrainingSetup(gpus=world, zero=zero if zero in (2, 3) else 2,
                         quant="nf4" if m.quantization == "nf4" else "none", lora_rank=rank,
                         lora_targets=tuple(targets), lora_dropout=dropout,
                         batch=batch, num_generations=group, micro_batch=a.per_device_train_batch_size,
                         generation_batch=decoded,
                         max_prompt=longest_prompt_tokens(cfg, rows=rows, tokenizer=tokenizer, tools=tools),
                         max_completion=cfg.rollout.max_completion_tokens,
                         gradient_checkpointing=m.gradient_checkpointing)


def fit_check(cfg: ExperimentConfig, *, rows: list[dict[str, Any]] | None = None, tokenizer: Any = None,
              tools: list[dict[str, Any]] | None = None) -> tuple[Any, str | None]:
    """``(setup, warning)``: the :func:`memory_setup` the estimate assumed (None when no estimate was made: no GPU
    memory budget, i.e. no GPU and no ``gpu_memory_gb``, or an estimate that cannot be made) and the memory
    estimator's warning (None when it fits)."""
    from .machine import gpu_memory_gb
    from .memory_advice import EstimateInputs, check_fits

    budget = cfg.gpu_memory_gb or gpu_memory_gb()
    if budget is None:
        return None, None
    try:
        setup = memory_setup(cfg, rows=rows, tokenizer=tokenizer, tools=tools)
        warning = check_fits(EstimateInputs(cfg.model.name_or_path, setup), budget)
    except Exception as exc:  # noqa: BLE001 - an estimate that cannot be made must not stop training
        log.info("no memory estimate (%s)", exc)
        return None, None
    if warning:
        warning += (f"\n(estimated for {setup.gpus} process(es) with DeepSpeed ZeRO-{setup.zero}, prompts of "
                    f"{setup.max_prompt} + completions of {setup.max_completion} tokens)")
    return setup, warning


def ram_check(cfg: ExperimentConfig, *, rows: list[dict[str, Any]] | None = None, tokenizer: Any = None,
              tools: list[dict[str, Any]] | None = None) -> str | None:
    """For a run on the CPU: None when the memory estimator says one training step fits the RAM available
    (:func:`~agentic_rag.training.memory.available_ram_gb`), else why not and what would help. Called before the
    model loads, so a config that cannot fit is refused in seconds instead of being killed by the kernel part-way.
    An estimate that cannot be made (an architecture the estimator does not know) lets the run go on."""
    from .machine import available_ram_gb
    from .memory_advice import EstimateInputs, check_fits_ram

    try:
        setup = memory_setup(cfg, rows=rows, tokenizer=tokenizer, tools=tools)
        return check_fits_ram(EstimateInputs(cfg.model.name_or_path, setup), available_ram_gb())
    except Exception as exc:  # noqa: BLE001 - an estimate that cannot be made must not stop training
        log.info("no RAM estimate (%s)", exc)
        return None


def output_inputs(cfg: ExperimentConfig) -> dict[str, str]:
    """The config's inputs on this machine, which ``checkpoint.output_dir`` must stay apart from."""
    m = cfg.model
    return {"model.name_or_path": m.name_or_path, "model.tokenizer": m.tokenizer, "model.adapter": m.adapter,
            "data.train_file": cfg.data.train_file, "search.index": cfg.search.index}


def check_output_dir(cfg: ExperimentConfig, *, resume: bool, move_aside: bool = False,
                     main_process: bool = True) -> str | None:
    """Check ``checkpoint.output_dir`` before anything loads; returns the checkpoint to resume from (None: a fresh
    run). The folder must stay apart from the inputs and be new, empty or a training run's
    (:func:`agentic_rag.outputs.claim_dir`). ``resume`` needs a complete checkpoint there, and a fresh run is
    refused where an earlier run left a complete checkpoint or a final adapter (continue it with ``--resume``, or
    ``move_aside`` keeps it as ``DIR.moved-TIME``): a new run would write its checkpoints over that run's. Only
    the main process moves or marks anything."""
    from .checkpoints import latest_complete_checkpoint

    out = Path(cfg.checkpoint.output_dir)
    flag = "checkpoint.output_dir"
    check_apart(out, output_inputs(cfg), flag=flag)
    claim_dir(out, "train", flag=flag, move_aside=move_aside and main_process)
    if resume:
        checkpoint = latest_complete_checkpoint(out, quarantine=main_process)
        if checkpoint is None:
            raise UserError(f"--resume: {flag} {out} holds no complete checkpoint to resume from; run without "
                            f"--resume to start a new run there")
        finished = finished_step(out, cfg)
        if finished is not None:
            raise UserError(f"--resume: {flag} {out} holds a finished run (step {finished} of "
                            f"{cfg.algorithm.max_steps}; its adapter is {out / 'final'}): there is nothing to resume. "
                            f"To train it further, raise algorithm.max_steps (--set algorithm.max_steps=N) and "
                            f"--resume again; to train anew, name another output_dir")
        return checkpoint
    earlier = [p.name for p in (Path(c) for c in [latest_complete_checkpoint(out, quarantine=False)] if c)]
    earlier += [name for name in ("final",) if (out / name / "adapter_config.json").is_file()]
    if earlier:
        if not move_aside:
            raise UserError(f"{flag} {out} holds an earlier run ({', '.join(earlier)}): continue it with --resume, "
                            f"name another output_dir, or pass --move-aside to keep it at {aside_path(out).name} "
                            f"and start over")
        if main_process:
            moved = aside_path(out)
            os.replace(out, moved)
            log.warning("%s %s held an earlier run: moved it to %s", flag, out, moved)
    if main_process:
        mark_dir(out, "train")
    return None


def finished_step(out: Path, cfg: ExperimentConfig) -> int | None:
    """The step at which the run in ``out`` finished, when it has finished what ``cfg`` asks (its final adapter and
    summary written at ``algorithm.max_steps`` or beyond); None when there is more to train."""
    summary = out / "train_summary.json"
    if not (out / "final" / "adapter_config.json").is_file() or not summary.is_file():
        return None
    try:
        step = int(json.loads(summary.read_text(encoding="utf-8")).get("global_step", -1))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return step if step >= cfg.algorithm.max_steps else None


def first_process(state) -> bool:
    """Whether this is the launch's first process, the one that writes and locks. ``PartialState`` cannot say yet on
    a CPU DeepSpeed launch (accelerate leaves its process group to the trainer's setup and reports process 0 on every
    process until then), so the launcher's ``RANK``, set for every process of a launch, decides where there is one."""
    rank = os.environ.get("RANK", "")
    return int(rank) == 0 if rank.isdigit() else state.is_main_process


def zero_stage(trainer) -> int | None:
    """The ZeRO stage DeepSpeed actually runs (accelerate's plugin, from the DeepSpeed config), None without it."""
    plugin = trainer.accelerator.state.deepspeed_plugin
    return None if plugin is None else int(plugin.zero_stage)


def run(cfg: ExperimentConfig, *, resume: bool | None = None, move_aside: bool = False) -> dict[str, Any]:
    """Train ``cfg`` (see the module docstring), the main process holding the output folder's lock throughout: one
    run per output folder, a second refused in one line naming the first's process."""
    from accelerate import PartialState

    state = PartialState()
    resume = cfg.checkpoint.resume if resume is None else resume
    lock = output_lock(cfg.checkpoint.output_dir, "agentic-rag train", flag="checkpoint.output_dir") \
        if first_process(state) else nullcontext()
    with lock:
        return _train(cfg, state, resume=resume, move_aside=move_aside)


def _train(cfg: ExperimentConfig, state, *, resume: bool, move_aside: bool) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import set_seed

    from ..errors import SearchFailuresError
    from ..models import load_tokenizer
    from ..rollout.engine import tool_schemas
    from ..search import open_searcher
    from ..search.probe import probe
    from ..tools.build import build_tools
    from .monitoring import CollapseGuard, SampleTrajectories, init_swanlab, watch_hint
    from .progress import ProgressLine, ValidationEval
    from .rewards import build_rewards
    from .trainer import AgenticGRPOTrainer, save_trained_settings

    set_seed(cfg.seed)
    first = first_process(state)
    checkpoint = check_output_dir(cfg, resume=resume, move_aside=move_aside, main_process=first)
    state.wait_for_everyone()
    rows = training_rows(cfg)
    tokenizer = load_tokenizer(cfg.model.tokenizer or cfg.model.name_or_path)
    searcher = open_searcher(cfg.search.index, cfg.search.retriever, cache_size=cfg.search.cache_size,
                             timeout=cfg.search.timeout_s)
    probe(searcher, cfg.search.index)  # a dead search target stops the run here, before the model loads
    # every tool of the tools: section, built (and a broken one refused) before the model loads; the native prompt
    # lists their schemas, so the prompt checks below measure them too
    tools = build_tools(cfg.tools, searcher=searcher)
    try:
        schemas = tool_schemas(tools)
        check_questions_fit(cfg, rows, tokenizer, schemas)
        estimated, warning = fit_check(cfg, rows=rows, tokenizer=tokenizer, tools=schemas)
        if warning:
            log.warning(warning)
        refusal = None if torch.cuda.is_available() else ram_check(cfg, rows=rows, tokenizer=tokenizer, tools=schemas)
        if refusal:
            raise SettingsError([refusal + "\n(set AGENTIC_RAG_RAM_GB to give the check a budget of your own)"],
                                "memory")
    except BaseException:
        tools.close()  # an MCP server it started stops with the refusal
        raise
    dataset = Dataset.from_list(rows)
    eos_tokens = [tokenizer.eos_token] if tokenizer.eos_token else []
    reward_funcs, weights = build_rewards(cfg, eos_tokens)
    use_cpu = not torch.cuda.is_available()
    args = grpo_args(cfg, use_cpu=use_cpu)
    args.reward_weights = weights
    model, peft_config = policy_model(cfg)

    out = Path(cfg.checkpoint.output_dir)
    if first:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    log_dir = init_swanlab(cfg.logging, str(out), to_dict(cfg), is_main=first)
    trainer_ref: list = []
    guard = CollapseGuard(cfg.guards, out)
    callbacks = [SampleTrajectories(trainer_ref, cfg.logging.sample_table_every, cfg.logging.sample_table_rows)] \
        if log_dir else []
    if guard.active:
        callbacks.append(guard)
    callbacks.append(ProgressLine("grpo"))
    if cfg.logging.validation_file:
        callbacks.append(ValidationEval(trainer_ref, cfg.logging.validation_file, cfg.logging.validation_every, out,
                                        limit=cfg.logging.validation_limit,
                                        at_start=cfg.logging.validation_at_start,
                                        at_end=cfg.logging.validation_at_end))
    from .model import quiet_adapter_saves

    trainer = AgenticGRPOTrainer(
        model, tokenizer=tokenizer, reward_funcs=reward_funcs, args=args, train_dataset=dataset,
        tools=tools, tool_specs=cfg.tools, settings=cfg.rollout, prompt=cfg.prompt, algorithm=cfg.algorithm.name,
        max_batch_size=cfg.sampling.max_batch_size, shuffle_rewards=cfg.algorithm.shuffle_rewards,
        dynamic_sampling=cfg.algorithm.dynamic_sampling, max_extra_rollouts=cfg.algorithm.max_extra_rollouts,
        max_search_failure_rate=cfg.search.max_failure_rate, search_timeout_s=cfg.search.timeout_s,
        answer_branching=cfg.algorithm.answer_branching,
        peft_config=peft_config, callbacks=callbacks)
    trainer_ref.append(trainer)
    quiet_adapter_saves(trainer.model)

    def summary(**extra: Any) -> dict[str, Any]:
        return {"global_step": trainer.state.global_step, "world_size": state.num_processes,
                "deepspeed_zero_stage": zero_stage(trainer),
                "memory_estimate": None if estimated is None else {
                    "gpus": estimated.gpus, "zero": estimated.zero, "max_prompt": estimated.max_prompt,
                    "max_completion": estimated.max_completion, "fits": warning is None},
                "resumed_from": checkpoint, "guard_alerts": guard.alerts, "stopped_by_guard_at": guard.stopped_at,
                "search_failures": trainer.search_failures.summary(), **extra,
                "swanlab_log_dir": log_dir, "peak_rss_mb": peak_rss_mb(), "log_history": trainer.state.log_history}

    if checkpoint:
        log.info("resuming from %s", checkpoint)
    # under CPU bf16 autocast the entry points' 1 MiB mmap threshold slows every step (agentic_rag.malloc)
    from ..malloc import heap_for_blocks_below

    try:
        with heap_for_blocks_below() if use_cpu and args.bf16 else nullcontext():
            result = trainer.train(resume_from_checkpoint=checkpoint)
    except SearchFailuresError:
        if first:  # the record of why it stopped; its last complete checkpoint stays
            (out / "train_summary.json").write_text(json.dumps(summary(
                stopped_by_search_failures_at=trainer.state.global_step, adapter=None), indent=1, default=str))
        raise
    final = out / "final"
    trainer.save_model(str(final))
    failures = trainer.search_failures.summary()
    if first:
        tokenizer.save_pretrained(str(final))
        save_trained_settings(trainer.agent, tokenizer, final)
        (out / "train_summary.json").write_text(json.dumps(summary(
            train_loss=result.training_loss, adapter=str(final),
            train_runtime_s=result.metrics.get("train_runtime")), indent=1, default=str))
        print(watch_hint(log_dir), file=sys.stderr)
    if log_dir:
        import swanlab

        swanlab.finish()
    # a process that exits with its process group alive can abort in the group's destructor ("terminate called
    # without an active exception", exit -6, seen once on a finished 2-process ZeRO-3 run): the launcher then
    # reports a completed run as failed. Destroy it once every process is done (a no-op without one).
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    if failures["over_threshold"]:  # the evaluation's rule at the end, whatever the batch size
        raise SearchFailuresError(
            f"{failures['failed']} of the run's {failures['searches']} searches failed ({failures['rate']:.1%}; "
            f"search.max_failure_rate is {failures['max_rate']:.1%}): the adapter in {final} was trained on a "
            f"broken search target (see search_failures in {out / 'train_summary.json'}). Check search.index and "
            f"train again", summary=failures)
    return {"global_step": trainer.state.global_step, "adapter": str(final), "swanlab_log_dir": log_dir}


def build_parser() -> Parser:
    """The command line of ``agentic-rag train`` and the launch scripts (their arguments after the config)."""
    ap = Parser(prog="agentic-rag train", description="Train a search agent with GRPO (see the module docstring).")
    ap.add_argument("--config", default=None, help="experiment YAML (experiments/training/*.yaml)")
    ap.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a setting by its dotted name, e.g. --set algorithm.max_steps=2")
    ap.add_argument("--check", action="store_true",
                    help="validate the config, read the training questions, open and probe the search target, check "
                         "the output directory, and exit (no model is loaded)")
    add_move_aside(ap, "checkpoint.output_dir")
    ap.add_argument("--describe", action="store_true",
                    help="print every setting (dotted name, value, help) as resolved from the defaults, the config "
                         "file, the environment and --set, and exit; without --config, the defaults")
    ap.add_argument("--log-level", default=os.environ.get("AGENTIC_RAG_LOG_LEVEL") or "INFO")
    return ap


def main(argv: list[str] | None = None) -> int:
    from ..malloc import release_freed_memory

    release_freed_memory()  # each launched process: freed activations go back to the system
    ap = build_parser()
    args = ap.parse_args(argv)
    configure_logging(args.log_level)
    if args.describe:
        def show() -> int:
            cfg, loaded = resolve_config(path=args.config, overrides=args.set, check_files=False)
            print("\n".join(describe(cfg, loaded.origins)))
            return 0

        return guarded("agentic-rag train", show)
    if not args.config:
        ap.error("--config is required (--describe lists every setting without one)")
    try:
        cfg = load_config(args.config, overrides=args.set)
    except SettingsError as exc:
        print(f"agentic-rag train: {exc}", file=sys.stderr)
        return 2
    if args.check:
        def check() -> int:
            from ..models import load_tokenizer

            rows = training_rows(cfg)
            schemas = check_search_target(cfg)
            check_questions_fit(cfg, rows, load_tokenizer(cfg.model.tokenizer or cfg.model.name_or_path), schemas)
            check_output_dir(cfg, resume=bool(args.resume or cfg.checkpoint.resume), move_aside=False,
                             main_process=False)
            print(f"{args.config}: OK ({len(rows)} training questions; the search target answers; tools: "
                  f"{', '.join(s['name'] for s in schemas)})")
            return 0

        return guarded("agentic-rag train", check)

    def train() -> int:
        run(cfg, resume=args.resume or None, move_aside=args.move_aside)
        return 0

    return guarded("agentic-rag train", train)


def check_search_target(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Open the searcher the run would use, ask it one query and build the run's tools with it (``--check``); returns
    the tools' schemas (what the native prompt lists)."""
    from ..rollout.engine import tool_schemas
    from ..search import open_searcher
    from ..search.probe import probe
    from ..tools.build import build_tools

    searcher = open_searcher(cfg.search.index, cfg.search.retriever, cache_size=0, timeout=cfg.search.timeout_s)
    probe(searcher, cfg.search.index)
    tools = build_tools(cfg.tools, searcher=searcher)
    try:
        return tool_schemas(tools)
    finally:
        tools.close()


if __name__ == "__main__":
    sys.exit(main())
