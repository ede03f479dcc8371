"""Every scorer's name, defined once: the training rewards and the evaluation metrics are one name space.

A scorer is a way to score a finished trajectory. Some are training rewards (``rewards: [{name: ...}]`` in a
training config, built by :func:`agentic_rag.training.rewards.make_reward`), some are evaluation metrics
(``metrics: [...]`` in an evaluation config, computed by :func:`agentic_rag.evaluation.metrics.example_metrics`),
and the accuracy scorers are both, under the same name. This module holds only the names, what they mean and
the params each reward takes: it imports nothing heavy (no torch, no model code), so a config check, a
``--describe`` or a test can list the names in a blink. The implementations dispatch on these names, and a name
listed here that an implementation lacks fails loudly (see the tests).

* ``em`` (reward, metric): exact match of the normalised answer with a gold answer (the papers' EM);
* ``f1`` (reward, metric): token F1 with the best gold answer (HotpotQA's rule for yes/no);
* ``cover_em`` (reward, metric): the gold is a substring of the answer (FlashRAG's acc, R1-Searcher's ACC_R);
* ``cover_em_tokens`` (reward): cover-EM on whole tokens, a short answer, no list: cover-EM fit to train on;
* ``judge`` (reward, metric): an LLM judge's verdict (ACC_L);
* ``choice`` (reward, metric): the option letter of a multiple-choice answer (MedQA);
* ``format`` (reward): the trajectory's tag format (balanced tags, one answer, no forged tags...);
* ``well_formed`` (metric): ended by answering, with a non-empty answer and no forged environment tag;
* ``retrieval`` (reward): at least one search showed the model a passage;
* ``ragas`` (reward): RAGAS retrieval quality of the passages shown;
* ``overlong`` (reward): DAPO's soft penalty for completions near the token budget.

Names written before they were renamed (``exact_match`` is now ``em``; evaluation's ``format`` metric is now
``well_formed``, since ``format`` is the training reward's name) are in :data:`RENAMED` and
:data:`RENAMED_METRICS`: a config that still says them gets a message naming the new name, and readers of old
``summary.json`` / ``predictions.jsonl`` files (:func:`metric_value`) find the value under the old key.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Scorer:
    """One scorer: its name, what it scores, where it can be used and the params it takes as a reward."""

    name: str
    help: str
    reward: bool = False  # usable as a training reward (``rewards: [{name: ...}]``)
    metric: bool = False  # reported by evaluation (``metrics: [...]``)
    params: Mapping[str, type] = field(default_factory=dict, hash=False)  # the reward's params and their types
    accuracy: bool = False  # scores the answer against the gold answers
    judge_fallback: bool = False  # a local comparison of the answer with the golds that can stand in for the judge
    # "module:function" comparing an answer with the gold answers, ``f(prediction, golds, **params) -> float``: such
    # a scorer needs nothing else to be a training reward (params from the config) and an evaluation metric
    compare: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))


ACCURACY = "agentic_rag.rewards.accuracy"  # where the answer comparisons live

_ALL = (
    Scorer("em", "exact match: the normalised answer equals a normalised gold answer (the papers' EM)",
           reward=True, metric=True, accuracy=True, judge_fallback=True, compare=f"{ACCURACY}:exact_match"),
    Scorer("f1", "token F1 between the normalised answer and the best gold answer (0 on a yes/no/noanswer "
                 "mismatch, as HotpotQA scores it)", reward=True, metric=True, accuracy=True, judge_fallback=True,
           compare=f"{ACCURACY}:f1_score"),
    Scorer("cover_em", "cover-EM: the normalised gold is a substring of the normalised answer (FlashRAG's acc, "
                       "R1-Searcher's ACC_R); for evaluation: as a reward it pays answers that list candidates",
           reward=True, metric=True, accuracy=True, judge_fallback=True, compare=f"{ACCURACY}:cover_exact_match"),
    Scorer("cover_em_tokens", "cover-EM on whole tokens, at most max_extra_tokens more than the gold and no list: "
                              "cover-EM fit to train on", reward=True, params={"max_extra_tokens": int},
           accuracy=True, judge_fallback=True, compare=f"{ACCURACY}:cover_exact_match_tokens"),
    Scorer("judge", "an LLM judge's yes/no verdict on the answer against the gold answers (ACC_L)",
           reward=True, metric=True, accuracy=True),
    Scorer("choice", "multiple choice (MedQA): the option letter read from the answer equals the gold letter",
           reward=True, metric=True, accuracy=True),
    Scorer("format", "the trajectory's tag format: balanced tags, one answer, no forged environment tag, searches "
                     "within bounds, nothing after the answer (1, or partial credit with partial: true)",
           reward=True, params={"partial": bool}),
    Scorer("well_formed", "the trajectory ended by answering (not a limit, EOS or cancellation) with a non-empty "
                          "answer, and the model never wrote an environment-only tag", metric=True),
    Scorer("retrieval", "1 when at least one search showed the model a passage", reward=True),
    Scorer("ragas", "RAGAS retrieval quality of the passages the model was shown (params: metric, fallback)",
           reward=True, params={"metric": str, "fallback": str}),
    Scorer("overlong", "DAPO's soft overlong penalty: 0 up to max_tokens - cache_tokens, falling to -1 at max_tokens",
           reward=True, params={"max_tokens": int, "cache_tokens": int}),
)

SCORERS: Mapping[str, Scorer] = MappingProxyType({s.name: s for s in _ALL})

# names that were renamed: a config still using one is told the new name
RENAMED: Mapping[str, str] = MappingProxyType({"exact_match": "em"})
# evaluation metrics that were renamed: old summary.json and predictions.jsonl files carry the old key
RENAMED_METRICS: Mapping[str, str] = MappingProxyType({"format": "well_formed"})


def reward_names() -> tuple[str, ...]:
    """The names a training config's ``rewards`` may list, in the registry's order."""
    return tuple(s.name for s in _ALL if s.reward)


def metric_names() -> tuple[str, ...]:
    """The names an evaluation config's ``metrics`` may list, in the registry's order."""
    return tuple(s.name for s in _ALL if s.metric)


def accuracy_names() -> tuple[str, ...]:
    """The scorers that score the answer against the gold answers (the rest score the trajectory)."""
    return tuple(s.name for s in _ALL if s.accuracy)


def judge_fallback_names() -> tuple[str, ...]:
    """The scorers that may stand in for a failed LLM judge verdict (``judge.fallback``)."""
    return tuple(s.name for s in _ALL if s.judge_fallback)


def reward_params(name: str) -> dict[str, type]:
    """The params the reward ``name`` takes, with their types (empty when it takes none)."""
    return dict(get_scorer(name, kind="reward").params)


def unknown_name(name: Any, known: tuple[str, ...], kind: str = "scorer") -> str:
    """The message for a name that is not one of ``known``: the known names, a did-you-mean, a rename."""
    renamed = (RENAMED_METRICS.get(str(name)) if kind == "metric" else None) or RENAMED.get(str(name))
    if renamed is not None and renamed in known:
        hint = f" ({name!r} was renamed {renamed!r})"
    else:
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; known {kind}s: {', '.join(known)}"


def get_scorer(name: str, *, kind: str = "scorer") -> Scorer:
    """The scorer called ``name``; ``kind`` ``reward`` or ``metric`` also requires it to be one. An unknown
    name is a ValueError listing the known ones, with a did-you-mean."""
    known = {"scorer": tuple(SCORERS), "reward": reward_names(), "metric": metric_names()}.get(kind)
    if known is None:
        raise ValueError(f"kind must be scorer, reward or metric, got {kind!r}")
    if name not in known:
        raise ValueError(unknown_name(name, known, kind))
    return SCORERS[name]


def metric_value(metrics: Mapping[str, Any], name: str) -> Any:
    """The value of metric ``name`` in a ``metrics`` mapping of a summary or a prediction record, also when the
    file was written before the metric was renamed (``well_formed`` under its old key ``format``)."""
    if name in metrics:
        return metrics[name]
    for old, new in RENAMED_METRICS.items():
        if new == name and old in metrics:
            return metrics[old]
    return None


def compare_fn(name: str) -> Callable[..., float]:
    """The comparison function of scorer ``name`` (:attr:`Scorer.compare`), imported when first asked for."""
    scorer = get_scorer(name)
    if not scorer.compare:
        raise ValueError(f"{name!r} does not compare an answer with gold answers; the ones that do: "
                         f"{', '.join(n for n, s in SCORERS.items() if s.compare)}")
    module, _, attr = scorer.compare.partition(":")
    return getattr(importlib.import_module(module), attr)
