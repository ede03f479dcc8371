"""Subcommands that search with question files: ``search`` (one query, or a question file -> hits per question)
and ``eval-retrieval`` (recall of gold titles at several k, :mod:`.retrieval`).

They join :mod:`agentic_rag.data.questions` and the search layer, so they live above both; the searcher options
are the search layer's own (:func:`agentic_rag.search.commands.add_searcher_args`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tqdm import tqdm

from ..argtypes import positive_int
from ..search.commands import add_searcher_args, open_from_args


def _parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError(f"--k values must be >= 1, got {text!r}")
    return ks


def cmd_search(args: argparse.Namespace) -> int:
    from ..data.questions import read_questions
    from ..errors import input_file
    from ..outputs import check_output_file, temp_beside

    if (args.query is None) == (args.queries is None):
        raise ValueError("give either a QUERY or --queries FILE")
    if args.output and args.queries is None:
        raise ValueError("--output goes with --queries FILE (one QUERY prints its hits)")
    rows = []
    if args.queries is not None:  # read and check everything before the JVM starts
        rows = read_questions(input_file(args.queries, "--queries", what="question file"))
        if args.output:
            check_output_file(args.output, {"--queries": args.queries, "--index": args.index}, flag="--output")
    searcher = open_from_args(args)
    if args.query is not None:
        for rank, hit in enumerate(searcher.search(args.query, args.k), start=1):
            print(f"{rank:>2}. [{hit.docid}] {hit.title}  (score {hit.score:.4f})")
            print(f"    {hit.text[:300]}")
        return 0
    def write(out_f) -> None:
        with tqdm(total=len(rows), unit="q", desc="search", disable=out_f is sys.stdout) as bar:
            for start in range(0, len(rows), args.batch_size):
                chunk = rows[start:start + args.batch_size]
                for row, hits in zip(chunk, searcher.batch_search([r.question for r in chunk], args.k),
                                     strict=True):
                    out_f.write(json.dumps({"id": row.id, "hits": [h.to_dict() for h in hits]},
                                           ensure_ascii=False) + "\n")
                bar.update(len(chunk))

    if not args.output:
        write(sys.stdout)
        return 0
    with temp_beside(args.output) as tmp:  # a fresh name: a file of the user's beside the output is never touched
        with open(tmp, "w", encoding="utf-8") as out_f:
            write(out_f)
        os.replace(tmp, args.output)  # whole or not at all: the file is complete when it has its name
    return 0


def cmd_eval_retrieval(args: argparse.Namespace) -> int:
    from ..data.questions import read_questions
    from ..errors import input_file
    from ..outputs import atomic_write_text, check_output_file
    from .retrieval import format_table, recall_at_k

    rows = read_questions(input_file(args.questions, "--questions", what="question file"), limit=args.limit)
    if args.output:
        check_output_file(args.output, {"--questions": args.questions, "--index": args.index}, flag="--output")
    result = recall_at_k(rows, open_from_args(args), args.k)
    result.update({"index": str(args.index), "retriever": args.retriever, "questions_file": str(args.questions)})
    if args.retriever == "hybrid":
        result.update({"fusion": args.fusion, "alpha": args.alpha, "depth": args.depth})
    print(format_table(result, f"retriever={args.retriever} index={args.index}"))
    print(json.dumps(result))
    if args.output:
        atomic_write_text(args.output, json.dumps(result, indent=2) + "\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search an index: one QUERY, or --queries FILE -> --output FILE")
    add_searcher_args(p)
    p.add_argument("query", nargs="?", default=None)
    p.add_argument("-k", "--k", type=positive_int, default=5, help="hits per query")
    p.add_argument("--queries", default=None, help="question file (JSONL {id, question}, or any reader format)")
    p.add_argument("--output", default=None, help="output JSONL (default stdout)")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("eval-retrieval", help="recall of gold titles at several k")
    add_searcher_args(p)
    p.add_argument("--questions", required=True, help="questions with supporting_facts (gold titles)")
    p.add_argument("--k", type=_parse_ks, default=[1, 5, 10, 20], help="comma-separated k values")
    p.add_argument("--limit", type=positive_int, default=None, help="first N questions only")
    p.add_argument("--output", default=None, help="also write the JSON result here")
    p.set_defaults(func=cmd_eval_retrieval)
