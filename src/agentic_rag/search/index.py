"""Open a searcher over an index directory (or a search server URL), checking the index as it opens."""

from __future__ import annotations

import os
from pathlib import Path

from .build import open_docstore, read_docids
from .cache import CachedSearcher
from .manifest import IndexManifest, check_corpus_unchanged, encoder_fingerprint, rebuild_hint
from .settings import RETRIEVERS, is_url
from .types import IndexMismatchError, IndexMissingError, Searcher

URL_CACHE_SIZE = 10000


def open_searcher(index: str | os.PathLike, retriever: str = "bm25", *, dense_encoder: str | None = None,
                  fusion: str = "weighted", alpha: float = 0.3, depth: int = 50, threads: int | None = None,
                  k1: float | None = None, b: float | None = None, corpus: str | None = None,
                  cache_size: int | None = None, timeout: float = 10.0, retries: int = 3,
                  nprobe: int | None = None, ef_search: int | None = None, k_factor: int | None = None,
                  mmap: bool = True, seed: int = 0) -> Searcher:
    """A :class:`Searcher` for ``index``: an index directory, or the URL of ``agentic-rag serve-search``.

    The index is checked against its manifest (parts present, document counts, encoder); every failure
    raises :class:`IndexMissingError` / :class:`IndexMismatchError` with the command that fixes it.
    ``cache_size`` entries of LRU cache go in front; ``0`` means no cache. Left out (None), a local index
    gets none and a URL gets 10000 (GRPO repeats queries, and each repeat would be a network round trip).

    Dense part: ``nprobe`` (ivf, ivfpq), ``ef_search`` (hnsw) and ``k_factor`` (an index built with ``refine``)
    override the defaults the manifest records;
    ``mmap`` memory-maps the FAISS files (opening takes milliseconds; pages load on first use).
    ``random`` (the ablation of search, :mod:`.random_searcher`) answers from the index's passage store, drawing
    with ``seed``; it needs an index directory (a server searches as it was started).
    """
    if retriever not in RETRIEVERS:
        raise ValueError(f"unknown retriever {retriever!r}; choose one of {', '.join(RETRIEVERS)}")
    if cache_size is not None and cache_size < 0:
        raise ValueError(f"cache_size must be >= 0 (0 = no cache), got {cache_size}")
    tuning = {"nprobe": nprobe, "ef_search": ef_search, "k_factor": k_factor}
    if any(v is not None for v in tuning.values()):
        named = ", ".join(f"{k}={v}" for k, v in tuning.items() if v is not None)
        if is_url(index):
            raise ValueError(f"{named} cannot be set by a client of {index}: the server searches; start it with "
                             f"agentic-rag serve-search --nprobe N / --ef-search N / --k-factor N")
        if retriever == "bm25":
            raise ValueError(f"{named} tune the dense index, and retriever 'bm25' has none: use --retriever dense "
                             f"or hybrid, or leave them out")
    if retriever == "random" and is_url(index):
        raise ValueError(f"retriever 'random' reads an index directory's passage store; {index} is a search server: "
                         f"name the index directory, or start the server with --retriever random")
    if is_url(index):
        from .client import HTTPSearcher

        return HTTPSearcher(str(index), timeout=timeout, retries=retries,
                            cache_size=URL_CACHE_SIZE if cache_size is None else cache_size)
    index_dir = Path(index)
    manifest = IndexManifest.load(index_dir)
    if corpus:
        check_corpus_unchanged(manifest, corpus, index_dir)
    searcher: Searcher
    if retriever == "bm25":
        searcher = _open_bm25(index_dir, manifest, threads, k1, b)
    elif retriever == "random":
        searcher = _open_random(index_dir, manifest, seed)
    elif retriever == "dense":
        searcher = _open_dense(index_dir, manifest, dense_encoder, threads, tuning, mmap)
    else:
        from .hybrid import HybridSearcher

        searcher = HybridSearcher(_open_bm25(index_dir, manifest, threads, k1, b),
                                  _open_dense(index_dir, manifest, dense_encoder, threads, tuning, mmap),
                                  fusion=fusion, alpha=alpha, depth=depth)
    return CachedSearcher(searcher, cache_size) if cache_size else searcher


def _open_bm25(index_dir: Path, manifest: IndexManifest, threads: int | None, k1: float | None,
               b: float | None):
    from .bm25 import BM25Searcher

    part = manifest.bm25
    if part is None:
        raise IndexMissingError(f"the index at {index_dir} has no BM25 part.\n"
                                + rebuild_hint(index_dir, manifest.corpus.get("path"), "--bm25"))
    path = manifest.resolve(index_dir, part.path)
    if not path.is_dir():
        raise IndexMissingError(f"the BM25 index of {index_dir} is missing ({path} does not exist).\n"
                                + rebuild_hint(index_dir, manifest.corpus.get("path"), "--bm25"))
    try:
        searcher = BM25Searcher(path, k1=part.k1 if k1 is None else k1, b=part.b if b is None else b,
                                language=manifest.language, threads=threads)
    except IndexMismatchError as exc:  # Lucene cannot read it: damaged, or written by another Lucene
        hint = rebuild_hint(index_dir, manifest.corpus.get("path"), "--bm25") if not part.external else \
            f"(it was linked from {path}: link a readable Lucene index with agentic-rag index link)"
        raise IndexMismatchError(f"{exc}. The index is damaged or incomplete.\n{hint}") from None
    if searcher.num_docs != part.docs:
        raise IndexMismatchError(f"the BM25 index at {path} holds {searcher.num_docs} documents but the manifest "
                                 f"says {part.docs}.\n" + rebuild_hint(index_dir, manifest.corpus.get("path")))
    return searcher


