"""The search settings, one shape for training, evaluation and the chat server (``search:`` in every YAML), and the
retriever registry. Imports nothing heavy: a config check reads them before any index opens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..settings import setting

# The retriever registry: every retriever name anywhere (configs, command-line choices) comes from here.
RETRIEVERS = {
    "bm25": "Lucene BM25 over the index's bm25 part",
    "dense": "FAISS inner product over the index's dense part, the query encoded with the index's encoder",
    "hybrid": "BM25 and dense fused (weighted scores, or reciprocal rank fusion)",
    "random": "random passages of the index's passage store, seeded by the query and the run's seed: the ablation "
              "that takes away what a search finds (search/random_searcher.py)",
}


def retriever_names() -> tuple[str, ...]:
    return tuple(RETRIEVERS)


def is_url(index: str) -> bool:
    return str(index).startswith(("http://", "https://"))


@dataclass
class SearchSettings:
    """What the agent searches and how long a search may take."""

    index: str = setting("", "index directory (agentic-rag index build) or search server URL http://... "
                             "(agentic-rag serve-search)")
    retriever: str = setting("bm25", "bm25, dense, hybrid or random (random passages: the ablation of search) over "
                                     "an index directory; a server searches as it was started",
                             choices=retriever_names)
    cache_size: int = setting(10000, "LRU cache entries in front of the searcher (GRPO repeats queries; 0 = off)",
                              min=0)
    timeout_s: float = setting(30.0, "seconds before a search counts as failed (an error observation)",
                               check=lambda v: None if v > 0 else "must be > 0")
    max_failure_rate: float = setting(0.05, "share of a run's search queries that may fail (errors, timeouts) "
                                            "before the run counts as failed: evaluation exits 3 with the count in "
                                            "its summary, training stops", min=0, max=1)

    def problems(self, at: Callable[[str], str]) -> list[str]:
        if self.retriever == "random" and is_url(self.index):
            return [f"{at('retriever')} random reads an index directory's passage store, and {at('index')} is a "
                    f"server ({self.index}): name the index directory, or start the server with --retriever random"]
        return []
