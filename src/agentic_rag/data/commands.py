"""Subcommands for data: ``agentic-rag world`` (the embedded default task) and ``agentic-rag trajectories`` (gold
trajectories for SFT, :mod:`.trajectories`)."""

from __future__ import annotations

import argparse
import json

from ..argtypes import positive_int
from ..outputs import add_move_aside
from ..rollout.trained_settings import SavedSettings
from ..settings import add_flags

TRAJECTORY_FLAGS: dict[str, str] = {}  # flag dest -> setting, filled when the parser is built


def cmd_trajectories(args: argparse.Namespace) -> int:
    from .trajectories import run_trajectories

    print(json.dumps(run_trajectories(args, TRAJECTORY_FLAGS)))
    return 0


def cmd_world(args: argparse.Namespace) -> int:
    from ..outputs import claim_dir, output_lock
    from .world import write_world

    with output_lock(args.out, "agentic-rag world"):
        claim_dir(args.out, "world", move_aside=args.move_aside)
        paths = write_world(args.out, seed=args.seed, n_people=args.people, n_guilds=args.guilds, n_towns=args.towns)
    print(json.dumps(paths))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("world", help="generate the embedded default task: a fictional world, its passages and "
                                     "one-/two-hop questions")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--people", type=positive_int, default=240)
    p.add_argument("--guilds", type=positive_int, default=24)
    p.add_argument("--towns", type=positive_int, default=30)
    add_move_aside(p)
    p.set_defaults(func=cmd_world)

    p = sub.add_parser("trajectories", help="gold trajectories for SFT: each question's scripted searches (one a hop) "
                                            "and gold answer, played through the real rollout engine and index")
    p.add_argument("--questions", required=True, help="question file (the 2Wiki split files carry hop_queries; other "
                                                      "2Wiki files get them from their evidence or gold titles)")
    p.add_argument("--index", required=True, help="index folder (or the URL of agentic-rag serve-search)")
    p.add_argument("--tokenizer", required=True, help="the model whose tokenizer and chat template the prompts use "
                                                      "(a directory, a hub name, a .gguf file, smollm2-135m-instruct)")
    p.add_argument("--out", required=True, help="output JSONL (token level, for agentic-rag sft --data); the settings "
                                                "used go to OUT.settings.json")
    p.add_argument("--limit", type=positive_int, default=None, help="the first N questions only")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a rollout or prompt setting (rollout.max_searches=4, prompt.system_prompt=...)")
    TRAJECTORY_FLAGS.update(add_flags(p, SavedSettings))
    p.set_defaults(func=cmd_trajectories)
