"""Subcommands of the search layer: corpus build, index build/link/info, search, eval-retrieval, serve-search."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm


def _add_searcher_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", required=True, help="index directory (agentic-rag index build) or search server URL")
    p.add_argument("--retriever", default="bm25", choices=["bm25", "dense", "hybrid"])
    p.add_argument("--dense-encoder", default=None,
                   help="override the encoder recorded in the index (same model, another path)")
    p.add_argument("--fusion", default="weighted", choices=["rrf", "weighted"], help="hybrid fusion method")
    p.add_argument("--alpha", type=float, default=0.3, help="hybrid: weight of the dense run (0..1)")
    p.add_argument("--depth", type=int, default=50, help="hybrid: candidates taken from each part")
    p.add_argument("--threads", type=int, default=None, help="Lucene threads for batch search")
    p.add_argument("--k1", type=float, default=None, help="BM25 k1 (default: the index's, 0.9)")
    p.add_argument("--b", type=float, default=None, help="BM25 b (default: the index's, 0.4)")


def _open(args: argparse.Namespace, cache_size: int = 0):
    from .index import open_searcher

    return open_searcher(args.index, args.retriever, dense_encoder=args.dense_encoder, fusion=args.fusion,
                         alpha=args.alpha, depth=args.depth, threads=args.threads, k1=args.k1, b=args.b,
                         cache_size=cache_size)


def _parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"--k values must be >= 1, got {text!r}")
    return ks


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
    m = build_index(args.corpus, args.out, bm25=bm25, dense_encoder=args.dense_encoder, language=args.language,
                    fmt=args.format, skip_bad=args.skip_bad, chunk_size=args.chunk_words, threads=args.threads,
                    k1=args.k1, b=args.b, faiss_type=args.faiss_type, query_prefix=args.query_prefix,
                    passage_prefix=args.passage_prefix, force=args.force)
    skipped = int(m.corpus.get("skipped") or 0)
    print(json.dumps({"index": str(args.out), "passages": m.corpus["passages"], "skipped": skipped,
                      "bm25": m.bm25 is not None, "dense": m.dense is not None}))
    if skipped:
        print(f"skipped {skipped} malformed record(s) (--skip-bad)", file=sys.stderr)
    return 0


def cmd_index_link(args: argparse.Namespace) -> int:
    from .build import link_index

    m = link_index(args.out, lucene=args.lucene, faiss_dir=args.faiss, dense_encoder=args.dense_encoder,
                   corpus=args.corpus, language=args.language, query_prefix=args.query_prefix,
                   passage_prefix=args.passage_prefix)
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


def cmd_search(args: argparse.Namespace) -> int:
    if (args.query is None) == (args.queries is None):
        raise ValueError("give either a QUERY or --queries FILE")
    searcher = _open(args)
    if args.query is not None:
        for rank, hit in enumerate(searcher.search(args.query, args.k), start=1):
            print(f"{rank:>2}. [{hit.docid}] {hit.title}  (score {hit.score:.4f})")
            print(f"    {hit.text[:300]}")
        return 0
    from ..data.questions import read_questions

    rows = read_questions(args.queries)
    out_f = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        with tqdm(total=len(rows), unit="q", desc="search", disable=out_f is sys.stdout) as bar:
            for start in range(0, len(rows), args.batch_size):
                chunk = rows[start:start + args.batch_size]
                for row, hits in zip(chunk, searcher.batch_search([r.question for r in chunk], args.k),
                                     strict=True):
                    out_f.write(json.dumps({"id": row.id, "hits": [h.to_dict() for h in hits]},
                                           ensure_ascii=False) + "\n")
                bar.update(len(chunk))
    finally:
        if out_f is not sys.stdout:
            out_f.close()
    return 0


def cmd_eval_retrieval(args: argparse.Namespace) -> int:
    from ..data.questions import read_questions
    from .evaluate import format_table, recall_at_k

    rows = read_questions(args.questions, limit=args.limit)
    result = recall_at_k(rows, _open(args), args.k)
    result.update({"index": str(args.index), "retriever": args.retriever, "questions_file": str(args.questions)})
    if args.retriever == "hybrid":
        result.update({"fusion": args.fusion, "alpha": args.alpha, "depth": args.depth})
    print(format_table(result, f"retriever={args.retriever} index={args.index}"))
    print(json.dumps(result))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def cmd_serve_search(args: argparse.Namespace) -> int:
    from .server import ServerLimits, serve

    searcher = _open(args, cache_size=args.cache_size)
    limits = ServerLimits(max_k=args.max_k, max_batch=args.max_batch)
    print(f"serving {args.retriever} search over {args.index} on http://{args.host}:{args.port}", file=sys.stderr)
    serve(searcher, args.host, args.port, limits=limits,
          info={"index": str(args.index), "retriever": args.retriever})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("corpus", help="corpus tools")
    csub = p.add_subparsers(dest="corpus_command", metavar="SUBCOMMAND", required=True)
    b = csub.add_parser("build", help="normalise a corpus into passage JSONL (id, title, text, contents)")
    b.add_argument("--input", required=True, help="corpus file")
    b.add_argument("--format", default="auto", choices=["auto", "json-list", "pyserini-jsonl", "kilt", "hotpot"])
    b.add_argument("--out", required=True, help="output JSONL")
    b.add_argument("--skip-bad", action="store_true", help="skip and count malformed records instead of failing")
    b.add_argument("--chunk-words", type=int, default=100, help="KILT: words per passage")
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
    b.add_argument("--chunk-words", type=int, default=100, help="KILT: words per passage")
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--k1", type=float, default=0.9)
    b.add_argument("--b", type=float, default=0.4)
    b.add_argument("--faiss-type", default="flat", choices=["flat", "hnsw"])
    b.add_argument("--query-prefix", default="", help="dense: prefix for queries (e5: 'query: ')")
    b.add_argument("--passage-prefix", default="", help="dense: prefix for passages (e5: 'passage: ')")
    b.add_argument("--force", action="store_true", help="rebuild even when the index is up to date")
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
    b.set_defaults(func=cmd_index_link)
    b = isub.add_parser("info", help="print an index's manifest (and check it against --corpus)")
    b.add_argument("--index", required=True)
    b.add_argument("--corpus", default=None)
    b.set_defaults(func=cmd_index_info)

    p = sub.add_parser("search", help="search an index: one QUERY, or --queries FILE -> --output FILE")
    _add_searcher_args(p)
    p.add_argument("query", nargs="?", default=None)
    p.add_argument("-k", "--k", type=int, default=5)
    p.add_argument("--queries", default=None, help="question file (JSONL {id, question}, or any reader format)")
    p.add_argument("--output", default=None, help="output JSONL (default stdout)")
    p.add_argument("--batch-size", type=int, default=64)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("eval-retrieval", help="recall of gold titles at several k")
    _add_searcher_args(p)
    p.add_argument("--questions", required=True, help="questions with supporting_facts (gold titles)")
    p.add_argument("--k", type=_parse_ks, default=[1, 5, 10, 20], help="comma-separated k values")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument("--output", default=None, help="also write the JSON result here")
    p.set_defaults(func=cmd_eval_retrieval)

    p = sub.add_parser("serve-search", help="serve an index over HTTP (POST /search, /batch_search; GET /health)")
    _add_searcher_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cache-size", type=int, default=10000, help="server-side LRU cache entries (0 = off)")
    p.add_argument("--max-k", type=int, default=100,
                   help="most hits per query; the HTTP client caps k here (the rollout engine asks passages + 20)")
    p.add_argument("--max-batch", type=int, default=256)
    p.set_defaults(func=cmd_serve_search)
