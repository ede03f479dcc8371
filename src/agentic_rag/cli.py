"""``agentic-rag``: the command line. Each package registers its own subcommands (see COMMAND_MODULES).

Heavy imports (torch, the JVM) happen inside the command that needs them, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .argtypes import Parser
from .errors import UserError, guarded  # noqa: F401  (UserError: re-exported)
from .logs import configure_logging

# Each module has ``register(subparsers)`` adding its subcommands, each with ``func(args) -> int``.
COMMAND_MODULES = [
    "agentic_rag.search.commands",
    "agentic_rag.evaluation.retrieval_commands",
    "agentic_rag.data.commands",
    "agentic_rag.training.memory_commands",
    "agentic_rag.training.commands",
    "agentic_rag.evaluation.commands",
    "agentic_rag.serving.commands",
    "agentic_rag.demo.results",
    "agentic_rag.export",
    "agentic_rag.tools.commands",
]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="agentic-rag", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default=os.environ.get("AGENTIC_RAG_LOG_LEVEL") or "INFO",
                        help="logging level (DEBUG, INFO, WARNING); env AGENTIC_RAG_LOG_LEVEL")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .malloc import release_freed_memory

    release_freed_memory()  # freed activations go back to the system (see agentic_rag.malloc)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # its flags are generated from its settings: its own parser reads them all
        from .serving.server import main as serve

        return serve(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    words = [args.command] + [getattr(args, f"{args.command}_command", None) or ""]
    return guarded(" ".join(["agentic-rag", *filter(None, words)]), lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
