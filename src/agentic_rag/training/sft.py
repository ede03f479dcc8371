"""SFT warm start (RAG-R1 starts from SFT): TRL's SFTTrainer on trajectories, environment tokens masked.

Input: a JSONL file of trajectories, one per line, in either form:

* token level, as the rollout engine writes them (``Trajectory.to_dict()``): ``prompt_ids``,
  ``completion_ids``, ``env_mask`` - exact, the masks are the engine's;
* text level: ``{"question": ..., "completion": ...}`` where ``completion`` is the assistant's full text with
  the observations inside the dialect's environment tags. The prompt is built like the trainer builds it;
  each observation block is tokenized on its own and masked, the model's text around it is trained on.

Each example becomes ``input_ids`` plus a ``completion_mask`` that is 1 only on tokens the model wrote, so
TRL's ``completion_only_loss`` trains on exactly those. Branched trajectories (after a backtrack or
summary) have no single linear context and are skipped, with a count.

The output directory gets ``agentic_rag.json`` (:mod:`agentic_rag.rollout.trained_settings`): the ``rollout`` and
``prompt`` settings the trajectories were made with (``rollout`` / ``prompt``, the same objects the configs hold; the
command line's flags are generated from them), so evaluation and serving run the model as it was taught. Text-level
lines are prompted with ``prompt``; token-level lines carry their prompt already, and the caller says how it was
built.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import shutil
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.prompts import build_prompt
from ..jsonl import FileFormatError, iter_jsonl
from ..rollout.protocol import Dialect, get_dialect
from ..rollout.settings import PromptSettings, RolloutSettings
from ..rollout.trained_settings import resolved_prompt, write_settings

log = logging.getLogger(__name__)


@dataclass
class SFTExample:
    input_ids: list[int]
    completion_mask: list[int]  # 1 = the model wrote it: trained on
    prompt_built: bool = False  # the prompt was built here (a text-level line), with SFT's prompt settings


def example_from_tokens(row: dict[str, Any]) -> SFTExample | None:
    prompt, completion, env = row["prompt_ids"], row["completion_ids"], row["env_mask"]
    if len(completion) != len(env):
        raise ValueError("completion_ids and env_mask differ in length")
    segments = row.get("segments") or []
    if any(int(s["parent"]) != i - 1 for i, s in enumerate(segments)):
        return None
    return SFTExample(list(prompt) + list(completion), [0] * len(prompt) + [int(m) for m in env])


def example_from_text(row: dict[str, Any], tokenizer: Any, dialect: Dialect, *, language: str = "en",
                      chat: bool | None = None, system: str | None = None) -> SFTExample:
    """A text-level line as an example. The model's text is tokenized as the model writes it (control tokens
    recognised); an observation block's passages are the environment's untrusted text, encoded as the engine encodes
    them (dialect tags neutralized, no control token recognised), inside the dialect's tags as written. A close tag
    outside any block is refused (ValueError): a passage holding the tag itself, which the text cannot tell from the
    block's end (the engine's own text, ``Trajectory.text``, never has one: it neutralizes passages)."""
    from ..rollout.encoding import encode_pieces

    prompt = build_prompt(tokenizer, row["question"], dialect, language=language, chat=chat, system=system)
    ids, mask = list(prompt), [0] * len(prompt)
    pattern = re.compile(r"(\s*" + re.escape(dialect.observation_open) + r")(.*?)("
                         + re.escape(dialect.observation_close) + r"\s*)", re.S)
    text = row["completion"]
    close = dialect.observation_close
    if close in pattern.sub("", text):
        raise ValueError(f"completion: {close!r} outside an observation block (a passage holding the tag itself?): "
                         f"a text-level line cannot tell where that observation ends; neutralize the passages' tags "
                         f"(Dialect.neutralize) or give token-level lines")
    pos = 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            part = tokenizer(text[pos:m.start()], add_special_tokens=False)["input_ids"]
            ids += part
            mask += [1] * len(part)
        part = encode_pieces(tokenizer, [(m.group(1), True), (dialect.neutralize(m.group(2)), False),
                                         (m.group(3), True)])
        ids += part
        mask += [0] * len(part)
        pos = m.end()
    tail = text[pos:]
    if tail:
        part = tokenizer(tail, add_special_tokens=False)["input_ids"]
        ids += part
        mask += [1] * len(part)
    if tokenizer.eos_token_id is not None and row.get("add_eos", True):
        ids.append(tokenizer.eos_token_id)
        mask.append(1)
    return SFTExample(ids, mask, prompt_built=True)


def read_examples(path: str | os.PathLike, tokenizer: Any, dialect: str = "agentic", *, language: str = "en",
                  chat: bool | None = None, system: str | None = None) -> tuple[list[SFTExample], int]:
    """The examples of a trajectory file, and how many branched trajectories were skipped."""
    d = get_dialect(dialect)
    out: list[SFTExample] = []
    skipped = 0
    for lineno, row in iter_jsonl(path):
        try:
            if not isinstance(row, dict):
                raise ValueError("a line must be a JSON object")
            if "completion_ids" in row:
                ex = example_from_tokens(row)
            elif "completion" in row and "question" in row:
                ex = example_from_text(row, tokenizer, d, language=language, chat=chat)
            else:
                raise ValueError("a line needs prompt_ids/completion_ids/env_mask, or question/completion")
        except (KeyError, ValueError, TypeError) as exc:
            raise FileFormatError(path, lineno, str(exc)) from None
        if ex is None:
            skipped += 1
        else:
            out.append(ex)
    if not out:
        raise FileFormatError(path, 0, f"no usable trajectories ({skipped} branched ones skipped)")
    return out, skipped


def build_sft_trainer(*, model: str, data: str, output_dir: str, rollout: RolloutSettings | None = None,
                      prompt: PromptSettings | None = None, epochs: float = 1.0, learning_rate: float = 2e-4,
                      batch_size: int = 4,
                      lora_r: int = 16, lora_alpha: int = 32, full: bool = False, max_length: int = 2048,
                      seed: int = 42, report_to: list[str] | None = None, logging_steps: int = 1,
                      base_model: Any = None, tokenizer: Any = None, gradient_checkpointing: bool = True,
                      group_by_length: bool = False, grad_accum: int = 1, save_steps: int = 0,
                      callbacks: list | None = None, cpu_autocast: str = "none"):
    """TRL's SFTTrainer on the trajectories of ``data`` (see :func:`run_sft`); returns ``(trainer, examples,
    skipped)``. The dataset carries ``completion_mask``; with ``completion_only_loss`` TRL turns it into labels
    that are -100 on the prompt and on every environment token. ``base_model`` and ``tokenizer``: ``model``
    already loaded (:func:`agentic_rag.training.model.load_base_model`, :func:`agentic_rag.models.load_tokenizer`),
    for a caller that has them (a test, a notebook); with LoRA the adapter is put on ``base_model`` in place.
    ``gradient_checkpointing`` (TRL's default: on) trades a third more compute for activation memory.
    ``cpu_autocast`` (``auto``, ``bf16``, ``none``; :func:`agentic_rag.training.machine.cpu_bf16`): on a CPU, the
    forward and backward passes in bfloat16 under ``torch.autocast`` (``auto``: where the CPU has it natively;
    default ``none``: fp32, the same numbers on every CPU).
    ``group_by_length`` batches trajectories of similar length together
    (transformers' length-grouped sampler), so a batch of one-search answers is not padded to a three-search
    trajectory's length. It changes what is learned, not only the speed: the loss is a mean over each batch's
    trained tokens and every batch weighs the same, so batched by length a long trajectory's tokens weigh less
    than a short one's (on the real-model quick start it cut the SFT model's sampled two-search rate from 23% to
    6%: experiments/real_model/README.md). ``grad_accum``: micro-batches of ``batch_size`` per optimizer step (the
    same step, less activation memory). ``save_steps``: a checkpoint every N optimizer steps (0: none)."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from ..models import load_tokenizer
    from .config import ModelConfig
    from .machine import cpu_bf16
    from .model import compact_lm_head_scoring, load_base_model, lora_config, quiet_adapter_saves

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model, padding_side="right")
    rollout, prompt = rollout or RolloutSettings(), prompt or PromptSettings()
    examples, skipped = read_examples(data, tokenizer, rollout.dialect, language=prompt.language,
                                      chat=prompt.chat_template, system=prompt.system_prompt or None)
    dataset = Dataset.from_list([{"input_ids": e.input_ids, "completion_mask": e.completion_mask} for e in examples])
    model_cfg = ModelConfig(name_or_path=model, lora_r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0,
                            gradient_checkpointing=gradient_checkpointing)
    base = base_model if base_model is not None else load_base_model(model_cfg)
    peft = None if full else lora_config(model_cfg)
    args = SFTConfig(output_dir=output_dir, num_train_epochs=epochs, learning_rate=learning_rate,
                     per_device_train_batch_size=batch_size, completion_only_loss=True, max_length=max_length,
                     seed=seed, save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
                     save_total_limit=2, gradient_accumulation_steps=grad_accum, logging_steps=logging_steps,
                     report_to=report_to or [],
                     use_cpu=not torch.cuda.is_available(),
                     bf16=not torch.cuda.is_available() and cpu_bf16(cpu_autocast),
                     activation_checkpointing=gradient_checkpointing,  # transformers 5 name (gradient_ deprecated)
                     train_sampling_strategy="group_by_length" if group_by_length else "random")
    compact_lm_head_scoring()  # on a CPU, project only the trained (labelled) positions, as on a GPU
    trainer = SFTTrainer(model=base, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft,
                         callbacks=callbacks)
    quiet_adapter_saves(trainer.model)
    return trainer, examples, skipped


