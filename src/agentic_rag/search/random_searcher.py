"""A searcher that answers every query with random passages of the index: the ablation of a trained agent's search.

``search.retriever: random`` keeps everything about a run (the agent, its prompts, its searches, the observation
layout) and takes away only what a search finds: each query gets ``k`` distinct passages drawn uniformly from the
index's passage store (:func:`~agentic_rag.search.build.open_docstore`). A gain that comes from searching vanishes
under it; one that comes from the format or the model's own knowledge stays.

Reproducible: the draw for a query depends only on the seed and the query text (``random.Random`` seeded with
both; string seeds hash with SHA-512, not Python's salted ``hash``), so the same query gets the same passages in
any batch, order, thread or process, and a cache in front changes nothing. Scores are 0.0 (there is no ranking).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from .types import Hit, clean_query


class RandomSearcher:
    """Random passages of ``store`` (anything with ``len()`` and ``get_many(rows)`` returning passages with
    ``id``, ``title``, ``text``: a :class:`~agentic_rag.search.build.ShardedDocStore`), seeded by ``seed``."""

    def __init__(self, store: Any, seed: int = 0):
        self.store = store
        self.seed = int(seed)

    @property
    def num_docs(self) -> int:
        return len(self.store)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        query = clean_query(query)
        if not query or k <= 0 or not len(self.store):
            return []  # as every searcher: an empty query finds nothing
        rng = random.Random(f"{self.seed}\x00{query}")
        rows = rng.sample(range(len(self.store)), min(k, len(self.store)))
        return [Hit(p.id, p.title, p.text, 0.0) for p in self.store.get_many(rows)]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        return [self.search(q, k) for q in queries]
