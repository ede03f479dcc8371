"""FAISS index types for dense retrieval: build them from stored vectors, read them memory-mapped, search shards.

Every type scores by inner product over L2-normalised vectors (cosine similarity), as the flat index always has:

* ``flat``  -- ``IndexFlatIP``: exact; 4·dim bytes a vector, every vector scanned per query.
* ``ivf``   -- ``IndexIVFFlat`` (inverted file, Jégou et al. 2011, "Product quantization for nearest neighbor
  search", section 4): k-means with ``nlist`` centroids trained on a sample; a query scans the ``nprobe`` lists
  whose centroids score highest. Exact inside the lists it scans; ``nprobe = nlist`` is exhaustive search.
* ``ivfpq`` -- ``IndexIVFPQ`` (the same paper's IVFADC): vectors stored as residuals to their centroid, product-
  quantised into ``pq_m`` codes of ``pq_bits`` bits (``pq_m`` bytes a vector at 8 bits). ``opq`` prepends an OPQ
  rotation (Ge et al. 2013, "Optimized product quantization") learnt on the same sample. Approximate twice over:
  the lists scanned and the quantised scores. Polysemous training is off (it only speeds up Hamming filtering,
  which this search does not use, and costs minutes).
* ``hnsw``  -- ``IndexHNSWFlat`` (Malkov & Yashunin 2018, "Hierarchical navigable small world graphs"): a graph
  of ``hnsw_m`` links a node, built with beam ``ef_construction``, searched with beam ``ef_search``; full vectors.
  ``hnsw_storage`` ``sq8`` / ``fp16`` keeps the vectors as 8-bit scalar-quantised codes (``IndexHNSWSQ``; each
  dimension's range learnt on ``train_sample`` vectors) or half floats instead: dim or 2·dim bytes a vector instead
  of 4·dim, and the graph walks on the approximate scores.

Re-ranking (``refine``, ivfpq only): ``IndexRefine`` keeps a second copy of every vector -- ``flat`` (4·dim bytes),
``fp16`` (2·dim) or ``sq8`` (dim) -- and a search takes the ``k_factor``·k best by PQ score, re-scores them with
that copy and returns the k best. This is the IVFADC-R idea of Jégou et al. 2011 (section 4.3 of "Searching in one
billion vectors: re-rank with source coding"), with FAISS's stored-vector refinement in place of that paper's
coded residual. It lifts recall to what the lists scanned hold (PQ alone caps it: 0.47 at 1M, SCALE.md), for the
bytes of the copy; ``k_factor`` is set per search as ``nprobe`` is.

A corpus too large for one file is split into shards of ``shard_size`` vectors (``index-00000.faiss``, ...); a
trained type trains once on a sample of the whole corpus and every shard starts from that trained index, so an
IVF shard probes the same centroids as the unsharded index would and sharded IVF/flat results equal unsharded
ones exactly. Shards are searched together (:class:`FaissShards`) and merged by score.

Reading: ``faiss.read_index(path, IO_FLAG_MMAP_IFC)`` maps the file instead of copying it into memory; with
faiss-cpu 1.15.1 this works for all four types (flat codes, IVF inverted lists, the HNSW graph and its vectors),
so opening takes milliseconds and worker processes share one copy in the page cache. Plain ``IO_FLAG_MMAP``
copies flat and HNSW indexes and ``IO_FLAG_MMAP | IO_FLAG_MMAP_IFC`` fails on IVF (measured), so neither is used.
Where mapping fails (another FAISS version, an index type not listed) the file is read normally, with a log line.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

log = logging.getLogger(__name__)

DENSE_INDEX_TYPES = ("flat", "ivf", "ivfpq", "hnsw")
DEFAULT_NPROBE = 64
DEFAULT_EF_SEARCH = 128
DEFAULT_K_FACTOR = 64  # candidates re-scored a hit when re-ranking (at 1M: 64 gained recall over 32 for 0.3 ms)
DEFAULT_SQ_TRAIN = 65536  # vectors an SQ8 code's per-dimension ranges are learnt on (hnsw_storage sq8)
STORAGES = ("flat", "fp16", "sq8")  # how a refine copy or an HNSW graph's vectors are kept
ADD_BLOCK = 65536  # vectors added to an index per call (bounds the memory of a build from memory-mapped parts)


@dataclass(frozen=True)
class DenseIndexSpec:
    """How to build a FAISS index. Zero means "choose from the corpus size" (see :meth:`resolved`)."""

    kind: str = "flat"
    nlist: int = 0            # ivf, ivfpq: inverted lists; 0 = 4·sqrt(n), at most n/39 (k-means wants 39 points a list)
    pq_m: int = 0             # ivfpq: sub-quantizers, i.e. code bytes a vector at 8 bits; 0 = dim/4; must divide dim
    pq_bits: int = 0          # ivfpq: bits per sub-quantizer code; 0 = 8
    opq: bool = False         # ivfpq: learn an OPQ rotation first
    hnsw_m: int = 0           # hnsw: links per node; 0 = 32
    ef_construction: int = 0  # hnsw: build beam; 0 = 200
    train_sample: int = 0     # ivf, ivfpq: training vectors, drawn uniformly (seed 0); 0 = 40·nlist (and 40·2^bits)
    shard_size: int = 0       # vectors per FAISS file; 0 = one file
    nprobe: int = 0           # ivf, ivfpq: lists scanned a query, the index's default; 0 = 64 (at most nlist)
    ef_search: int = 0        # hnsw: search beam, the index's default; 0 = 128
    refine: str = ""          # ivfpq: re-rank with a copy of the vectors kept as flat, fp16 or sq8; "" = none
    k_factor: int = 0         # ivfpq with refine: candidates re-scored per hit wanted, the default; 0 = 64
    hnsw_storage: str = ""    # hnsw: the graph's vectors as flat, fp16 or sq8; "" = flat

    def __post_init__(self) -> None:
        if self.kind not in DENSE_INDEX_TYPES:
            raise ValueError(f"unknown dense index type {self.kind!r}; choose one of {', '.join(DENSE_INDEX_TYPES)}")
        for name in ("refine", "hnsw_storage"):
            if getattr(self, name) not in ("", *STORAGES):
                raise ValueError(f"--{name.replace('_', '-')} must be one of {', '.join(STORAGES)}, got "
                                 f"{getattr(self, name)!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and value < 0:
                raise ValueError(f"--{f.name.replace('_', '-')} must be >= 0 (0 = automatic), got {value}")
        applies = {"nlist": ("ivf", "ivfpq"), "train_sample": ("ivf", "ivfpq", "hnsw"), "nprobe": ("ivf", "ivfpq"),
                   "pq_m": ("ivfpq",), "pq_bits": ("ivfpq",), "opq": ("ivfpq",),
                   "hnsw_m": ("hnsw",), "ef_construction": ("hnsw",), "ef_search": ("hnsw",),
                   "refine": ("ivfpq",), "k_factor": ("ivfpq",), "hnsw_storage": ("hnsw",)}
        wrong = [name for name, kinds in applies.items() if getattr(self, name) and self.kind not in kinds]
        if wrong:
            opts = ", ".join(f"--{w.replace('_', '-')} (for {'/'.join(applies[w])})" for w in wrong)
            raise ValueError(f"{opts} do(es) not apply to a {self.kind} index: drop it or pick a matching "
                             f"--dense-index")
        if self.kind == "hnsw" and self.train_sample and self.hnsw_storage != "sq8":
            raise ValueError("--train-sample applies to an hnsw index only with --hnsw-storage sq8 (its code "
                             "ranges are learnt); a flat or fp16 graph trains nothing")
        if self.k_factor and not self.refine:
            raise ValueError("--k-factor sets how many candidates re-ranking re-scores: give --refine too")
        if self.pq_bits > 16:
            raise ValueError(f"--pq-bits must be at most 16, got {self.pq_bits}")

    @property
    def trained(self) -> bool:
        return self.kind in ("ivf", "ivfpq") or (self.kind == "hnsw" and self.hnsw_storage == "sq8")

    def resolved(self, n: int, dim: int) -> DenseIndexSpec:
        """Every automatic (zero) parameter replaced by its value for ``n`` vectors of ``dim`` dimensions; ValueError
        (saying what to change) where the vectors are too few for the parameters."""
        if n < 1:
            raise ValueError("cannot build a dense index over 0 vectors")
        spec = self
        if self.kind in ("ivf", "ivfpq"):
            nlist = self.nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
            if nlist > n:
                raise ValueError(f"--nlist {nlist} is more than the {n} vectors to index; use at most {n // 39 or 1}")
            spec = replace(spec, nlist=nlist, nprobe=min(self.nprobe or DEFAULT_NPROBE, nlist))
        if self.kind == "ivfpq":
            pq_m = self.pq_m or max(1, dim // 4)
            if dim % pq_m:
                divisors = [m for m in (8, 16, 32, 48, 64, 96, 128, 192) if dim % m == 0]
                raise ValueError(f"--pq-m {pq_m} does not divide the dimension {dim}; try one of {divisors}")
            spec = replace(spec, pq_m=pq_m, pq_bits=self.pq_bits or 8)
        if self.kind in ("ivf", "ivfpq"):
            wanted = 40 * spec.nlist
            if self.kind == "ivfpq":
                wanted = max(wanted, 40 * 2 ** spec.pq_bits)
            spec = replace(spec, train_sample=min(n, self.train_sample or wanted))
            spec._check_training(n, dim)
        if self.kind == "hnsw":
            spec = replace(spec, hnsw_m=self.hnsw_m or 32, ef_construction=self.ef_construction or 200,
                           ef_search=self.ef_search or DEFAULT_EF_SEARCH, hnsw_storage=self.hnsw_storage or "flat")
            if self.hnsw_storage == "sq8":
                spec = replace(spec, train_sample=min(n, self.train_sample or DEFAULT_SQ_TRAIN))
        if self.refine:
            spec = replace(spec, k_factor=self.k_factor or DEFAULT_K_FACTOR)
        return spec

    def _check_training(self, n: int, dim: int) -> None:
        """Refuse, with the fix, a training sample too small for what it trains. FAISS's k-means raises a bare
        RuntimeError when it has fewer points than centroids, and its OPQ training with fewer points than
        dimensions corrupts the heap and aborts the process (faiss-cpu 1.15.1, measured), so both are caught here."""
        have = f"{self.train_sample} training vectors (of {n} in the corpus)"
        if self.train_sample < self.nlist:
            raise ValueError(f"--nlist {self.nlist} needs at least {self.nlist} training vectors and there are "
                             f"{have}: lower --nlist or raise --train-sample")
        if self.kind == "ivfpq" and self.train_sample < 2 ** self.pq_bits:
            fits = max(1, int(math.log2(self.train_sample)))
            raise ValueError(f"--pq-bits {self.pq_bits} trains {2 ** self.pq_bits} centroids a sub-quantizer, which "
                             f"needs at least that many training vectors, and there are {have}: use --pq-bits "
                             f"{fits} or less, raise --train-sample, or use an ivf, hnsw or flat index")
        if self.kind == "ivfpq" and self.opq and self.train_sample < dim:
            raise ValueError(f"--opq learns a {dim}x{dim} rotation and needs at least {dim} training vectors (the "
                             f"dimension), and there are {have}: raise --train-sample or drop --opq")

    def params(self) -> dict[str, Any]:
        """The parameters that apply to this type (for the manifest)."""
        out = {k: v for k, v in asdict(self).items() if k != "kind"}
        keep = {"flat": (), "ivf": ("nlist", "train_sample", "nprobe"),
                "ivfpq": ("nlist", "pq_m", "pq_bits", "opq", "train_sample", "nprobe")
                + (("refine", "k_factor") if self.refine else ()),
                "hnsw": ("hnsw_m", "ef_construction", "ef_search")
                + (("hnsw_storage",) if self.hnsw_storage not in ("", "flat") else ())
                + (("train_sample",) if self.hnsw_storage == "sq8" else ())}[self.kind]
        return {k: v for k, v in out.items() if k in keep or k == "shard_size"}

    @classmethod
    def from_params(cls, kind: str, params: dict[str, Any]) -> DenseIndexSpec:
        known = {f.name for f in fields(cls)}
        return cls(kind=kind, **{k: v for k, v in params.items() if k in known})

    def factory_string(self) -> str:
        """The FAISS ``index_factory`` name of this (resolved) spec, for people who know FAISS."""
        opq = f"OPQ{self.pq_m}," if self.opq else ""
        refine = {"": "", "flat": ",RFlat", "fp16": ",Refine(SQfp16)", "sq8": ",Refine(SQ8)"}[self.refine]
        storage = {"": ",Flat", "flat": ",Flat", "fp16": "_SQfp16", "sq8": "_SQ8"}[self.hnsw_storage]
        return {"flat": "Flat", "ivf": f"IVF{self.nlist},Flat",
                "ivfpq": f"{opq}IVF{self.nlist},PQ{self.pq_m}x{self.pq_bits}np{refine}",
                "hnsw": f"HNSW{self.hnsw_m}{storage}"}[self.kind]


def _scalar_quantizer(storage: str):
    import faiss

    return {"fp16": faiss.ScalarQuantizer.QT_fp16, "sq8": faiss.ScalarQuantizer.QT_8bit}[storage]


def new_index(spec: DenseIndexSpec, dim: int):
    """An empty FAISS inner-product index for a resolved ``spec`` (untrained for ivf / ivfpq)."""
    import faiss

    ip = faiss.METRIC_INNER_PRODUCT
    if spec.kind == "flat":
        return faiss.IndexFlatIP(dim)
    if spec.kind == "hnsw":
        if spec.hnsw_storage in ("", "flat"):
            index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, ip)
        else:
            index = faiss.IndexHNSWSQ(dim, _scalar_quantizer(spec.hnsw_storage), spec.hnsw_m, ip)
        index.hnsw.efConstruction = spec.ef_construction
        index.hnsw.efSearch = spec.ef_search
        return index
    # The constructors (not index_factory) keep polysemous training off; the Python wrappers hold the quantizer.
    quantizer = faiss.IndexFlatIP(dim)
    if spec.kind == "ivf":
        index = faiss.IndexIVFFlat(quantizer, dim, spec.nlist, ip)
    else:
        index = faiss.IndexIVFPQ(quantizer, dim, spec.nlist, spec.pq_m, spec.pq_bits, ip)
        index.do_polysemous_training = False
    index.nprobe = spec.nprobe
    if spec.kind == "ivfpq" and spec.opq:
        index = faiss.IndexPreTransform(faiss.OPQMatrix(dim, spec.pq_m), index)
    if spec.refine:
        copy = faiss.IndexFlatIP(dim) if spec.refine == "flat" else \
            faiss.IndexScalarQuantizer(dim, _scalar_quantizer(spec.refine), ip)
        index = faiss.IndexRefine(index, copy)  # the wrapper keeps both alive (and trains both)
        index.k_factor = spec.k_factor
    return index


def shard_file_names(n: int, shard_size: int) -> list[str]:
    if not shard_size or shard_size >= n:
        return ["index.faiss"]
    return [f"index-{i:05d}.faiss" for i in range(math.ceil(n / shard_size))]


def build_shards(vectors, spec: DenseIndexSpec, out_dir: str | os.PathLike, *, progress: bool = True) -> list[str]:
    """Build the FAISS file(s) of ``spec`` over ``vectors`` in ``out_dir``; returns their names, in row order.

    ``vectors`` is anything with ``len()``, ``.dim``, ``.rows(start, stop)`` and ``.take(sorted_rows)`` (a
    :class:`~agentic_rag.search.vectors.VectorParts`, or :class:`ArrayVectors` over an array). ``spec`` must be
    resolved. Only one shard's index is in memory at a time (all of it for an unsharded build).
    """
    import faiss

    n, dim = len(vectors), int(vectors.dim)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    template = new_index(spec, dim)
    if spec.trained:
        rows = np.sort(np.random.default_rng(0).choice(n, size=spec.train_sample, replace=False))
        log.info("training %s on %d of %d vectors", spec.factory_string(), len(rows), n)
        template.train(np.ascontiguousarray(vectors.take(rows), dtype=np.float32))
    names = shard_file_names(n, spec.shard_size)
    size = spec.shard_size if len(names) > 1 else n
    with tqdm(total=n, unit="vector", desc=f"dense index ({spec.kind})", disable=not progress) as bar:
        for i, name in enumerate(names):
            index = faiss.clone_index(template) if spec.trained else new_index(spec, dim)
            for start in range(i * size, min(n, (i + 1) * size), ADD_BLOCK):
                stop = min(n, (i + 1) * size, start + ADD_BLOCK)
                index.add(np.ascontiguousarray(vectors.rows(start, stop), dtype=np.float32))
                bar.update(stop - start)
            faiss.write_index(index, str(out_dir / name))
            del index
    return names


@dataclass
class ArrayVectors:
    """An in-memory (or memory-mapped) ``(n, dim)`` array with the interface :func:`build_shards` reads."""

    array: np.ndarray

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @property
    def dim(self) -> int:
        return int(self.array.shape[1])

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.array[start:stop]

    def take(self, rows: np.ndarray) -> np.ndarray:
        return self.array[rows]


def read_index(path: str | os.PathLike, *, mmap: bool = True):
    """Read a FAISS file, memory-mapped when ``mmap`` and FAISS can (see the module docstring), else into memory."""
    import faiss

    if mmap:
        try:
            return faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC)
        except RuntimeError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("FAISS cannot memory-map %s (%s); reading it into memory instead", path, reason[:200])
    return faiss.read_index(str(path))


def index_kind(index) -> str:
    """``flat``, ``ivf``, ``ivfpq``, ``hnsw`` -- or FAISS's class name for any other type."""
    import faiss

    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        ivf = None
    if ivf is not None:
        return "ivfpq" if isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQ) else "ivf"
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexHNSW):
        return "hnsw"
    if isinstance(inner, faiss.IndexFlat):
        return "flat"
    return type(inner).__name__


