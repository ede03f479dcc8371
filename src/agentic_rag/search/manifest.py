"""The index manifest: what an index directory holds, how it was built, and the checks made on opening it.

An index directory (``agentic-rag index build`` or ``agentic-rag index link``) holds ``manifest.json``::

    {"format_version": 1, "created": "...", "language": "en",
     "corpus":   {"path": ..., "sha256": ..., "size": ..., "passages": N},
     "docstore": {"jsonl": "corpus/passages.jsonl", "offsets": "passages.offsets.npy"} | null,
     "bm25":     {"path": "bm25", "external": false, "k1": 0.9, "b": 0.4, "docs": N} | null,
     "dense":    {"path": "dense/index.faiss", "external": false, "encoder": ..., "encoder_fingerprint": ...,
                  "dim": 384, "docs": N, "faiss_type": "flat", "query_prefix": "", "passage_prefix": "",
                  "docids": null, "params": {"shard_size": 0}, "shards": ["dense/index.faiss"],
                  "vectors": "dense/vectors"} | null,
     "versions": {"agentic_rag": ..., "pyserini": ..., "anserini": ..., "faiss": ...}}

Relative paths are relative to the index directory; ``external`` parts point at indexes built elsewhere
(a Pyserini prebuilt Wikipedia index, say) and are used in place, never copied.

``faiss_type`` is the dense index type (flat, ivf, ivfpq, hnsw) and ``params`` its build parameters and query-time
defaults (:class:`~agentic_rag.search.dense_index.DenseIndexSpec`); ``shards`` lists the FAISS files searched
together (``path`` is the first); ``vectors`` is the kept encoding (:mod:`agentic_rag.search.vectors`) or null.
A manifest written before these three fields existed reads as one flat-or-``faiss_type`` file at ``path``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .types import IndexMismatchError, IndexMissingError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def rebuild_hint(index_dir: str | os.PathLike, corpus: str | None = None, what: str = "--bm25") -> str:
    corpus_arg = corpus or "CORPUS.jsonl"
    return (f"Rebuild it with: agentic-rag index build --corpus {corpus_arg} --out {index_dir} {what} --force\n"
            f"(or point at an index built elsewhere: agentic-rag index link --out {index_dir} "
            f"--lucene LUCENE_DIR | --faiss FAISS_DIR --dense-encoder ENCODER_DIR)")


@dataclass
class BM25Part:
    path: str
    docs: int
    external: bool = False
    k1: float = 0.9
    b: float = 0.4


@dataclass
class DensePart:
    path: str
    docs: int
    encoder: str
    dim: int
    encoder_fingerprint: str = ""
    external: bool = False
    faiss_type: str = "flat"
    query_prefix: str = ""
    passage_prefix: str = ""
    docids: str | None = None  # Pyserini FAISS indexes keep row -> docid in a 'docid' file
    params: dict[str, Any] = field(default_factory=dict)  # DenseIndexSpec.params(): build settings, query defaults
    shards: list[str] = field(default_factory=list)  # FAISS files in row order; empty (older manifests) = [path]
    vectors: str | None = None  # the passage vectors the index was built from, kept for rebuilds

    def shard_paths(self) -> list[str]:
        return list(self.shards) or [self.path]


@dataclass
class IndexManifest:
    corpus: dict[str, Any]
    docstore: dict[str, str] | None = None
    bm25: BM25Part | None = None
    dense: DensePart | None = None
    language: str = "en"
    versions: dict[str, str] = field(default_factory=dict)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False)

    def save(self, index_dir: str | os.PathLike) -> None:
        path = Path(index_dir) / MANIFEST
        tmp = path.with_suffix(".json.partial")
        tmp.write_text(self.to_json() + "\n", encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def load(cls, index_dir: str | os.PathLike) -> IndexManifest:
        index_dir = Path(index_dir)
        path = index_dir / MANIFEST
        if not path.is_file():
            if not index_dir.exists():
                raise IndexMissingError(f"no index at {index_dir}: the directory does not exist.\n"
                                        + rebuild_hint(index_dir))
            if not index_dir.is_dir():
                raise IndexMissingError(f"{index_dir} is a file, not an index directory (agentic-rag index build "
                                        f"--out DIR makes one)")
            looks_lucene = any(p.name.startswith("segments_") for p in index_dir.iterdir())
            if looks_lucene:
                hint = (f"{index_dir} looks like a Lucene index built elsewhere; use it with: agentic-rag index "
                        f"link --out NEW_DIR --lucene {index_dir}")
            elif any(index_dir.iterdir()):  # someone's folder: never suggest building over it
                hint = ("build an index in a folder of its own: agentic-rag index build --corpus CORPUS.jsonl "
                        "--out NEW_DIR --bm25")
            else:
                hint = rebuild_hint(index_dir)
            raise IndexMissingError(f"no index manifest ({MANIFEST}) in {index_dir}: not an index directory.\n{hint}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise IndexMismatchError(f"{path} is not valid JSON ({exc}).\n" + rebuild_hint(index_dir)) from None
        if raw.get("format_version") != FORMAT_VERSION:
            raise IndexMismatchError(
                f"{path} has format_version {raw.get('format_version')!r}; this version of agentic-rag reads "
                f"{FORMAT_VERSION}.\n" + rebuild_hint(index_dir, raw.get("corpus", {}).get("path")))
        raw["bm25"] = BM25Part(**raw["bm25"]) if raw.get("bm25") else None
        raw["dense"] = DensePart(**raw["dense"]) if raw.get("dense") else None
        return cls(**raw)

    def resolve(self, index_dir: str | os.PathLike, rel: str) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else Path(index_dir) / p


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def corpus_record(path: str | os.PathLike, passages: int) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "sha256": file_sha256(path), "size": st.st_size,
            "passages": passages}


def check_corpus_unchanged(manifest: IndexManifest, corpus: str | os.PathLike, index_dir: str | os.PathLike) -> None:
    """Fail if ``corpus`` is not the file the index was built from (size, then checksum)."""
    rec = manifest.corpus
    if os.path.getsize(corpus) != rec.get("size") or file_sha256(corpus) != rec.get("sha256"):
        raise IndexMismatchError(
            f"the index at {index_dir} was built from a different corpus (sha256 {str(rec.get('sha256'))[:12]}..., "
            f"{rec.get('passages')} passages) than {corpus}.\n" + rebuild_hint(index_dir, str(corpus)))


def backend_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("agentic-rag-r1", "pyserini", "faiss-cpu", "sentence-transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    try:
        from .jvm import anserini_jar

        out["anserini"] = anserini_jar().name.removeprefix("anserini-").removesuffix("-fatjar.jar")
    except Exception:
        pass
    return out


def encoder_fingerprint(encoder_dir: str | os.PathLike) -> str:
    """A short hash of an encoder directory's configuration files (detects a different model)."""
    h = hashlib.sha256()
    for name in ("config.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        p = Path(encoder_dir) / name
        if p.is_file():
            h.update(name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]
