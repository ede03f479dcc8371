"""One experiment config: dataclasses with help text, read from YAML, validated as a whole.

Every setting is a dataclass field whose ``metadata["help"]`` says what it does. :func:`load_config` reads a
YAML file, applies environment overrides (the ``.env`` variables the launch scripts export), and checks
everything *before* any model loads: unknown keys, wrong types, values out of range and rules that involve
several fields are all collected and reported at once, each with the field's dotted path and the fix.

Secrets never live here: the judge's API key and the SwanLab key are read from the environment variables
named in the config, at the moment they are needed, and are never logged.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .models import PACKAGED_MODELS, model_problem
from .rewards.rag import ID_METRICS as RAGAS_ID_METRICS
from .rewards.rag import LLM as RAGAS_LLM_METRICS
from .rewards.rag import METRICS as RAGAS_METRICS

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """Every problem of a config, one per line."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


def _f(default: Any, help: str, **kw: Any) -> Any:  # noqa: A002 - mirrors dataclasses.field(metadata=help)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


# ----------------------------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    name_or_path: str = _f("", "base model: a local directory, a hub name, a .gguf file or a packaged model "
                                 "(smollm2-135m-instruct) (env MODEL_PATH)")
    tokenizer: str = _f("", "tokenizer directory or hub name (default: the model's)")
    dtype: str = _f("auto", "weights dtype: auto (bf16 on GPUs that have it, else fp32), bfloat16, float16, float32")
    quantization: str = _f("none", "none, or nf4 for QLoRA (bitsandbytes 4-bit NF4, double quant, bf16 compute)")
    lora_r: int = _f(16, "LoRA rank")
    lora_alpha: int = _f(32, "LoRA alpha")
    lora_dropout: float = _f(0.05, "LoRA dropout")
    lora_target_modules: list[str] = _f(["all-linear"], "modules LoRA adapts; 'all-linear' = every linear layer "
                                                       "of the decoder (not the LM head)")
    gradient_checkpointing: bool = _f(True, "recompute activations in the backward pass (less memory, ~30% slower)")
    attn_implementation: str = _f("sdpa", "attention kernel: sdpa, eager or flash_attention_2 (not with a dialect "
                                          "whose backtrack/summary branch contexts: their 4D tree mask needs sdpa "
                                          "or eager)")
    chat_template: bool | None = _f(None, "use the tokenizer's chat template (None: when it has one); False for "
                                          "base models, as R1-Searcher trains the Qwen base model")
    adapter: str = _f("", "start from this existing LoRA adapter (a peft directory, e.g. a stage-1 run's "
                          "OUTPUT_DIR/final) and keep training it; its rank and target modules replace lora_*. "
                          "Empty: a fresh adapter")


@dataclass
class DataConfig:
    train_file: str = _f("", "training questions (any format agentic-rag reads: JSONL or JSON list)")
    limit: int | None = _f(None, "use only the first N training questions")
    language: str = _f("en", "system prompt language: en or zh")
    system_prompt: str = _f("", "replace the dialect's system prompt (empty: the dialect's own)")


@dataclass
class SearchConfig:
    index: str = _f("", "index directory (agentic-rag index build) or search server URL http://... "
                        "(env INDEX_DIR or SEARCH_URL)")
    retriever: str = _f("bm25", "bm25, dense or hybrid")
    cache_size: int = _f(10000, "LRU cache entries in front of the searcher (GRPO repeats queries)")
    timeout_s: float = _f(30.0, "seconds before a search counts as failed")
    max_failure_rate: float = _f(0.05, "share of the run's searches that may fail (errors, timeouts) before "
                                       "training stops: rewards earned without passages teach the wrong thing")


@dataclass
class RolloutConfig:
    dialect: str = _f("agentic", "tag protocol: agentic, search-r1 or r1-searcher")
    max_turns: int = _f(8, "model turns per trajectory")
    max_searches: int = _f(4, "search actions per trajectory")
    on_search_limit: str = _f("observe", "a search past max_searches: observe = refused with a notice that no "
                                         "searches are left, and the model may still answer (the notice is "
                                         "environment text, never trained on); end = the trajectory ends there "
                                         "(finish_reason max_searches, usually reward 0)")
    max_tokens_per_turn: int = _f(256, "new model tokens per turn")
    max_completion_tokens: int = _f(1024, "all tokens after the prompt, observations included")
    passages_per_search: int = _f(3, "passages shown per query")
    max_observation_tokens: int = _f(384, "tokens per observation (truncated cleanly)")
    summary_mode: str = _f("replace", "replace: a summary restarts the context; keep: nothing is dropped")
    temperature: float = _f(1.0, "sampling temperature of rollouts (the loss uses the same)")
    top_p: float = _f(1.0, "nucleus sampling of rollouts; below 1 the samples are off-policy for the loss "
                           "(a warning says so)")
    top_k: int = _f(0, "sample among the k likeliest tokens (0 = off); on, the samples are off-policy for the loss")
    repetition_penalty: float = _f(1.0, "penalise tokens already in the context while sampling (1 = off); other "
                                        "values make the samples off-policy for the loss")
    max_batch_size: int | None = _f(None, "sequences decoded together (default: all of a generation batch)")


@dataclass
class RewardSpec:
    name: str = _f("", "reward function: exact_match, f1, cover_em, cover_em_tokens, choice, judge, format, "
                       "retrieval, ragas, overlong")
    weight: float = _f(1.0, "weight in the summed reward")
    params: dict[str, Any] = _f({}, "reward-specific settings: format {partial: bool}; ragas {metric, fallback}; "
                                    "cover_em_tokens {max_extra_tokens: int}; overlong {max_tokens: int, "
                                    "cache_tokens: int} (see agentic_rag.training.rewards)")


