"""The reward functions the trainer hands to TRL, built from the config's reward list.

TRL calls each with ``(prompts, completions, completion_ids, **columns)``: the dataset's columns
(``answers``, ``gold_titles``, ``options``...) and what the rollout returned (``trajectory``, a small view
of each finished trajectory: answer, model-written text, events, finish reason). Each returns one float per
completion, or ``None`` only where it does not apply (no gold titles to judge retrieval against). Each is
logged by TRL under its own name (``rewards/<name>/mean``) and weighted by the config.

The accuracy metrics are :mod:`agentic_rag.rewards.accuracy`'s, the same functions evaluation uses. An LLM
call that fails on a completion (the ``judge`` reward, or an LLM-judged ``ragas`` metric) is logged with a
warning and counted (``rewards/judge/failures``, ``rewards/ragas/failures``), and the completion is scored by
the configured fallback instead (``judge.fallback``; the ragas reward's ``params.fallback``, ``id_recall``
unless set): a failure never silently scores 0 and is never mistaken for "not applicable".

The names are the scorer registry's (:mod:`agentic_rag.rewards.registry`, shared with evaluation's metrics);
:func:`make_reward` builds an answer comparison (a registry scorer with ``compare``) from the registry alone, and
every other reward through :data:`BUILDERS`, one builder per name; a registry name without one fails loudly. The
reward list's names and params are checked with the rest of the training config before any model loads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..rewards import accuracy
from ..rewards.curriculum import Curriculum
from ..rewards.format import check_format, open_at_prompt_end
from ..rewards.rag import LLMEndpoint, RetrievalQuality, contexts_from_events
from ..rewards.registry import compare_fn, get_scorer, judge_fallback_names
from ..rollout.events import search_events, searched_with_hits
from ..rollout.protocol import get_dialect
from .config import ExperimentConfig, RewardSpec, overlong_bounds

log = logging.getLogger(__name__)

Reward = Callable[..., list[float | None]]

def answer_score(name: str) -> Callable[..., float]:
    """The answer-against-golds comparison of registry scorer ``name`` (its ``compare``: em, f1, cover_em,
    cover_em_tokens; also the judge's fallbacks)."""
    return compare_fn(name)


def _answers(kwargs: dict[str, Any], n: int) -> list[list[str]]:
    golds = kwargs.get("answers")
    if golds is None:
        raise ValueError("the training data has no 'answers' column: accuracy rewards need gold answers")
    return [list(g) if isinstance(g, (list, tuple)) else [str(g)] for g in golds][:n]


class _Named:
    """A callable with the ``__name__`` TRL logs it under."""

    def __init__(self, name: str):
        self.__name__ = name


class MetricReward(_Named):
    def __init__(self, name: str, **params: Any):
        super().__init__(name)
        self.metric = answer_score(name)
        self.params = params  # keyword settings of the metric (cover_em_tokens: max_extra_tokens)

    def __call__(self, prompts, completions, completion_ids, trajectory, **kwargs) -> list[float | None]:
        golds = _answers(kwargs, len(trajectory))
        return [self.metric(t["answer"], g, **self.params) if t["answer"] is not None else 0.0
                for t, g in zip(trajectory, golds, strict=True)]


class ChoiceReward(_Named):
    """MedQA: 1 when the answer picks the gold option (letter or option text)."""

    def __init__(self):
        super().__init__("choice")

    def __call__(self, prompts, completions, completion_ids, trajectory, **kwargs) -> list[float | None]:
        letters = kwargs.get("answer_idx")
        options = kwargs.get("options")
        if letters is None or options is None:
            raise ValueError("the choice reward needs 'answer_idx' and 'options' columns (MedQA)")
        return [accuracy.choice_accuracy(t["answer"], [letter], opts)
                for t, letter, opts in zip(trajectory, letters, options, strict=True)]


class FormatReward(_Named):
    def __init__(self, dialect: str, partial: bool = False, eos_tokens: Sequence[str] = ()):
        super().__init__("format")
        self.dialect = get_dialect(dialect)
        self.partial = partial
        self.eos_tokens = list(eos_tokens)

    def report(self, t: dict[str, Any]):
        return check_format(t["model_text"], t["events"], t["finish_reason"], self.dialect,
                            eos_tokens=self.eos_tokens,
                            open_at_start=open_at_prompt_end(t.get("prompt_tail", ""), self.dialect))

    def __call__(self, prompts, completions, completion_ids, trajectory, **kwargs) -> list[float | None]:
        reports = [self.report(t) for t in trajectory]
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            for rule in ("balanced", "one_answer", "no_forged_tags", "searches_in_bounds", "nothing_after_answer",
                         "memory_used_correctly"):
                log_metric(f"format/{rule}", sum(rule in r.violations for r in reports) / max(1, len(reports)))
        return [r.score(self.partial) for r in reports]


class RetrievedReward(_Named):
    """1 when the trajectory was shown at least one passage. (R1-Searcher's stage-1 ``R_retrieval`` counts search
    calls instead, found passages or not: the curriculum reward pays that.)"""

    def __init__(self):
        super().__init__("retrieval")

    def __call__(self, prompts, completions, completion_ids, trajectory, **kwargs) -> list[float | None]:
        return [1.0 if retrieved(t) else 0.0 for t in trajectory]


def retrieved(t: dict[str, Any]) -> bool:
    return searched_with_hits(t["events"])


def search_calls(t: dict[str, Any]) -> int:
    """Retrieval calls the searcher ran (``search`` events), whether or not they found anything; a search
    refused past the limit, with an empty query or whose tool call failed outright is not one."""
    return len(search_events(t["events"]))


class RagasReward(_Named):
    """RAGAS retrieval quality; an LLM metric's failed call falls back to an ID metric and is counted."""

    def __init__(self, metric: str, llm: LLMEndpoint | None, fallback: str = "id_recall", max_concurrency: int = 8):
        super().__init__("ragas")
        self.quality = RetrievalQuality(metric, llm, max_concurrency=max_concurrency, fallback=fallback)
        self.fallback_name = fallback
        from accelerate import PartialState

        if PartialState().is_main_process:  # every process of a launch builds its rewards: one line per run
            log.info("RAGAS reward: %s", self.quality.describe())

    def __call__(self, prompts, completions, completion_ids, trajectory, **kwargs) -> list[float | None]:
        golds = kwargs.get("gold_titles") or [[] for _ in trajectory]
        items = [contexts_from_events(t["events"], t["question"], t["answer"], g)
                 for t, g in zip(trajectory, golds, strict=True)]
        scores = self.quality.score_batch(items)
        if self.quality.fallback is None:
            return scores
        failed = self.quality.last_failures
        if failed:
            log.warning("RAGAS %s failed on %d of %d completions; scored them with %s instead",
                        self.quality.metric_name, failed, len(items), self.fallback_name)
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            log_metric("rewards/ragas/failures", float(failed))
        return scores


class JudgeReward(_Named):
    """LLM-as-judge accuracy; a failed verdict falls back to ``fallback`` and is counted in the logs."""

    def __init__(self, cfg: ExperimentConfig):
        super().__init__("judge")
        from ..rewards.judge import JudgeClient, JudgeSettings

        self.client = JudgeClient(JudgeSettings(base_url=cfg.judge.base_url, model=cfg.judge.model,
                                                api_key_env=cfg.judge.api_key_env, timeout_s=cfg.judge.timeout_s,
                                                max_concurrency=cfg.judge.max_concurrency))
        fallback = cfg.judge.fallback
        if fallback not in judge_fallback_names():
            get_scorer(fallback)  # an unknown or renamed name: the registry's message
            raise ValueError(f"judge.fallback {fallback!r} cannot stand in for the judge; choose one of "
                             f"{', '.join(judge_fallback_names())}")
        self.fallback = answer_score(fallback)
        self.fallback_name = fallback

    def __call__(self, prompts, completions, completion_ids, trajectory, **kwargs) -> list[float | None]:
        golds = _answers(kwargs, len(trajectory))
        from ..rewards.judge import JudgeItem

        items = [JudgeItem(t["question"], g, t["answer"]) for t, g in zip(trajectory, golds, strict=True)]
        verdicts = self.client.judge_batch(items)
        failed = sum(v is None for v in verdicts)
        if failed:
            log.warning("LLM judge failed on %d of %d completions; scored them with %s instead",
                        failed, len(verdicts), self.fallback_name)
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            log_metric("rewards/judge/failures", float(failed))
        return [float(v) if v is not None else self.fallback(t["answer"] or "", g)
                for v, t, g in zip(verdicts, trajectory, golds, strict=True)]


class CurriculumReward(_Named):
    """R1-Searcher's two-stage reward (:mod:`agentic_rag.rewards.curriculum`): stage 1 format + retrieval calls,
    stage 2 the answer's F1 + the format penalty."""

    def __init__(self, cfg: ExperimentConfig, eos_tokens: Sequence[str]):
        super().__init__("curriculum")
        c = cfg.curriculum
        self.curriculum = Curriculum(c.stage2_step, c.retrieval_bonus, c.format_penalty, fixed_stage=c.stage,
                                     format_reward=c.format_reward)
        self.format = FormatReward(cfg.rollout.dialect, eos_tokens=eos_tokens)

    def __call__(self, prompts, completions, completion_ids, trajectory, **kwargs) -> list[float | None]:
        state = kwargs.get("trainer_state")
        step = int(getattr(state, "global_step", 0))
        golds = _answers(kwargs, len(trajectory))
        out = []
        for t, g in zip(trajectory, golds, strict=True):
            report = self.format.report(t)
            out.append(self.curriculum.reward(step, format_ok=report.ok, searches=search_calls(t),
                                              answer_f1=accuracy.f1_score(t["answer"], g) if t["answer"] else 0.0))
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            log_metric("curriculum/stage", float(self.curriculum.stage(step)))
        return out


class OverlongPenalty(_Named):
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), on the length the completion budget counts (every
    completion token, the environment's included): 0 up to ``max_tokens - cache_tokens``, then falling linearly to
    -1 at ``max_tokens``, and -1 beyond. Added to the other rewards with its weight. ``max_tokens`` defaults to
    ``rollout.max_completion_tokens``, ``cache_tokens`` to a fifth of it (DAPO: 4,096 of 20,480)."""

    def __init__(self, max_tokens: int, cache_tokens: int):
        super().__init__("overlong")
        if not 0 < cache_tokens <= max_tokens:
            raise ValueError(f"the overlong reward needs 0 < cache_tokens <= max_tokens, got {cache_tokens} and "
                             f"{max_tokens}")
        self.max_tokens, self.cache_tokens = max_tokens, cache_tokens

    def penalty(self, length: int) -> float:
        free = self.max_tokens - self.cache_tokens
        if length <= free:
            return 0.0
        if length <= self.max_tokens:
            return (free - length) / self.cache_tokens
        return -1.0

    def __call__(self, prompts, completions, completion_ids, trajectory, **kwargs) -> list[float | None]:
        return [self.penalty(len(ids)) for ids in completion_ids]


def build_rewards(cfg: ExperimentConfig, eos_tokens: Sequence[str] = ()) -> tuple[list[Reward], list[float]]:
    """The reward callables and their weights, from the config."""
    if cfg.curriculum.enabled:
        return [CurriculumReward(cfg, eos_tokens)], [1.0]
    funcs: list[Reward] = []
    weights: list[float] = []
    for spec in cfg.rewards:
        funcs.append(make_reward(spec, cfg, eos_tokens))
        weights.append(spec.weight)
    names = [f.__name__ for f in funcs]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"reward names must be unique (they are logged by name); repeated: {sorted(dupes)}")
    return funcs, weights


def _format(spec: RewardSpec, cfg: ExperimentConfig, eos_tokens: Sequence[str]) -> Reward:
    return FormatReward(cfg.rollout.dialect, partial=bool(spec.params.get("partial", False)), eos_tokens=eos_tokens)


def _ragas(spec: RewardSpec, cfg: ExperimentConfig, eos_tokens: Sequence[str]) -> Reward:
    metric = str(spec.params.get("metric", "id_recall"))
    llm = LLMEndpoint(cfg.judge.base_url, cfg.judge.model, cfg.judge.api_key_env, cfg.judge.timeout_s) \
        if cfg.judge.base_url else None
    return RagasReward(metric, llm, fallback=str(spec.params.get("fallback", "id_recall")),
                       max_concurrency=cfg.judge.max_concurrency)


def _overlong(spec: RewardSpec, cfg: ExperimentConfig, eos_tokens: Sequence[str]) -> Reward:
    budget, cache = overlong_bounds(dict(spec.params), cfg.rollout.max_completion_tokens)
    return OverlongPenalty(int(budget), int(cache))


# one builder per reward of the registry that is not an answer comparison (those need none: make_reward)
BUILDERS: dict[str, Callable[[RewardSpec, ExperimentConfig, Sequence[str]], Reward]] = {
    "choice": lambda spec, cfg, eos: ChoiceReward(),
    "judge": lambda spec, cfg, eos: JudgeReward(cfg),
    "format": _format,
    "retrieval": lambda spec, cfg, eos: RetrievedReward(),
    "ragas": _ragas,
    "overlong": _overlong,
}


def make_reward(spec: RewardSpec, cfg: ExperimentConfig, eos_tokens: Sequence[str] = ()) -> Reward:
    """The reward the registry names ``spec.name``, built with its params. An unknown name is a ValueError with
    the known ones; a registry name without a builder here is a bug, and says so."""
    if get_scorer(spec.name, kind="reward").compare:  # an answer comparison: its params are the function's
        return MetricReward(spec.name, **dict(spec.params))
    build = BUILDERS.get(spec.name)
    if build is None:
        raise NotImplementedError(f"reward {spec.name!r} is in the scorer registry (agentic_rag.rewards.registry) "
                                  f"but agentic_rag.training.rewards has no builder for it: add one to BUILDERS")
    return build(spec, cfg, eos_tokens)

