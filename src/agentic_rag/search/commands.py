"""Subcommands of the search layer: corpus build, index build/link/info, serve-search.

``search`` and ``eval-retrieval`` read question files, which belong to :mod:`agentic_rag.data`, so they are
registered by :mod:`agentic_rag.evaluation.retrieval_commands` (the search layer imports nothing above it); they
reuse :func:`add_searcher_args` and :func:`open_from_args` from here."""

from __future__ import annotations

import argparse
import json
import sys

from ..argtypes import non_negative_float, non_negative_int, port, positive_float, positive_int, unit_float
from ..outputs import add_move_aside
from .settings import RETRIEVERS, retriever_names


def add_searcher_args(p: argparse.ArgumentParser) -> None:
    """The options that pick and tune a searcher, shared by every command that searches."""
    p.add_argument("--index", required=True, help="index directory (agentic-rag index build) or search server URL")
    p.add_argument("--retriever", default="bm25", choices=retriever_names(),
                   help="; ".join(f"{name}: {text}" for name, text in RETRIEVERS.items()))
    p.add_argument("--dense-encoder", default=None,
                   help="override the encoder recorded in the index (same model, another path)")
    p.add_argument("--fusion", default="weighted", choices=["rrf", "weighted"], help="hybrid fusion method")
    p.add_argument("--alpha", type=unit_float, default=0.3, help="hybrid: weight of the dense run (0..1)")
    p.add_argument("--depth", type=positive_int, default=50, help="hybrid: candidates taken from each part")
    p.add_argument("--threads", type=positive_int, default=None, help="Lucene threads for batch search")
    p.add_argument("--k1", type=non_negative_float, default=None, help="BM25 k1 (default: the index's, 0.9)")
    p.add_argument("--b", type=unit_float, default=None, help="BM25 b (default: the index's, 0.4)")
    p.add_argument("--nprobe", type=positive_int, default=None,
                   help="ivf/ivfpq dense index: inverted lists scanned a query (default: the index's, 64)")
    p.add_argument("--ef-search", type=positive_int, default=None,
                   help="hnsw dense index: search beam width (default: the index's, 128)")
    p.add_argument("--k-factor", type=positive_int, default=None,
                   help="dense index built with --refine: candidates re-scored per hit (default: the index's, 64)")
    p.add_argument("--no-mmap", dest="mmap", action="store_false",
                   help="read the FAISS index into memory instead of memory-mapping it")


def searcher_options(args: argparse.Namespace, cache_size: int = 0) -> dict:
    """:func:`~agentic_rag.search.index.open_searcher`'s keyword arguments from :func:`add_searcher_args`' options."""
    return {"index": str(args.index), "retriever": args.retriever, "dense_encoder": args.dense_encoder,
            "fusion": args.fusion, "alpha": args.alpha, "depth": args.depth, "threads": args.threads,
            "k1": args.k1, "b": args.b, "cache_size": cache_size, "nprobe": args.nprobe,
            "ef_search": args.ef_search, "k_factor": args.k_factor, "mmap": args.mmap}


def open_from_args(args: argparse.Namespace, cache_size: int = 0):
    """The searcher named by :func:`add_searcher_args`' options."""
    from .index import open_searcher

    return open_searcher(**searcher_options(args, cache_size))


# ------------------------------------------------------------------------------------------- corpus


def cmd_corpus_build(args: argparse.Namespace) -> int:
    from .corpus import build_corpus

    stats = build_corpus(args.input, args.out, args.format, skip_bad=args.skip_bad, chunk_size=args.chunk_words)
    print(json.dumps({"out": str(args.out), **stats.to_dict()}))
    if stats.skipped:
        print(f"skipped {stats.skipped} malformed record(s) (--skip-bad)", file=sys.stderr)
    return 0


# -------------------------------------------------------------------------------------------- index


def cmd_index_build(args: argparse.Namespace) -> int:
    from .build import build_index

    bm25 = args.bm25 or not args.dense_encoder  # BM25 by default when nothing is named
    from .dense_index import DenseIndexSpec

    spec = DenseIndexSpec(kind=args.dense_index, nlist=args.nlist, pq_m=args.pq_m, pq_bits=args.pq_bits,
                          opq=args.opq, hnsw_m=args.hnsw_m, ef_construction=args.ef_construction,
                          train_sample=args.train_sample, shard_size=args.shard_size, refine=args.refine,
                          k_factor=args.k_factor, hnsw_storage=args.hnsw_storage)
    m = build_index(args.corpus, args.out, bm25=bm25, dense_encoder=args.dense_encoder, language=args.language,
                    fmt=args.format, skip_bad=args.skip_bad, chunk_size=args.chunk_words, threads=args.threads,
                    k1=args.k1, b=args.b, dense_index=spec, query_prefix=args.query_prefix,
                    passage_prefix=args.passage_prefix, encode_chunk=args.encode_chunk,
                    keep_vectors=args.keep_vectors, force=args.force, move_aside=args.move_aside)
    skipped = int(m.corpus.get("skipped") or 0)
    summary = {"index": str(args.out), "passages": m.corpus["passages"], "skipped": skipped,
               "bm25": m.bm25 is not None, "dense": m.dense is not None}
    if m.dense is not None:
        summary["dense_index"] = {"type": m.dense.faiss_type, **m.dense.params}
    print(json.dumps(summary))
    if skipped:
        print(f"skipped {skipped} malformed record(s) (--skip-bad)", file=sys.stderr)
    return 0


