"""Subcommands of training: ``agentic-rag train`` (one process; the scripts launch several) and ``sft``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ..argtypes import non_negative_int, positive_float, positive_int
from ..outputs import add_move_aside
from ..rollout.trained_settings import SavedSettings, beneath, find_settings_file, override_lines
from ..settings import add_flags, flag_overrides, load
from .machine import CPU_AUTOCAST

SFT_FLAGS: dict[str, str] = {}  # flag dest -> setting, filled when the parser is built


def cmd_train(args: argparse.Namespace) -> int:
    from .train import main

    argv = [*(["--config", args.config] if args.config else []), *(["--resume"] if args.resume else []),
            *(["--check"] if args.check else []), *(["--move-aside"] if args.move_aside else []),
            *(["--describe"] if args.describe else [])]
    for item in args.set:
        argv += ["--set", item]
    return main(argv)


def cmd_sft(args: argparse.Namespace) -> int:
    from ..errors import input_file
    from ..models import model_problem
    from ..outputs import check_apart, claim_dir, output_lock
    from .sft import run_sft

    # everything the user named is checked before the model loads: the settings first, then the paths. The
    # settings the trajectories were made with (`agentic-rag trajectories` writes DATA.settings.json) apply to
    # every setting no flag gives: the model is recorded with the very settings its data was played with.
    sidecar = Path(str(args.data) + ".settings.json")
    found = find_settings_file(sidecar) if sidecar.is_file() else None
    saved, loaded = load(SavedSettings, env={}, overrides=flag_overrides(args, SFT_FLAGS), source="sft",
                         beneath=beneath(found))
    for line in override_lines(found, saved, loaded.origins):
        logging.getLogger("agentic_rag.sft").info(line)
    input_file(args.data, "--data", what="JSONL trajectory file")
    if problem := model_problem(args.model):
        raise ValueError(f"--model: {problem}")
    check_apart(args.out, {"--model": args.model, "--data": args.data})
    with output_lock(args.out, "agentic-rag sft"):  # before --move-aside can rename anything
        claim_dir(args.out, "sft", move_aside=args.move_aside)
        summary = run_sft(model=args.model, data=args.data, output_dir=args.out, rollout=saved.rollout,
                          prompt=saved.prompt, epochs=args.epochs, learning_rate=args.lr,
                          batch_size=args.batch_size, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                          full=args.full,
                          merge=args.merge, max_length=args.max_length, seed=args.seed,
                          gradient_checkpointing=args.gradient_checkpointing,
                          group_by_length=args.group_by_length,
                          grad_accum=args.grad_accum, save_steps=args.save_steps, resume=args.resume,
                          cpu_autocast=args.cpu_autocast, move_aside=args.move_aside, tools=saved.tools)
    print(json.dumps(summary))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="GRPO training from an experiment YAML (one process; multi-GPU: "
                                     "script/training/train_zero2.sh)")
    p.add_argument("--config", default=None, help="experiment YAML (experiments/training/*.yaml)")
    p.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    p.add_argument("--check", action="store_true",
                   help="validate the config, read the training questions, open and probe the search target, check "
                        "the output directory, and exit (no model is loaded)")
    add_move_aside(p, "checkpoint.output_dir")
    p.add_argument("--describe", action="store_true",
                   help="print every setting (dotted name, value, help) as resolved from the defaults, the config "
                        "file, the environment and --set, and exit; without --config, the defaults")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("sft", help="supervised warm start on trajectories (environment tokens masked)")
    p.add_argument("--model", required=True, help="base model: a directory, a hub name, a .gguf file or a "
                                                     "packaged model (smollm2-135m-instruct)")
    p.add_argument("--data", required=True, help="JSONL trajectories (token level or question/completion text)")
    p.add_argument("--out", required=True, help="output directory (LoRA adapter, or full model with --full)")
    # the rollout and prompt settings the trajectories were made with: recorded with the model (agentic_rag.json)
    SFT_FLAGS.update(add_flags(p, SavedSettings))
    p.add_argument("--epochs", type=positive_float, default=1.0)
    p.add_argument("--lr", type=positive_float, default=2e-4)
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--lora-r", type=positive_int, default=16)
    p.add_argument("--lora-alpha", type=positive_int, default=32)
    p.add_argument("--full", action="store_true", help="fine-tune every weight instead of a LoRA adapter")
    p.add_argument("--merge", action="store_true", help="save the base model with the adapter merged in "
                                                         "(the warm start a GRPO run then adapts)")
    p.add_argument("--max-length", type=positive_int, default=2048)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--grad-accum", type=positive_int, default=1,
                   help="micro-batches of --batch-size per optimizer step (the same step in less memory)")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                   help="recompute activations in the backward pass: far less memory, about a third slower")
    p.add_argument("--cpu-autocast", choices=CPU_AUTOCAST, default="none",
                   help="on a CPU: none (default: fp32, the same numbers on every CPU), bf16 (torch.autocast; the "
                        "weights stay fp32), or auto (bf16 where the CPU computes it natively: AVX512-BF16 or AMX)")
    p.add_argument("--group-by-length", action="store_true",
                   help="batch trajectories of similar length (faster; long trajectories then weigh less)")
    p.add_argument("--save-steps", type=non_negative_int, default=50,
                   help="a checkpoint every N optimizer steps, in OUT.partial (0: none)")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in OUT.partial")
    add_move_aside(p)
    p.set_defaults(func=cmd_sft)