@dataclass
class CurriculumConfig:
    enabled: bool = _f(False, "R1-Searcher's two-stage curriculum instead of the plain reward list")
    stage2_step: int = _f(100, "global step from which stage 2 rewards apply (when stage is unset)")
    stage: int | None = _f(None, "fix the stage: 1 or 2 for the whole run (stage 2 as a second config, usually "
                                 "with model.adapter set to the stage-1 adapter); unset: switch at stage2_step")
    format_reward: float = _f(0.5, "stage 1: reward for a well-formed trajectory (R1-Searcher's R_format)")
    retrieval_bonus: float = _f(0.5, "stage 1: reward for a trajectory that made at least one search call "
                                     "(R1-Searcher's R_retrieval)")
    format_penalty: float = _f(-2.0, "stage 2: added to the answer's F1 for a malformed trajectory")


@dataclass
class JudgeConfig:
    base_url: str = _f("", "OpenAI-compatible endpoint of the LLM judge (env JUDGE_BASE_URL); empty = no judge")
    model: str = _f("", "judge model name (env JUDGE_MODEL)")
    api_key_env: str = _f("JUDGE_API_KEY", "name of the environment variable holding the judge's API key")
    timeout_s: float = _f(30.0, "seconds per judge call")
    max_concurrency: int = _f(8, "judge calls in flight")
    fallback: str = _f("cover_em", "metric used when the judge fails: exact_match, f1, cover_em or "
                                   "cover_em_tokens")


@dataclass
class AlgorithmConfig:
    name: str = _f("grpo", "grpo, dr_grpo (no std scaling, a constant normaliser), dapo (clip-higher, token-level "
                           "loss, dynamic sampling), gspo (sequence-level importance ratio), cispo (clipped, detached "
                           "importance weights), sapo (a soft gate instead of the clip), bnpo (a per-micro-batch "
                           "token mean), reinforce_pp (REINFORCE++: KL-shaped per-token returns, normalised over the "
                           "batch's tokens) or reinforce_pp_baseline (the same after subtracting each question's "
                           "mean reward, as R1-Searcher trains); see agentic_rag.training.trainer")
    num_generations: int = _f(4, "rollouts per question (the group)")
    beta: float = _f(0.0, "KL coefficient against the base model (adapter disabled); 0 = no KL. A k3 term in the "
                          "loss, except for reinforce_pp*: a k1 penalty in each token's reward")
    epsilon: float | None = _f(None, "clip range below 1 (default: the algorithm's: 0.2; gspo 3e-4)")
    epsilon_high: float | None = _f(None, "clip range above 1 (default: the algorithm's: epsilon; dapo 0.28, gspo "
                                          "4e-4); for cispo the cap of the importance weight itself (default 5.0)")
    num_iterations: int = _f(1, "optimisation passes per generation batch")
    learning_rate: float = _f(1e-5, "peak learning rate of the adapter")
    per_device_train_batch_size: int = _f(4, "completions per device per micro-step (a multiple of the group "
                                             "size divides evenly)")
    gradient_accumulation_steps: int = _f(1, "micro-steps per optimizer step")
    max_steps: int = _f(100, "optimizer steps")
    warmup_ratio: float = _f(0.0, "linear warm-up, as a fraction of max_steps (0 <= x < 1)")
    lr_scheduler: str = _f("linear", "learning-rate schedule after the warm-up: linear (decays to 0 at max_steps), "
                                     "cosine, or constant (a short run that should not spend its last steps at a "
                                     "near-zero rate)")
    max_grad_norm: float = _f(1.0, "clip the gradient norm to this (0 = no clipping)")
    mask_truncated_completions: bool | None = _f(None, "exclude trajectories cut by the completion budget "
                                                       "(rollout.max_completion_tokens) from the loss (default: True "
                                                       "for dapo); every other ending, turn_token_limit included, "
                                                       "stays in the loss with its reward")
    scale_rewards: str | None = _f(None, "divide each advantage by the std of its group's rewards ('group'), of "
                                         "the batch's ('batch'), or not at all ('none'); default: the algorithm's "
                                         "(group for grpo and dapo, none for dr_grpo). 'none' stops questions the "
                                         "policy nearly always gets right from weighing as much as the ones it "
                                         "is still learning (Dr. GRPO). Not for reinforce_pp*")
    shuffle_rewards: bool = _f(False, "control experiment: permute the rewards within each batch, which keeps "
                                      "their distribution and destroys their signal")
    dynamic_sampling: bool | None = _f(None, "drop the groups whose rewards are all equal (no signal) and roll out "
                                             "groups of further questions in their place (DAPO); default: on for "
                                             "dapo, off for the others. Not for reinforce_pp*")
    max_extra_rollouts: int | None = _f(None, "the most rollouts dynamic sampling draws a process per generation "
                                              "batch beyond it (default: as many as the batch); a batch still short "
                                              "keeps some zero-variance groups")


@dataclass
class LoggingConfig:
    swanlab_mode: str = _f("auto", "auto (default: cloud when SWANLAB_API_KEY is set, else local: the runs "
                                   "`swanlab watch` shows), local, offline (for `swanlab sync` later), cloud "
                                   "(needs SWANLAB_API_KEY) or disabled (env SWANLAB_MODE)")
    swanlab_project: str = _f("agentic-rag-r1", "SwanLab project (env SWANLAB_PROJECT)")
    swanlab_log_dir: str = _f("", "where local/offline logs go (env SWANLAB_LOG_DIR; default OUTPUT_DIR/swanlog); "
                                  "runs that train at the same time need one each")
    run_name: str = _f("", "run name (default: derived from the config file name)")
    logging_steps: int = _f(1, "log metrics every N steps")
    sample_table_every: int = _f(10, "log a table of sample trajectories every N steps (0 = never)")
    sample_table_rows: int = _f(4, "trajectories in each table")


