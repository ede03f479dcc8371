"""Build an index directory from a corpus, or link indexes built elsewhere.

``build_index`` normalises the corpus into sharded passage JSONL files (the docstore, and Lucene's input:
Anserini indexes one file per thread), then builds a Lucene BM25 index with Anserini's ``IndexCollection``
in a separate Java process (so this process holds no JVM while indexing) and/or a FAISS index with a local
encoder. Everything is written into ``OUT.partial`` and renamed into place at the end, so an interrupted
build never leaves a half-built index under the real name; the passage vectors it had encoded stay in
``OUT.partial/dense/vectors``, and the next build with the same corpus and encoder encodes only the rest.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections import deque
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import UserError, input_dir, input_file
from ..outputs import check_apart, claim_dir, claim_work_dir, mark_dir, output_lock, replace_dir
from .corpus import CorpusStats, Passage, iter_passages
from .dense_index import DenseIndexSpec
from .docstore import DocStore, write_offsets
from .manifest import (
    MANIFEST,
    BM25Part,
    DensePart,
    IndexManifest,
    backend_versions,
    corpus_record,
    encoder_fingerprint,
    file_sha256,
)
from .types import IndexMismatchError, IndexMissingError
from .vectors import DEFAULT_CHUNK

log = logging.getLogger(__name__)

SHARD_PASSAGES = 200_000
LANGUAGES = ("en", "zh")


def _write_shards(corpus: str | os.PathLike, out_dir: Path, fmt: str, skip_bad: bool, chunk_size: int,
                  progress: bool) -> CorpusStats:
    """Normalise the corpus into ``out_dir/passages-NNNNN.jsonl`` files of SHARD_PASSAGES passages."""
    out_dir.mkdir(parents=True)
    stats = CorpusStats(fmt)
    shard, count, f = 0, 0, None
    try:
        for passage in iter_passages(corpus, fmt, skip_bad=skip_bad, chunk_size=chunk_size, stats=stats,
                                     progress=progress):
            if f is None or count == SHARD_PASSAGES:
                if f is not None:
                    f.close()
                    shard += 1
                f = open(out_dir / f"passages-{shard:05d}.jsonl", "w", encoding="utf-8")
                count = 0
            f.write(passage.to_json() + "\n")
            count += 1
    finally:
        if f is not None:
            f.close()
    if stats.passages == 0:
        raise ValueError(f"{corpus}: no passages were read")
    return stats


class ShardedDocStore:
    """A DocStore over the shard files of an index, rows numbered across shards in order."""

    def __init__(self, jsonl_dir: Path, offsets_dir: Path):
        self.shards = [DocStore(p, offsets_dir / (p.stem + ".offsets.npy"))
                       for p in sorted(jsonl_dir.glob("passages-*.jsonl"))]
        self._starts = np.cumsum([0] + [len(s) for s in self.shards])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, row: int) -> Passage:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range for {len(self)} passages")
        s = int(np.searchsorted(self._starts, row, side="right")) - 1
        return self.shards[s][row - int(self._starts[s])]

    def get_many(self, rows: list[int]) -> list[Passage]:
        return [self[r] for r in rows]

    def __iter__(self):
        for s in self.shards:
            for i in range(len(s)):
                yield s[i]


def open_docstore(index_dir: Path, manifest: IndexManifest) -> ShardedDocStore:
    if manifest.docstore is None:
        raise IndexMissingError(f"the index at {index_dir} has no passage store")
    store = ShardedDocStore(manifest.resolve(index_dir, manifest.docstore["jsonl"]),
                            manifest.resolve(index_dir, manifest.docstore["offsets"]))
    if len(store) != manifest.corpus["passages"]:
        raise IndexMismatchError(f"the passage store at {index_dir} holds {len(store)} passages but the "
                                 f"manifest says {manifest.corpus['passages']}; the index is damaged: rebuild it")
    return store


def build_lucene(jsonl_dir: Path, out: Path, *, language: str = "en", threads: int = 2,
                 progress: bool = True, expected_docs: int | None = None) -> int:
    """Run Anserini's IndexCollection in its own Java process; returns the number of documents indexed."""
    from .jvm import anserini_jar, java_executable, jvm_heap

    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; choose one of {', '.join(LANGUAGES)}")
    heap = jvm_heap()  # before anything is written: a bad value is refused by name
    cmd = [str(java_executable()), f"-Xmx{heap}", "-cp", str(anserini_jar()), "io.anserini.index.IndexCollection",
           "-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator",
           "-input", str(jsonl_dir), "-index", str(out), "-threads", str(threads),
           "-storePositions", "-storeDocvectors", "-storeRaw"]
    if language != "en":
        cmd += ["-language", language]  # zh: Lucene's CJK analyzer (bigrams)
    tail: deque[str] = deque(maxlen=40)
    indexed = None
    with tqdm(total=expected_docs, unit="doc", desc="BM25 (Lucene)", disable=not progress) as bar:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            m = re.search(r"([\d,]+) documents indexed", line)
            if m:
                n = int(m.group(1).replace(",", ""))
                bar.update(max(0, n - bar.n))
                if "Indexing Complete" in line:
                    indexed = n
        rc = proc.wait()
    if rc != 0 or indexed is None:
        raise RuntimeError(f"Lucene indexing failed (exit {rc}). Last lines:\n" + "\n".join(tail))
    return indexed