def _open_random(index_dir: Path, manifest: IndexManifest, seed: int):
    from .random_searcher import RandomSearcher

    if manifest.docstore is None:
        raise IndexMissingError(f"retriever 'random' draws from the index's passage store, and the index at "
                                f"{index_dir} has none (it was linked without a corpus).\n"
                                + rebuild_hint(index_dir, manifest.corpus.get("path")))
    return RandomSearcher(open_docstore(index_dir, manifest), seed=seed)


def _open_dense(index_dir: Path, manifest: IndexManifest, dense_encoder: str | None, threads: int | None,
                tuning: dict[str, int | None] | None = None, mmap: bool = True):
    from .dense import DenseSearcher, Encoder, resolve_encoder

    part = manifest.dense
    hint = rebuild_hint(index_dir, manifest.corpus.get("path"), "--dense-encoder ENCODER_DIR")
    if part is None:
        raise IndexMissingError(f"the index at {index_dir} has no dense part.\n{hint}")
    faiss_paths = [manifest.resolve(index_dir, p) for p in part.shard_paths()]
    for faiss_path in faiss_paths:
        if not faiss_path.is_file():
            raise IndexMissingError(f"the FAISS index of {index_dir} is missing ({faiss_path}).\n{hint}")
    encoder_path = resolve_encoder(dense_encoder) if dense_encoder else part.encoder
    if os.path.isabs(encoder_path) and not os.path.isdir(encoder_path):
        raise IndexMismatchError(
            f"the encoder this index was built with is not at {encoder_path} (was the index moved from another "
            f"machine?). Pass the same encoder with --dense-encoder PATH.")
    if part.encoder_fingerprint and os.path.isdir(encoder_path) \
            and encoder_fingerprint(encoder_path) != part.encoder_fingerprint:
        raise IndexMismatchError(f"the encoder at {encoder_path} is not the one the FAISS index was built with "
                                 f"({part.encoder}); query with that encoder, or rebuild.\n{hint}")
    encoder = Encoder(encoder_path, query_prefix=part.query_prefix, passage_prefix=part.passage_prefix)
    if manifest.docstore is not None:
        store = open_docstore(index_dir, manifest)
        lookup = store.get_many
        if part.docs != len(store):
            raise IndexMismatchError(f"the FAISS index has {part.docs} vectors but the passage store holds "
                                     f"{len(store)}.\n{hint}")
    elif part.docids and manifest.bm25 is not None:
        lookup = _docid_lookup(Path(part.docids), part.docs, _open_bm25(index_dir, manifest, threads, None, None))
    else:
        raise IndexMissingError(f"the dense index at {index_dir} has no passage text source: link it again "
                                f"with --corpus FILE (the corpus the FAISS index was built from, in row order), "
                                f"or with --lucene DIR and a FAISS directory that has a 'docid' file")
    tuning = tuning or {}
    nprobe, ef_search, k_factor = (tuning.get(k) if tuning.get(k) is not None else part.params.get(k)
                                   for k in ("nprobe", "ef_search", "k_factor"))
    searcher = DenseSearcher(encoder, faiss_paths, lookup, nprobe=nprobe, ef_search=ef_search, k_factor=k_factor,
                             mmap=mmap)
    if searcher.num_docs != part.docs:
        where = faiss_paths[0] if len(faiss_paths) == 1 else f"{faiss_paths[0].parent} ({len(faiss_paths)} shards)"
        raise IndexMismatchError(f"the FAISS index at {where} holds {searcher.num_docs} vectors but the "
                                 f"manifest says {part.docs}.\n{hint}")
    return searcher


def _docid_lookup(docid_file: Path, rows: int, bm25):
    """Row -> passage for a Pyserini FAISS index: the 'docid' file names rows, Lucene stores the text."""
    from .corpus import Passage

    docids = read_docids(docid_file)
    if len(docids) != rows:
        raise IndexMismatchError(f"{docid_file} names {len(docids)} rows but the FAISS index holds {rows} "
                                 f"vectors: it is not this index's docid file")

    def lookup(row_ids: list[int]) -> list[Passage]:
        out = []
        for r in row_ids:
            hit = bm25.doc(docids[r])
            out.append(Passage(docids[r], hit.title if hit else "", hit.text if hit else ""))
        return out

    return lookup
