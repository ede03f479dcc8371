"""Run the chat server: parse the command line, check the whole config, load, serve.

    agentic-rag serve --model DIR [--adapter DIR] --index DIR_OR_URL [...]
    python service/chat_server.py ...      # the same
    bash script/run_server.sh              # the same, with .env loaded first

Every setting has a flag and an ``AGENTIC_RAG_CHAT_*`` environment variable (``--help`` lists them; ``.env_format``
documents them); ``--describe`` prints every setting as resolved and exits. A setting set by neither comes from the
adapter's ``agentic_rag.json`` when it has one (the settings it was trained with; each one set otherwise is logged),
else from its default. The config is checked as a whole before anything is loaded, so a typo costs no model load.
One process, one worker: the model and the search index (its JVM) live in this process.

SIGTERM or SIGINT shuts it down gracefully (:mod:`agentic_rag.graceful`): new connections are refused, a request
that arrives on an open connection gets 503, the replies in flight get ``--shutdown-grace-s`` to finish, and one
still running then is answered with an OpenAI error (a stream: an error chunk, then ``data: [DONE]``); exit 0.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Mapping

from ..errors import guarded
from ..logs import configure_logging
from .config import build_parser, resolve

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None,
         prog: str = "agentic-rag serve") -> int:
    from ..malloc import release_freed_memory

    release_freed_memory()  # replies' activations go back to the system (see agentic_rag.malloc)
    parser, dests = build_parser(prog)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_level)
    return guarded(prog, lambda: serve(args, dests, environ))


def serve(args, dests, environ: Mapping[str, str] | None = None) -> int:
    from ..settings import describe

    config, loaded, trained = resolve(args, dests, environ, check_files=not args.describe)
    for line in trained:
        log.info(line)
    if args.describe:
        shown = dataclasses.replace(config, server=dataclasses.replace(
            config.server, api_token="(set)" if config.server.api_token else ""))  # never print a secret
        print("\n".join(describe(shown, loaded.origins)))
        return 0
    import uvicorn

    from ..graceful import run, uvicorn_options
    from .agent import ChatAgent
    from .app import create_app

    agent = ChatAgent.load(config)
    app = create_app(agent, config)
    srv = config.server
    auth = "bearer token required" if srv.api_token else "no auth (loopback only)" if not srv.insecure_public \
        else "NO AUTH, PUBLIC"
    log.info("serving %r on http://%s:%d (%s)", config.served_name, srv.host, srv.port, auth)
    run(uvicorn.Config(app, host=srv.host, port=srv.port, log_level=args.log_level.lower(), workers=1,
                       access_log=False, **uvicorn_options(srv.shutdown_grace_s)))
    return 0
