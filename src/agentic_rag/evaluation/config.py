"""The evaluation config: one YAML file, dataclasses with help text, validated as a whole before any model loads.

.. code-block:: yaml

    name: hotpotqa-bm25-base
    dataset: {path: ../shared/data/hipporag/hotpotqa_train.json, format: auto, limit: 100}
    policy: {type: local, model: ${EVAL_MODEL_PATH}, adapter: "", temperature: 0.0}
    search: {index: outputs/indexes/hotpotqa, retriever: bm25, k: 3}
    rollout: {dialect: agentic, language: en, max_turns: 8, max_searches: 4}
    metrics: [em, f1, cover_em, format]
    output_dir: runs/eval/hotpotqa-bm25-base

String values may use ``${VAR}`` or ``${VAR:-default}``: the variable comes from the environment (the
scripts load ``.env``). :func:`load_eval_config` collects every problem - unknown keys (with the closest
known one), wrong types, values out of range, missing files, rules that involve several fields - and
raises one :class:`EvalConfigError` listing them all, each with the field's dotted path and the fix.
Relative paths are relative to the working directory (the scripts run from the project root).

A trained adapter is evaluated as it was trained: when ``policy.adapter`` (or a ``policy.model`` directory) holds
``agentic_rag.json`` (written by the trainer), every rollout setting it records - dialect, language, system
prompt, chat template, summary mode, the limits, and the passages per search (``search.k``) - that neither the
file nor ``--set`` gives is taken from it, and one log line says which.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..data.questions import FORMATS
from ..models import model_problem
from ..rollout.trained_settings import describe_taken, find_trained_settings

log = logging.getLogger(__name__)

METRICS = ("em", "f1", "cover_em", "judge", "choice", "format")
DEFAULT_METRICS = ("em", "f1", "cover_em", "format")
POLICY_TYPES = ("local", "endpoint")
DIALECTS = ("agentic", "search-r1", "r1-searcher")
# TrainedSettings name -> the setting it fills here
TRAINED_FIELDS = {"dialect": "rollout.dialect", "language": "rollout.language",
                  "system_prompt": "rollout.system_prompt", "chat_template": "rollout.chat_template",
                  "summary_mode": "rollout.summary_mode", "max_turns": "rollout.max_turns",
                  "max_searches": "rollout.max_searches", "max_tokens_per_turn": "rollout.max_tokens_per_turn",
                  "max_completion_tokens": "rollout.max_completion_tokens",
                  "max_observation_tokens": "rollout.max_observation_tokens", "passages_per_search": "search.k",
                  "on_search_limit": "rollout.on_search_limit"}


class EvalConfigError(ValueError):
    """Every problem of an evaluation config, one per line."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


def _f(default: Any, help: str) -> Any:  # noqa: A002 - the field's help text
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class DatasetSection:
    path: str = _f("", "question file: JSONL, JSON list or CSV, in any format agentic-rag reads")
    format: str = _f("auto", "auto (recognised from the first record), generic, or one of: " + ", ".join(FORMATS))
    limit: int | None = _f(None, "evaluate only the first N questions (raise it later to extend a run)")
    question_field: str = _f("", "read the question from this field instead (generic rules)")
    answer_field: str = _f("", "read the gold answer(s) from this field instead (generic rules)")