def build_faiss(store, out_dir: Path, encoder, *, spec: DenseIndexSpec, key: dict, chunk: int = DEFAULT_CHUNK,
                progress: bool = True) -> tuple[list[str], DenseIndexSpec]:
    """Encode ``store`` into ``out_dir/vectors`` (resumable: :func:`~agentic_rag.search.vectors.encode_corpus`),
    then build the FAISS file(s) of ``spec`` in ``out_dir``; returns their names and the resolved spec."""
    from .dense_index import build_shards
    from .vectors import encode_corpus

    vectors = encode_corpus(store, encoder, out_dir / "vectors", key=key, chunk=chunk, progress=progress)
    resolved = spec.resolved(len(vectors), vectors.dim)
    names = build_shards(vectors, resolved, out_dir, progress=progress)
    return names, resolved


def build_index(corpus: str | os.PathLike, out: str | os.PathLike, *, bm25: bool = True,
                dense_encoder: str | None = None, language: str = "en", fmt: str = "auto",
                skip_bad: bool = False, chunk_size: int = 100, threads: int | None = None,
                k1: float = 0.9, b: float = 0.4, dense_index: DenseIndexSpec | str = "flat", query_prefix: str = "",
                passage_prefix: str = "", encode_chunk: int = DEFAULT_CHUNK, keep_vectors: bool = True,
                force: bool = False, progress: bool = True, move_aside: bool = False) -> IndexManifest:
    """Build (or reuse, when up to date) the index directory ``out`` from ``corpus``.

    ``out`` must be new, empty or an index (:func:`agentic_rag.outputs.claim_dir`: a folder of the user's is
    refused, or with ``move_aside`` renamed aside), and must not hold the corpus; the old index is replaced only
    once the new one is complete.

    Up to date means the same corpus file, read the same way (format, ``chunk_size`` for KILT pages,
    ``skip_bad``), with the same parts and parameters: see :func:`_stale_reason`.

    Dense: passages are encoded in parts of ``encode_chunk`` into ``OUT.partial/dense/vectors``; a build that
    stops (crash, kill, Ctrl-C) and is started again with the same corpus and encoder keeps those parts and
    encodes only the rest. A rebuild of a finished index for another reason (another ``dense_index``, say)
    reuses the vectors kept in ``OUT/dense/vectors`` (``keep_vectors``; hard links, nothing copied).
    """
    spec = DenseIndexSpec(kind=dense_index) if isinstance(dense_index, str) else dense_index
    if not bm25 and not dense_encoder:
        raise ValueError("nothing to build: pass --bm25 and/or --dense-encoder PATH")
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; choose one of {', '.join(LANGUAGES)}")
    if chunk_size < 1:
        raise ValueError(f"--chunk-words must be >= 1, got {chunk_size}")
    corpus, out = Path(corpus), Path(out)
    input_file(corpus, "--corpus", what="corpus file")
    with output_lock(out, "agentic-rag index build"):  # one build per index: a second is refused, naming this one
        tmp = out.with_name(out.name + ".partial")
        check_apart(out, {"--corpus": corpus})
        check_apart(tmp, {"--corpus": corpus})
        claim_dir(out, "index", move_aside=move_aside)
        claim_work_dir(tmp, ("index", "index-partial"), what="agentic-rag index build", move_aside=move_aside)
        threads = threads or min(8, os.cpu_count() or 1)
        encoder = None
        if dense_encoder:
            from .dense import Encoder

            encoder = Encoder(dense_encoder, query_prefix=query_prefix, passage_prefix=passage_prefix)

        if not force and (out / MANIFEST).is_file():
            try:
                old = IndexManifest.load(out)
            except (IndexMismatchError, IndexMissingError):
                old = None
            stale = "its manifest cannot be read" if old is None else _stale_reason(
                old, corpus, bm25=bm25, encoder=encoder, language=language, fmt=fmt, skip_bad=skip_bad,
                chunk_size=chunk_size, k1=k1, b=b, spec=spec)
            if old is not None and stale is None:
                log.info("index at %s is up to date (same corpus, options and parts); use --force to rebuild", out)
                return old
            log.info("rebuilding the index at %s: %s", out, stale)

        key = _vector_key(corpus, fmt, chunk_size, encoder, passage_prefix) if encoder is not None else None
        _reset_partial(tmp, out, key)
        t0 = time.time()
        stats = _write_shards(corpus, tmp / "corpus", fmt, skip_bad, chunk_size, progress)
        _write_all_offsets(tmp)
        manifest = IndexManifest(corpus=corpus_record(corpus, stats.passages), language=language,
                                 docstore={"jsonl": "corpus", "offsets": "offsets"}, versions=backend_versions())
        manifest.corpus["format"] = stats.format
        manifest.corpus["skipped"] = stats.skipped
        manifest.corpus["skip_bad"] = skip_bad
        manifest.corpus["chunk_words"] = chunk_size
        if bm25:
            n = build_lucene(tmp / "corpus", tmp / "bm25", language=language, threads=threads, progress=progress,
                             expected_docs=stats.passages)
            if n != stats.passages:
                raise RuntimeError(f"Lucene indexed {n} documents but the corpus has {stats.passages} passages")
            manifest.bm25 = BM25Part(path="bm25", docs=n, k1=k1, b=b)
        if encoder is not None:
            store = open_docstore(tmp, manifest)
            names, resolved = build_faiss(store, tmp / "dense", encoder, spec=spec, key=key, chunk=encode_chunk,
                                          progress=progress)
            if not keep_vectors:
                shutil.rmtree(tmp / "dense" / "vectors")
            shards = [f"dense/{name}" for name in names]
            manifest.dense = DensePart(path=shards[0], docs=len(store), encoder=encoder.path, dim=encoder.dim,
                                       encoder_fingerprint=encoder_fingerprint(encoder.path), faiss_type=spec.kind,
                                       query_prefix=query_prefix, passage_prefix=passage_prefix,
                                       params=resolved.params(), shards=shards,
                                       vectors="dense/vectors" if keep_vectors else None)
        manifest.save(tmp)
        mark_dir(tmp, "index")
        replace_dir(tmp, out)  # the old index (this command's own, claimed above) goes only once the new one is whole
        log.info("built %s in %.1fs: %d passages", out, time.time() - t0, stats.passages)
        return manifest


