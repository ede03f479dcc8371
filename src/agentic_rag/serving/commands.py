"""The ``serve`` subcommand: the chat server (:mod:`.server`), whose flags are generated from its settings."""

from __future__ import annotations

import argparse


def cmd_serve(args: argparse.Namespace) -> int:
    """Reached only through ``agentic-rag --log-level X serve ...``: ``agentic-rag serve ...`` goes straight to
    :func:`.server.main` (see :func:`agentic_rag.cli.main`)."""
    from .server import main

    return main(list(args.rest))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", add_help=False, help="serve the agent over an OpenAI-compatible chat API (every "
                                                     "setting a flag; agentic-rag serve --help lists them)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_serve)
