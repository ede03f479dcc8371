"""The evaluation config (``agentic-rag eval``): sections of settings read and checked by the one settings layer
(:mod:`agentic_rag.settings`) before any model loads.

.. code-block:: yaml

    name: hotpotqa-bm25-base
    dataset: {path: ../shared/data/hipporag/hotpotqa_train.json, format: auto, limit: 100}
    policy: {type: local, model: ${EVAL_MODEL_PATH}, adapter: ""}
    search: {index: outputs/indexes/hotpotqa, retriever: bm25}
    rollout: {dialect: agentic, max_turns: 8, max_searches: 4, passages_per_search: 3}
    prompt: {language: en}
    sampling: {temperature: 0.0}
    mode: agent          # or naive_rag (the question's passages in the prompt), direct (closed book)
    samples: 1           # rollouts per question (> 1 needs sampling.temperature > 0): pass@n, mixed share
    metrics: [em, f1, cover_em, well_formed]
    output_dir: runs/eval/hotpotqa-bm25-base

``rollout``, ``prompt``, ``sampling`` and ``search`` are the sections training and the chat server have, under the
same names. A trained adapter is evaluated as it was trained: when ``policy.adapter`` (or a ``policy.model``
directory) holds ``agentic_rag.json``, every ``rollout`` and ``prompt`` setting it records that neither the file
nor ``--set`` gives is taken from it, and each one you set differently is logged. Relative paths are relative to
the working directory. ``agentic-rag eval --describe`` lists every setting with its value and help.

``mode`` says what the model is given (:mod:`.modes` documents each prompt exactly): ``agent`` (the default),
``naive_rag`` (the question's top passages in the prompt, no search action) or ``direct`` (closed book).
``samples: N`` draws N rollouts per question at ``sampling.temperature`` (refused at temperature 0).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..data.questions import FORMATS
from ..models import DTYPES, model_problem
from ..rewards.registry import metric_names, unknown_name
from ..rollout.settings import PromptSettings, RolloutSettings, SamplingSettings
from ..rollout.trained_settings import beneath, find_settings, override_lines
from ..search.settings import SearchSettings, is_url
from ..settings import Loaded, SettingsError, gather, load, section, setting
from ..tools.settings import tools_setting
from .modes import mode_names

log = logging.getLogger(__name__)

EvalConfigError = SettingsError  # evaluation's config errors are the settings layer's
DEFAULT_METRICS = ("em", "f1", "cover_em", "well_formed")
POLICY_TYPES = ("local", "endpoint")


@dataclass
class DatasetSection:
    path: str = setting("", "question file: JSONL, JSON list or CSV, in any format agentic-rag reads")
    format: str = setting("auto", "auto (recognised from the first record), generic, or one of: " + ", ".join(
        FORMATS), choices=("auto", "generic", *FORMATS))
    limit: int | None = setting(None, "evaluate only the first N questions (raise it later to extend a run)", min=1)
    question_field: str = setting("", "read the question from this field instead (generic rules)")
    answer_field: str = setting("", "read the gold answer(s) from this field instead (generic rules)")


@dataclass
class PolicySection:
    type: str = setting("local", "local (a model + optional LoRA adapter) or endpoint (any OpenAI-compatible "
                                 "/v1/completions server: vLLM, SGLang)", choices=POLICY_TYPES)
    model: str = setting("", "local: model directory, .gguf file, packaged model or hub name; endpoint: the served "
                             "model's name")
    adapter: str = setting("", "local: LoRA adapter directory (its agentic_rag.json settings apply); empty = the "
                               "base model")
    merge_adapter: bool = setting(False, "local: merge the adapter into the weights before decoding (faster)")
    tokenizer: str = setting("", "tokenizer directory (default: the model's); endpoints need the served model's")
    dtype: str = setting("auto", "local: auto, float32, bfloat16 or float16", choices=DTYPES)
    device: str = setting("", "local: cpu, cuda, cuda:1 (default: cuda when available)")
    base_url: str = setting("", "endpoint: OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = setting("EVAL_API_KEY", "endpoint: environment variable holding its API key (unset: no key)")
    concurrency: int = setting(8, "endpoint: requests in flight", min=1)
    timeout_s: float = setting(300.0, "endpoint: seconds per request", check=lambda v: None if v > 0 else
                               "must be > 0")
    retries: int = setting(2, "endpoint: retries of a failed request (connection errors, 429, 5xx)", min=0)
    extra_body: dict[str, Any] = setting({}, "endpoint: extra request fields, e.g. {skip_special_tokens: false} "
                                             "for vLLM")

    def problems(self, at: Callable[[str], str]) -> list[str]:
        p = []
        if self.type == "local" and self.base_url:
            p.append(f"{at('base_url')} is set but {at('type')} is local: set type: endpoint, or remove base_url")
        if self.type == "endpoint":
            if not self.base_url.startswith(("http://", "https://")):
                p.append(f"{at('base_url')} must be the endpoint's http(s) URL (e.g. http://127.0.0.1:8000/v1), "
                         f"got {self.base_url!r}")
            if self.adapter:
                p.append(f"{at('adapter')} is only for local models: serve the adapter with the endpoint instead "
                         f"(e.g. vLLM --lora-modules) and name it in {at('model')}")
        return p


@dataclass
class JudgeSection:
    base_url: str = setting("", "OpenAI-compatible base URL of the LLM judge (metric judge)")
    model: str = setting("", "the judge model's name on that endpoint")
    api_key_env: str = setting("JUDGE_API_KEY", "environment variable holding the judge's API key (unset: no key)")
    timeout_s: float = setting(30.0, "seconds per judge call", check=lambda v: None if v > 0 else "must be > 0")
    max_concurrency: int = setting(8, "judge calls in flight", min=1)
    retries: int = setting(2, "retries of a failed call (connection errors, timeouts, 429, 5xx)", min=0)
    max_tokens: int | None = setting(16, "max_tokens of a judge reply (null: not sent)", min=1)


@dataclass
class EvalConfig:
    name: str = setting("", "run name (default: the config file's name)")
    dataset: DatasetSection = section(DatasetSection)
    policy: PolicySection = section(PolicySection)
    search: SearchSettings = section(SearchSettings)
    tools: list[str | dict] = tools_setting()
    rollout: RolloutSettings = section(RolloutSettings)
    prompt: PromptSettings = section(PromptSettings)
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(temperature=0.0),
                                       metadata={"help": "evaluation decodes greedily unless told otherwise"})
    metrics: list[str] | None = setting(None, "metrics (agentic_rag.rewards.registry): " + ", ".join(metric_names())
                                              + " (default: em, f1, cover_em, well_formed, + choice for MedQA)",
                                        check=lambda v: next(("has " + unknown_name(m, metric_names(), "metric")
                                                              for m in v if m not in metric_names()), None))
    judge: JudgeSection = section(JudgeSection)
    mode: str = setting("agent", "agent: the dialect's system prompt and the question, searching as it likes; "
                                 "naive_rag: the question's top rollout.passages_per_search passages (the question "
                                 "is the query) after the question in the user message ('{question}\\n\\nPassages:"
                                 "\\n{passages as the dialect lays them out}'), no search action (max_searches "
                                 "treated as 0); direct: the question alone, no passages, no search. Outside agent "
                                 "the system prompt is prompt.system_prompt when set, else the mode's own asking for "
                                 "the answer in the dialect's answer tags (agentic_rag.evaluation.modes)",
                        choices=mode_names)
    samples: int = setting(1, "rollouts per question, drawn at sampling.temperature (> 0 when samples > 1); the "
                              "record keeps the first sample's fields and adds 'samples', the summary pass_at_n, "
                              "mean_over_samples and mixed_share", min=1)
    batch_size: int = setting(16, "questions rolled out together (each with its samples); finished ones are saved "
                                  "after each batch", min=1)
    output_dir: str = setting("", "where predictions.jsonl and summary.json go (default: runs/eval/NAME)")
    seed: int = setting(0, "random seed (sampling, and the passages of search.retriever: random)")
    # settings of configs written before the one settings layer -> where they are now (a clear refusal, not a map)
    MOVED: ClassVar[dict[str, str]] = {
        "search.k": "rollout.passages_per_search", "rollout.language": "prompt.language",
        "rollout.system_prompt": "prompt.system_prompt", "rollout.chat_template": "prompt.chat_template",
        "rollout.batch_size": "batch_size", "policy.temperature": "sampling.temperature",
        "policy.top_p": "sampling.top_p", "policy.top_k": "sampling.top_k",
        "policy.repetition_penalty": "sampling.repetition_penalty", "policy.max_batch_size": "sampling.max_batch_size"}

    def problems(self, at: Callable[[str], str]) -> list[str]:
        p: list[str] = []
        if self.samples > 1 and self.sampling.temperature == 0:
            p.append(f"{at('samples')} is {self.samples} but sampling.temperature is 0 (greedy): every sample would be "
                     f"the same. Set sampling.temperature (e.g. --set sampling.temperature=1.0), or samples: 1")
        if self.mode == "naive_rag" and self.search.index == "none":
            p.append(f"{at('mode')} naive_rag retrieves with the question, and search.index is none: name an index "
                     f"directory or a search server URL, or use mode: direct for closed book")
        if "judge" in (self.metrics or []):
            from ..rewards.judge import JudgeSettings

            p.extend(JudgeSettings.from_any(self.judge).problems("judge"))
        return p

    def resolved_metrics(self, dataset_format: str) -> list[str]:
        if self.metrics:
            return list(dict.fromkeys(self.metrics))
        return list(DEFAULT_METRICS) + (["choice"] if dataset_format == "medqa" else [])


def file_problems(cfg: EvalConfig) -> list[str]:
    """What the config names on this machine: the question file, the model, adapter and tokenizer, the index."""
    p: list[str] = []
    d, pol, s = cfg.dataset, cfg.policy, cfg.search
    if not pol.model:
        p.append("policy.model is empty: a model (local) or the served model's name (endpoint)")
    if not d.path:
        p.append("dataset.path is empty: point it at a question file")
    elif Path(d.path).is_dir():
        p.append(f"dataset.path {d.path} is a folder; name a question file")
    elif not Path(d.path).is_file():
        p.append(f"dataset.path: no such file {d.path}")
    if pol.type == "local" and pol.model and (problem := model_problem(pol.model)):
        p.append(f"policy.model: {problem}")
    if pol.type == "local" and pol.adapter and not (Path(pol.adapter) / "adapter_config.json").is_file():
        p.append(f"policy.adapter: no LoRA adapter at {pol.adapter} (adapter_config.json missing); use the directory "
                 f"the trainer saved, or leave it empty for the base model")
    if pol.type == "endpoint" and not pol.tokenizer and not (pol.model and Path(pol.model).is_dir()):
        p.append("policy.tokenizer is empty: an endpoint policy needs the served model's tokenizer (a local "
                 "directory) to build prompts")
    if pol.tokenizer and (problem := model_problem(pol.tokenizer, kind="tokenizer")):
        p.append(f"policy.tokenizer: {problem}")
    if cfg.mode == "direct":
        pass  # closed book: no index is opened
    elif not s.index:
        p.append("search.index is empty: an index directory, a search server URL, or none (closed book)")
    elif s.index != "none" and not is_url(s.index) and not (Path(s.index) / "manifest.json").is_file():
        p.append(f"search.index: no index at {s.index} (build one: agentic-rag index build --corpus CORPUS --out "
                 f"NEW_DIR)")
    return p


def config_from_dict(data: Mapping[str, Any] | None, *, source: str = "config", overrides: Sequence[str] = (),
                     env: Mapping[str, str] | None = None, default_name: str = "eval",
                     check_files: bool = True) -> EvalConfig:
    """The config of a YAML tree with ``overrides`` (``dotted=value``) on top and the adapter's trained settings
    beneath, checked as a whole (:class:`~agentic_rag.settings.SettingsError`). An empty ``name`` becomes
    ``default_name``, an empty ``output_dir`` ``runs/eval/NAME``."""
    cfg, _ = resolve(data=data if data is not None else {}, source=source, overrides=overrides, env=env,
                     check_files=check_files)
    cfg.name = cfg.name or default_name
    cfg.output_dir = cfg.output_dir or str(Path("runs") / "eval" / cfg.name)
    return cfg


def load_eval_config(path: str | os.PathLike, *, overrides: Sequence[str] = (),
                     env: Mapping[str, str] | None = None) -> EvalConfig:
    from ..settings import read_yaml

    return config_from_dict(read_yaml(path), source=str(path), overrides=overrides, env=env,
                            default_name=Path(path).stem)


def resolve(*, data: dict[str, Any] | None = None, source: str = "config", overrides: Sequence[str] = (),
            env: Mapping[str, str] | None = None, check_files: bool = True,
            log_trained: bool = True) -> tuple[EvalConfig, Loaded]:
    """The config and where each value came from: defaults, the adapter's trained settings, the file, ``--set``."""
    env = os.environ if env is None else env
    if data is not None and not isinstance(data, dict):
        raise SettingsError([f"the config must be a mapping of settings (key: value lines), got "
                             f"{type(data).__name__}"], source)
    given = gather(EvalConfig, data=data, env=env, overrides=overrides, problems=[])
    pol = given.tree.get("policy") if isinstance(given.tree.get("policy"), dict) else {}
    adapter, model = str(pol.get("adapter") or ""), str(pol.get("model") or "")
    try:
        found = find_settings(adapter or None, model if model and Path(model).is_dir() else None)
    except SettingsError as exc:
        raise SettingsError([f"policy.adapter: {exc.source}: {p}" for p in exc.problems], source) from None
    cfg, loaded = load(EvalConfig, data=data, env=env, overrides=overrides, beneath=beneath(found), source=source,
                       extra_problems=file_problems if check_files else None)
    if log_trained:
        for line in override_lines(found, cfg, loaded.origins):
            log.info(line)
    return cfg, loaded


def config_to_dict(cfg: EvalConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
