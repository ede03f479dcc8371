"""Check the memory estimator against measured process memory of real LoRA training steps on the CPU.

    python experiments/benchmarks/memory_check.py [--suite quick|full]
    python experiments/benchmarks/memory_check.py --model qwen2.5-0.5b --layers 2 --micro-batch 2 \\
        --prompt 64 --completion 64 --lora-rank 128 [--gradient-checkpointing] [--steps 2]

Each measurement runs in a fresh Python process. It first runs one step of a tiny model of the same architecture
through the same code path (so library code pages, thread pools and kernel caches are resident before anything is
measured), then builds a random-init model of a real architecture (a built-in config with its real widths and
vocabulary, only the layer count shrunk, so each layer and the vocabulary cost what they cost in the real model) in
fp32, wraps it in PEFT LoRA (B drawn at random rather than zero, so its pages are resident at once), patches it with
TRL 1.16's fused LM head exactly as GRPOTrainer does, and runs ``--steps`` GRPO-like training steps (forward on
prompt + completion with padding, loss = -advantage * log-prob over the completion tokens, backward, AdamW step,
zero_grad). It records the resident set size (RSS) after the model is built, after LoRA, around the first optimizer
step and after each step, and the peak RSS of each step (the kernel's VmHWM, reset at the start of each step
through /proc/self/clear_refs; the process's ru_maxrss where that is not allowed).

The children run with ``MALLOC_MMAP_THRESHOLD_=65536`` so glibc serves every tensor-sized allocation with mmap and
returns it on free: RSS then tracks live tensor memory the way ``torch.cuda.max_memory_allocated`` does on a GPU
(without it, freed heap memory stays resident and the peak measures the allocator, not the tensors).

The estimate is ``agentic_rag.training.memory.estimate`` with ``device="cpu"`` (fp32, plain PyTorch AdamW) for the
same shrunk config: its base-weight term against the RSS growth of building the model, its LoRA term against the
growth of wrapping it, its optimizer term against the growth over the first ``optimizer.step()`` (AdamW allocates
its state), the training phase minus the persistent terms against the last step's peak above its start
(``step_transient``: activations, LM-head workspace, gradients), and its peak against the process's peak growth.
Runs that differ only in their layer count also give the per-layer activation cost. The last line printed is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

MiB = 2**20
TARGET_ERROR = 0.15

# name, model, layers, micro-batch, prompt, completion, lora rank, gradient checkpointing. Ranks are chosen so
# LoRA and its AdamW state are tens of MiB: a few MiB would drown in page-granular noise.
FULL = [
    ("qwen0.5b-2L", "qwen2.5-0.5b", 2, 2, 64, 64, 128, False),
    ("qwen0.5b-2L-long", "qwen2.5-0.5b", 2, 4, 256, 256, 128, False),
    ("qwen0.5b-6L-long", "qwen2.5-0.5b", 6, 4, 256, 256, 128, False),
    ("qwen0.5b-2L-long-gc", "qwen2.5-0.5b", 2, 4, 256, 256, 128, True),
    ("qwen0.5b-6L-long-gc", "qwen2.5-0.5b", 6, 4, 256, 256, 128, True),
    ("llama1b-2L", "llama-3.2-1b", 2, 2, 128, 128, 128, False),
    ("qwen7b-2L", "qwen2.5-7b", 2, 2, 128, 128, 64, False),
    ("llama8b-2L-gc", "llama-3.1-8b", 2, 2, 128, 128, 64, True),
]
SUITES = {"quick": FULL[:1], "full": FULL}


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak(reset_ok: bool) -> int:
    if reset_ok:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _train_steps(model, steps: int, vocab: int, m: int, p: int, c: int, reset_ok: bool) -> dict:
    """``steps`` GRPO-like steps on one padded micro-batch; RSS after each step and the peak at each stage."""
    import gc

    import torch

    torch.manual_seed(0)
    input_ids = torch.randint(0, vocab, (m, p + c))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, : min(8, p - 1)] = 0  # a left-padded prompt and a completion that ended early:
    attention_mask[-1, -min(16, c - 1):] = 0  # the batch has padding, as GRPO batches do
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-c] = -100
    advantages = torch.randn(m, 1)
    completion_mask = attention_mask[:, -c:].float()
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
    rss_steps, losses, stage_peaks, around_step = [], [], [], []
    for _ in range(steps):
        step_start = _rss()
        reset_ok = reset_ok and _reset_peak()  # per-step peaks (the process peak is their maximum)
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        logps = out.log_probs[:, -c:]
        loss = -(advantages * logps * completion_mask).sum() / completion_mask.sum()
        after_forward = _peak(reset_ok)
        loss.backward()
        after_backward = _peak(reset_ok)
        before_step = _rss()
        optimizer.step()
        stage_peaks.append({"start": step_start, "forward": after_forward, "backward": after_backward,
                            "step": _peak(reset_ok)})
        around_step.append((before_step, _rss()))
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
        del out, logps, loss
        gc.collect()
        rss_steps.append(_rss())
    return {"rss_steps": rss_steps, "rss_around_optimizer_step": around_step, "stage_peaks": stage_peaks,
            "losses": losses}


def _lora_model(config, args: argparse.Namespace):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from agentic_rag.training.memory import DEFAULT_LORA_TARGETS

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    yield model
    # init_lora_weights=False draws B at random instead of zeros, so LoRA's pages are resident at once (untouched
    # zero pages would only count from the first optimizer step); the memory is the same.
    lora = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=args.lora_dropout,
                      target_modules=list(DEFAULT_LORA_TARGETS), task_type="CAUSAL_LM", init_lora_weights=False)
    model = get_peft_model(model, lora)
    add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy"))  # as GRPOTrainer does
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    yield model


def measure(args: argparse.Namespace) -> dict:
    """Run in a fresh process: warm up, build, wrap, train ``args.steps`` steps; RSS at each stage and the peak."""
    import gc

    import torch

    from agentic_rag.training.model_arch import resolve_config

    # Warm-up: one step of a tiny model of the same architecture through the same code path, so that what the
    # first step allocates once per process (library code pages, thread pools, kernel caches) is not counted.
    tiny = resolve_config(args.model, num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1024,
                          bos_token_id=0, eos_token_id=1)
    stages = _lora_model(tiny, args)
    next(stages)
    _train_steps(next(stages), 1, 1024, 2, 16, 16, False)
    del stages
    gc.collect()

    config = resolve_config(args.model, num_hidden_layers=args.layers)
    rss0 = _rss()
    reset_ok = _reset_peak()
    t0 = time.time()
    stages = _lora_model(config, args)
    model = next(stages)
    base_parameters = sum(q.numel() for q in model.parameters())
    gc.collect()
    rss_model = _rss()
    build_peak = _peak(reset_ok)  # transformers' random init briefly holds more than the weights
    del model
    model = next(stages)
    gc.collect()
    rss_lora = _rss()
    trainable = sum(q.numel() for q in model.parameters() if q.requires_grad)
    reset_ok = _reset_peak()  # the training peak only: reset to the current RSS
    steps = _train_steps(model, args.steps, config.vocab_size, args.micro_batch, args.prompt, args.completion,
                         reset_ok)
    return {
        "rss_start": rss0, "rss_model": rss_model, "rss_lora": rss_lora, **steps,
        "peak_rss": max(max(st["forward"], st["backward"], st["step"]) for st in steps["stage_peaks"]),
        "model_build_peak_rss": build_peak,
        "peak_source": "VmHWM reset through /proc/self/clear_refs" if reset_ok else "ru_maxrss (peak since start)",
        "parameters": base_parameters, "trainable_parameters": trainable,
        "seconds": round(time.time() - t0, 1), "threads": torch.get_num_threads(),
    }


def estimate_for(args: argparse.Namespace):
    from agentic_rag.training.memory import TrainingSetup, estimate
    from agentic_rag.training.model_arch import arch_from_config, resolve_config

    config = resolve_config(args.model, num_hidden_layers=args.layers)
    arch = arch_from_config(config, name=f"{args.model} ({args.layers} layers)")
    setup = TrainingSetup(device="cpu", quant="none", gpus=1, lora_rank=args.lora_rank,
                          lora_dropout=args.lora_dropout, batch=args.micro_batch, num_generations=1,
                          max_prompt=args.prompt, max_completion=args.completion,
                          gradient_checkpointing=args.gradient_checkpointing, padded=True)
    return estimate(arch, setup)


def compare(measured: dict, est) -> dict:
    """Measured vs estimated MiB for each checkable term and the peak; error = (estimate - measured) / measured."""
    t = est.terms
    first = measured["rss_around_optimizer_step"][0]
    st = measured["stage_peaks"][-1]  # the last step: AdamW's state allocated, as in every step but the first
    pairs = {
        "weights": (measured["rss_model"] - measured["rss_start"], t["weights"]),
        "lora": (measured["rss_lora"] - measured["rss_model"], t["lora"]),
        "optimizer": (first[1] - first[0], t["optimizer"]),
        "step_transient": (max(st["forward"], st["backward"], st["step"]) - st["start"],
                           est.phases["training"] - t["weights"] - t["lora"] - t["optimizer"]),
        "peak": (measured["peak_rss"] - measured["rss_start"], est.allocated),
    }
    return {name: {"measured_mib": round(meas / MiB, 1), "estimated_mib": round(value / MiB, 1),
                   "error": round((value - meas) / meas, 4)} for name, (meas, value) in pairs.items()}


def per_layer(runs: list[dict]) -> list[dict]:
    """Runs that differ only in their layer count isolate the per-layer activations: the LM head, the embedding and
    the batch are the same, so (transient at L2 - transient at L1) / (L2 - L1) is what one more layer keeps."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        key = (r["model"], r["micro_batch"], r["prompt"], r["completion"], r["lora_rank"], r["lora_dropout"],
               r["gradient_checkpointing"])
        groups.setdefault(key, []).append(r)
    out = []
    for rs in groups.values():
        if len({r["layers"] for r in rs}) < 2:
            continue
        lo, hi = min(rs, key=lambda r: r["layers"]), max(rs, key=lambda r: r["layers"])
        dl = hi["layers"] - lo["layers"]
        meas = (hi["terms"]["step_transient"]["measured_mib"] - lo["terms"]["step_transient"]["measured_mib"]) / dl
        est = (hi["terms"]["step_transient"]["estimated_mib"] - lo["terms"]["step_transient"]["estimated_mib"]) / dl
        out.append({"runs": [lo["name"], hi["name"]], "measured_mib_per_layer": round(meas, 2),
                    "estimated_mib_per_layer": round(est, 2), "error": round((est - meas) / meas, 4)})
    return out


