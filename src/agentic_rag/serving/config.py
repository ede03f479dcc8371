"""The chat server's settings: one dataclass, each field with its help text and the environment variable
that sets its default. The command line (``service/chat_server.py``) is generated from the same fields, so
a flag, its environment variable and its documentation never drift apart.

Precedence: command-line flag > environment variable (``script/run_server.sh`` loads ``.env``) > the settings the
adapter was trained with (``agentic_rag.json`` in ``--adapter``, or in a ``--model`` directory that has one:
dialect, language, system prompt, chat template, summary mode and rollout limits; see
:meth:`ServerConfig.with_trained_settings`) > default. :meth:`ServerConfig.problems` checks the whole config
before any model is loaded and reports every problem at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from ..models import DTYPES, model_problem
from ..rollout.protocol import get_dialect
from ..rollout.trained_settings import describe_taken, find_trained_settings
from ..search.index import RETRIEVERS, is_url

LOOPBACK_NAMES = ("localhost",)
CHAT_TEMPLATE = ("auto", "on", "off")
# TrainedSettings name -> ServerConfig field
TRAINED_FIELDS = {"dialect": "dialect", "language": "language", "system_prompt": "system_prompt",
                  "chat_template": "chat_template", "summary_mode": "summary_mode", "max_turns": "max_turns",
                  "max_searches": "max_searches", "max_tokens_per_turn": "max_tokens_per_turn",
                  "max_completion_tokens": "max_tokens", "passages_per_search": "passages_per_search",
                  "max_observation_tokens": "max_observation_tokens", "on_search_limit": "on_search_limit"}


def _opt(default: Any, env: str, help_text: str) -> Any:
    return field(default=default, metadata={"env": env, "help": help_text})


@dataclass
class ServerConfig:
    # ---- what is served
    model: str = _opt("", "AGENTIC_RAG_CHAT_MODEL", "base model: a local directory, a .gguf file, a packaged "
                                                    "model (smollm2-135m-instruct) or a hub name when online")
    adapter: str = _opt("", "AGENTIC_RAG_CHAT_ADAPTER", "LoRA adapter directory applied on the base model")
    model_name: str = _opt("", "AGENTIC_RAG_CHAT_MODEL_NAME",
                           "model id clients must send (default: the adapter's directory name, else the model's)")
    dtype: str = _opt("auto", "AGENTIC_RAG_CHAT_DTYPE", f"weights dtype: {', '.join(DTYPES)}")
    device: str = _opt("", "AGENTIC_RAG_CHAT_DEVICE", "torch device (default: cuda when available, else cpu)")
    # ---- search
    index: str = _opt("", "AGENTIC_RAG_CHAT_INDEX", "local index directory (agentic-rag index build)")
    search_url: str = _opt("", "AGENTIC_RAG_CHAT_SEARCH_URL",
                           "URL of a search server (agentic-rag serve-search) instead of --index")
    retriever: str = _opt("bm25", "AGENTIC_RAG_CHAT_RETRIEVER", f"retriever over --index: {', '.join(RETRIEVERS)}")
    dialect: str = _opt("agentic", "AGENTIC_RAG_CHAT_DIALECT", "tag dialect the model was trained with")
    language: str = _opt("en", "AGENTIC_RAG_CHAT_LANGUAGE", "language of the default system prompt: en or zh")
    system_prompt: str = _opt("", "AGENTIC_RAG_CHAT_SYSTEM_PROMPT",
                              "system prompt the agent is given (default: the dialect's, in --language; a client's "
                              "own system message replaces it)")
    chat_template: str = _opt("auto", "AGENTIC_RAG_CHAT_CHAT_TEMPLATE",
                              "prompt through the tokenizer's chat template: auto (when it has one), on or off")
    summary_mode: str = _opt("replace", "AGENTIC_RAG_CHAT_SUMMARY_MODE",
                             "replace: a summary restarts the context; keep: nothing is dropped")
    max_searches: int = _opt(4, "AGENTIC_RAG_CHAT_MAX_SEARCHES", "searches per reply")
    on_search_limit: str = _opt("observe", "AGENTIC_RAG_CHAT_ON_SEARCH_LIMIT",
                                "a search past --max-searches: observe (the agent is told none are left and may "
                                "still answer) or end (the reply ends there)")
    max_turns: int = _opt(8, "AGENTIC_RAG_CHAT_MAX_TURNS", "model turns per reply")
    max_tokens_per_turn: int = _opt(256, "AGENTIC_RAG_CHAT_MAX_TOKENS_PER_TURN", "new tokens in one model turn")
    passages_per_search: int = _opt(3, "AGENTIC_RAG_CHAT_PASSAGES", "passages shown per query")
    max_observation_tokens: int = _opt(384, "AGENTIC_RAG_CHAT_MAX_OBSERVATION_TOKENS",
                                       "tokens of one observation (the search results), tags included")
    # ---- scheduling
    max_batch: int = _opt(8, "AGENTIC_RAG_CHAT_MAX_BATCH", "requests decoded together in one engine run")
    queue_size: int = _opt(32, "AGENTIC_RAG_CHAT_QUEUE_SIZE",
                           "requests waiting for the engine; one more gets 429 with Retry-After")
    shutdown_grace_s: float = _opt(10.0, "AGENTIC_RAG_CHAT_SHUTDOWN_GRACE_S",
                                   "on SIGTERM or SIGINT: stop accepting connections and give the replies in flight "
                                   "this many seconds to finish; one still running then gets an error (503, or an "
                                   "error chunk and [DONE] in a stream), and a request arriving meanwhile gets 503")
    # ---- per-request limits and defaults
    max_tokens: int = _opt(1024, "AGENTIC_RAG_CHAT_MAX_TOKENS",
                           "default max_tokens of a request: the whole agent completion (model tokens and "
                           "inserted search results); cut to what the model's context leaves after the prompt")
    max_tokens_limit: int = _opt(4096, "AGENTIC_RAG_CHAT_MAX_TOKENS_LIMIT", "largest max_tokens a request may ask")
    max_prompt_tokens: int = _opt(8192, "AGENTIC_RAG_CHAT_MAX_PROMPT_TOKENS", "largest templated conversation")
    max_message_chars: int = _opt(32000, "AGENTIC_RAG_CHAT_MAX_MESSAGE_CHARS", "largest content of one message")
    max_messages: int = _opt(64, "AGENTIC_RAG_CHAT_MAX_MESSAGES", "most messages in one request")
    temperature: float = _opt(1.0, "AGENTIC_RAG_CHAT_TEMPERATURE",
                              "temperature of a request that sends none (0 = greedy)")
    # ---- network and auth
    host: str = _opt("127.0.0.1", "AGENTIC_RAG_CHAT_HOST", "interface to bind")
    port: int = _opt(8001, "AGENTIC_RAG_CHAT_PORT", "port to bind")
    api_token: str = _opt("", "AGENTIC_RAG_CHAT_API_TOKEN",
                          "require 'Authorization: Bearer <token>' on every /v1 request (prefer the environment "
                          "variable to the flag: flags show in the process list)")
    insecure_public: bool = _opt(False, "AGENTIC_RAG_CHAT_INSECURE_PUBLIC",
                                 "allow a non-loopback --host without an API token")

    @property
    def served_name(self) -> str:
        if self.model_name:
            return self.model_name
        source = self.adapter or self.model
        return os.path.basename(source.rstrip("/")) or "agentic-rag"

    @property
    def search_target(self) -> str:
        return self.search_url or self.index

    @property
    def chat(self) -> bool | None:
        """The chat template setting as prompt building takes it (None: when the tokenizer has one)."""
        return {"auto": None, "on": True, "off": False}.get(self.chat_template)

    def with_trained_settings(self, given: set[str]) -> tuple[ServerConfig, str | None]:
        """This config with every setting the adapter was trained with (``agentic_rag.json`` in ``adapter``, else
        in a ``model`` directory) that the user did not set (``given``: fields set by a flag or an environment
        variable), and the one line saying what came from where (None when there is no such file)."""
        found = find_trained_settings(self.adapter or None, self.model if os.path.isdir(self.model) else None)
        if found is None:
            return self, None
        settings, path = found
        taken: dict[str, Any] = {}
        kept: list[str] = []
        for name, value in settings.known().items():
            field_name = TRAINED_FIELDS[name]
            if field_name in given:
                kept.append(field_name)
            else:
                taken[field_name] = ("on" if value else "off") if name == "chat_template" else value
        if taken.get("max_tokens", 0) > self.max_tokens_limit and "max_tokens_limit" not in given:
            taken["max_tokens_limit"] = taken["max_tokens"]
        return dataclasses.replace(self, **taken), describe_taken(taken, path, kept)

    def problems(self) -> list[str]:
        """Every problem with the config, each naming the setting and the fix; empty when it is valid."""
        out: list[str] = []
        if not self.model:
            out.append("--model (AGENTIC_RAG_CHAT_MODEL) is required: a base model directory")
        elif problem := model_problem(self.model):
            out.append(f"--model: {problem}")
        if bool(self.index) == bool(self.search_url):
            out.append("give exactly one of --index (AGENTIC_RAG_CHAT_INDEX) and --search-url "
                       "(AGENTIC_RAG_CHAT_SEARCH_URL)")
        if self.search_url and not is_url(self.search_url):
            out.append(f"--search-url must start with http:// or https://, got {self.search_url!r}")
        if self.retriever not in RETRIEVERS:
            out.append(f"--retriever must be one of {', '.join(RETRIEVERS)}, got {self.retriever!r}")
        try:
            get_dialect(self.dialect)
        except ValueError as exc:
            out.append(f"--dialect: {exc}")
        if self.language not in ("en", "zh"):
            out.append(f"--language must be en or zh, got {self.language!r}")
        if self.chat_template not in CHAT_TEMPLATE:
            out.append(f"--chat-template must be one of {', '.join(CHAT_TEMPLATE)}, got {self.chat_template!r}")
        if self.summary_mode not in ("replace", "keep"):
            out.append(f"--summary-mode must be replace or keep, got {self.summary_mode!r}")
        if self.max_observation_tokens < 16:
            out.append(f"--max-observation-tokens must be >= 16 to hold the tags, got {self.max_observation_tokens}")
        if self.dtype not in DTYPES:
            out.append(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("max_batch", "queue_size", "max_tokens", "max_tokens_limit", "max_prompt_tokens",
                     "max_message_chars", "max_messages", "max_turns", "max_tokens_per_turn", "passages_per_search"):
            if getattr(self, name) < 1:
                out.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_searches < 0:
            out.append(f"--max-searches must be >= 0, got {self.max_searches}")
        if self.on_search_limit not in ("observe", "end"):
            out.append(f"--on-search-limit must be observe or end, got {self.on_search_limit!r}")
        if self.max_tokens > self.max_tokens_limit:
            out.append(f"--max-tokens ({self.max_tokens}) must not exceed --max-tokens-limit ({self.max_tokens_limit})")
        if not 0 <= self.shutdown_grace_s < float("inf"):
            out.append(f"--shutdown-grace-s must be a number of seconds >= 0, got {self.shutdown_grace_s}")
        if not 0 <= self.temperature <= 2:
            out.append(f"--temperature must be in [0, 2], got {self.temperature}")
        if not 0 < self.port < 65536:
            out.append(f"--port must be in 1..65535, got {self.port}")
        if not self.api_token and not self.insecure_public and not is_loopback(self.host):
            out.append(f"refusing to bind {self.host!r} without an API token: set AGENTIC_RAG_CHAT_API_TOKEN, "
                       "bind 127.0.0.1, or pass --insecure-public")
        return out

    # ------------------------------------------------------------------------------ env and argv

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> ServerConfig:
        """Defaults from the environment (unset or empty variables keep the built-in default)."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f.metadata["env"], "")
            if raw != "":
                values[f.name] = _parse(f, raw)
        values.update(overrides)
        return cls(**values)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, environ: dict[str, str] | None = None) -> None:
        """One flag per field; its default comes from the environment, so flags override ``.env``."""
        base = cls.from_env(environ)
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            env, default = f.metadata["env"], getattr(base, f.name)
            shown = "(set)" if f.name == "api_token" and default else default
            help_text = f"{f.metadata['help']}; env {env} (now: {shown!r})"
            if f.type in (bool, "bool"):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
            else:
                parser.add_argument(flag, type=_type_of(f), default=default, help=help_text)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def given(cls, argv: list[str], environ: dict[str, str] | None = None) -> set[str]:
        """The fields the user set: by a flag in ``argv`` or by a non-empty environment variable."""
        environ = os.environ if environ is None else environ
        parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            if f.type in (bool, "bool"):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction)
            else:
                parser.add_argument(flag)
        flags, _ = parser.parse_known_args(argv)
        return set(vars(flags)) | {f.name for f in dataclasses.fields(cls) if environ.get(f.metadata["env"], "")}

    def public_dict(self) -> dict[str, Any]:
        """The settings, with the token hidden (for /health and logs)."""
        out = dataclasses.asdict(self)
        out["api_token"] = bool(self.api_token)
        return out


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _type_of(f: dataclasses.Field) -> type:
    return {"int": int, "float": float, "str": str, "bool": bool}.get(f.type, f.type) if isinstance(f.type, str) \
        else f.type


def _parse(f: dataclasses.Field, raw: str) -> Any:
    kind = _type_of(f)
    if kind is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{f.metadata['env']} must be 1/0, true/false, yes/no or on/off, got {raw!r}")
    try:
        return kind(raw)
    except ValueError as exc:
        raise ValueError(f"{f.metadata['env']} must be {kind.__name__}, got {raw!r}") from exc


def env_names() -> list[str]:
    """Every environment variable the server config reads (tests check they are documented)."""
    return [f.metadata["env"] for f in dataclasses.fields(ServerConfig)]
