"""The ``estimate-memory`` subcommand: per-GPU peak memory of a LoRA/QLoRA GRPO run, before loading anything."""

from __future__ import annotations

import argparse
import json


def cmd_estimate_memory(args: argparse.Namespace) -> int:
    from ..models import PACKAGED_MODELS
    from .memory import TrainingSetup, estimate
    from .memory_advice import EstimateInputs, check_fits
    from .model_arch import builtin_models, load_arch

    if args.list_models:
        for name, pkg in PACKAGED_MODELS.items():
            print(f"{name:<24} {pkg.filename} (PyPI {pkg.requirement})")
        for name, hub in builtin_models().items():
            print(f"{name:<24} {hub}")
        return 0
    if not args.model:
        raise ValueError("--model is required (a model directory, a config.json, a .gguf file, a packaged model, a "
                         "built-in name or a hub id; --list-models lists the packaged and built-in ones)")
    targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
    setup = TrainingSetup(
        gpus=args.gpus, zero=args.zero, quant=args.quant, double_quant=not args.no_double_quant,
        lora_rank=args.lora_rank, lora_targets=targets, lora_dropout=args.lora_dropout, batch=args.batch,
        num_generations=args.num_generations, micro_batch=args.micro_batch, generation_batch=args.generation_batch,
        max_prompt=args.max_prompt,
        max_completion=args.max_completion, gradient_checkpointing=args.gradient_checkpointing,
        padded=not args.no_padding, ds3_gather_for_generation=not args.no_ds3_gather_for_generation,
        logits=args.logits, device=args.device,
    )
    arch = load_arch(args.model)
    est = estimate(arch, setup)
    warning = check_fits(EstimateInputs(arch, setup), args.gpu_memory) if args.gpu_memory else None
    if args.json:
        out = est.to_dict()
        if args.gpu_memory:
            out.update({"gpu_memory_gb": args.gpu_memory, "fits": warning is None, "warning": warning})
        print(json.dumps(out))
    else:
        print(est.format_table())
        if args.gpu_memory:
            print()
            print(warning or f"fits: {est.total / 2**30:.1f} GiB <= {args.gpu_memory:g} GiB per GPU")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimate-memory", help="per-GPU peak memory of a LoRA/QLoRA GRPO run (no weights needed)",
                       description="Estimate per-GPU peak memory of GRPO training with LoRA/QLoRA and DeepSpeed "
                                   "from the model's config (instantiated on the meta device). Sizes in GiB. "
                                   "Defaults follow the project's training config, except gradient checkpointing, "
                                   "which the trainer turns on by default and this command only with the flag.")
    p.add_argument("--model", default=None,
                   help="model directory, config.json, .gguf file, packaged model (smollm2-135m-instruct), "
                        "built-in name (--list-models) or Hugging Face hub id")
    p.add_argument("--list-models", action="store_true",
                   help="list the packaged models and the built-in model configs and exit")
    p.add_argument("--gpus", type=int, default=1, help="GPUs (data-parallel ranks)")
    p.add_argument("--zero", type=int, default=2, choices=[2, 3], help="DeepSpeed ZeRO stage")
    p.add_argument("--quant", default="none", choices=["none", "nf4", "int8"], help="base weight format")
    p.add_argument("--no-double-quant", action="store_true", help="nf4 without double quantisation")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                   help="comma-separated linear layer names LoRA adapts, or all-linear")
    p.add_argument("--lora-dropout", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=1, help="prompts per GPU per generation round")
    p.add_argument("--num-generations", type=int, default=4, help="completions per prompt (GRPO group size)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="completions per forward/backward (TRL per_device_train_batch_size); "
                        "default batch * num-generations")
    p.add_argument("--generation-batch", type=int, default=None,
                   help="sequences decoded together (default: all batch * num-generations of them)")
    p.add_argument("--max-prompt", type=int, default=512, help="prompt tokens")
    p.add_argument("--max-completion", type=int, default=1024,
                   help="completion tokens, inserted search results included")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--no-padding", action="store_true",
                   help="batches without padding (SDPA uses GQA directly; rare in GRPO)")
    p.add_argument("--no-ds3-gather-for-generation", action="store_true",
                   help="ZeRO-3: gather layer by layer during generation instead of the whole model")
    p.add_argument("--logits", default="fused", choices=["fused", "full"],
                   help="fused: TRL 1.16's chunked LM head; full: a trainer that materialises the logits")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a plain fp32 PyTorch step (used to check the estimator against measurements)")
    p.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                   help="memory of each GPU in GiB: also say whether it fits and what to change if not")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_estimate_memory)