def run_child(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "--model", args.model, "--layers", str(args.layers),
           "--micro-batch", str(args.micro_batch), "--prompt", str(args.prompt), "--completion", str(args.completion),
           "--lora-rank", str(args.lora_rank), "--lora-dropout", str(args.lora_dropout), "--steps", str(args.steps)]
    if args.gradient_checkpointing:
        cmd.append("--gradient-checkpointing")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"measurement failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check(args: argparse.Namespace, name: str = "") -> dict:
    measured = run_child(args)
    est = estimate_for(args)
    result = {
        "name": name or f"{args.model}-{args.layers}L", "model": args.model, "layers": args.layers,
        "micro_batch": args.micro_batch, "prompt": args.prompt, "completion": args.completion,
        "lora_rank": args.lora_rank, "lora_dropout": args.lora_dropout,
        "gradient_checkpointing": args.gradient_checkpointing, "steps": args.steps,
        "parameters": measured["parameters"], "trainable_parameters": measured["trainable_parameters"],
        "estimated_parameters": est.arch.total_params, "estimated_trainable_parameters": est.trainable_params,
        "terms": compare(measured, est), "estimate": est.to_dict(), "measured": measured,
    }
    result["max_abs_error"] = max(abs(t["error"]) for t in result["terms"].values())
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES), default=None, help="run a predefined set of configurations")
    p.add_argument("--model", default="qwen2.5-0.5b", help="built-in config name or config path")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (the real count shrunk)")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--completion", type=int, default=64)
    p.add_argument("--lora-rank", type=int, default=128)
    p.add_argument("--lora-dropout", type=float, default=0.05)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--steps", type=int, default=2, help="training steps (the second runs with AdamW state allocated)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def main() -> int:
    args = parser().parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    runs = []
    if args.suite:
        for name, model, layers, mb, prompt, completion, rank, gcp in SUITES[args.suite]:
            run_args = argparse.Namespace(**{**vars(args), "model": model, "layers": layers, "micro_batch": mb,
                                             "prompt": prompt, "completion": completion, "lora_rank": rank,
                                             "gradient_checkpointing": gcp})
            runs.append(check(run_args, name))
            print(f"done {name}", file=sys.stderr)
    else:
        runs.append(check(args))
    print(f"{'run':<22} {'term':<15} {'measured MiB':>13} {'estimate MiB':>13} {'error':>8}")
    for r in runs:
        for term, t in r["terms"].items():
            print(f"{r['name']:<22} {term:<15} {t['measured_mib']:>13.1f} {t['estimated_mib']:>13.1f} "
                  f"{t['error']:>+8.1%}")
    layer_checks = per_layer(runs)
    for c in layer_checks:
        print(f"per-layer activations {c['runs'][0]} -> {c['runs'][1]}: measured {c['measured_mib_per_layer']:.1f} MiB,"
              f" estimate {c['estimated_mib_per_layer']:.1f} MiB ({c['error']:+.1%})")
    worst = max([r["max_abs_error"] for r in runs] + [abs(c["error"]) for c in layer_checks])
    print(json.dumps({"runs": runs, "per_layer_activations": layer_checks, "max_abs_error": worst,
                      "target": TARGET_ERROR, "within_target": worst <= TARGET_ERROR}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
