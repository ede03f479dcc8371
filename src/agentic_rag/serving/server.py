"""Run the chat server: parse flags (defaults from the environment), check the whole config, load, serve.

    python service/chat_server.py --model DIR [--adapter DIR] (--index DIR | --search-url URL) [...]
    bash script/run_server.sh            # the same, with .env loaded first

Every flag has an ``AGENTIC_RAG_CHAT_*`` environment variable (``--help`` lists them; ``.env_format``
documents them). A setting set by neither comes from the adapter's ``agentic_rag.json`` when it has one (the
settings it was trained with; one log line lists them), else from its default. The config is checked as a
whole before anything is loaded, so a typo costs no model load. One process, one worker: the model and the
search index (its JVM) live in this process.

SIGTERM or SIGINT shuts it down gracefully (:mod:`agentic_rag.graceful`): new connections are refused, a request
that arrives on an open connection gets 503, the replies in flight get ``--shutdown-grace-s`` to finish, and one
still running then is answered with an OpenAI error (a stream: an error chunk, then ``data: [DONE]``); exit 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..logs import configure_logging
from .config import ServerConfig


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chat_server", description="OpenAI-compatible chat server for the search agent.",
        epilog="Flags default to their AGENTIC_RAG_CHAT_* environment variables (see .env_format), then to the "
               "settings saved with the adapter (agentic_rag.json), then to the defaults shown.")
    ServerConfig.add_arguments(parser, environ)
    parser.add_argument("--log-level", default=os.environ.get("AGENTIC_RAG_LOG_LEVEL", "INFO"),
                        help="logging level; env AGENTIC_RAG_LOG_LEVEL")
    return parser


def resolve_config(argv: list[str] | None = None,
                   environ: dict[str, str] | None = None) -> tuple[ServerConfig, argparse.Namespace, str | None]:
    """The config from flags, the environment and the adapter's trained settings, the parsed arguments, and the
    line saying which settings came from the adapter (None without a settings file)."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(environ).parse_args(argv)
    config, line = ServerConfig.from_args(args).with_trained_settings(ServerConfig.given(argv, environ))
    return config, args, line


def main(argv: list[str] | None = None) -> int:
    try:
        config, args, trained = resolve_config(argv)
    except ValueError as exc:  # a malformed environment variable or settings file
        print(f"chat_server: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    if trained:
        logging.getLogger(__name__).info(trained)
    problems = config.problems()
    if problems:
        print("chat_server: invalid configuration:\n  - " + "\n  - ".join(problems), file=sys.stderr)
        return 2
    import uvicorn

    from ..graceful import run, uvicorn_options
    from ..search.types import SearchError
    from .agent import ChatAgent
    from .app import create_app

    try:
        agent = ChatAgent.load(config)
    except (FileNotFoundError, SearchError, ValueError) as exc:
        print(f"chat_server: error: {exc}", file=sys.stderr)
        return 2
    app = create_app(agent, config)
    auth = "bearer token required" if config.api_token else "no auth (loopback only)" if not config.insecure_public \
        else "NO AUTH, PUBLIC"
    logging.getLogger(__name__).info("serving %r on http://%s:%d (%s)", config.served_name, config.host,
                                     config.port, auth)
    run(uvicorn.Config(app, host=config.host, port=config.port, log_level=args.log_level.lower(), workers=1,
                       access_log=False, **uvicorn_options(config.shutdown_grace_s)))
    return 0