def run_sft_apart(**kw: Any) -> dict[str, Any]:
    """:func:`run_sft` (same arguments) in a process of its own, started fresh (spawn: the caller may hold a JVM,
    which a fork would copy unsafely); returns its summary. What the SFT's allocations leave in a process's heap
    stays with that process (under CPU bf16 autocast, ~2 GB that every later evaluation dirtied again in the wiki
    quick start: measured in :mod:`agentic_rag.malloc`). The child's errors are reported
    there, as the command line reports them; here they raise a :class:`~agentic_rag.errors.UserError` naming the
    exit status. An interrupted child leaves its checkpoints for the next call (``resume=None`` continues them)."""
    import multiprocessing

    from ..errors import UserError
    from ..malloc import child_env

    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_sft_child, args=(kw,), name="sft")
    # the child's environment is this one's when it starts: glibc's huge pages for it, as for the training processes
    added = {k: v for k, v in child_env(dict(os.environ)).items() if os.environ.get(k) != v}
    before = {k: os.environ.get(k) for k in added}
    os.environ.update(added)
    try:
        proc.start()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        proc.join()
    finally:
        if proc.is_alive():  # interrupted here (Ctrl-C reaches the child too): let it stop on its own, then make it
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    if proc.exitcode != 0:
        raise UserError(f"the SFT process stopped (exit {proc.exitcode}); its message is above. The checkpoints it "
                        f"saved, if any, stay in {kw['output_dir']}.partial for the next run to continue")
    return json.loads((Path(kw["output_dir"]) / "sft_summary.json").read_text())


