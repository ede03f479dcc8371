"""What fits where: the memory estimator over models x GPU counts x GPU sizes x ZeRO stage x quantisation.

    python experiments/memory/fit_table.py [--out experiments/memory/fit_table.md]

Uses the built-in configs (offline) and one reference GRPO workload (REFERENCE below). Writes a markdown file with
three tables: the fit grid for Qwen2.5 7B/14B/32B/72B and Llama-3.1-8B on 1 and 2 GPUs of 24, 40 and 80 GiB under
ZeRO-2/ZeRO-3 with and without nf4; the settings that make Qwen2.5-32B fit on two 80 GiB and two 40 GiB GPUs; and
the longest completion budget that fits with the recommended settings. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from agentic_rag.training.memory import GiB, TrainingSetup, estimate  # noqa: E402
from agentic_rag.training.model_arch import load_arch  # noqa: E402

MODELS = ["qwen2.5-7b", "llama-3.1-8b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"]
GPU_SIZES = [24, 40, 80]
GPU_COUNTS = [1, 2]
MARGIN = 0.9  # below 90% of the GPU's memory an estimate is a clear fit
REFERENCE = TrainingSetup(lora_rank=64, lora_dropout=0.05, batch=1, num_generations=8, micro_batch=4,
                          max_prompt=1024, max_completion=2048, gradient_checkpointing=True)


def describe(s: TrainingSetup) -> str:
    return (f"LoRA r={s.lora_rank} on all linear layers of the decoder (q,k,v,o,gate,up,down), dropout "
            f"{s.lora_dropout}; rollout {s.batch} prompt x {s.num_generations} generations per GPU, "
            f"{s.max_prompt} prompt + {s.max_completion} completion tokens; micro-batch {s.micro_batch} completions; "
            f"gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}; TRL 1.16 fused LM head; "
            f"ZeRO-3 gathers the whole model for generation (TRL's default); nf4 with double quantisation")


def total_gb(model: str, setup: TrainingSetup) -> float:
    return estimate(load_arch(model), setup).total / GiB


def verdict(gb: float, size: int) -> str:
    """✓ fits with 10% to spare, ~ fits by less than 10% (marginal: the GPU part is not yet measured), ✗ does not."""
    return "✓" if gb <= MARGIN * size else ("~" if gb <= size else "✗")


def cell(gb: float, size: int) -> str:
    return f"{verdict(gb, size)} {gb:.1f}"


def fit_grid() -> tuple[list[str], dict]:
    lines = ["| model | params | quant | ZeRO | " + " | ".join(f"{n}x{g} GiB" for n in GPU_COUNTS for g in GPU_SIZES)
             + " |", "|---|---|---|---|" + "---|" * (len(GPU_COUNTS) * len(GPU_SIZES))]
    summary = {}
    for model in MODELS:
        arch = load_arch(model)
        for quant in ("none", "nf4"):
            for zero in (2, 3):
                cells = []
                for n in GPU_COUNTS:
                    gb = total_gb(model, replace(REFERENCE, quant=quant, zero=zero, gpus=n))
                    for size in GPU_SIZES:
                        cells.append(cell(gb, size))
                        summary[f"{model}/{quant}/zero{zero}/{n}x{size}"] = verdict(gb, size)
                label = "bf16" if quant == "none" else "nf4"
                lines.append(f"| {model} | {arch.total_params / 1e9:.2f} B | {label} | {zero} | " + " | ".join(cells)
                             + " |")
    return lines, summary


def settings_32b() -> tuple[list[str], dict]:
    model = "qwen2.5-32b"
    micro = [1, 4, 8]
    header = "| quant | ZeRO | generation gather | " + " | ".join(
        f"GC {'on' if gc else 'off'}, micro {m}" for gc in (False, True) for m in micro) + " |"
    lines = [header, "|---|---|---|" + "---|" * (2 * len(micro))]
    fits = {80: [], 40: []}
    for quant in ("none", "nf4"):
        for zero, gathers in ((2, (True,)), (3, (True, False))):
            for gather in gathers:
                cells = []
                for gc in (False, True):
                    for m in micro:
                        s = replace(REFERENCE, gpus=2, quant=quant, zero=zero, ds3_gather_for_generation=gather,
                                    gradient_checkpointing=gc, micro_batch=m)
                        gb = total_gb(model, s)
                        mark = next((f"{verdict(gb, size)}{size}" for size in (40, 80) if gb <= size), "✗")
                        cells.append(f"{gb:.1f} {mark}")
                        for size in (80, 40):
                            if gb <= size:
                                fits[size].append({"quant": quant, "zero": zero, "ds3_gather_for_generation": gather,
                                                   "gradient_checkpointing": gc, "micro_batch": m,
                                                   "per_gpu_gb": round(gb, 2)})
                label = "bf16" if quant == "none" else "nf4"
                g = "whole model" if gather else "layer by layer"
                lines.append(f"| {label} | {zero} | {g if zero == 3 else '-'} | " + " | ".join(cells) + " |")
    return lines, fits


def longest_completion(setup: TrainingSetup, model: str, size: int) -> int:
    """The largest max_completion (multiple of 256) whose estimate fits ``size`` GiB."""
    best, c = 0, 256
    while c <= 32768:
        if total_gb(model, replace(setup, max_completion=c)) <= size:
            best = c
        else:
            break
        c += 256
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "experiments" / "memory" / "fit_table.md"))
    args = p.parse_args()

    grid, grid_summary = fit_grid()
    table_32b, fits_32b = settings_32b()
    recommended = replace(REFERENCE, gpus=2, quant="nf4", zero=3, gradient_checkpointing=True)
    rec_80 = estimate(load_arch("qwen2.5-32b"), recommended)
    rec_40 = replace(recommended, ds3_gather_for_generation=False)
    longest = {
        "2x80 nf4 ZeRO-3 (gather)": longest_completion(recommended, "qwen2.5-32b", 80),
        "2x40 nf4 ZeRO-3 (gather)": longest_completion(recommended, "qwen2.5-32b", 40),
        "2x40 nf4 ZeRO-3 (layer by layer)": longest_completion(rec_40, "qwen2.5-32b", 40),
        "2x40 nf4 ZeRO-2": longest_completion(replace(recommended, zero=2), "qwen2.5-32b", 40),
    }
    full_logits = total_gb("qwen2.5-32b", replace(recommended, logits="full"))

    out = [
        "# What fits: estimated per-GPU memory of GRPO + LoRA/QLoRA",
        "",
        "Generated by `python experiments/memory/fit_table.py` from the estimator "
        "(`agentic_rag.training.memory`, `agentic-rag estimate-memory`); do not edit by hand.",
        "",
        f"Reference workload: {describe(REFERENCE)}. Cells: per-GPU GiB that must fit (allocated peak + 10% "
        "allocator fragmentation + CUDA context + NCCL buffers); ✓ fits with 10% to spare, ~ fits by less than "
        "10% (marginal), ✗ does not. With one GPU ZeRO-2 and ZeRO-3 shard nothing and give the same numbers.",
        "",
        *grid,
        "",
        "## Qwen2.5-32B on two GPUs: which settings fit",
        "",
        "Same workload on 2 GPUs, varying quantisation, ZeRO stage, how ZeRO-3 gathers weights for the rollout "
        "(TRL's `ds3_gather_for_generation`), gradient checkpointing (GC) and the micro-batch (completions per "
        "forward/backward, TRL's `per_device_train_batch_size`). Cells: GiB per GPU, then ✓40 fits 2x40 GiB "
        "(and 2x80) with 10% to spare, ~40 fits 2x40 by less than 10%, ✓80 / ~80 the same for 2x80 GiB only, ✗ "
        "neither.",
        "",
        *table_32b,
        "",
        f"Recommended for 2x80 GiB: nf4 + ZeRO-3 + gradient checkpointing, micro-batch {recommended.micro_batch}: "
        f"{rec_80.total / GiB:.1f} GiB per GPU (peak in {rec_80.peak_phase}).",
        "",
        "Longest completion budget (prompt 1024, 1 prompt x 8 generations per GPU, micro-batch 4, GC on) that fits:",
        "",
        "| setting | max completion tokens |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in longest.items()],
        "",
        f"Without TRL's fused LM head (a trainer that materialises the completion logits, `--logits full`) the "
        f"recommended 2x80 setting needs {full_logits:.1f} GiB per GPU instead of {rec_80.total / GiB:.1f}.",
        "",
    ]
    Path(args.out).write_text("\n".join(out))
    print("\n".join(out))
    out = Path(args.out).resolve()
    print(json.dumps({"out": str(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out), "fits": grid_summary,
                      "qwen2.5-32b_2x80_fitting_settings": len(fits_32b[80]),
                      "qwen2.5-32b_2x40_fitting_settings": fits_32b[40],
                      "recommended_2x80_gb": round(rec_80.total / GiB, 2), "longest_completion": longest,
                      "full_logits_gb": round(full_logits, 2)}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
