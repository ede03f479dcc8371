"""Subcommands for data: ``agentic-rag world`` (the embedded default task)."""

from __future__ import annotations

import argparse
import json

from ..argtypes import positive_int
from ..outputs import add_move_aside


def cmd_world(args: argparse.Namespace) -> int:
    from ..outputs import claim_dir
    from .world import write_world

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