@dataclass
class GuardsConfig:
    min_entropy: float | None = _f(None, "alert when the policy's mean entropy over the tokens it wrote (nats, "
                                         "TRL's logged 'entropy') stays below this; unset: no entropy guard")
    min_searches: float | None = _f(None, "alert when the searches per trajectory stay below this; unset: none")
    max_searches: float | None = _f(None, "alert when the searches per trajectory stay above this (a policy "
                                          "that searches until the limit); unset: none")
    patience: int = _f(3, "logged steps in a row past a bound before the guard acts")
    action: str = _f("warn", "warn (a warning and a line in OUTPUT_DIR/guards.jsonl; training goes on) or stop "
                             "(the same, then training stops and saves its adapter as at a normal end)")


@dataclass
class CheckpointConfig:
    output_dir: str = _f("outputs/run", "checkpoints, logs and the final adapter")
    save_steps: int = _f(50, "save the adapter and trainer state every N steps")
    save_total_limit: int | None = _f(3, "keep only the last N checkpoints")
    resume: bool = _f(False, "continue from the latest complete checkpoint in output_dir")


@dataclass
class ExperimentConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rewards: list[RewardSpec] = field(
        default_factory=lambda: [RewardSpec("f1", 1.0), RewardSpec("format", 0.2)],
        metadata={"help": "weighted reward functions: a list of {name, weight, params} (see RewardSpec)"})
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: int = _f(42, "random seed (data order, sampling, LoRA init)")
    gpu_memory_gb: float | None = _f(None, "per-GPU memory for the fit check before loading (default: detected)")

    def validate(self, *, check_files: bool = True, env: Mapping[str, str] | None = None) -> list[str]:
        """Rules that involve values and several fields; returns every problem found. ``check_files=False``
        skips the checks that files exist (for configs written for another machine); ``env`` (default: the
        process environment) is where the SwanLab key is looked for."""
        env = os.environ if env is None else env
        p: list[str] = []
        m = self.model
        if not m.name_or_path:
            p.append("model.name_or_path is empty: set it in the config or MODEL_PATH in .env")
        elif check_files and (problem := model_problem(m.name_or_path)):
            p.append(f"model.name_or_path: {problem}")
        elif m.quantization == "nf4" and (m.name_or_path.lower().endswith(".gguf")
                                          or m.name_or_path.lower() in PACKAGED_MODELS):
            p.append(f"model.quantization is nf4 but model.name_or_path {m.name_or_path!r} is a GGUF model, loaded "
                     "dequantized to float: set model.quantization to none")
        _choice(p, "model.dtype", m.dtype, ("auto", "bfloat16", "float16", "float32"))
        _choice(p, "model.quantization", m.quantization, ("none", "nf4"))
        _choice(p, "model.attn_implementation", m.attn_implementation, ("sdpa", "eager", "flash_attention_2"))
        _positive(p, "model.lora_r", m.lora_r)
        _positive(p, "model.lora_alpha", m.lora_alpha)
        if not 0 <= m.lora_dropout < 1:
            p.append(f"model.lora_dropout must be in [0, 1), got {m.lora_dropout}")
        targets = m.lora_target_modules
        if not targets or not all(t.strip() for t in targets):
            p.append(f"model.lora_target_modules must name modules (e.g. [q_proj, v_proj]) or be [all-linear], "
                     f"got {targets!r}")
        elif "all-linear" in targets and len(targets) > 1:
            p.append(f"model.lora_target_modules: all-linear already means every linear layer; list it alone or "
                     f"list module names, got {targets!r}")
        if m.adapter and check_files and not (Path(m.adapter) / "adapter_config.json").is_file():
            p.append(f"model.adapter: no LoRA adapter at {m.adapter} (a peft directory with adapter_config.json, "
                     f"e.g. a stage-1 run's OUTPUT_DIR/final)")
        if not self.data.train_file:
            p.append("data.train_file is empty: point it at a question file")
        elif check_files and not Path(self.data.train_file).is_file():
            p.append(f"data.train_file: no such file {self.data.train_file}")
        if self.data.limit is not None:
            _positive(p, "data.limit", self.data.limit)
        _choice(p, "data.language", self.data.language, ("en", "zh"))
        if not self.search.index:
            p.append("search.index is empty: an index directory or http:// URL (INDEX_DIR or SEARCH_URL in .env)")
        elif check_files and not self.search.index.startswith(("http://", "https://")) and \
                not (Path(self.search.index) / "manifest.json").is_file():
            p.append(f"search.index: no index at {self.search.index} (build one: agentic-rag index build "
                     f"--corpus CORPUS --out {self.search.index})")
        _choice(p, "search.retriever", self.search.retriever, ("bm25", "dense", "hybrid"))
        if self.search.cache_size < 0:
            p.append(f"search.cache_size must be >= 0 (0 = no cache), got {self.search.cache_size}")
        if self.search.timeout_s <= 0:
            p.append(f"search.timeout_s must be > 0, got {self.search.timeout_s}")
        if not 0.0 <= self.search.max_failure_rate <= 1.0:
            p.append(f"search.max_failure_rate must be between 0 and 1, got {self.search.max_failure_rate}")
        self._validate_rollout(p)
        self._validate_tree_masks(p, check_files)
        self._validate_algorithm(p)
        self._validate_guards(p)
        p.extend(launch_problems(**launch_from_env(env)))  # the accelerate launch this process runs under
        self._validate_rewards(p)
        self._validate_curriculum(p)
        j = self.judge
        if j.base_url and not j.model:
            p.append("judge.model is empty while judge.base_url is set (JUDGE_MODEL in .env)")
        _choice(p, "judge.fallback", j.fallback, ("exact_match", "f1", "cover_em", "cover_em_tokens"))
        if j.timeout_s <= 0:
            p.append(f"judge.timeout_s must be > 0, got {j.timeout_s}")
        _positive(p, "judge.max_concurrency", j.max_concurrency)
        lg = self.logging
        _choice(p, "logging.swanlab_mode", lg.swanlab_mode, ("auto", "offline", "cloud", "local", "disabled"))
        if lg.swanlab_mode == "cloud" and not env.get("SWANLAB_API_KEY"):
            p.append("logging.swanlab_mode is cloud but SWANLAB_API_KEY is not set (in the environment or .env); "
                     "set it, or use auto/offline")
        _positive(p, "logging.logging_steps", lg.logging_steps)
        if lg.sample_table_every < 0:
            p.append(f"logging.sample_table_every must be >= 0 (0 = never), got {lg.sample_table_every}")
        _positive(p, "logging.sample_table_rows", lg.sample_table_rows)
        _positive(p, "checkpoint.save_steps", self.checkpoint.save_steps)
        if self.checkpoint.save_total_limit is not None:
            _positive(p, "checkpoint.save_total_limit", self.checkpoint.save_total_limit)
        return p

    def _validate_rollout(self, p: list[str]) -> None:
        r = self.rollout
        _choice(p, "rollout.dialect", r.dialect, ("agentic", "search-r1", "r1-searcher"))
        _choice(p, "rollout.summary_mode", r.summary_mode, ("replace", "keep"))
        _choice(p, "rollout.on_search_limit", r.on_search_limit, ("observe", "end"))
        for name in ("max_turns", "max_tokens_per_turn", "max_completion_tokens", "passages_per_search"):
            _positive(p, f"rollout.{name}", getattr(r, name))
        if r.max_searches < 0:
            p.append(f"rollout.max_searches must be >= 0, got {r.max_searches}")
        if r.max_observation_tokens < 16:
            p.append(f"rollout.max_observation_tokens must be >= 16, got {r.max_observation_tokens}")
        if r.max_tokens_per_turn > r.max_completion_tokens:
            p.append(f"rollout.max_tokens_per_turn ({r.max_tokens_per_turn}) exceeds rollout.max_completion_tokens "
                     f"({r.max_completion_tokens}): lower it or raise the total")
        if r.temperature <= 0:
            p.append(f"rollout.temperature must be > 0, got {r.temperature}")
        if not 0 < r.top_p <= 1:
            p.append(f"rollout.top_p must be in (0, 1], got {r.top_p}")
        if r.top_k < 0:
            p.append(f"rollout.top_k must be >= 0 (0 = off), got {r.top_k}")
        if r.repetition_penalty <= 0:
            p.append(f"rollout.repetition_penalty must be > 0 (1 = off), got {r.repetition_penalty}")
        if r.max_batch_size is not None:
            _positive(p, "rollout.max_batch_size", r.max_batch_size)

    def _validate_tree_masks(self, p: list[str], check_files: bool) -> None:
        """Attention that cannot apply the tree mask branched trajectories are scored with (see
        :func:`tree_mask_problems`). The model's config.json is read from its directory, or from the local Hugging
        Face cache for a hub name; a model found in neither is checked by the trainer once it is loaded."""
        m, r = self.model, self.rollout
        actions = branching_actions(r.dialect, r.summary_mode)
        if not actions:
            return
        model_config = None
        if check_files and m.name_or_path and model_problem(m.name_or_path) is None:
            model_config = local_model_config(m.name_or_path)
        # an attention value that is no choice at all is reported once, as such
        attention = None if any(x.startswith("model.attn_implementation") for x in p) else m.attn_implementation
        p.extend(tree_mask_problems(memory=f"rollout.dialect {r.dialect}'s {' and '.join(actions)}",
                                    attn_implementation=attention, model_config=model_config,
                                    model_name=m.name_or_path))

    def _validate_algorithm(self, p: list[str]) -> None:
        a = self.algorithm
        _choice(p, "algorithm.name", a.name, ALGORITHM_NAMES)
        if a.num_generations < 2:
            p.append(f"algorithm.num_generations must be >= 2 (a group needs two rollouts to compare), "
                     f"got {a.num_generations}")
        elif a.per_device_train_batch_size % a.num_generations and \
                (a.per_device_train_batch_size * a.gradient_accumulation_steps) % a.num_generations:
            p.append(f"algorithm.per_device_train_batch_size x gradient_accumulation_steps "
                     f"({a.per_device_train_batch_size} x {a.gradient_accumulation_steps}) must be a multiple of "
                     f"algorithm.num_generations ({a.num_generations})")
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "num_iterations"):
            _positive(p, f"algorithm.{name}", getattr(a, name))
        if a.beta < 0:
            p.append(f"algorithm.beta must be >= 0, got {a.beta}")
        if a.learning_rate <= 0:
            p.append(f"algorithm.learning_rate must be > 0, got {a.learning_rate}")
        if a.lr_scheduler not in LR_SCHEDULERS:
            p.append(f"algorithm.lr_scheduler must be one of {', '.join(LR_SCHEDULERS)}, got {a.lr_scheduler!r}")
        if not 0 <= a.warmup_ratio < 1:
            p.append(f"algorithm.warmup_ratio is a fraction of max_steps and must be in [0, 1), got {a.warmup_ratio}")
        if a.epsilon is not None and not 0 < a.epsilon < 1:
            p.append(f"algorithm.epsilon (the clip range below 1) must be in (0, 1), got {a.epsilon}")
        if a.epsilon_high is not None and a.epsilon_high <= 0:
            p.append(f"algorithm.epsilon_high (the clip range above 1) must be > 0, or unset to use epsilon; "
                     f"got {a.epsilon_high}")
        if a.max_grad_norm < 0:
            p.append(f"algorithm.max_grad_norm must be >= 0 (0 = no clipping), got {a.max_grad_norm}")
        if a.scale_rewards is not None:
            _choice(p, "algorithm.scale_rewards", a.scale_rewards, ("group", "batch", "none"))
            if a.name in ("reinforce_pp", "reinforce_pp_baseline"):
                p.append(f"algorithm.scale_rewards does not apply to {a.name}: its advantages are whitened over the "
                         f"batch's tokens by the trainer; leave it unset")
        if a.dynamic_sampling and a.name in ("reinforce_pp", "reinforce_pp_baseline"):
            p.append(f"algorithm.dynamic_sampling does not apply to {a.name}: its advantages are normalised over the "
                     f"whole batch, not within groups")
        if a.dynamic_sampling or (a.dynamic_sampling is None and a.name in DYNAMIC_SAMPLING_BY_DEFAULT):
            if (a.per_device_train_batch_size * a.gradient_accumulation_steps) % a.num_generations:
                p.append(f"algorithm.dynamic_sampling drops and refills whole groups on each process: "
                         f"per_device_train_batch_size x gradient_accumulation_steps "
                         f"({a.per_device_train_batch_size} x {a.gradient_accumulation_steps}) must be a multiple of "
                         f"algorithm.num_generations ({a.num_generations})")
        if a.max_extra_rollouts is not None and (not isinstance(a.max_extra_rollouts, int)
                                                 or a.max_extra_rollouts < 0):
            p.append(f"algorithm.max_extra_rollouts must be an integer >= 0, got {a.max_extra_rollouts!r}")

    def _validate_guards(self, p: list[str]) -> None:
        g = self.guards
        _positive(p, "guards.patience", g.patience)
        _choice(p, "guards.action", g.action, ("warn", "stop"))
        for name in ("min_entropy", "min_searches", "max_searches"):
            value = getattr(g, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                p.append(f"guards.{name} must be a number >= 0 or unset, got {value!r}")
        if g.min_searches is not None and g.max_searches is not None and g.min_searches > g.max_searches:
            p.append(f"guards.min_searches ({g.min_searches}) exceeds guards.max_searches ({g.max_searches})")

    def _validate_rewards(self, p: list[str]) -> None:
        if not self.curriculum.enabled and not self.rewards:
            p.append("rewards is empty: list at least one reward (e.g. {name: f1, weight: 1.0})")
        first: dict[str, int] = {}
        for i, spec in enumerate(self.rewards):
            where = f"rewards[{i}]"
            _choice(p, f"{where}.name", spec.name, REWARD_NAMES)
            if spec.name in first:
                p.append(f"{where}.name {spec.name!r} repeats rewards[{first[spec.name]}]: rewards are logged by "
                         f"name, so list each one once")
            first.setdefault(spec.name, i)
            if not math.isfinite(spec.weight):
                p.append(f"{where}.weight must be a finite number, got {spec.weight}")
            if spec.name not in REWARD_NAMES:
                continue
            known = REWARD_PARAMS.get(spec.name, {})
            for key, value in spec.params.items():
                if key not in known:
                    takes = f"it takes {', '.join(known)}" if known else "it takes none"
                    p.append(f"{where}.params.{key} is not a setting of the {spec.name} reward; {takes}")
                elif not isinstance(value, known[key]):
                    p.append(f"{where}.params.{key} must be {known[key].__name__}, got {value!r}")
            if spec.name == "judge" and not self.judge.base_url:
                p.append(f"{where} is the LLM judge but judge.base_url is empty (JUDGE_BASE_URL in .env)")
            if spec.name == "ragas":
                self._validate_ragas(p, where, spec.params)
            if spec.name == "overlong":
                self._validate_overlong(p, where, spec.params)
            extra = spec.params.get("max_extra_tokens") if spec.name == "cover_em_tokens" else None
            if isinstance(extra, int) and extra < 0:
                p.append(f"{where}.params.max_extra_tokens must be >= 0, got {extra}")

    def _validate_overlong(self, p: list[str], where: str, params: dict[str, Any]) -> None:
        budget, cache = overlong_bounds(params, self.rollout.max_completion_tokens)
        if not isinstance(budget, int) or not isinstance(cache, int):
            return  # reported as a type problem
        if budget > self.rollout.max_completion_tokens:
            p.append(f"{where}.params.max_tokens ({budget}) exceeds rollout.max_completion_tokens "
                     f"({self.rollout.max_completion_tokens}): no completion is ever that long")
        if not 0 < cache <= budget:
            p.append(f"{where}.params.cache_tokens must be in 1..max_tokens ({budget}), got {cache}")

    def _validate_ragas(self, p: list[str], where: str, params: dict[str, Any]) -> None:
        metric = params.get("metric", "id_recall")
        if not isinstance(metric, str):
            return  # reported as a type problem
        _choice(p, f"{where}.params.metric", metric, RAGAS_METRICS)
        if metric == "text_recall":
            p.append(f"{where}.params.metric text_recall needs reference passages, which training questions do not "
                     f"carry (it would never score); use id_recall or id_precision")
        if metric in RAGAS_LLM_METRICS and not self.judge.base_url:
            p.append(f"{where}.params.metric {metric} is judged by an LLM but judge.base_url is empty "
                     f"(JUDGE_BASE_URL in .env); or use a metric without one: {', '.join(RAGAS_ID_METRICS)}")
        fallback = params.get("fallback", "id_recall")
        if isinstance(fallback, str):
            _choice(p, f"{where}.params.fallback", fallback, RAGAS_ID_METRICS)

    def reward_warnings(self) -> list[str]:
        """Rewards that run but teach something other than their name says: cover-EM (a substring test, as
        FlashRAG and R1-Searcher evaluate) as a training reward pays answers a policy learns to game."""
        if self.curriculum.enabled:
            return []
        return [f"rewards[{i}] is cover_em, a substring test meant for evaluation: as a training reward it pays "
                f'"nothing" covers "no" and answers that list several candidates ("Paris or Lyon"), which the '
                f"policy learns to write. Use cover_em_tokens (the gold as whole tokens, a short answer, no "
                f"list), f1 or exact_match to train on"
                for i, spec in enumerate(self.rewards) if spec.name == "cover_em"]

    def _validate_curriculum(self, p: list[str]) -> None:
        c = self.curriculum
        if c.stage2_step < 0:
            p.append(f"curriculum.stage2_step must be >= 0, got {c.stage2_step}")
        if c.stage not in (None, 1, 2):
            p.append(f"curriculum.stage must be 1 or 2 (or unset to switch at curriculum.stage2_step), got {c.stage}")
        elif c.stage is not None and not c.enabled:
            p.append("curriculum.stage is set but curriculum.enabled is false: enable the curriculum or drop the stage")
        if c.retrieval_bonus < 0:
            p.append(f"curriculum.retrieval_bonus must be >= 0, got {c.retrieval_bonus}")
        if c.format_reward < 0:
            p.append(f"curriculum.format_reward must be >= 0, got {c.format_reward}")
        if c.format_penalty > 0:
            p.append(f"curriculum.format_penalty is paid for a malformed trajectory and must be <= 0, "
                     f"got {c.format_penalty}")

    def off_policy_warnings(self) -> list[str]:
        """Rollout settings that sample from another distribution than the one the loss scores.

        The trainer scores every token with the full-softmax ``log_softmax(logits / temperature)`` (as TRL does),
        for the old, the current and the reference policy alike; the rollout records the same quantity. Top-p,
        top-k and a repetition penalty change which tokens are drawn but not that number, so the importance
        ratio and the KL describe a distribution the samples did not come from: biased, and nothing corrects
        it. Temperature is not among them: the loss divides by the same temperature."""
        r = self.rollout
        why = ("the loss scores tokens with full-softmax log-probabilities, so the samples are off-policy: the "
               "importance ratio (and the KL) is biased and nothing corrects it")
        found = []
        if r.top_p < 1:
            found.append(f"rollout.top_p={r.top_p:g}: rollouts sample from the top-p nucleus but {why}. "
                         f"Set rollout.top_p: 1.0 for on-policy training")
        if r.top_k > 0:
            found.append(f"rollout.top_k={r.top_k}: rollouts sample among the top-k tokens but {why}. "
                         f"Set rollout.top_k: 0 for on-policy training")
        if r.repetition_penalty != 1:
            found.append(f"rollout.repetition_penalty={r.repetition_penalty:g}: rollouts sample from the "
                         f"penalised distribution but {why}. Set rollout.repetition_penalty: 1.0 for on-policy "
                         f"training")
        return found


LR_SCHEDULERS = ("linear", "cosine", "constant")
DYNAMIC_SAMPLING_BY_DEFAULT = ("dapo",)  # DAPO's recipe samples dynamically unless told otherwise
ALGORITHM_NAMES = ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "bnpo", "reinforce_pp",
                   "reinforce_pp_baseline")


