"""Subcommands of training: ``agentic-rag train`` (one process; the scripts launch several) and ``sft``."""

from __future__ import annotations

import argparse
import json


def cmd_train(args: argparse.Namespace) -> int:
    from .train import main

    argv = ["--config", args.config, *(["--resume"] if args.resume else []), *(["--check"] if args.check else [])]
    for item in args.set:
        argv += ["--set", item]
    return main(argv)


def cmd_sft(args: argparse.Namespace) -> int:
    from .sft import run_sft

    summary = run_sft(model=args.model, data=args.data, output_dir=args.out, dialect=args.dialect,
                      language=args.language, chat=args.chat, epochs=args.epochs, learning_rate=args.lr,
                      batch_size=args.batch_size, lora_r=args.lora_r, lora_alpha=args.lora_alpha, full=args.full,
                      merge=args.merge,
                      max_length=args.max_length, seed=args.seed)
    print(json.dumps(summary))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="GRPO training from an experiment YAML (one process; multi-GPU: "
                                     "script/training/train_zero2.sh)")
    p.add_argument("--config", required=True)
    p.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", help="supervised warm start on trajectories (environment tokens masked)")
    p.add_argument("--model", required=True, help="base model: a directory, a hub name, a .gguf file or a "
                                                     "packaged model (smollm2-135m-instruct)")
    p.add_argument("--data", required=True, help="JSONL trajectories (token level or question/completion text)")
    p.add_argument("--out", required=True, help="output directory (LoRA adapter, or full model with --full)")
    p.add_argument("--dialect", default="agentic", choices=["agentic", "search-r1", "r1-searcher"])
    p.add_argument("--language", default="en", choices=["en", "zh"])
    p.add_argument("--chat", default=None, type=lambda s: s.lower() in ("1", "true", "yes"),
                   help="use the chat template (default: when the tokenizer has one)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--full", action="store_true", help="fine-tune every weight instead of a LoRA adapter")
    p.add_argument("--merge", action="store_true", help="save the base model with the adapter merged in "
                                                         "(the warm start a GRPO run then adapts)")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--seed", type=int, default=42)
    p.set_defaults(func=cmd_sft)