def _vector_key(corpus: Path, fmt: str, chunk_size: int, encoder, passage_prefix: str) -> dict:
    """What determines the passage vectors: the passages (corpus checksum, format as resolved, KILT chunk size)
    and the encoder (its weights and configuration) with its passage prefix."""
    from .corpus import detect_format
    from .vectors import weights_digest

    resolved = detect_format(corpus) if fmt == "auto" else fmt
    return {"corpus_sha256": file_sha256(corpus), "format": resolved,
            "chunk_words": chunk_size if resolved == "kilt" else None,
            "encoder_weights": weights_digest(encoder.path), "encoder_config": encoder_fingerprint(encoder.path),
            "passage_prefix": passage_prefix}


def _reset_partial(tmp: Path, out: Path, key: dict | None) -> None:
    """Empty ``tmp`` (``OUT.partial``) for a new build, keeping the one thing worth keeping: passage vectors
    made for ``key`` -- an interrupted build's (resumed where they stop) or, failing that, the finished vectors
    kept in ``out`` (hard-linked in, so ``out`` stays whole until the final rename)."""
    from .vectors import link_tree, matches

    vectors = tmp / "dense" / "vectors"
    keep = key is not None and matches(vectors, key)
    if tmp.exists():
        for child in tmp.iterdir():
            if child.name == "dense" and keep:
                for sub in child.iterdir():
                    if sub.name != "vectors":
                        shutil.rmtree(sub) if sub.is_dir() else sub.unlink()
            elif child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()
    mark_dir(tmp, "index-partial")
    if keep:
        log.info("keeping the passage vectors of the interrupted build in %s", vectors)
    elif key is not None and matches(out / "dense" / "vectors", key, complete=True):
        log.info("reusing the passage vectors of %s (same corpus and encoder)", out)
        link_tree(out / "dense" / "vectors", vectors)


