"""What the chat server serves: a policy (base model + optional LoRA adapter), its tokenizer, a searcher, and the
rollout and prompt settings, loaded from a :class:`~.config.ServeConfig` (which holds the adapter's trained settings
where the user set none).

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
from ..rollout.engine import AgentRollout
from ..rollout.policy import HFPolicy, Policy
from ..rollout.protocol import Dialect, get_dialect
from ..rollout.settings import PromptSettings, RolloutSettings
from ..search.settings import is_url
from ..search.types import Hit, PartialSearchError, Searcher, SearchError
from .config import ServeConfig

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
    """What the server runs: the policy and its tokenizer, the searcher, and the rollout and prompt settings (the
    same objects the config holds, with the adapter's trained settings where the user set none)."""

    policy: Policy
    tokenizer: Any
    searcher: Searcher
    settings: RolloutSettings = field(default_factory=RolloutSettings)
    prompt: PromptSettings = field(default_factory=PromptSettings)
    search_timeout_s: float = 30.0
    context_length: int | None = None  # the model's maximum positions, when it says
    info: dict[str, Any] = field(default_factory=dict)
    tool_specs: list | None = None  # the config's tools: (None: [search])
    _tools: Any = field(default=None, repr=False)

    @property
    def dialect(self) -> Dialect:
        return get_dialect(self.settings.dialect)

    @classmethod
    def load(cls, config: ServeConfig, *, processors: Sequence[Processor] = (), policy: Policy | None = None,
             tokenizer: Any = None, searcher: Searcher | None = None) -> ChatAgent:
        """Load the tokenizer, the model (+ adapter) and the searcher named by ``config``; given objects win."""
        from ..models import load_causal_lm, load_tokenizer
        from ..search import open_searcher

        m, r = config.model, config.rollout
        if searcher is None:  # first: a dead search target stops the server at start, before the model loads
            from ..search.probe import probe

            searcher = open_searcher(config.search.index, config.search.retriever,
                                     cache_size=config.search.cache_size, timeout=config.search.timeout_s)
            probe(searcher, config.search.index)
        from ..tools.build import build_tools

        # every tool of the tools: section, before the model loads (a broken one stops the server here)
        tools = build_tools(config.tools, searcher=None if searcher is None else PublicSearchErrors(searcher))
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(m.model)
        context = None
        if policy is None:
            model = load_causal_lm(m.model, adapter=m.adapter or None, dtype=m.dtype, device=m.device or None)
            policy = HFPolicy(model, tokenizer, SamplingParams(temperature=1.0), return_logprobs=False,
                              max_batch_size=config.server.max_batch, processors=processors)
            context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
            log.info("loaded model %s%s", m.model, f" + adapter {m.adapter}" if m.adapter else "")
        if context and r.max_completion_tokens >= context:
            log.info("rollout.max_completion_tokens %d does not fit the model's context of %d tokens: a request that "
                     "sends no max_tokens gets what the context leaves after its prompt", r.max_completion_tokens,
                     context)
        info = {"model": config.served_name, "base_model": m.model, "adapter": m.adapter or None,
                "search": config.search.index,
                "retriever": None if is_url(config.search.index) else config.search.retriever,  # a server: its own
                "dialect": r.dialect,
                "system_prompt": config.prompt.system_prompt or None, "chat_template": config.prompt.chat_template}
        info["tools"] = tools.names()
        info["client_tools"] = get_dialect(r.dialect).native  # whether a request may declare tools of its own
        return cls(policy, tokenizer, searcher, r, config.prompt, config.search.timeout_s, context, info,
                   tool_specs=list(config.tools), _tools=tools)

    def engine(self) -> AgentRollout:
        return AgentRollout(self.policy, self.tokenizer, self.tools, self.settings,
                            search_timeout_s=self.search_timeout_s)

    @property
    def tools(self) -> Any:
        """The agent's tools (the config's ``tools:``, built once; search errors as a client may see them)."""
        if self._tools is None:
            from ..tools.build import build_tools

            searcher = None if self.searcher is None else PublicSearchErrors(self.searcher)
            self._tools = build_tools(self.tool_specs, searcher=searcher)
        return self._tools