def cmd_index_link(args: argparse.Namespace) -> int:
    from .build import link_index

    m = link_index(args.out, lucene=args.lucene, faiss_dir=args.faiss, dense_encoder=args.dense_encoder,
                   corpus=args.corpus, language=args.language, query_prefix=args.query_prefix,
                   passage_prefix=args.passage_prefix, move_aside=args.move_aside)
    print(json.dumps({"index": str(args.out), "passages": m.corpus["passages"], "bm25": m.bm25 is not None,
                      "dense": m.dense is not None}))
    return 0


def cmd_index_info(args: argparse.Namespace) -> int:
    from .manifest import IndexManifest, check_corpus_unchanged

    m = IndexManifest.load(args.index)
    if args.corpus:
        check_corpus_unchanged(m, args.corpus, args.index)
    print(m.to_json())
    return 0


# ------------------------------------------------------------------------------------------- search


def cmd_serve_search(args: argparse.Namespace) -> int:
    from ..http_guard import DEFAULT_CLIENT_TIMEOUT_S
    from .server import ServerLimits, serve, serve_workers

    limits = ServerLimits(max_k=args.max_k, max_batch=args.max_batch,
                          client_timeout_s=args.client_timeout_s or DEFAULT_CLIENT_TIMEOUT_S)
    info = {"index": str(args.index), "retriever": args.retriever}
    if args.workers > 1:
        print(f"serving {args.retriever} search over {args.index} on http://{args.host}:{args.port} with "
              f"{args.workers} worker processes", file=sys.stderr)
        return serve_workers(searcher_options(args, cache_size=args.cache_size), args.host, args.port,
                             workers=args.workers, limits=limits, info=info, shutdown_grace_s=args.shutdown_grace_s)
    searcher = open_from_args(args, cache_size=args.cache_size)
    print(f"serving {args.retriever} search over {args.index} on http://{args.host}:{args.port}", file=sys.stderr)
    serve(searcher, args.host, args.port, limits=limits, info=info, shutdown_grace_s=args.shutdown_grace_s)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("corpus", help="corpus tools")
    csub = p.add_subparsers(dest="corpus_command", metavar="SUBCOMMAND", required=True)
    b = csub.add_parser("build", help="normalise a corpus into passage JSONL (id, title, text, contents)")
    b.add_argument("--input", required=True, help="corpus file")
    b.add_argument("--format", default="auto", choices=["auto", "json-list", "pyserini-jsonl", "kilt", "hotpot"])
    b.add_argument("--out", required=True, help="output JSONL")
    b.add_argument("--skip-bad", action="store_true", help="skip and count malformed records instead of failing")
    b.add_argument("--chunk-words", type=positive_int, default=100, help="KILT: words per passage")
    b.set_defaults(func=cmd_corpus_build)

    p = sub.add_parser("index", help="index tools")
    isub = p.add_subparsers(dest="index_command", metavar="SUBCOMMAND", required=True)
    b = isub.add_parser("build", help="build a BM25 (Lucene) and/or dense (FAISS) index from a corpus")
    b.add_argument("--corpus", required=True, help="corpus file in any format 'corpus build' reads")
    b.add_argument("--out", required=True, help="index directory")
    b.add_argument("--bm25", action="store_true", help="build the Lucene BM25 index (default if no encoder)")
    b.add_argument("--dense-encoder", default=None,
                   help="encoder directory (sentence-transformers) for a FAISS index; 'minilm' = bundled MiniLM")
    b.add_argument("--language", default="en", choices=["en", "zh"], help="zh: Lucene's CJK analyzer")
    b.add_argument("--format", default="auto", choices=["auto", "json-list", "pyserini-jsonl", "kilt", "hotpot"])
    b.add_argument("--skip-bad", action="store_true", help="skip and count malformed records instead of failing")
    b.add_argument("--chunk-words", type=positive_int, default=100, help="KILT: words per passage")
    b.add_argument("--threads", type=positive_int, default=None)
    b.add_argument("--k1", type=non_negative_float, default=0.9)
    b.add_argument("--b", type=unit_float, default=0.4)
    b.add_argument("--dense-index", "--faiss-type", dest="dense_index", default="flat",
                   choices=["flat", "ivf", "ivfpq", "hnsw"],
                   help="FAISS index type: flat (exact), ivf, ivfpq (compressed), hnsw (graph); all inner product")
    b.add_argument("--nlist", type=non_negative_int, default=0, help="ivf/ivfpq: inverted lists (0: 4*sqrt(passages))")
    b.add_argument("--pq-m", type=non_negative_int, default=0,
                   help="ivfpq: code bytes a vector; must divide the dim (0: dim/4)")
    b.add_argument("--pq-bits", type=non_negative_int, default=0, help="ivfpq: bits per sub-quantizer code (0: 8)")
    b.add_argument("--opq", action="store_true", help="ivfpq: learn an OPQ rotation before quantizing")
    b.add_argument("--hnsw-m", type=non_negative_int, default=0, help="hnsw: links per node (0: 32)")
    b.add_argument("--ef-construction", type=non_negative_int, default=0, help="hnsw: build beam width (0: 200)")
    b.add_argument("--hnsw-storage", default="", choices=["", "flat", "fp16", "sq8"],
                   help="hnsw: the graph's vectors as float32 (flat, the default), half floats or 8-bit codes")
    b.add_argument("--refine", default="", choices=["", "flat", "fp16", "sq8"],
                   help="ivfpq: keep a copy of the vectors (float32, half floats or 8-bit codes) and re-rank the "
                        "PQ candidates with it")
    b.add_argument("--k-factor", type=non_negative_int, default=0,
                   help="ivfpq with --refine: candidates re-scored per hit wanted (0: 64); --k-factor at search "
                        "time overrides it")
    b.add_argument("--train-sample", type=non_negative_int, default=0,
                   help="ivf/ivfpq: vectors to train on, drawn uniformly (0: 40 per list, at least 40*2^pq-bits); "
                        "hnsw with --hnsw-storage sq8: vectors its code ranges are learnt on (0: 65536)")
    b.add_argument("--shard-size", type=non_negative_int, default=0,
                   help="vectors per FAISS file; the files are searched together (0: one file)")
    b.add_argument("--encode-chunk", type=positive_int, default=50000,
                   help="passages per saved part of the encoding (an interrupted build resumes at a part)")
    b.add_argument("--keep-vectors", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the passage vectors in DIR/dense/vectors, so a rebuild with another index type "
                        "does not encode again (4*dim bytes a passage)")
    b.add_argument("--query-prefix", default="", help="dense: prefix for queries (e5: 'query: ')")
    b.add_argument("--passage-prefix", default="", help="dense: prefix for passages (e5: 'passage: ')")
    b.add_argument("--force", action="store_true", help="rebuild even when the index is up to date")
    add_move_aside(b)
    b.set_defaults(func=cmd_index_build)
    b = isub.add_parser("link", help="use a Lucene / FAISS index built elsewhere (e.g. Pyserini prebuilt)")
    b.add_argument("--out", required=True)
    b.add_argument("--lucene", default=None, help="existing Lucene index directory")
    b.add_argument("--faiss", default=None, help="existing FAISS index (Pyserini dir with index + docid, or file)")
    b.add_argument("--dense-encoder", default=None, help="the encoder the FAISS index was built with")
    b.add_argument("--corpus", default=None, help="passage text for the FAISS rows (else from --lucene)")
    b.add_argument("--language", default="en", choices=["en", "zh"])
    b.add_argument("--query-prefix", default="")
    b.add_argument("--passage-prefix", default="")
    add_move_aside(b)
    b.set_defaults(func=cmd_index_link)
    b = isub.add_parser("info", help="print an index's manifest (and check it against --corpus)")
    b.add_argument("--index", required=True)
    b.add_argument("--corpus", default=None)
    b.set_defaults(func=cmd_index_info)

    p = sub.add_parser("serve-search", help="serve an index over HTTP (POST /search, /batch_search; GET /health)")
    add_searcher_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--cache-size", type=non_negative_int, default=10000, help="server-side LRU cache entries (0 = off)")
    p.add_argument("--max-k", type=positive_int, default=100,
                   help="most hits per query; the HTTP client caps k here (the rollout engine asks passages + 20)")
    p.add_argument("--max-batch", type=positive_int, default=256, help="most queries in one request")
    p.add_argument("--workers", type=positive_int, default=1,
                   help="worker processes (spawned, each with its own searcher: its own read-only Lucene searcher "
                        "and JVM, the FAISS files memory-mapped and shared); each gets cpu_count/workers threads")
    p.add_argument("--shutdown-grace-s", type=non_negative_float, default=10.0,
                   help="on SIGTERM or SIGINT: stop accepting connections and give the requests in flight this long "
                        "to be answered; what is still waiting then gets 503 'server shutting down' (default 10)")
    # default None, not http_guard's constant: every agentic-rag command registers these flags, and importing
    # http_guard (uvicorn, starlette) here would slow them all; cmd_serve_search fills the default in
    p.add_argument("--client-timeout-s", type=positive_float, default=None,
                   help="a request's head, and then its body, must each arrive within this many seconds: a slow "
                        "client's connection is closed (head) or answered 408 (body) (default 20)")
    p.set_defaults(func=cmd_serve_search)
