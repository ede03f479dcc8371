"""What the chat server serves: a policy (base model + optional LoRA adapter), its tokenizer, a searcher,
the dialect, the prompt settings (system prompt, chat template) and the rollout limits, loaded from a
:class:`~.config.ServerConfig` (which holds the adapter's trained settings where the user set none).

Tests and benchmarks pass ``processors`` (a forcing processor makes a tiny random model search and answer
on cue) or a whole ``policy``; everything else is loaded exactly as in production.

The engine searches through :class:`PublicSearchErrors`: a search that fails reaches the model's observation and the
reply's events without the searcher's exception text (a search server's address, a backend's message), which is
logged here instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..rollout.decoding import Processor, SamplingParams
from ..rollout.engine import AgentRollout, RolloutLimits
from ..rollout.policy import HFPolicy, Policy
from ..rollout.protocol import Dialect, get_dialect
from ..search.types import Hit, PartialSearchError, Searcher, SearchError
from .config import ServerConfig

log = logging.getLogger(__name__)

BACKEND_FAILED = "the search backend is unavailable"
QUERY_FAILED = "the search could not answer this query"


class PublicSearchErrors:
    """A searcher whose failures carry no detail: the whole call fails with ``SearchError(BACKEND_FAILED)``, one
    query of a batch with :data:`QUERY_FAILED`; what really happened is logged (WARNING) for the operator. The
    chat server's model would otherwise read the exception text in its observation and could copy it into a reply,
    and the reply's events would show it to the client."""

    def __init__(self, searcher: Searcher):
        self.searcher = searcher

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        try:
            return self.searcher.batch_search(queries, k)
        except PartialSearchError as exc:
            failed = [(q, e) for q, e in zip(queries, exc.errors, strict=False) if e is not None]
            log.warning("search failed for %d of %d queries: %s", len(failed), len(queries),
                        "; ".join(f"{q[:80]!r}: {e}" for q, e in failed[:3]))
            raise PartialSearchError(exc.results, [None if e is None else QUERY_FAILED for e in exc.errors]) from None
        except Exception as exc:  # noqa: BLE001 - the detail goes to the log, the engine gets a generic error
            log.warning("search failed: %s: %s", type(exc).__name__, exc)
            raise SearchError(BACKEND_FAILED) from None


@dataclass
class ChatAgent:
    policy: Policy
    tokenizer: Any
    searcher: Searcher
    dialect: Dialect
    language: str = "en"
    limits: RolloutLimits = field(default_factory=RolloutLimits)
    context_length: int | None = None  # the model's maximum positions, when it says
    info: dict[str, Any] = field(default_factory=dict)
    system: str | None = None  # the system prompt (None: the dialect's)
    chat: bool | None = None  # the chat template (None: when the tokenizer has one)
    summary_mode: str = "replace"

    @classmethod
    def load(cls, config: ServerConfig, *, processors: Sequence[Processor] = (), policy: Policy | None = None,
             tokenizer: Any = None, searcher: Searcher | None = None) -> ChatAgent:
        """Load the tokenizer, the model (+ adapter) and the searcher named by ``config``; given objects win."""
        from ..models import load_causal_lm, load_tokenizer
        from ..search import open_searcher

        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.model)
        context = None
        if policy is None:
            model = load_causal_lm(config.model, adapter=config.adapter or None, dtype=config.dtype,
                                   device=config.device or None)
            policy = HFPolicy(model, tokenizer, SamplingParams(temperature=1.0), return_logprobs=False,
                              max_batch_size=config.max_batch, processors=processors)
            context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
            log.info("loaded model %s%s", config.model, f" + adapter {config.adapter}" if config.adapter else "")
        if searcher is None:
            searcher = open_searcher(config.search_target, config.retriever)
        limits = RolloutLimits(max_turns=config.max_turns, max_searches=config.max_searches,
                               max_tokens_per_turn=config.max_tokens_per_turn,
                               max_completion_tokens=config.max_tokens,
                               passages_per_search=config.passages_per_search,
                               max_observation_tokens=config.max_observation_tokens,
                               on_search_limit=config.on_search_limit)
        if context and config.max_tokens >= context:
            log.info("max_tokens %d does not fit the model's context of %d tokens: a request that sends no "
                     "max_tokens gets what the context leaves after its prompt", config.max_tokens, context)
        info = {"model": config.served_name, "base_model": config.model, "adapter": config.adapter or None,
                "search": config.search_target, "retriever": None if config.search_url else config.retriever,
                "dialect": config.dialect, "system_prompt": config.system_prompt or None,
                "chat_template": config.chat_template}
        return cls(policy, tokenizer, searcher, get_dialect(config.dialect), config.language, limits, context, info,
                   system=config.system_prompt or None, chat=config.chat, summary_mode=config.summary_mode)

    def engine(self) -> AgentRollout:
        searcher = None if self.searcher is None else PublicSearchErrors(self.searcher)
        return AgentRollout(self.policy, self.tokenizer, searcher, self.dialect, self.limits,
                            summary_mode=self.summary_mode)