def refine_of(index):
    """The ``IndexRefine`` wrapping ``index`` (re-ranking, see the module docstring), or None."""
    import faiss

    inner = faiss.downcast_index(index)
    return inner if isinstance(inner, faiss.IndexRefine) else None


def search_parameters(index, *, nprobe: int | None = None, ef_search: int | None = None,
                      k_factor: int | None = None):
    """Per-call FAISS search parameters for ``index`` (None: the index's own). Passed to every ``search`` call,
    so nothing on the shared index changes and concurrent searches with different settings cannot race.

    ``nprobe`` applies to IVF types, ``ef_search`` to HNSW, ``k_factor`` to an index that re-ranks (``refine``);
    one given for another type raises ValueError."""
    import faiss

    kind = index_kind(index)
    refine = refine_of(index)
    if nprobe is not None and (nprobe < 1 or kind not in ("ivf", "ivfpq")):
        raise ValueError(f"nprobe={nprobe} cannot be used: nprobe (>= 1) applies to ivf/ivfpq dense indexes, and this "
                         f"one is {kind}; leave --nprobe out" if kind not in ("ivf", "ivfpq")
                         else f"nprobe must be >= 1, got {nprobe}")
    if ef_search is not None and (ef_search < 1 or kind != "hnsw"):
        raise ValueError(f"ef_search={ef_search} cannot be used: ef_search (>= 1) applies to hnsw dense indexes, and "
                         f"this one is {kind}; leave --ef-search out" if kind != "hnsw"
                         else f"ef_search must be >= 1, got {ef_search}")
    if k_factor is not None and (k_factor < 1 or refine is None):
        raise ValueError(f"k_factor={k_factor} cannot be used: k_factor (>= 1) applies to a dense index built with "
                         f"--refine, and this {kind} index re-ranks nothing; leave --k-factor out" if refine is None
                         else f"k_factor must be >= 1, got {k_factor}")
    if nprobe is not None:
        inner = faiss.SearchParametersIVF()
        inner.nprobe = int(nprobe)
    elif ef_search is not None:
        inner = faiss.SearchParametersHNSW()
        inner.efSearch = int(ef_search)
    else:
        inner = None
    base = refine.base_index if refine is not None else index
    if inner is not None and isinstance(faiss.downcast_index(base), faiss.IndexPreTransform):
        outer = faiss.SearchParametersPreTransform()
        outer.index_params = inner
        outer.referenced_objects = [inner]  # SWIG does not keep the inner object alive
        inner = outer
    if refine is None or (inner is None and k_factor is None):
        return inner
    # IndexRefine takes k_factor from the parameters whenever they are given (default 1), so the index's own
    # k_factor is passed on when only the base's settings change
    params = faiss.IndexRefineSearchParameters(k_factor=float(k_factor if k_factor is not None else refine.k_factor),
                                               base_index_params=inner)
    params.referenced_objects = [inner]
    return params