def _sft_child(kw: dict[str, Any]) -> None:
    from ..errors import guarded
    from ..malloc import release_freed_memory

    release_freed_memory()  # as every entry point (agentic_rag.malloc)
    sys.exit(guarded("sft", lambda: run_sft(**kw) and 0))


def run_sft(*, model: str, data: str, output_dir: str, rollout: RolloutSettings | None = None,
            prompt: PromptSettings | None = None, epochs: float = 1.0, learning_rate: float = 2e-4,
            batch_size: int = 4, lora_r: int = 16, lora_alpha: int = 32, full: bool = False, merge: bool = False,
            max_length: int = 2048, seed: int = 42, report_to: list[str] | None = None, logging_steps: int = 1,
            gradient_checkpointing: bool = True, group_by_length: bool = False, grad_accum: int = 1,
            save_steps: int = 50, resume: bool | None = False, progress: bool = True,
            cpu_autocast: str = "none", move_aside: bool = False, tools: list | None = None) -> dict[str, Any]:
    """Fine-tune ``model`` on the trajectories of ``data`` and save to ``output_dir``: the LoRA adapter, or with
    ``merge`` the base model with the adapter merged in (a warm start GRPO puts a fresh adapter on), or with
    ``full`` every weight fine-tuned. ``model`` is any model name (:func:`agentic_rag.models.resolve_model`),
    a GGUF file or a packaged model's short name included; whole models are saved by
    :func:`agentic_rag.models.save_model`, so a merged GGUF model becomes a plain model directory. ``rollout`` and
    ``prompt``: the settings the trajectories were made with (defaults when not given), saved with the model.

    The run works in ``OUTPUT_DIR.partial`` and is swapped into place whole at the end. It saves a checkpoint every
    ``save_steps`` optimizer steps there; a run stopped on the way is continued with ``resume`` (same model, data
    and settings, checked), and an interrupted run is never started over silently: without ``resume`` it is
    refused (``resume=None``: continue one if there is one, as the quick start does). ``OUTPUT_DIR.partial`` is
    used only when missing or marked as this command's (:func:`agentic_rag.outputs.claim_work_dir`): a folder of the
    user's by that name is refused, or renamed aside with ``move_aside``, never emptied. The run holds
    ``OUTPUT_DIR``'s lock throughout (:func:`agentic_rag.outputs.output_lock`). ``progress``: one console line per
    step (step i/N, loss, seconds a step, time left)."""
    from ..errors import UserError
    from ..malloc import heap_for_blocks_below, trim_heap
    from ..models import save_model
    from ..outputs import claim_work_dir, mark_dir, output_lock, replace_dir
    from .progress import ProgressLine

    final = Path(output_dir)
    with output_lock(final, "agentic-rag sft"):  # one run per output: a second is refused, naming this one
        # everything is written beside the output and swapped in whole: an earlier output there stays until then
        partial = final.with_name(final.name + ".partial")
        run = {"model": model, "data": str(Path(data).resolve()), "data_sha256": _sha256(data), "epochs": epochs,
               "learning_rate": learning_rate, "batch_size": batch_size, "grad_accum": grad_accum, "lora_r": lora_r,
               "lora_alpha": lora_alpha, "full": full, "max_length": max_length, "seed": seed,
               "group_by_length": group_by_length, "cpu_autocast": cpu_autocast}
        claim_work_dir(partial, ("sft",), what="agentic-rag sft", move_aside=move_aside)
        checkpoint = _latest_checkpoint(partial)
        if resume is None:
            resume = checkpoint is not None
        if resume:
            if checkpoint is None:
                raise UserError(f"--resume: {partial} holds no checkpoint of an interrupted SFT run to continue; run "
                                f"without --resume")
            before = json.loads((partial / "sft_run.json").read_text()) if (partial / "sft_run.json").is_file() else {}
            differ = sorted(k for k in run if before.get(k) != run[k])
            if differ:
                raise UserError(f"--resume: the interrupted run in {partial} was made with other settings "
                                f"({', '.join(differ)} differ); continue it with the same ones, or move {partial} away "
                                f"to start over")
        elif checkpoint is not None:
            raise UserError(f"{partial} holds an interrupted SFT run ({Path(checkpoint).name}): continue it with "
                            f"--resume, or move {partial} away to start over")
        elif partial.exists():
            shutil.rmtree(partial)  # this command's own (claimed above), without a checkpoint: nothing to continue
        output_dir = str(mark_dir(partial, "sft"))
        (partial / "sft_run.json").write_text(json.dumps(run, indent=1))
        trainer, examples, skipped = build_sft_trainer(
            model=model, data=data, output_dir=output_dir, rollout=rollout, prompt=prompt, epochs=epochs,
            learning_rate=learning_rate, batch_size=batch_size, lora_r=lora_r, lora_alpha=lora_alpha, full=full,
            max_length=max_length, seed=seed, report_to=report_to, logging_steps=logging_steps,
            gradient_checkpointing=gradient_checkpointing, group_by_length=group_by_length, grad_accum=grad_accum,
            save_steps=save_steps, callbacks=[ProgressLine("sft")] if progress else None, cpu_autocast=cpu_autocast)
        if checkpoint:
            log.info("resuming SFT from %s", checkpoint)
        # under CPU bf16 autocast the entry points' 1 MiB mmap threshold slows every step (agentic_rag.malloc)
        stretch = trainer.args.bf16 and trainer.args.use_cpu
        with heap_for_blocks_below() if stretch else nullcontext():
            result = trainer.train(resume_from_checkpoint=checkpoint)
        for old in partial.glob("checkpoint-*"):
            shutil.rmtree(old)  # done: the checkpoints served their purpose, the output is what stays
        if full:
            save_model(trainer.model, output_dir)
        elif merge:
            save_model(trainer.model.merge_and_unload(), output_dir)
        else:
            trainer.save_model(output_dir)  # the LoRA adapter (PEFT)
        rollout = rollout or RolloutSettings()
        if get_dialect(rollout.dialect).native:  # the tokenizer saved with the model carries its tool template
            from ..rollout.native import prepare_tokenizer

            prepare_tokenizer(trainer.processing_class, name=model)
        trainer.processing_class.save_pretrained(output_dir)
        write_settings(output_dir, rollout, resolved_prompt(prompt or PromptSettings(), rollout.dialect,
                                                            trainer.processing_class), written_by="sft", tools=tools)
        from .train import peak_rss_mb

        summary = {"examples": len(examples), "skipped_branched": skipped, "train_loss": result.training_loss,
                   "output_dir": str(final), "adapter": not full and not merge, "merged": merge and not full,
                   "masked_fraction": 1 - sum(sum(e.completion_mask) for e in examples) / sum(len(e.input_ids)
                                                                                              for e in examples),
                   "steps": trainer.state.global_step, "resumed_from": checkpoint,
                   "train_runtime_s": result.metrics.get("train_runtime"), "peak_rss_mb": round(peak_rss_mb(), 1),
                   "cpu_bf16_autocast": bool(trainer.args.bf16)}  # what cpu_autocast resolved to on this machine
        Path(output_dir, "sft_summary.json").write_text(json.dumps(summary, indent=1))
        replace_dir(partial, final)
        if stretch:  # the trainer's memory was allocated in the heap: free it, hand it back before the caller goes on
            del trainer, result
            gc.collect()
            trim_heap()
        return summary


def _sha256(path: str | os.PathLike) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _latest_checkpoint(run_dir: Path) -> str | None:
    """The newest complete TRL checkpoint of an interrupted run (one with its trainer state), or None."""
    found = [(int(p.name.split("-")[1]), p) for p in run_dir.glob("checkpoint-*")
             if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").is_file()]
    return str(max(found)[1]) if found else None