def _stale_reason(old: IndexManifest, corpus: Path, *, bm25: bool, encoder, language: str, fmt: str,
                  skip_bad: bool, chunk_size: int, k1: float, b: float,
                  spec: DenseIndexSpec | None = None) -> str | None:
    """Why the index ``old`` is not what this build would make (None: it is, nothing to do).

    Corpus options count only where they change the passages: the format as resolved (``auto`` is what
    the file's first record says), the chunk size for KILT pages only, and ``--skip-bad`` only if the old
    build skipped records (a corpus with no bad record reads the same either way).
    """
    from .corpus import detect_format

    if old.corpus.get("sha256") != file_sha256(corpus):
        return "the corpus file changed"
    resolved = detect_format(corpus) if fmt == "auto" else fmt
    if old.corpus.get("format") != resolved:
        return f"corpus format {old.corpus.get('format')} -> {resolved}"
    if resolved == "kilt" and old.corpus.get("chunk_words", 100) != chunk_size:
        return f"chunk size {old.corpus.get('chunk_words', 100)} -> {chunk_size} words"
    if old.corpus.get("skipped", 0) and not skip_bad:
        return f"the old build skipped {old.corpus['skipped']} malformed record(s) and --skip-bad is off"
    if old.language != language:
        return f"language {old.language} -> {language}"
    if bool(old.bm25) != bm25 or (old.bm25 is not None and (old.bm25.k1, old.bm25.b) != (k1, b)):
        return "the BM25 part or its k1/b differ"
    if (encoder is None) != (old.dense is None) or (
            encoder is not None and old.dense.encoder_fingerprint != encoder_fingerprint(encoder.path)):
        return "the dense part or its encoder differ"
    if encoder is not None and spec is not None:
        before = (old.dense.faiss_type, old.dense.params or None)
        wanted = spec.resolved(old.dense.docs, old.dense.dim)
        if before != (wanted.kind, wanted.params() if old.dense.params else None):
            return f"dense index {old.dense.faiss_type} {old.dense.params} -> {wanted.kind} {wanted.params()}"
    return None


def _write_all_offsets(index_dir: Path) -> None:
    (index_dir / "offsets").mkdir(exist_ok=True)
    for shard in sorted((index_dir / "corpus").glob("passages-*.jsonl")):
        write_offsets(shard, index_dir / "offsets" / (shard.stem + ".offsets.npy"), progress=False)


