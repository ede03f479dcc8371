"""Will a training run fit, and if not, what to change: the verdicts and advice built on the memory estimate.

Why a module of its own: the estimate (:mod:`.memory`) says how much memory a setup needs; this module compares
it with what the machine has (the trainer's pre-load checks in ``training/train.py`` and ``estimate-memory
--gpu-memory``) and, when it does not fit, lists single changes that lower the need (nf4, ZeRO-3, more GPUs,
gradient checkpointing, smaller micro-batches or rollouts), each with its own estimate, so a user can pick one
before loading anything.

What it holds: :class:`EstimateInputs` (a model and its setup), :func:`check_fits` (GPU), :func:`check_fits_ram`
(a CPU run against the RAM available, with :data:`CPU_PROCESS_GB` for the process itself) and the alternatives and
their lines of advice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .memory import TERM_LABELS, GiB, TrainingSetup, estimate
from .model_arch import ModelArch, load_arch


@dataclass(frozen=True)
class EstimateInputs:
    """A model (path, built-in name, hub id, or an already loaded :class:`ModelArch`) and how it is trained."""

    model: str | ModelArch
    setup: TrainingSetup


def _smaller_micro_batch(s: TrainingSetup) -> int | None:
    """The largest micro-batch at most half of ``s``'s that divides its rollout (TRL's micro-batches are equal)."""
    m = s.completions_per_step
    return next((d for d in range(m // 2, 0, -1) if s.rollout_sequences % d == 0), None)


def _alternatives(setup: TrainingSetup) -> list[tuple[str, TrainingSetup]]:
    """Single changes that lower per-GPU memory, then all of them together."""
    s = setup
    alts: list[tuple[str, TrainingSetup]] = []
    if s.quant != "nf4":
        alts.append(("quantise the base weights to nf4 (QLoRA)", replace(s, quant="nf4")))
    if s.gpus > 1 and s.zero != 3:
        alts.append(("DeepSpeed ZeRO-3 (shards the weights)", replace(s, zero=3)))
    alts.append((f"{s.gpus * 2} GPUs with ZeRO-3", replace(s, gpus=s.gpus * 2, zero=3)))
    # never ds3_gather_for_generation=False: the rollout would hang under it (config.launch_problems refuses it)
    if not s.gradient_checkpointing:
        alts.append(("gradient checkpointing", replace(s, gradient_checkpointing=True)))
    m = s.completions_per_step
    smaller = _smaller_micro_batch(s)
    if smaller:
        alts.append((f"micro-batch {smaller} instead of {m} (per_device_train_batch_size)",
                     replace(s, micro_batch=smaller)))
    if s.batch > 1:
        fewer = replace(s, batch=s.batch // 2, micro_batch=None)
        alts.append((f"{fewer.batch} prompt(s) per GPU per rollout instead of {s.batch}",
                     replace(fewer, micro_batch=math.gcd(m, fewer.rollout_sequences))))
    elif s.num_generations > 2:
        fewer = replace(s, num_generations=s.num_generations // 2, micro_batch=None)
        alts.append((f"{fewer.num_generations} generations per prompt instead of {s.num_generations}",
                     replace(fewer, micro_batch=math.gcd(m, fewer.rollout_sequences))))
    gpus = max(s.gpus, 2)
    together = replace(s, quant="nf4", zero=3, gpus=gpus, gradient_checkpointing=True, micro_batch=1)
    alts.append((f"all together: nf4, ZeRO-3 on {gpus} GPUs, gradient checkpointing, micro-batch 1", together))
    return alts


def check_fits(inputs: EstimateInputs, gpu_memory_gb: float) -> str | None:
    """None when the estimate fits ``gpu_memory_gb`` GiB per GPU; else a warning naming the estimate, the budget and
    the changes that would help, each with its own estimate (so the user can pick one before loading anything)."""
    arch = load_arch(inputs.model) if isinstance(inputs.model, str) else inputs.model
    est = estimate(arch, inputs.setup)
    budget = gpu_memory_gb * GiB
    if est.total <= budget:
        return None
    biggest = sorted(((v, k) for k, v in est.terms.items() if k != "quant_constants"), reverse=True)[:3]
    lines = [
        f"memory estimate: {arch.name} needs ~{est.total / GiB:.1f} GiB per GPU (peak in {est.peak_phase}: "
        + ", ".join(f"{TERM_LABELS[k].strip()} {v / GiB:.1f}" for v, k in biggest)
        + f") but each of the {inputs.setup.gpus} GPU(s) has {gpu_memory_gb:.1f} GiB. It will probably run out of "
        "memory. Changes that would help (estimated GiB per GPU):"
    ]
    lines += _alternative_lines(arch, _alternatives(inputs.setup), gpu_memory_gb)
    return "\n".join(lines)


# What a CPU training process holds besides the step's tensors: Python, torch and its libraries, the tokenizer,
# the datasets, and the JVM of a BM25 searcher. Measured on the SmolLM2-135M run (world_grpo_smollm2.yaml):
# 1.29 GB RSS before the first step, 0.54 GB of it the fp32 weights the estimate already counts.
CPU_PROCESS_GB = 0.8


def check_fits_ram(inputs: EstimateInputs, ram_gb: float) -> str | None:
    """None when a CPU run (plain fp32 step, ``device="cpu"``) fits ``ram_gb`` GiB of RAM; else the reason, with
    the changes that would help and their estimates. The estimate is of one training step (the rollout's KV
    cache is smaller on the CPU runs measured) plus :data:`CPU_PROCESS_GB`; on the SmolLM2 run it was 15-30%
    above the measured peak RSS, so a config it refuses would be near the edge at best."""
    arch = load_arch(inputs.model) if isinstance(inputs.model, str) else inputs.model
    setup = replace(inputs.setup, device="cpu", gpus=1, quant="none")
    need = estimate(arch, setup).total / GiB + CPU_PROCESS_GB
    if need <= ram_gb:
        return None
    lines = [f"memory estimate: training {arch.name} on the CPU needs ~{need:.1f} GiB of RAM (one fp32 training "
             f"step of {setup.completions_per_step} completions of up to {setup.seq_len} tokens, and "
             f"~{CPU_PROCESS_GB} GiB for the process) but {ram_gb:.1f} GiB is available. The kernel would kill the "
             "run part-way. Changes that would help (estimated GiB):"]
    alts = []
    if not setup.gradient_checkpointing:
        alts.append(("model.gradient_checkpointing: true", replace(setup, gradient_checkpointing=True)))
    smaller = _smaller_micro_batch(setup)
    if smaller:
        alts.append((f"algorithm.per_device_train_batch_size: {smaller} (with gradient_accumulation_steps "
                     "raised to keep the rollouts per step)", replace(setup, micro_batch=smaller)))
    lines += _alternative_lines(arch, alts, ram_gb, extra_gb=CPU_PROCESS_GB)
    return "\n".join(lines)


def _alternative_lines(arch: ModelArch, alts: list[tuple[str, TrainingSetup]], budget_gb: float, *,
                       extra_gb: float = 0.0) -> list[str]:
    """One line per alternative: its estimate (plus ``extra_gb``) in GiB and whether it fits ``budget_gb``."""
    lines = []
    for label, alt in alts:
        total = estimate(arch, alt).total / GiB + extra_gb
        lines.append(f"  - {label}: {total:.1f} ({'fits' if total <= budget_gb else 'still too much'})")
    return lines

