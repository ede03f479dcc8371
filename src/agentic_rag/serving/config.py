"""The chat server's settings (``agentic-rag serve``, ``service/chat_server.py``): sections of the one settings layer
(:mod:`agentic_rag.settings`), each field with its help, its flag and its environment variable.

``search``, ``rollout`` and ``prompt`` are the sections training and evaluation have, under the same names; the
server's own are ``model`` (what is served) and ``server`` (network, auth, scheduling, request limits). Every
setting has a flag named after it (``rollout.max_searches`` -> ``--max-searches``) and an environment variable
``AGENTIC_RAG_CHAT_<NAME>`` (``AGENTIC_RAG_CHAT_MAX_SEARCHES``; ``.env_format`` lists them); ``--config FILE``
reads a YAML file of the same sections and ``--set rollout.max_searches=2`` any setting.

Precedence: ``--set`` and flags > environment variable (``script/run_server.sh`` loads ``.env``) > the YAML file >
the settings the adapter was trained with (``agentic_rag.json`` in ``--adapter``, or in a ``--model`` directory
that has one: every ``rollout`` and ``prompt`` setting; each one set otherwise is logged) > default. The whole
config is checked before any model loads and every problem is reported at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import ipaddress
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..http_guard import DEFAULT_CLIENT_TIMEOUT_S
from ..models import DTYPES, model_problem
from ..rollout.settings import PromptSettings, RolloutSettings
from ..rollout.trained_settings import beneath, find_settings, override_lines
from ..search.settings import SearchSettings, is_url
from ..settings import (
    Loaded,
    SettingsError,
    add_flags,
    env_var,
    flag_overrides,
    gather,
    known_names,
    load,
    section,
    setting,
)
from ..tools.settings import tools_setting

log = logging.getLogger(__name__)

ENV_PREFIX = "AGENTIC_RAG_CHAT_"
LOOPBACK_NAMES = ("localhost",)
CLIENT_ENV = ("AGENTIC_RAG_CHAT_URL",)  # read by the terminal client, not the server
# environment variables of earlier versions: refused with the new name, never silently ignored
RENAMED_ENV = {"AGENTIC_RAG_CHAT_PASSAGES": "AGENTIC_RAG_CHAT_PASSAGES_PER_SEARCH",
               "AGENTIC_RAG_CHAT_MAX_TOKENS": "AGENTIC_RAG_CHAT_MAX_COMPLETION_TOKENS",
               "AGENTIC_RAG_CHAT_SEARCH_URL": "AGENTIC_RAG_CHAT_INDEX (an index directory or a search server URL)"}


@dataclass
class ModelSection:
    model: str = setting("", "base model: a local directory, a .gguf file, a packaged model (smollm2-135m-instruct) "
                             "or a hub name when online")
    adapter: str = setting("", "LoRA adapter directory applied on the base model (its agentic_rag.json settings "
                               "apply)")
    model_name: str = setting("", "model id clients must send (default: the adapter's directory name, else the "
                                  "model's)")
    dtype: str = setting("auto", f"weights dtype: {', '.join(DTYPES)}", choices=DTYPES)
    device: str = setting("", "torch device (default: cuda when available, else cpu)")


def _positive_seconds(value: float) -> str | None:
    return None if math.isfinite(value) and value > 0 else "must be a finite number > 0"


@dataclass
class ServerSection:
    host: str = setting("127.0.0.1", "interface to bind")
    port: int = setting(8001, "port to bind", min=1, max=65535)
    api_token: str = setting("", "require 'Authorization: Bearer <token>' on every /v1 request (prefer the "
                                 "environment variable to the flag: flags show in the process list)")
    insecure_public: bool = setting(False, "allow a non-loopback host without an API token")
    max_batch: int = setting(8, "requests decoded together in one engine run", min=1)
    queue_size: int = setting(32, "requests waiting for the engine; one more gets 429 with Retry-After", min=1)
    shutdown_grace_s: float = setting(10.0, "on SIGTERM or SIGINT: stop accepting connections and give the replies "
                                            "in flight this many seconds to finish; one still running then gets an "
                                            "error (503, or an error chunk and [DONE] in a stream), and a request "
                                            "arriving meanwhile gets 503", min=0)
    client_timeout_s: float = setting(DEFAULT_CLIENT_TIMEOUT_S, "a request's head (request line and headers), and "
                                      "then its body, must each arrive within this many seconds; a slow client is "
                                      "dropped (a head: the connection is closed) or answered 408 (a body)",
                                      check=_positive_seconds)
    max_tokens_limit: int = setting(4096, "largest max_tokens a request may ask (the whole agent completion: model "
                                          "tokens and inserted search results)", min=1)
    max_prompt_tokens: int = setting(8192, "largest templated conversation", min=1)
    max_message_chars: int = setting(32000, "largest content of one message", min=1)
    max_messages: int = setting(64, "most messages in one request", min=1)
    temperature: float = setting(1.0, "temperature of a request that sends none (0 = greedy)", min=0, max=2)

    def problems(self, at: Callable[[str], str]) -> list[str]:
        if not self.api_token and not self.insecure_public and not is_loopback(self.host):
            return [f"refusing to bind {self.host!r} without an API token: set {ENV_PREFIX}API_TOKEN, bind "
                    f"127.0.0.1, or pass --insecure-public"]
        return []


@dataclass
class ServeConfig:
    model: ModelSection = section(ModelSection)
    search: SearchSettings = section(SearchSettings)
    tools: list[str | dict] = tools_setting()
    rollout: RolloutSettings = section(RolloutSettings)
    prompt: PromptSettings = section(PromptSettings)
    server: ServerSection = section(ServerSection)

    @property
    def served_name(self) -> str:
        if self.model.model_name:
            return self.model.model_name
        source = self.model.adapter or self.model.model
        return os.path.basename(source.rstrip("/")) or "agentic-rag"

    def problems(self, at: Callable[[str], str]) -> list[str]:
        if self.rollout.max_completion_tokens > self.server.max_tokens_limit:
            return [f"rollout.max_completion_tokens ({self.rollout.max_completion_tokens}), the max_tokens of a "
                    f"request that sends none, exceeds server.max_tokens_limit ({self.server.max_tokens_limit})"]
        return []

    def public_dict(self) -> dict[str, Any]:
        """The settings, with the token hidden (for /health and logs)."""
        out = dataclasses.asdict(self)
        out["server"]["api_token"] = bool(self.server.api_token)
        return out


def file_problems(cfg: ServeConfig) -> list[str]:
    p: list[str] = []
    if not cfg.model.model:
        p.append(f"--model ({ENV_PREFIX}MODEL) is required: the base model")
    elif problem := model_problem(cfg.model.model):
        p.append(f"--model: {problem}")
    index = cfg.search.index
    if not index:
        p.append(f"--index ({ENV_PREFIX}INDEX) is required: an index directory (agentic-rag index build) or a search "
                 f"server URL (agentic-rag serve-search)")
    elif not is_url(index) and not os.path.isfile(os.path.join(index, "manifest.json")):
        p.append(f"--index: no index at {index} (build one: agentic-rag index build --corpus CORPUS --out NEW_DIR), "
                 f"and not an http(s):// search server URL")
    return p


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def env_vars() -> dict[str, str]:
    """Every environment variable the server reads -> the setting it sets (tests check they are documented)."""
    return {env_var(ENV_PREFIX, dotted): dotted for dotted in known_names(ServeConfig)}


def env_names() -> list[str]:
    return list(env_vars())


def env_problems(environ: Mapping[str, str]) -> list[str]:
    """``AGENTIC_RAG_CHAT_*`` variables the server does not read: a renamed one, or a typo (with the closest)."""
    known = env_vars()
    p = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known or name in CLIENT_ENV or name.endswith("_API_TOKEN"):
            continue
        if name in RENAMED_ENV and environ[name]:  # set but empty sets nothing, as for every variable
            p.append(f"{name} is no longer read: use {RENAMED_ENV[name]}")
        elif environ[name] and name not in RENAMED_ENV:
            close = difflib.get_close_matches(name, list(known), n=1)
            p.append(f"{name} is not a setting of the chat server" + (f"; did you mean {close[0]}?" if close else ""))
    return p


def build_parser(prog: str = "agentic-rag serve") -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """The command line: one flag per setting (its help is the field's), ``--config``, ``--set``, ``--describe``."""
    from ..argtypes import Parser

    parser = Parser(prog=prog, description="OpenAI-compatible chat server for the search agent.",
                    epilog=f"Every flag has an environment variable {ENV_PREFIX}<NAME> (see .env_format); flags win "
                           f"over it, it wins over --config, which wins over the settings saved with the adapter "
                           f"(agentic_rag.json), which win over the defaults.")
    parser.add_argument("--config", default=None, help="YAML file of serve settings (sections model, search, "
                                                       "rollout, prompt, server)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a setting by its dotted name, e.g. --set rollout.max_searches=2")
    parser.add_argument("--describe", action="store_true", help="print every setting (dotted name, value, help) as "
                                                                "resolved, and exit; no model is loaded")
    parser.add_argument("--log-level", default=os.environ.get("AGENTIC_RAG_LOG_LEVEL") or "INFO",
                        help="logging level; env AGENTIC_RAG_LOG_LEVEL")
    dests = add_flags(parser, ServeConfig, env_prefix=ENV_PREFIX)
    return parser, dests


def resolve(args: argparse.Namespace, dests: Mapping[str, str], environ: Mapping[str, str] | None = None, *,
            check_files: bool = True) -> tuple[ServeConfig, Loaded, list[str]]:
    """The config from the parsed command line, the environment, ``--config`` and the adapter's trained settings;
    where each value came from; and the lines about the trained settings (taken, overridden). Raises
    :class:`SettingsError` with every problem."""
    environ = os.environ if environ is None else environ
    from ..settings import read_yaml

    data = read_yaml(args.config) if args.config else {}
    return _resolve(data, environ, [*flag_overrides(args, dests), *args.set], check_files=check_files)


def _resolve(data: Mapping[str, Any], environ: Mapping[str, str], overrides: Sequence[str], *,
             check_files: bool) -> tuple[ServeConfig, Loaded, list[str]]:
    problems = env_problems(environ)
    given = gather(ServeConfig, data=data, env=environ, env_vars=env_vars(), overrides=overrides, problems=[])
    model = given.tree.get("model") if isinstance(given.tree.get("model"), dict) else {}
    adapter, base = str(model.get("adapter") or ""), str(model.get("model") or "")
    try:
        found = find_settings(adapter or None, base if base and os.path.isdir(base) else None)
    except SettingsError as exc:
        raise SettingsError([f"--adapter: {exc.source}: {p}" for p in exc.problems], "chat server") from None
    try:
        cfg, loaded = load(ServeConfig, data=data, env=environ, env_vars=env_vars(), overrides=overrides,
                           beneath=beneath(found), source="chat server",
                           extra_problems=file_problems if check_files else None)
    except SettingsError as exc:
        raise SettingsError(problems + exc.problems, "chat server") from None
    if problems:
        raise SettingsError(problems, "chat server")
    return cfg, loaded, override_lines(found, cfg, loaded.origins)


def config_for(overrides: Sequence[str] = (), **sections: Any) -> ServeConfig:
    """A config for code and tests: ``config_for(["model.model=DIR", "search.index=IDX"])``, checked (files
    included) and resolved like the command line's (the adapter's trained settings beneath, each one overridden
    logged), without the environment."""
    cfg, _, lines = _resolve(sections, {}, list(overrides), check_files=True)
    for line in lines:
        log.info(line)
    return cfg
