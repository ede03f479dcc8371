"""The settings of a rollout, one shape wherever they are used: the training config, the evaluation config, the
chat server, the engine itself and the settings a trained adapter carries (``agentic_rag.json``) all hold these
same objects, under the same names (``rollout``, ``prompt``, ``sampling``) in every YAML file.

* :class:`RolloutSettings` (``rollout:``): the tag dialect and how a trajectory unfolds and is limited: turns,
  searches and what a search past the limit gets, tokens per turn and in all, passages per search, the length of
  an observation, the summary mode. Part of what a model learns: an adapter records them.
* :class:`PromptSettings` (``prompt:``): how the prompt is built: the system prompt's language, a system prompt of
  your own, the chat template on or off. An adapter records them too (the system prompt written out).
* :class:`SamplingSettings` (``sampling:``): how tokens are drawn, and how many sequences are decoded together.
  Not recorded with an adapter: evaluation is greedy unless told otherwise, training samples.

Importing this module loads no torch (the dialect and language names come from :mod:`.protocol`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..settings import setting
from .protocol import DIALECTS, LANGUAGES

SUMMARY_MODES = ("replace", "keep")
SEARCH_LIMIT_ACTIONS = ("observe", "end")


def dialect_names() -> tuple[str, ...]:
    return tuple(DIALECTS)


def language_names() -> tuple[str, ...]:
    return tuple(LANGUAGES)


@dataclass
class RolloutSettings:
    """How a trajectory unfolds and what limits it; each limit that runs out ends the trajectory with a
    ``finish_reason`` of its name (except ``max_searches`` under ``on_search_limit: observe``)."""

    dialect: str = setting("agentic", "the format the model calls tools in: a tag dialect (agentic, search-r1, "
                                      "r1-searcher) or native (its chat template's own tool calls)",
                           choices=dialect_names)
    max_turns: int = setting(8, "model turns per trajectory", min=1)
    max_searches: int = setting(4, "search actions per trajectory (a failed search counts)", min=0)
    on_search_limit: str = setting("observe", "a search past max_searches: observe = refused with a notice that "
                                              "none are left, and the model may still answer (the notice is "
                                              "environment text, never trained on); end = the trajectory ends "
                                              "there (finish_reason max_searches)", choices=SEARCH_LIMIT_ACTIONS)
    max_tokens_per_turn: int = setting(256, "new model tokens in one turn", min=1)
    max_completion_tokens: int = setting(1024, "all tokens after the prompt, observations included", min=1)
    passages_per_search: int = setting(3, "passages shown per query", min=1)
    max_observation_tokens: int = setting(384, "tokens of one observation (the search results), tags included; "
                                               "longer ones are cut cleanly", min=16)
    summary_mode: str = setting("replace", "replace: a summary restarts the context from it; keep: nothing is "
                                           "dropped", choices=SUMMARY_MODES)
    dedup_passages: bool = setting(True, "a passage the trajectory was already shown is not shown again")

    def problems(self, at: Callable[[str], str]) -> list[str]:
        if self.max_tokens_per_turn > self.max_completion_tokens:
            return [f"{at('max_tokens_per_turn')} ({self.max_tokens_per_turn}) exceeds {at('max_completion_tokens')} "
                    f"({self.max_completion_tokens}): lower it or raise the total"]
        return []


@dataclass
class PromptSettings:
    """How a question becomes the model's prompt."""

    language: str = setting("en", "language of the dialect's system prompt and of a base model's User/Assistant "
                                  "labels: en or zh", choices=language_names)
    system_prompt: str = setting("", "a system prompt of your own instead of the dialect's (empty: the dialect's, "
                                     "in prompt.language)")
    chat_template: bool | None = setting(None, "prompt through the tokenizer's chat template (null: when it has "
                                               "one); false for base models, as R1-Searcher trains Qwen base")

    def system_for(self, dialect: str) -> str:
        """The system prompt this builds for ``dialect``: its own, or the dialect's in ``language``."""
        from .protocol import get_dialect

        return self.system_prompt or get_dialect(dialect).system_prompt(self.language)


@dataclass
class SamplingSettings:
    """How rollout tokens are drawn. The loss scores the full softmax at ``temperature``: top-p, top-k and a
    repetition penalty make samples off-policy for it (training warns)."""

    temperature: float = setting(1.0, "sampling temperature (0 = greedy)", min=0)
    top_p: float = setting(1.0, "nucleus sampling: draw from the smallest set of tokens holding this much "
                                "probability (1 = off)", check=lambda v: None if 0 < v <= 1 else "must be in (0, 1]")
    top_k: int = setting(0, "draw among the k likeliest tokens (0 = off)", min=0)
    repetition_penalty: float = setting(1.0, "penalise tokens already in the context (1 = off)",
                                        check=lambda v: None if v > 0 else "must be > 0")
    max_batch_size: int | None = setting(None, "sequences decoded together (null: all of a batch)", min=1)