def link_index(out: str | os.PathLike, *, lucene: str | None = None, faiss_dir: str | None = None,
               dense_encoder: str | None = None, corpus: str | None = None, language: str = "en",
               k1: float = 0.9, b: float = 0.4, query_prefix: str = "", passage_prefix: str = "",
               progress: bool = True, move_aside: bool = False) -> IndexManifest:
    """Make an index directory that uses indexes built elsewhere in place (nothing is copied).

    ``lucene``: a Lucene index directory (e.g. a Pyserini prebuilt one). ``faiss_dir``: a Pyserini FAISS
    index directory (``index`` + ``docid`` files) or a ``.faiss`` file, with the ``dense_encoder`` it was
    built with. Passage text comes from ``corpus`` when given (normalised into a docstore here, FAISS row i
    = passage i), otherwise from the stored documents of ``lucene``, found by the ``docid`` file's names.
    Every combination that could not be opened afterwards is refused here, with what to pass instead.
    """
    if not lucene and not faiss_dir:
        raise ValueError("nothing to link: pass --lucene DIR and/or --faiss DIR")
    if lucene:
        input_dir(lucene, "--lucene", what="Lucene index directory")
    if faiss_dir and not Path(faiss_dir).exists():
        raise UserError(f"--faiss {faiss_dir}: no such FAISS directory or file")
    if faiss_dir and not dense_encoder:
        raise ValueError("--faiss needs --dense-encoder: the encoder the FAISS index was built with")
    index_file = docid_file = None
    if faiss_dir:
        fpath = Path(faiss_dir).resolve()
        index_file = fpath / "index" if fpath.is_dir() else fpath
        if not index_file.is_file():
            raise FileNotFoundError(f"no FAISS index at {index_file} (--faiss takes a Pyserini FAISS directory "
                                    f"with 'index' + 'docid' files, or a FAISS index file)")
        docid_file = fpath / "docid" if fpath.is_dir() and (fpath / "docid").is_file() else None
        if not corpus and docid_file is None:
            raise ValueError(f"--faiss {faiss_dir} needs passage text: it has no 'docid' file naming its rows, so "
                             f"the documents of --lucene cannot be matched to them. Pass --corpus FILE, the corpus "
                             f"the FAISS index was built from (row i = passage i)")
        if not corpus and not lucene:
            raise ValueError(f"--faiss {faiss_dir} needs passage text: pass --lucene DIR (the Lucene index that "
                             f"stores the documents its 'docid' file names) or --corpus FILE")
    out = Path(out)
    with output_lock(out, "agentic-rag index link"):
        check_apart(out, {"--lucene": lucene, "--faiss": faiss_dir, "--corpus": corpus})
        claim_dir(out, "index", move_aside=move_aside)
        if corpus:
            input_file(corpus, "--corpus", what="corpus file")
        mark_dir(out, "index")
        manifest = IndexManifest(corpus={"path": None, "sha256": None, "size": None, "passages": None},
                                 language=language, versions=backend_versions())
        if corpus:
            stats = _write_shards(corpus, out / "corpus.partial", "auto", False, 100, progress)
            shutil.rmtree(out / "corpus", ignore_errors=True)
            os.replace(out / "corpus.partial", out / "corpus")
            _write_all_offsets(out)
            manifest.corpus = corpus_record(corpus, stats.passages)
            manifest.docstore = {"jsonl": "corpus", "offsets": "offsets"}
        bm25 = None
        if lucene:
            from .bm25 import BM25Searcher

            lucene_path = Path(lucene).resolve()
            bm25 = BM25Searcher(lucene_path, k1=k1, b=b, language=language)
            docs = bm25.num_docs
            manifest.bm25 = BM25Part(path=str(lucene_path), docs=docs, external=True, k1=k1, b=b)
            if manifest.corpus["passages"] is None:
                manifest.corpus["passages"] = docs
        if index_file is not None:
            from .dense import resolve_encoder
            from .dense_index import index_kind, read_index

            index = read_index(index_file)  # memory-mapped: a 21M-vector index is not read just to count it
            encoder_path = resolve_encoder(dense_encoder)
            manifest.dense = DensePart(path=str(index_file), docs=int(index.ntotal), encoder=encoder_path,
                                       dim=int(index.d),
                                       encoder_fingerprint=encoder_fingerprint(encoder_path)
                                       if os.path.isdir(encoder_path) else "", external=True,
                                       faiss_type=index_kind(index),
                                       query_prefix=query_prefix, passage_prefix=passage_prefix,
                                       docids=str(docid_file) if docid_file else None)
            if manifest.docstore is not None and manifest.corpus["passages"] != index.ntotal:
                raise IndexMismatchError(f"the FAISS index has {index.ntotal} vectors but the corpus has "
                                         f"{manifest.corpus['passages']} passages; pass the corpus it was built from")
            if manifest.docstore is None:  # text from Lucene by docid: check the docid file fits both indexes
                _check_docids(docid_file, int(index.ntotal), bm25)
        manifest.save(out)
        return manifest


def read_docids(docid_file: str | os.PathLike) -> list[str]:
    """The docids of a Pyserini FAISS directory's ``docid`` file, one per FAISS row (blank lines skipped)."""
    with open(docid_file, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def _check_docids(docid_file: Path, rows: int, bm25) -> None:
    docids = read_docids(docid_file)
    if len(docids) != rows:
        raise IndexMismatchError(f"{docid_file} names {len(docids)} rows but the FAISS index holds {rows} "
                                 f"vectors: pass the docid file of this FAISS index")
    for docid in {docids[0], docids[-1]} if docids else ():
        if bm25.doc(docid) is None:
            raise IndexMismatchError(f"{docid_file} names docid {docid!r}, which the Lucene index at "
                                     f"{bm25.lucene_dir} does not hold: link the Lucene index the FAISS index "
                                     f"was built from, or pass --corpus FILE")
