"""The training config (``agentic-rag train``): sections of settings read and checked by the one settings layer
(:mod:`agentic_rag.settings`) before anything loads.

The sections shared with evaluation and the chat server are the same classes under the same names: ``rollout``
(:class:`~agentic_rag.rollout.settings.RolloutSettings`), ``prompt`` (:class:`~agentic_rag.rollout.settings.
PromptSettings`), ``sampling`` (:class:`~agentic_rag.rollout.settings.SamplingSettings`) and ``search``
(:class:`~agentic_rag.search.settings.SearchSettings`); the adapter a run saves records its ``rollout`` and ``prompt``
(``agentic_rag.json``), and evaluation and serving take them from there. Training's own sections: ``model``,
``data``, ``rewards``, ``curriculum``, ``judge``, ``algorithm`` (presets: :mod:`.algorithms`), ``guards``,
``logging``, ``checkpoint``.

Secrets never live here: the judge's API key and the SwanLab key are read from the environment variables named in
the config, at the moment they are needed, and are never logged. ``agentic-rag train --describe`` lists every
setting with its value and help.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..models import PACKAGED_MODELS, model_problem
from ..rewards.rag import ID_METRICS as RAGAS_ID_METRICS
from ..rewards.rag import LLM as RAGAS_LLM_METRICS
from ..rewards.rag import METRICS as RAGAS_METRICS
from ..rewards.registry import judge_fallback_names, reward_names, reward_params, unknown_name
from ..rollout.settings import PromptSettings, RolloutSettings, SamplingSettings
from ..search.settings import SearchSettings, is_url
from ..settings import Loaded, SettingsError, load, section, setting
from ..tools.settings import tools_setting
from .algorithms import DEFAULT_ALGORITHM, algorithm_names, get_preset
from .launch_checks import branching_actions, launch_from_env, launch_problems, local_model_config, tree_mask_problems
from .machine import CPU_AUTOCAST

log = logging.getLogger(__name__)

ConfigError = SettingsError  # the training config's errors are the settings layer's
LR_SCHEDULERS = ("linear", "cosine", "constant")
# environment variables the launch scripts export from .env -> the setting each sets
ENV_OVERRIDES = {
    "MODEL_PATH": "model.name_or_path", "INDEX_DIR": "search.index", "SEARCH_URL": "search.index",
    "JUDGE_BASE_URL": "judge.base_url", "JUDGE_MODEL": "judge.model", "SWANLAB_MODE": "logging.swanlab_mode",
    "SWANLAB_PROJECT": "logging.swanlab_project", "SWANLAB_LOG_DIR": "logging.swanlab_log_dir",
    "OUTPUT_DIR": "checkpoint.output_dir",
}


def _in_unit(v: float) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


@dataclass
class ModelConfig:
    name_or_path: str = setting("", "base model: a local directory, a hub name, a .gguf file or a packaged model "
                                    "(smollm2-135m-instruct) (env MODEL_PATH)")
    tokenizer: str = setting("", "tokenizer directory or hub name (default: the model's)")
    dtype: str = setting("auto", "weights dtype: auto (bf16 on GPUs that have it, else fp32), bfloat16, float16, "
                                 "float32", choices=("auto", "bfloat16", "float16", "float32"))
    quantization: str = setting("none", "none, or nf4 for QLoRA (bitsandbytes 4-bit NF4, double quant, bf16 "
                                        "compute)", choices=("none", "nf4"))
    lora_r: int = setting(16, "LoRA rank", min=1)
    lora_alpha: int = setting(32, "LoRA alpha", min=1)
    lora_dropout: float = setting(0.05, "LoRA dropout", check=_in_unit)
    lora_target_modules: list[str] = setting(["all-linear"], "modules LoRA adapts; 'all-linear' = every linear "
                                                             "layer of the decoder (not the LM head)")
    gradient_checkpointing: bool = setting(True, "recompute activations in the backward pass (less memory, ~30% "
                                                 "slower)")
    cpu_autocast: str = setting("none", "a CPU run's forward and backward passes: none (fp32, the default: the same "
                                        "numbers on every CPU), bf16 (torch.autocast; the weights, the adapter and "
                                        "the optimizer stay fp32; the rollouts decode in fp32), or auto (bf16 where "
                                        "the CPU computes it natively: AVX512-BF16 or AMX; emulated, and slower, "
                                        "elsewhere). Measured on SmolLM2-135M LoRA SFT on a CPU with AVX512-BF16: half "
                                        "the time of fp32 (experiments/wiki/README.md); GRPO's training passes "
                                        "not measured", choices=CPU_AUTOCAST)
    attn_implementation: str = setting("sdpa", "attention kernel: sdpa, eager or flash_attention_2 (not with a "
                                               "dialect whose backtrack/summary branch contexts: their 4D tree mask "
                                               "needs sdpa or eager)", choices=("sdpa", "eager", "flash_attention_2"))
    adapter: str = setting("", "start from this existing LoRA adapter (a peft directory, e.g. a stage-1 run's "
                               "OUTPUT_DIR/final) and keep training it; its rank and target modules replace lora_*. "
                               "Empty: a fresh adapter")

    def problems(self, at: Callable[[str], str]) -> list[str]:
        t = self.lora_target_modules
        if not t or not all(x.strip() for x in t):
            return [f"{at('lora_target_modules')} must name modules (e.g. [q_proj, v_proj]) or be [all-linear], "
                    f"got {t!r}"]
        if "all-linear" in t and len(t) > 1:
            return [f"{at('lora_target_modules')}: all-linear already means every linear layer; list it alone or "
                    f"list module names, got {t!r}"]
        if self.quantization == "nf4" and (self.name_or_path.lower().endswith(".gguf")
                                          or self.name_or_path.lower() in PACKAGED_MODELS):
            return [f"{at('quantization')} is nf4 but {at('name_or_path')} {self.name_or_path!r} is a GGUF model, "
                    f"loaded dequantized to float: set it to none"]
        return []


@dataclass
class DataConfig:
    train_file: str = setting("", "training questions (any format agentic-rag reads: JSONL or JSON list)")
    limit: int | None = setting(None, "use only the first N training questions", min=1)


@dataclass
class RewardSpec:
    name: str = setting("", "reward function (agentic_rag.rewards.registry): " + ", ".join(reward_names()),
                        check=lambda v: None if v in reward_names() else "is " + unknown_name(v, reward_names(),
                                                                                            "reward"))
    weight: float = setting(1.0, "weight in the summed reward",
                            check=lambda v: None if math.isfinite(v) else "must be a finite number")
    params: dict[str, Any] = setting({}, "reward-specific settings: format {partial: bool}; ragas {metric, "
                                         "fallback}; cover_em_tokens {max_extra_tokens: int}; overlong {max_tokens: "
                                         "int, cache_tokens: int}")


@dataclass
class CurriculumConfig:
    enabled: bool = setting(False, "R1-Searcher's two-stage curriculum instead of the plain reward list")
    stage2_step: int = setting(100, "global step from which stage 2 rewards apply (when stage is unset)", min=0)
    stage: int | None = setting(None, "fix the stage: 1 or 2 for the whole run (stage 2 as a second config, "
                                      "usually with model.adapter set to the stage-1 adapter); unset: switch at "
                                      "stage2_step", check=lambda v: None if v in (1, 2) else "must be 1 or 2")
    format_reward: float = setting(0.5, "stage 1: reward for a well-formed trajectory (R1-Searcher's R_format)",
                                   min=0)
    retrieval_bonus: float = setting(0.5, "stage 1: reward for a trajectory that made at least one search call "
                                          "(R1-Searcher's R_retrieval)", min=0)
    format_penalty: float = setting(-2.0, "stage 2: added to the answer's F1 for a malformed trajectory",
                                    check=lambda v: None if v <= 0 else "is paid for a malformed trajectory and "
                                                                        "must be <= 0")

    def problems(self, at: Callable[[str], str]) -> list[str]:
        if self.stage is not None and not self.enabled:
            return [f"{at('stage')} is set but {at('enabled')} is false: enable the curriculum or drop the stage"]
        return []


@dataclass
class JudgeConfig:
    base_url: str = setting("", "OpenAI-compatible endpoint of the LLM judge (env JUDGE_BASE_URL); empty = no judge")
    model: str = setting("", "judge model name (env JUDGE_MODEL)")
    api_key_env: str = setting("JUDGE_API_KEY", "name of the environment variable holding the judge's API key")
    timeout_s: float = setting(30.0, "seconds per judge call", check=lambda v: None if v > 0 else "must be > 0")
    max_concurrency: int = setting(8, "judge calls in flight", min=1)
    fallback: str = setting("cover_em", "score used when the judge fails: " + ", ".join(judge_fallback_names()),
                            choices=judge_fallback_names)

    def problems(self, at: Callable[[str], str]) -> list[str]:
        if self.base_url and not self.model:
            return [f"{at('model')} is empty while {at('base_url')} is set (JUDGE_MODEL in .env)"]
        return []


@dataclass
class AlgorithmConfig:
    name: str = setting(DEFAULT_ALGORITHM, "the RL algorithm preset (agentic_rag.training.algorithms says what each "
                                           "computes and its paper): " + ", ".join(algorithm_names()),
                        choices=algorithm_names)
    num_generations: int = setting(4, "rollouts per question (the group); a group needs two to compare", min=2)
    beta: float = setting(0.0, "KL coefficient against the base model (adapter disabled); 0 = no KL. A k3 term in "
                               "the loss, except for reinforce_pp*: a k1 penalty in each token's reward", min=0)
    epsilon: float | None = setting(None, "clip range below 1 (default: the preset's: 0.2; gspo 3e-4)",
                                    check=lambda v: None if 0 < v < 1 else "must be in (0, 1)")
    epsilon_high: float | None = setting(None, "clip range above 1 (default: the preset's: epsilon; dapo 0.28, "
                                               "gspo 4e-4); for cispo the cap of the importance weight itself "
                                               "(default 5.0)", check=lambda v: None if v > 0 else "must be > 0")
    num_iterations: int = setting(1, "optimisation passes per generation batch", min=1)
    learning_rate: float = setting(1e-5, "peak learning rate of the adapter",
                                   check=lambda v: None if v > 0 else "must be > 0")
    per_device_train_batch_size: int = setting(4, "completions per device per micro-step (a multiple of the "
                                                  "group size divides evenly)", min=1)
    gradient_accumulation_steps: int = setting(1, "micro-steps per optimizer step", min=1)
    max_steps: int = setting(100, "optimizer steps", min=1)
    warmup_ratio: float = setting(0.0, "linear warm-up, as a fraction of max_steps", check=_in_unit)
    lr_scheduler: str = setting("linear", "learning-rate schedule after the warm-up: linear (decays to 0 at "
                                          "max_steps), cosine, or constant (a short run that should not spend its "
                                          "last steps at a near-zero rate)", choices=LR_SCHEDULERS)
    max_grad_norm: float = setting(1.0, "clip the gradient norm to this (0 = no clipping)", min=0)
    mask_truncated_completions: bool | None = setting(None, "exclude trajectories cut by the completion budget "
                                                            "(rollout.max_completion_tokens) from the loss "
                                                            "(default: the preset's; true for dapo)")
    scale_rewards: str | None = setting(None, "divide each advantage by the std of its group's rewards ('group'), "
                                              "of the batch's ('batch'), or not at all ('none'); default: the "
                                              "preset's. Not for reinforce_pp*", choices=("group", "batch", "none"))
    shuffle_rewards: bool = setting(False, "control experiment: permute the rewards within each batch, which keeps "
                                           "their distribution and destroys their signal")
    dynamic_sampling: bool | None = setting(None, "drop the groups whose rewards are all equal (no signal) and roll "
                                                  "out groups of further questions in their place (DAPO); default: "
                                                  "the preset's (on for dapo). Not for reinforce_pp*")
    answer_branching: bool = setting(False, "each group is one question's greedy rollout cut after its answer tag "
                                            "and num_generations answers sampled from there, trained on those "
                                            "answers only: the same searches, the answers compared (the reading "
                                            "signal; experiments/wiki/README.md)")
    max_extra_rollouts: int | None = setting(None, "the most rollouts dynamic sampling draws a process per "
                                                   "generation batch beyond it (default: as many as the batch)",
                                             min=0)

    def problems(self, at: Callable[[str], str]) -> list[str]:
        p: list[str] = []
        if self.name not in algorithm_names():
            return p
        preset = get_preset(self.name)
        per_round = self.per_device_train_batch_size * self.gradient_accumulation_steps
        if self.per_device_train_batch_size % self.num_generations and per_round % self.num_generations:
            p.append(f"{at('per_device_train_batch_size')} x gradient_accumulation_steps "
                     f"({self.per_device_train_batch_size} x {self.gradient_accumulation_steps}) must be a multiple "
                     f"of {at('num_generations')} ({self.num_generations})")
        if self.scale_rewards is not None and preset.kl_in_return:
            p.append(f"{at('scale_rewards')} does not apply to {self.name}: its advantages are whitened over the "
                     f"batch's tokens by the trainer; leave it unset")
        if self.dynamic_sampling and preset.kl_in_return:
            p.append(f"{at('dynamic_sampling')} does not apply to {self.name}: its advantages are normalised over "
                     f"the whole batch, not within groups")
        dynamic = self.dynamic_sampling if self.dynamic_sampling is not None else preset.dynamic_sampling_default
        if dynamic and per_round % self.num_generations:
            p.append(f"{at('dynamic_sampling')} drops and refills whole groups on each process: "
                     f"per_device_train_batch_size x gradient_accumulation_steps ({self.per_device_train_batch_size} "
                     f"x {self.gradient_accumulation_steps}) must be a multiple of {at('num_generations')} "
                     f"({self.num_generations})")
        return p


@dataclass
class LoggingConfig:
    swanlab_mode: str = setting("auto", "auto (default: cloud when SWANLAB_API_KEY is set, else local: the runs "
                                        "`swanlab watch` shows), local, offline (for `swanlab sync` later), cloud "
                                        "(needs SWANLAB_API_KEY) or disabled (env SWANLAB_MODE)",
                                choices=("auto", "offline", "cloud", "local", "disabled"))
    swanlab_project: str = setting("agentic-rag-r1", "SwanLab project (env SWANLAB_PROJECT)")
    swanlab_log_dir: str = setting("", "where local/offline logs go (env SWANLAB_LOG_DIR; default OUTPUT_DIR/"
                                       "swanlog); runs that train at the same time need one each")
    run_name: str = setting("", "run name (default: derived from the config file name)")
    logging_steps: int = setting(1, "log metrics every N steps", min=1)
    sample_table_every: int = setting(10, "log a table of sample trajectories every N steps (0 = never)", min=0)
    sample_table_rows: int = setting(4, "trajectories in each table", min=1)
    validation_file: str = setting("", "questions the current policy is evaluated on greedily every "
                                       "validation_every steps and at the end (eval/em, eval/f1, per kind), in the "
                                       "log, SwanLab and OUTPUT_DIR/validation.jsonl; empty: none")
    validation_every: int = setting(0, "optimizer steps between validation runs (0: only at the start and end)",
                                    min=0)
    validation_limit: int | None = setting(None, "the first N validation questions only (null: all)", min=1)
    validation_at_start: bool = setting(True, "also validate before the first step (the curve's starting point); "
                                              "false when that start was measured already (runs from one SFT "
                                              "adapter), which saves one validation a run")
    validation_at_end: bool = setting(True, "validate after the last step (true: even off the validation_every "
                                            "grid; false: not even on it); false when the final adapter is "
                                            "evaluated anyway (the wiki quick start evaluates every run's "
                                            "final/), which saves one validation a run")


@dataclass
class GuardsConfig:
    min_entropy: float | None = setting(None, "alert when the policy's mean entropy over the tokens it wrote "
                                              "(nats, TRL's logged 'entropy') stays below this; unset: none", min=0)
    min_searches: float | None = setting(None, "alert when the searches per trajectory stay below this; unset: "
                                               "none", min=0)
    max_searches: float | None = setting(None, "alert when the searches per trajectory stay above this (a policy "
                                               "that searches until the limit); unset: none", min=0)
    patience: int = setting(3, "logged steps in a row past a bound before the guard acts", min=1)
    action: str = setting("warn", "warn (a warning and a line in OUTPUT_DIR/guards.jsonl; training goes on) or "
                                  "stop (the same, then training stops and saves its adapter as at a normal end)",
                          choices=("warn", "stop"))

    def problems(self, at: Callable[[str], str]) -> list[str]:
        if self.min_searches is not None and self.max_searches is not None and self.min_searches > self.max_searches:
            return [f"{at('min_searches')} ({self.min_searches}) exceeds {at('max_searches')} ({self.max_searches})"]
        return []


@dataclass
class CheckpointConfig:
    output_dir: str = setting("outputs/run", "checkpoints, logs and the final adapter (env OUTPUT_DIR)")
    save_steps: int = setting(50, "save the adapter and trainer state every N steps", min=1)
    save_total_limit: int | None = setting(3, "keep only the last N checkpoints", min=1)
    resume: bool = setting(False, "continue from the latest complete checkpoint in output_dir (as --resume)")


@dataclass
class ExperimentConfig:
    model: ModelConfig = section(ModelConfig)
    data: DataConfig = section(DataConfig)
    search: SearchSettings = section(SearchSettings)
    tools: list[str | dict] = tools_setting()
    rollout: RolloutSettings = section(RolloutSettings)
    prompt: PromptSettings = section(PromptSettings)
    sampling: SamplingSettings = section(SamplingSettings)
    rewards: list[RewardSpec] = field(
        default_factory=lambda: [RewardSpec("f1", 1.0), RewardSpec("format", 0.2)],
        metadata={"help": "weighted reward functions: a list of {name, weight, params}"})
    curriculum: CurriculumConfig = section(CurriculumConfig)
    judge: JudgeConfig = section(JudgeConfig)
    algorithm: AlgorithmConfig = section(AlgorithmConfig)
    guards: GuardsConfig = section(GuardsConfig)
    logging: LoggingConfig = section(LoggingConfig)
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    seed: int = setting(42, "random seed (data order, sampling, LoRA init)")
    # settings of configs written before the one settings layer -> where they are now (a clear refusal, not a map)
    MOVED: ClassVar[dict[str, str]] = {
        "data.language": "prompt.language", "data.system_prompt": "prompt.system_prompt",
        "model.chat_template": "prompt.chat_template", "rollout.temperature": "sampling.temperature",
        "rollout.top_p": "sampling.top_p", "rollout.top_k": "sampling.top_k",
        "rollout.repetition_penalty": "sampling.repetition_penalty",
        "rollout.max_batch_size": "sampling.max_batch_size"}
    gpu_memory_gb: float | None = setting(None, "per-GPU memory for the fit check before loading (default: "
                                                "detected)", check=lambda v: None if v > 0 else "must be > 0")

    def problems(self, at: Callable[[str], str]) -> list[str]:
        """The rules that join sections (each section checks its own)."""
        p: list[str] = []
        if self.sampling.temperature <= 0:
            p.append(f"sampling.temperature must be > 0 (GRPO samples its rollouts), got {self.sampling.temperature}")
        p.extend(self._reward_problems())
        j = self.judge
        if any(s.name == "judge" for s in self.rewards) and not j.base_url:
            p.append("rewards lists the LLM judge but judge.base_url is empty (JUDGE_BASE_URL in .env)")
        m, r = self.model, self.rollout
        actions = branching_actions(r.dialect, r.summary_mode)
        if actions:
            p.extend(tree_mask_problems(memory=f"rollout.dialect {r.dialect}'s {' and '.join(actions)}",
                                        attn_implementation=m.attn_implementation, model_config=None,
                                        model_name=m.name_or_path))
        return p

    def _reward_problems(self) -> list[str]:
        p: list[str] = []
        if not self.curriculum.enabled and not self.rewards:
            p.append("rewards is empty: list at least one reward (e.g. {name: f1, weight: 1.0})")
        first: dict[str, int] = {}
        for i, spec in enumerate(self.rewards):
            where = f"rewards[{i}]"
            if spec.name in first:
                p.append(f"{where}.name {spec.name!r} repeats rewards[{first[spec.name]}]: rewards are logged by "
                         f"name, so list each one once")
            first.setdefault(spec.name, i)
            if spec.name not in reward_names():
                continue
            known = reward_params(spec.name)
            for key, value in spec.params.items():
                if key not in known:
                    takes = f"it takes {', '.join(known)}" if known else "it takes none"
                    p.append(f"{where}.params.{key} is not a setting of the {spec.name} reward; {takes}")
                elif not isinstance(value, known[key]) or (known[key] is int and isinstance(value, bool)):
                    p.append(f"{where}.params.{key} must be {known[key].__name__}, got {value!r}")
            if spec.name == "ragas":
                p.extend(self._ragas_problems(where, spec.params))
            if spec.name == "overlong":
                budget, cache = overlong_bounds(spec.params, self.rollout.max_completion_tokens)
                if isinstance(budget, int) and isinstance(cache, int):
                    if budget > self.rollout.max_completion_tokens:
                        p.append(f"{where}.params.max_tokens ({budget}) exceeds rollout.max_completion_tokens "
                                 f"({self.rollout.max_completion_tokens}): no completion is ever that long")
                    if not 0 < cache <= budget:
                        p.append(f"{where}.params.cache_tokens must be in 1..max_tokens ({budget}), got {cache}")
            extra = spec.params.get("max_extra_tokens") if spec.name == "cover_em_tokens" else None
            if isinstance(extra, int) and extra < 0:
                p.append(f"{where}.params.max_extra_tokens must be >= 0, got {extra}")
        return p

    def _ragas_problems(self, where: str, params: dict[str, Any]) -> list[str]:
        p: list[str] = []
        metric = params.get("metric", "id_recall")
        if isinstance(metric, str):
            if metric not in RAGAS_METRICS:
                p.append(f"{where}.params.metric must be one of {', '.join(RAGAS_METRICS)}; got {metric!r}")
            if metric == "text_recall":
                p.append(f"{where}.params.metric text_recall needs reference passages, which training questions do "
                         f"not carry (it would never score); use id_recall or id_precision")
            if metric in RAGAS_LLM_METRICS and not self.judge.base_url:
                p.append(f"{where}.params.metric {metric} is judged by an LLM but judge.base_url is empty "
                         f"(JUDGE_BASE_URL in .env); or use a metric without one: {', '.join(RAGAS_ID_METRICS)}")
        fallback = params.get("fallback", "id_recall")
        if isinstance(fallback, str) and fallback not in RAGAS_ID_METRICS:
            p.append(f"{where}.params.fallback must be one of {', '.join(RAGAS_ID_METRICS)}; got {fallback!r}")
        return p

    def reward_warnings(self) -> list[str]:
        """Rewards that run but teach something other than their name says: cover-EM (a substring test, as
        FlashRAG and R1-Searcher evaluate) as a training reward pays answers a policy learns to game."""
        if self.curriculum.enabled:
            return []
        return [f"rewards[{i}] is cover_em, a substring test meant for evaluation: as a training reward it pays "
                f'"nothing" covers "no" and answers that list several candidates ("Paris or Lyon"), which the '
                f"policy learns to write. Use cover_em_tokens (the gold as whole tokens, a short answer, no "
                f"list), f1 or em to train on"
                for i, spec in enumerate(self.rewards) if spec.name == "cover_em"]

    def off_policy_warnings(self) -> list[str]:
        """Sampling settings that draw from another distribution than the one the loss scores: the trainer scores
        every token with the full-softmax ``log_softmax(logits / temperature)`` (as TRL does); top-p, top-k and a
        repetition penalty change which tokens are drawn but not that number, so the importance ratio and the KL
        describe a distribution the samples did not come from. Temperature is not among them."""
        s = self.sampling
        why = ("the loss scores tokens with full-softmax log-probabilities, so the samples are off-policy: the "
               "importance ratio (and the KL) is biased and nothing corrects it")
        found = []
        if s.top_p < 1:
            found.append(f"sampling.top_p={s.top_p:g}: rollouts sample from the top-p nucleus but {why}. Set "
                         f"sampling.top_p: 1.0 for on-policy training")
        if s.top_k > 0:
            found.append(f"sampling.top_k={s.top_k}: rollouts sample among the top-k tokens but {why}. Set "
                         f"sampling.top_k: 0 for on-policy training")
        if s.repetition_penalty != 1:
            found.append(f"sampling.repetition_penalty={s.repetition_penalty:g}: rollouts sample from the "
                         f"penalised distribution but {why}. Set sampling.repetition_penalty: 1.0 for on-policy "
                         f"training")
        return found


def overlong_bounds(params: dict[str, Any], max_completion_tokens: int) -> tuple[Any, Any]:
    """The ``overlong`` reward's ``(max_tokens, cache_tokens)``: its params, else the completion budget and a fifth
    of it (at least 1; DAPO: 4,096 of 20,480)."""
    budget = params.get("max_tokens", max_completion_tokens)
    cache = params.get("cache_tokens", max(1, budget // 5) if isinstance(budget, int) else None)
    return budget, cache


def file_problems(cfg: ExperimentConfig, env: Mapping[str, str]) -> list[str]:
    """What the config names on this machine and how it launches: the model, adapter, question file and index
    exist as what they claim to be, the model can score branched trajectories, the launch is one the rollout runs
    under, and the SwanLab key is there when the cloud is asked for."""
    p: list[str] = []
    m = cfg.model
    if not m.name_or_path:
        p.append("model.name_or_path is empty: set it in the config or MODEL_PATH in .env")
    elif problem := model_problem(m.name_or_path):
        p.append(f"model.name_or_path: {problem}")
    elif branching_actions(cfg.rollout.dialect, cfg.rollout.summary_mode):
        config = local_model_config(m.name_or_path)
        if config is not None:
            actions = branching_actions(cfg.rollout.dialect, cfg.rollout.summary_mode)
            p.extend(tree_mask_problems(memory=f"rollout.dialect {cfg.rollout.dialect}'s {' and '.join(actions)}",
                                        attn_implementation=None, model_config=config, model_name=m.name_or_path))
    if m.tokenizer and (problem := model_problem(m.tokenizer, kind="tokenizer")):
        p.append(f"model.tokenizer: {problem}")
    if m.adapter and not (Path(m.adapter) / "adapter_config.json").is_file():
        p.append(f"model.adapter: no LoRA adapter at {m.adapter} (a peft directory with adapter_config.json, e.g. a "
                 f"stage-1 run's OUTPUT_DIR/final)")
    if cfg.logging.validation_file and not Path(cfg.logging.validation_file).is_file():
        p.append(f"logging.validation_file: no such file {cfg.logging.validation_file}")
    if not cfg.data.train_file:
        p.append("data.train_file is empty: point it at a question file")
    elif not Path(cfg.data.train_file).is_file():
        p.append(f"data.train_file: no such file {cfg.data.train_file}")
    index = cfg.search.index
    if not index:
        p.append("search.index is empty: an index directory or http:// URL (INDEX_DIR or SEARCH_URL in .env)")
    elif not is_url(index) and not (Path(index) / "manifest.json").is_file():
        p.append(f"search.index: no index at {index} (build one: agentic-rag index build --corpus CORPUS --out "
                 f"NEW_DIR)")
    p.extend(launch_problems(**launch_from_env(env)))
    if cfg.logging.swanlab_mode == "cloud" and not env.get("SWANLAB_API_KEY"):
        p.append("logging.swanlab_mode is cloud but SWANLAB_API_KEY is not set (in the environment or .env); set "
                 "it, or use auto/offline")
    return p


def config_from_dict(data: Mapping[str, Any] | None, *, source: str = "config", env: Mapping[str, str] | None = None,
                     overrides: Mapping[str, Any] | Sequence[str] | None = None,
                     check_files: bool = True) -> ExperimentConfig:
    """The config of a YAML tree, with the environment (:data:`ENV_OVERRIDES`) and ``overrides`` (``--set``:
    ``{dotted: value}`` or ``["dotted=value"]``) on top, checked as a whole (:class:`SettingsError`)."""
    return _load(data=data or {}, source=source, env=env, overrides=overrides, check_files=check_files)


def load_config(path: str | os.PathLike, *, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | Sequence[str] | None = None,
                check_files: bool = True) -> ExperimentConfig:
    if not Path(path).is_file() and not Path(path).is_dir():
        raise SettingsError([f"no such config file: {path} (the shipped ones are experiments/training/*.yaml and "
                             f"src/agentic_rag/resources/configs/*.yaml)"], str(path))
    cfg = _load(path=path, source=str(path), env=env, overrides=overrides, check_files=check_files)
    if not cfg.logging.run_name:
        cfg.logging.run_name = Path(path).stem
    return cfg


def resolve_config(*, path: str | os.PathLike | None = None, data: dict[str, Any] | None = None,
                   source: str | None = None, env: Mapping[str, str] | None = None,
                   overrides: Mapping[str, Any] | Sequence[str] | None = None,
                   check_files: bool = True) -> tuple[ExperimentConfig, Loaded]:
    """The config and where each value came from (for ``--describe``); no path and no data: the defaults."""
    env = os.environ if env is None else env
    items = [f"{k}={v}" for k, v in overrides.items()] if isinstance(overrides, Mapping) else list(overrides or [])
    return load(ExperimentConfig, path=path, data=data, env=env, env_vars=ENV_OVERRIDES, overrides=items,
                source=source or (str(path) if path else "training config"),
                extra_problems=(lambda c: file_problems(c, env)) if check_files else None)


def _load(*, path: str | os.PathLike | None = None, data: dict[str, Any] | None = None, source: str,
          env: Mapping[str, str] | None, overrides: Mapping[str, Any] | Sequence[str] | None,
          check_files: bool) -> ExperimentConfig:
    env = os.environ if env is None else env
    cfg, _ = resolve_config(path=path, data=data, source=source, env=env, overrides=overrides,
                            check_files=check_files)
    if env.get("RANK", "0") == "0":  # every process of a launch reads the config; one warning per run
        for warning in cfg.off_policy_warnings() + cfg.reward_warnings():
            log.warning(warning)
    if cfg.sampling.repetition_penalty != 1:  # said above, once per run: the rollout's policy need not say it again
        from ..rollout.policy import repetition_penalty_warned

        repetition_penalty_warned(cfg.sampling.repetition_penalty)
    return cfg