@dataclass
class PolicySection:
    type: str = _f("local", "local (a model directory + optional LoRA adapter) or endpoint (any OpenAI-compatible "
                            "/v1/completions server: vLLM, SGLang)")
    model: str = _f("", "local: model directory or hub name; endpoint: the served model's name")
    adapter: str = _f("", "local: LoRA adapter directory (peft save_pretrained output); empty = the base model")
    merge_adapter: bool = _f(False, "local: merge the adapter into the weights before decoding (faster)")
    tokenizer: str = _f("", "tokenizer directory (default: the model's); endpoints need the served model's")
    dtype: str = _f("auto", "local: auto, float32, bfloat16 or float16")
    device: str = _f("", "local: cpu, cuda, cuda:1 (default: cuda when available)")
    base_url: str = _f("", "endpoint: OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = _f("EVAL_API_KEY", "endpoint: environment variable holding its API key (unset: no key)")
    temperature: float = _f(0.0, "sampling temperature; 0 = greedy")
    top_p: float = _f(1.0, "nucleus sampling")
    top_k: int = _f(0, "top-k sampling (0 = off)")
    repetition_penalty: float = _f(1.0, "repetition penalty (1 = off)")
    max_batch_size: int | None = _f(None, "local: sequences decoded together (default: rollout.batch_size)")
    concurrency: int = _f(8, "endpoint: requests in flight")
    timeout_s: float = _f(300.0, "endpoint: seconds per request")
    retries: int = _f(2, "endpoint: retries of a failed request (connection errors, 429, 5xx)")
    extra_body: dict[str, Any] = _f({}, "endpoint: extra request fields, e.g. {skip_special_tokens: false} for vLLM")


@dataclass
class SearchSection:
    index: str = _f("", "index directory (agentic-rag index build), search server URL http://..., or none "
                        "(closed book: search actions get an error observation)")
    retriever: str = _f("bm25", "bm25, dense or hybrid")
    k: int = _f(3, "passages shown per query")
    cache_size: int = _f(10000, "LRU cache entries in front of the searcher")
    timeout_s: float = _f(30.0, "seconds before a search counts as failed (an error observation)")
    max_failure_rate: float = _f(0.05, "share of searches that may fail (errors, timeouts) before the run counts as "
                                       "failed: its summary says so and the command exits non-zero")


@dataclass
class RolloutSection:
    dialect: str = _f("agentic", "tag protocol: agentic, search-r1 or r1-searcher (as the model was trained)")
    language: str = _f("en", "system prompt language: en or zh")
    chat_template: bool | None = _f(None, "use the tokenizer's chat template (default: when it has one)")
    system_prompt: str = _f("", "replace the dialect's system prompt")
    summary_mode: str = _f("replace", "replace: a summary restarts the context; keep: nothing is dropped")
    max_turns: int = _f(8, "model turns per question")
    max_searches: int = _f(4, "search actions per question")
    on_search_limit: str = _f("observe", "a search past max_searches: observe = refused with a notice, the model "
                                         "may still answer; end = the question ends unanswered (max_searches)")
    max_tokens_per_turn: int = _f(512, "new model tokens per turn")
    max_completion_tokens: int = _f(2048, "all tokens after the prompt, observations included")
    max_observation_tokens: int = _f(512, "tokens per observation (truncated cleanly)")
    batch_size: int = _f(16, "questions rolled out together; finished ones are saved after each batch")


@dataclass
class JudgeSection:
    base_url: str = _f("", "OpenAI-compatible base URL of the LLM judge (metric judge)")
    model: str = _f("", "the judge model's name on that endpoint")
    api_key_env: str = _f("JUDGE_API_KEY", "environment variable holding the judge's API key (unset: no key)")
    timeout_s: float = _f(30.0, "seconds per judge call")
    max_concurrency: int = _f(8, "judge calls in flight")
    retries: int = _f(2, "retries of a failed call (connection errors, timeouts, 429, 5xx)")
    max_tokens: int | None = _f(16, "max_tokens of a judge reply (null: not sent)")


@dataclass
class EvalConfig:
    name: str = _f("", "run name (default: the config file's name)")
    dataset: DatasetSection = field(default_factory=DatasetSection)
    policy: PolicySection = field(default_factory=PolicySection)
    search: SearchSection = field(default_factory=SearchSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    metrics: list[str] | None = _f(None, "metrics: em, f1, cover_em, judge (LLM judge), choice (multiple choice), "
                                         "format (default: em, f1, cover_em, format, + choice for MedQA)")
    judge: JudgeSection = field(default_factory=JudgeSection)
    output_dir: str = _f("", "where predictions.jsonl and summary.json go (default: runs/eval/NAME)")
    seed: int = _f(0, "random seed (sampling)")

    # ------------------------------------------------------------------------------------------ rules

    def validate(self) -> list[str]:
        p: list[str] = []
        d, pol, s, r = self.dataset, self.policy, self.search, self.rollout
        if not d.path:
            p.append("dataset.path is empty: point it at a question file")
        elif not Path(d.path).is_file():
            p.append(f"dataset.path: no such file {d.path}")
        _choice(p, "dataset.format", d.format, ("auto", "generic", *FORMATS))
        if d.limit is not None and d.limit < 1:
            p.append(f"dataset.limit must be >= 1 or null, got {d.limit}")
        _choice(p, "policy.type", pol.type, POLICY_TYPES)
        if not pol.model:
            p.append("policy.model is empty: a model directory (local) or the served model's name (endpoint)")
        if pol.type == "local":
            if pol.model and (problem := model_problem(pol.model)):
                p.append(f"policy.model: {problem}")
            elif pol.model and _looks_like_path(pol.model) and not _is_model_path(pol.model):
                p.append(f"policy.model: no such directory {pol.model}")
            if pol.adapter and not (Path(pol.adapter) / "adapter_config.json").is_file():
                p.append(f"policy.adapter: no LoRA adapter at {pol.adapter} (adapter_config.json missing); use the "
                         f"directory the trainer saved, or leave it empty for the base model")
            _choice(p, "policy.dtype", pol.dtype, ("auto", "float32", "bfloat16", "float16"))
            if pol.base_url:
                p.append("policy.base_url is set but policy.type is local: set type: endpoint, or remove base_url")
        if pol.type == "endpoint":
            if not pol.base_url.startswith(("http://", "https://")):
                p.append(f"policy.base_url must be the endpoint's http(s) URL (e.g. http://127.0.0.1:8000/v1), "
                         f"got {pol.base_url!r}")
            if not pol.tokenizer and not (pol.model and Path(pol.model).is_dir()):
                p.append("policy.tokenizer is empty: an endpoint policy needs the served model's tokenizer "
                         "(a local directory) to build prompts")
            if pol.adapter:
                p.append("policy.adapter is only for local models: serve the adapter with the endpoint instead "
                         "(e.g. vLLM --lora-modules) and name it in policy.model")
            if pol.concurrency < 1:
                p.append(f"policy.concurrency must be >= 1, got {pol.concurrency}")
        if pol.tokenizer and (problem := model_problem(pol.tokenizer, kind="tokenizer")):
            p.append(f"policy.tokenizer: {problem}")
        elif pol.tokenizer and _looks_like_path(pol.tokenizer) and not _is_model_path(pol.tokenizer):
            p.append(f"policy.tokenizer: no such directory {pol.tokenizer}")
        if pol.temperature < 0:
            p.append(f"policy.temperature must be >= 0 (0 = greedy), got {pol.temperature}")
        if not 0 < pol.top_p <= 1:
            p.append(f"policy.top_p must be in (0, 1], got {pol.top_p}")
        if pol.top_k < 0:
            p.append(f"policy.top_k must be >= 0, got {pol.top_k}")
        if pol.max_batch_size is not None and pol.max_batch_size < 1:
            p.append(f"policy.max_batch_size must be >= 1 or null, got {pol.max_batch_size}")
        if not s.index:
            p.append("search.index is empty: an index directory, a search server URL, or none (closed book)")
        elif s.index != "none" and not s.index.startswith(("http://", "https://")) and \
                not (Path(s.index) / "manifest.json").is_file():
            p.append(f"search.index: no index at {s.index} (build one: agentic-rag index build --corpus CORPUS "
                     f"--out {s.index})")
        _choice(p, "search.retriever", s.retriever, ("bm25", "dense", "hybrid"))
        _positive(p, "search.k", s.k)
        if not 0.0 <= s.max_failure_rate <= 1.0:
            p.append(f"search.max_failure_rate must be between 0 and 1, got {s.max_failure_rate}")
        if s.timeout_s <= 0:
            p.append(f"search.timeout_s must be > 0, got {s.timeout_s}")
        if s.cache_size < 0:
            p.append(f"search.cache_size must be >= 0 (0 = no cache), got {s.cache_size}")
        _choice(p, "rollout.dialect", r.dialect, DIALECTS)
        _choice(p, "rollout.language", r.language, ("en", "zh"))
        _choice(p, "rollout.summary_mode", r.summary_mode, ("replace", "keep"))
        _choice(p, "rollout.on_search_limit", r.on_search_limit, ("observe", "end"))
        for name in ("max_turns", "max_tokens_per_turn", "max_completion_tokens", "batch_size"):
            _positive(p, f"rollout.{name}", getattr(r, name))
        if r.max_searches < 0:
            p.append(f"rollout.max_searches must be >= 0, got {r.max_searches}")
        if r.max_observation_tokens < 16:
            p.append(f"rollout.max_observation_tokens must be >= 16, got {r.max_observation_tokens}")
        if r.max_tokens_per_turn > r.max_completion_tokens:
            p.append(f"rollout.max_tokens_per_turn ({r.max_tokens_per_turn}) exceeds rollout.max_completion_tokens "
                     f"({r.max_completion_tokens}): lower it or raise the total")
        for i, m in enumerate(self.metrics or []):
            _choice(p, f"metrics[{i}]", m, METRICS)
        if "judge" in (self.metrics or []):
            from ..rewards.judge import JudgeSettings

            p.extend(JudgeSettings.from_any(self.judge).problems("judge"))
        return p

    def resolved_metrics(self, dataset_format: str) -> list[str]:
        if self.metrics:
            return list(dict.fromkeys(self.metrics))
        return list(DEFAULT_METRICS) + (["choice"] if dataset_format == "medqa" else [])


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or Path(value).exists()


def _is_model_path(value: str) -> bool:
    """A model directory, or a GGUF file (agentic_rag.models.resolve_model)."""
    path = Path(value).expanduser()
    return path.is_dir() or (path.is_file() and value.lower().endswith(".gguf"))


def _choice(problems: list[str], name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{name} must be one of {', '.join(allowed)}; got {value!r}{hint}")


def _positive(problems: list[str], name: str, value: Any) -> None:
    if not isinstance(value, int) or value < 1:
        problems.append(f"{name} must be a positive integer, got {value!r}")


# ------------------------------------------------------------------------------------------------ building

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: Any, where: str, problems: list[str], env: dict[str, str]) -> Any:
    """``${VAR}`` / ``${VAR:-default}`` in every string of a YAML tree."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else str(k), problems, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", problems, env) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if env.get(name):
            return env[name]
        if default is not None:
            return default
        problems.append(f"{where}: environment variable {name} is not set (set it in .env or the environment)")
        return ""

    return _VAR.sub(sub, value)


def _type_ok(value: Any, tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, v = _type_ok(value, arg)
            if ok:
                return True, v
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is Any:
        return True, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is str:
        ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        return ok, str(value) if ok else value
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            return False, value
        out = []
        for x in value:
            ok, v = _type_ok(x, item)
            if not ok:
                return False, value
            out.append(v)
        return True, out
    if origin is dict:
        return isinstance(value, dict), value
    return True, value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _build(cls: type, data: Any, path: str, problems: list[str]) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        problems.append(f"{path or 'the config'} must be a mapping, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(names)}"
            problems.append(f"{where} is not a setting{hint}")
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, where, problems)
            continue
        ok, coerced = _type_ok(value, tp)
        if ok:
            kwargs[key] = coerced
        else:
            problems.append(f"{where} must be {_type_name(tp)}, got {value!r}")
    return cls(**kwargs)


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for name in parents:
        if not isinstance(node.get(name), dict):
            node[name] = {}
        node = node[name]
    node[leaf] = value


def config_from_dict(data: dict[str, Any] | None, *, source: str = "config", overrides: list[str] | None = None,
                     env: dict[str, str] | None = None, default_name: str = "eval") -> EvalConfig:
    """Build and validate a config from a YAML tree; ``overrides`` are ``dotted.key=value`` (YAML values).
    An empty ``name`` becomes ``default_name``, an empty ``output_dir`` ``runs/eval/NAME``."""
    problems: list[str] = []
    data = dict(data or {})
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"--set {item!r}: expected KEY=VALUE, e.g. policy.adapter=outputs/run/adapter")
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(data, key.strip(), value)
    data = _expand(data, "", problems, dict(os.environ) if env is None else env)
    cfg = _build(EvalConfig, data, "", problems)
    try:
        trained = apply_trained_settings(cfg, data)
    except ValueError as exc:  # a malformed settings file
        problems.append(f"policy.adapter: {exc}")
        trained = None
    # the value rules run too (every problem at once), except on fields whose value was already rejected
    rejected = [p.split(" ", 1)[0].rstrip(":") for p in problems]
    problems += [p for p in cfg.validate() if not any(p.startswith(r) for r in rejected)]
    if problems:
        raise EvalConfigError(problems, source)
    cfg.name = cfg.name or default_name
    cfg.output_dir = cfg.output_dir or str(Path("runs") / "eval" / cfg.name)
    if trained:
        log.info(trained)
    return cfg


def apply_trained_settings(cfg: EvalConfig, data: dict[str, Any]) -> str | None:
    """Fill ``cfg`` with the settings saved with its adapter (or model directory) that ``data`` (the YAML tree,
    overrides applied) does not set; returns the line saying which (None without a settings file)."""
    pol = cfg.policy
    model_dir = pol.model if pol.model and Path(pol.model).is_dir() else None
    found = find_trained_settings(pol.adapter or None, model_dir)
    if found is None:
        return None
    settings, path = found
    taken: dict[str, Any] = {}
    kept: list[str] = []
    for name, value in settings.known().items():
        dotted = TRAINED_FIELDS[name]
        section, key = dotted.split(".")
        if isinstance(data.get(section), dict) and key in data[section]:
            kept.append(dotted)
        else:
            setattr(getattr(cfg, section), key, value)
            taken[dotted] = value
    return describe_taken(taken, path, kept)


def load_eval_config(path: str | os.PathLike, *, overrides: list[str] | None = None,
                     env: dict[str, str] | None = None) -> EvalConfig:
    path = Path(path)
    if not path.is_file():
        raise EvalConfigError([f"no such config file: {path}"], str(path))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise EvalConfigError([f"not valid YAML: {exc}"], str(path)) from None
    if not isinstance(data, dict):
        raise EvalConfigError([f"the config must be a mapping, got {type(data).__name__}"], str(path))
    return config_from_dict(data, source=str(path), overrides=overrides, env=env, default_name=path.stem)


def config_to_dict(cfg: EvalConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def describe(cls: type = EvalConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(dotted name, default, help)`` of every setting (for docs and ``agentic-rag eval --describe``)."""
    rows: list[tuple[str, str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            rows.extend(describe(hints[f.name], f"{prefix}{f.name}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((f"{prefix}{f.name}", repr(default), f.metadata.get("help", "")))
    return rows