def launch_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The distributed launch this process runs under, as ``accelerate launch`` describes it to the processes it
    starts: ``{"zero_stage": 2 | 3 | None, "fsdp": bool}``. The ZeRO stage is the one exported with the launch
    (``ACCELERATE_DEEPSPEED_ZERO_STAGE``; the launch scripts export it), else the ``zero_optimization.stage`` of
    the DeepSpeed config file accelerate names (``ACCELERATE_DEEPSPEED_CONFIG_FILE``); None without DeepSpeed."""
    fsdp = env.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes")
    stage = None
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes"):
        value: Any = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
        if not value and env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"):
            try:
                ds = json.loads(Path(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"]).read_text())
                value = ds.get("zero_optimization", {}).get("stage", "")
            except (OSError, ValueError, AttributeError):
                value = ""  # DeepSpeed itself reports an unreadable config file, at launch
        stage = int(value) if str(value).isdigit() else None
    return {"zero_stage": stage, "fsdp": fsdp}


def launch_problems(*, zero_stage: int | None, fsdp: bool, ds3_gather_for_generation: bool = True) -> list[str]:
    """Launches the rollout cannot run under, with the reason. The rollout engine decodes each process's own
    trajectories, as many forward passes as they need, so processes run different numbers of decode steps.
    With sharded weights every forward pass is a collective that needs every process: FSDP, and ZeRO-3 when the
    weights are not gathered for generation (``ds3_gather_for_generation: false``), would wait forever on the
    process that finished first. (ZeRO-3 as launched by script/training/train_zero3.sh gathers them.)"""
    found = []
    if fsdp:
        found.append("this launch uses FSDP (accelerate's distributed_type: FSDP), which the rollout does not "
                     "support: with sharded weights each decode step needs every process, and ranks run different "
                     "numbers of decode steps, so they would hang; launch with DeepSpeed instead "
                     "(script/training/train_zero2.sh or train_zero3.sh)")
    if zero_stage == 3 and not ds3_gather_for_generation:
        found.append("DeepSpeed ZeRO-3 with ds3_gather_for_generation false would hang: without the whole model "
                     "gathered for generation each decode step needs every process, and ranks run different "
                     "numbers of decode steps; keep ds3_gather_for_generation true (the default), or use ZeRO-2")
    return found


# Dialects with memory actions, by the names rollout.protocol gives them (a test keeps the two in step; the config
# check does not import the rollout, which would load torch before any problem is reported).
MEMORY_ACTIONS: dict[str, tuple[str, ...]] = {"agentic": ("backtrack", "summary")}
# the attention kernels that apply a custom 4D attention mask as given
TREE_MASK_ATTENTION = ("sdpa", "eager")
NO_MEMORY_DIALECTS = "a dialect without memory actions (rollout.dialect search-r1 or r1-searcher)"


def branching_actions(dialect: str, summary_mode: str) -> tuple[str, ...]:
    """The memory actions of ``dialect`` that branch a trajectory's context: a backtrack always (its note hangs off
    the segment before the abandoned step), a summary under ``summary_mode`` replace (the context restarts from it);
    a summary that keeps the context does not branch."""
    return tuple(a for a in MEMORY_ACTIONS.get(dialect, ()) if a == "backtrack" or summary_mode == "replace")


def model_sliding_window(model_config: Mapping[str, Any]) -> int | None:
    """The sliding attention window (in tokens) that layers of a model use, from its config.json (or a transformers
    config's ``to_dict()``); None when every layer attends to the whole context. Reads ``sliding_window``, switched
    off by ``use_sliding_window: false`` (Qwen2, Qwen3), and which layers slide from ``layer_types`` or, without it,
    Qwen2's ``max_window_layers`` (layers from that index on slide). A multimodal config's ``text_config`` counts."""
    text = model_config.get("text_config")
    if isinstance(text, Mapping) and (window := model_sliding_window(text)) is not None:
        return window
    window = model_config.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        return None
    if model_config.get("use_sliding_window") is False:
        return None
    layers = model_config.get("layer_types")
    if isinstance(layers, list):
        return window if "sliding_attention" in layers else None
    first, count = model_config.get("max_window_layers"), model_config.get("num_hidden_layers")
    if "use_sliding_window" in model_config and isinstance(first, int) and isinstance(count, int) and first >= count:
        return None
    return window


def local_model_config(name_or_path: str, *, cache_dir: str | None = None) -> dict[str, Any] | None:
    """A model's config.json, read without loading the model or using the network: from a model directory, or for a
    hub name from the local Hugging Face cache (``cache_dir``: its default) when it was downloaded before. None
    otherwise (a GGUF file, a packaged model, a hub model not downloaded yet, an unreadable file)."""
    path = Path(name_or_path).expanduser()
    file: Path | None = path / "config.json" if path.is_dir() else None
    if file is None and not path.exists() and not name_or_path.lower().endswith(".gguf"):
        from huggingface_hub import try_to_load_from_cache

        try:
            found = try_to_load_from_cache(name_or_path, "config.json", cache_dir=cache_dir)
        except ValueError:  # not a valid repository id
            found = None
        file = Path(found) if isinstance(found, str) else None
    if file is None or not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def tree_mask_problems(*, memory: str, attn_implementation: str | None, model_config: Mapping[str, Any] | None,
                       model_name: str = "") -> list[str]:
    """Why branched trajectories could not be scored correctly with this model, with the fix; empty when they can.

    ``memory`` names what branches a context (e.g. "rollout.dialect agentic's backtrack"). A micro-batch holding a
    branched trajectory is scored with a 4D tree-shaped additive mask and the tree's position ids
    (:class:`agentic_rag.training.trainer.TreeLayout`). Only sdpa and eager apply such a mask as given: the
    flash-attention path of transformers (5.23) reads an attention mask as a 2D padding mask (an index error, or
    wrong attention). And the mask replaces the model's own sliding-window mask, so a model whose layers slide over
    a window shorter than the contexts it takes (``max_position_embeddings``; the prompt's length is not bounded
    by the config) would be trained on attention it never uses."""
    found = []
    if attn_implementation is not None and attn_implementation not in TREE_MASK_ATTENTION:
        found.append(f"model.attn_implementation is {attn_implementation!r}, but {memory} can branch a trajectory's "
                     f"context, and a micro-batch holding a branched trajectory is scored with a 4D tree-shaped "
                     f"attention mask that {attn_implementation} cannot apply (transformers' flash-attention path "
                     f"reads it as a 2D padding mask: an index error or wrong attention, partway through a run). Set "
                     f"model.attn_implementation to sdpa or eager, or use {NO_MEMORY_DIALECTS}")
    window = model_sliding_window(model_config) if model_config is not None else None
    longest = model_config.get("max_position_embeddings") if model_config is not None else None
    if window is not None and not (isinstance(longest, int) and window >= longest):
        found.append(f"model.name_or_path {model_name!r} uses a sliding attention window of {window} tokens "
                     f"(its contexts may reach {longest or 'any length'}), but {memory} can branch a trajectory's "
                     f"context, and a branched trajectory is scored with a 4D tree-shaped attention mask that replaces "
                     f"the model's sliding-window mask: past {window} tokens its log-probabilities would come from "
                     f"attention the model never uses. Use a model without a sliding window (Qwen2 and Qwen3 "
                     f"checkpoints ship with use_sliding_window: false in config.json), or {NO_MEMORY_DIALECTS}")
    return found


REWARD_NAMES = ("exact_match", "f1", "cover_em", "cover_em_tokens", "choice", "judge", "format", "retrieval",
                "ragas", "overlong")
# the params each reward takes, with their types (a reward not listed takes none)
REWARD_PARAMS: dict[str, dict[str, type]] = {"format": {"partial": bool}, "ragas": {"metric": str, "fallback": str},
                                              "cover_em_tokens": {"max_extra_tokens": int},
                                              "overlong": {"max_tokens": int, "cache_tokens": int}}


def overlong_bounds(params: dict[str, Any], max_completion_tokens: int) -> tuple[Any, Any]:
    """The ``overlong`` reward's ``(max_tokens, cache_tokens)``: its params, else the completion budget and a fifth
    of it (at least 1; DAPO: 4,096 of 20,480)."""
    budget = params.get("max_tokens", max_completion_tokens)
    cache = params.get("cache_tokens", max(1, budget // 5) if isinstance(budget, int) else None)
    return budget, cache


def _choice(problems: list[str], name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{name} must be one of {', '.join(allowed)}; got {value!r}{hint}")


def _positive(problems: list[str], name: str, value: Any) -> None:
    if not isinstance(value, int) or value < 1:
        problems.append(f"{name} must be a positive integer, got {value!r}")


# -------------------------------------------------------------------------------------------- loading

ENV_OVERRIDES = {
    "MODEL_PATH": "model.name_or_path",
    "INDEX_DIR": "search.index",
    "SEARCH_URL": "search.index",
    "JUDGE_BASE_URL": "judge.base_url",
    "JUDGE_MODEL": "judge.model",
    "SWANLAB_MODE": "logging.swanlab_mode",
    "SWANLAB_PROJECT": "logging.swanlab_project",
    "SWANLAB_LOG_DIR": "logging.swanlab_log_dir",
    "OUTPUT_DIR": "checkpoint.output_dir",
}


def _type_ok(value: Any, tp: Any) -> tuple[bool, Any]:
    """Check (and lightly coerce: int -> float) ``value`` against a simple annotation."""
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
    if tp is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)), float(value) \
            if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is str:
        return isinstance(value, str), value
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


def _build(cls: type, data: Any, path: str, problems: list[str], bad: set[str]) -> Any:
    """``cls`` from a mapping; problems go to ``problems`` and the dotted paths whose value was unusable (so
    their defaults stand in) to ``bad``."""
    if not isinstance(data, dict):
        problems.append(f"{path or 'the config'} must be a mapping of settings (key: value lines), "
                        f"got {type(data).__name__}")
        bad.add(path)
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else key
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(fields)}"
            problems.append(f"{where} is not a setting{hint}")
            continue
        ok, coerced = _coerce(value, hints[key], where, problems, bad)
        if ok:
            kwargs[key] = coerced
    return cls(**kwargs)


def _coerce(value: Any, tp: Any, where: str, problems: list[str], bad: set[str]) -> tuple[bool, Any]:
    if dataclasses.is_dataclass(tp):
        return True, _build(tp, value, where, problems, bad)
    if typing.get_origin(tp) is list and dataclasses.is_dataclass((typing.get_args(tp) or (None,))[0]):
        item_cls = typing.get_args(tp)[0]
        if not isinstance(value, list):
            problems.append(f"{where} must be a list, got {type(value).__name__}")
            bad.add(where)
            return False, None
        return True, [_build(item_cls, v, f"{where}[{i}]", problems, bad) for i, v in enumerate(value)]
    ok, coerced = _type_ok(value, tp)
    if not ok:
        tname = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        problems.append(f"{where} must be {tname}, got {value!r}")
        bad.add(where)
    return ok, coerced


def _set(cfg: ExperimentConfig, dotted: str, value: str, label: str, problems: list[str], bad: set[str]) -> None:
    """Override one setting by its dotted name with a string (parsed as YAML unless the setting is text)."""
    obj: Any = cfg
    *parents, leaf = dotted.split(".")
    for name in parents:
        obj = getattr(obj, name)
    if not dataclasses.is_dataclass(obj):
        raise KeyError(dotted)
    tp = typing.get_type_hints(type(obj))[leaf]
    try:
        parsed: Any = yaml.safe_load(value) if tp not in (str, str | None) else value
        if tp == str | None and value.strip() in ("null", "Null", "NULL", "~"):
            parsed = None  # an optional text setting unset (back to its default), as in YAML
    except yaml.YAMLError:
        parsed = value
    found: list[str] = []
    ok, coerced = _coerce(parsed, tp, dotted, found, bad)
    problems.extend(f"{label} gives an invalid value: {p}" for p in found)
    if ok and not found:
        setattr(obj, leaf, coerced)


def _mentions(problem: str, path: str) -> bool:
    return re.search(rf"(?:^|[\s(]){re.escape(path)}(?=$|[\s.\[:,)])", problem) is not None


def config_from_dict(data: dict[str, Any], *, source: str = "config", env: Mapping[str, str] | None = None,
                     overrides: dict[str, str] | None = None, check_files: bool = True) -> ExperimentConfig:
    """Build, override (environment, then ``overrides`` by dotted path) and validate a config.

    Every problem is reported at once: unknown keys and wrong types, and the value and cross-field rules on
    whatever is usable (a rule about a setting whose value was unusable is not reported twice). A problem
    about a setting the environment or ``--set`` supplied says so."""
    problems: list[str] = []
    bad: set[str] = set()
    cfg = _build(ExperimentConfig, data or {}, "", problems, bad)
    env = os.environ if env is None else env
    origin: dict[str, str] = {}
    for var, dotted in ENV_OVERRIDES.items():
        if env.get(var):
            _set(cfg, dotted, env[var], f"{var} (environment)", problems, bad)
            origin[dotted] = f"{var} in the environment or .env"
    for dotted, value in (overrides or {}).items():
        try:
            _set(cfg, dotted, value, f"--set {dotted}={value}", problems, bad)
            origin[dotted] = f"--set {dotted}"
            bad.discard(dotted)
        except (AttributeError, KeyError):
            problems.append(f"--set {dotted}: no such setting (see agentic_rag/config.py for every dotted name)")
    if "" in bad:  # the file is not a mapping at all: nothing else is worth saying
        raise ConfigError(problems, source)
    for problem in cfg.validate(check_files=check_files, env=env):
        if any(_mentions(problem, path) for path in bad if path):
            continue
        sources = [label for dotted, label in origin.items() if _mentions(problem, dotted)]
        problems.append(problem + (f" (from {sources[0]})" if sources else ""))
    if problems:
        raise ConfigError(problems, source)
    if env.get("RANK", "0") == "0":  # every process of a launch reads the config; one warning per run
        for warning in cfg.off_policy_warnings():
            log.warning(warning)
        for warning in cfg.reward_warnings():
            log.warning(warning)
    if cfg.rollout.repetition_penalty != 1:  # said above, once per run: the rollout's policy need not say it again
        from .rollout.policy import repetition_penalty_warned

        repetition_penalty_warned(cfg.rollout.repetition_penalty)
    return cfg


def load_config(path: str | os.PathLike, *, env: Mapping[str, str] | None = None,
                overrides: dict[str, str] | None = None, check_files: bool = True) -> ExperimentConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"no such config file: {path} (the shipped ones are experiments/training/*.yaml)"],
                          str(path))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"], str(path)) from None
    cfg = config_from_dict(data, source=str(path), env=env, overrides=overrides, check_files=check_files)
    if not cfg.logging.run_name:
        cfg.logging.run_name = path.stem
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def describe(cls: type = ExperimentConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(dotted name, default, help)`` for every setting: the reference table in the docs."""
    rows = []
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, name + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((name, repr(default), f.metadata.get("help", "")))
    return rows
