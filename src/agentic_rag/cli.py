"""``agentic-rag``: the command line. Each package registers its own subcommands (see COMMAND_MODULES).

Heavy imports (torch, the JVM) happen inside the command that needs them, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .logs import configure_logging

# Each module has ``register(subparsers)`` adding its subcommands, each with ``func(args) -> int``.
COMMAND_MODULES = [
    "agentic_rag.search.commands",
    "agentic_rag.evaluation.retrieval_commands",
    "agentic_rag.data.commands",
    "agentic_rag.training.memory_commands",
    "agentic_rag.training.commands",
    "agentic_rag.evaluation.commands",
]


class UserError(Exception):
    """An error caused by the user's input: printed as one clear message, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentic-rag", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default=os.environ.get("AGENTIC_RAG_LOG_LEVEL", "INFO"),
                        help="logging level (DEBUG, INFO, WARNING); env AGENTIC_RAG_LOG_LEVEL")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    from .search.corpus import CorpusFormatError
    from .search.types import SearchError

    try:
        return int(args.func(args) or 0)
    except (UserError, SearchError, CorpusFormatError, FileNotFoundError, ValueError) as exc:
        print(f"agentic-rag {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