class FaissShards:
    """Several FAISS files searched as one index: rows numbered across the files in order; each file's top k
    merged by score (ties: lower row first). One file is searched directly; several, on a thread pool (FAISS
    releases the GIL while it searches)."""

    def __init__(self, paths: Sequence[str | os.PathLike], *, mmap: bool = True):
        if not paths:
            raise ValueError("no FAISS files to open")
        self.paths = [Path(p) for p in paths]
        self.indexes = [read_index(p, mmap=mmap) for p in self.paths]
        dims = {int(ix.d) for ix in self.indexes}
        kinds = {index_kind(ix) for ix in self.indexes}
        if len(dims) > 1 or len(kinds) > 1:
            raise ValueError(f"the FAISS shards {[str(p) for p in self.paths]} differ in dimension {sorted(dims)} or "
                             f"type {sorted(kinds)}; they are not one index")
        self.d, self.kind = dims.pop(), kinds.pop()
        self.offsets = np.cumsum([0] + [int(ix.ntotal) for ix in self.indexes])
        self._pool = ThreadPoolExecutor(len(self.indexes), thread_name_prefix="faiss-shard") \
            if len(self.indexes) > 1 else None

    @property
    def ntotal(self) -> int:
        return int(self.offsets[-1])

    def parameters(self, *, nprobe: int | None = None, ef_search: int | None = None, k_factor: int | None = None):
        return search_parameters(self.indexes[0], nprobe=nprobe, ef_search=ef_search, k_factor=k_factor)

    def search(self, queries: np.ndarray, k: int, params=None) -> tuple[np.ndarray, np.ndarray]:
        """Scores and global row numbers, ``(len(queries), k)`` each; -1 rows where fewer than k were found (with
        FAISS's filler score, as in an unsharded search)."""
        x = np.ascontiguousarray(queries, dtype=np.float32)
        if self._pool is None:
            return self.indexes[0].search(x, k, params=params)
        parts = list(self._pool.map(lambda ix: ix.search(x, k, params=params), self.indexes))
        scores = np.concatenate([d for d, _ in parts], axis=1)
        rows = np.concatenate([np.where(i >= 0, i + off, -1) for (_, i), off in zip(parts, self.offsets, strict=False)],
                              axis=1)
        key = np.where(rows >= 0, scores, -np.inf)  # a missing row sorts last whatever score FAISS filled in
        order = np.lexsort((np.where(rows >= 0, rows, np.iinfo(np.int64).max), -key), axis=1)[:, :k]
        # missing rows keep FAISS's own filler score (-FLT_MAX for inner product), as one file's search gives
        return np.take_along_axis(scores, order, axis=1), np.take_along_axis(rows, order, axis=1)

    def nbytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.paths)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
