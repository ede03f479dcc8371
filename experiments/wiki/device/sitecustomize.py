"""Screening stand-in for Pyserini on a lent GPU machine, where Java and Pyserini's 166 MB jar cannot travel.

Put this folder on PYTHONPATH and set ``AGENTIC_RAG_DEV_CORPUS`` to a corpus.jsonl (``id``, ``title``, ``text``):
every ``agentic_rag.search.open_searcher`` call then answers with bm25s over that corpus, with Lucene's BM25 formula
(k1 0.9, b 0.4, Pyserini's defaults), English stopwords and the Porter stemmer. On the wiki quick start's 400 first
gold queries its top passage is Pyserini's in 98% of them, and the SFT adapter's greedy validation score through it
is Pyserini's to the third decimal (0.475 / multi-hop 0.301). For screening recipes only: every number the project
reports is measured through Pyserini.

With ``AGENTIC_RAG_DEV_MEMFRAC`` set (sweep.py's MEMFRAC), each process caps its share of the GPU's memory
(``torch.cuda.set_per_process_memory_fraction``), so several runs share one card without one taking it all.
"""

import json
import os

_CORPUS = os.environ.get("AGENTIC_RAG_DEV_CORPUS")


def _open(*args, **kwargs):
    import bm25s
    import Stemmer

    from agentic_rag.search.types import Hit

    with open(_CORPUS, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    stem = Stemmer.Stemmer("porter")
    retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    retriever.index(bm25s.tokenize([f"{d.get('title', '')}\n{d.get('text', '')}" for d in docs], stopwords="en",
                                   stemmer=stem, show_progress=False), show_progress=False)

    class ScreeningBM25:
        def search(self, query, k=10):
            return self.batch_search([query], k)[0]

        def batch_search(self, queries, k=10):
            out = [[] for _ in queries]
            todo = [i for i, q in enumerate(queries) if q and q.strip()]
            if todo:
                tokens = bm25s.tokenize([queries[i] for i in todo], stopwords="en", stemmer=stem, show_progress=False)
                ids, scores = retriever.retrieve(tokens, k=min(k, len(docs)), show_progress=False, n_threads=1)
                for row, i in enumerate(todo):
                    out[i] = [Hit(docs[j]["id"], docs[j].get("title", ""), docs[j].get("text", ""), float(s))
                              for j, s in zip(ids[row], scores[row], strict=True) if s > 0]
            return out

        def close(self):
            pass

    return ScreeningBM25()


if os.environ.get("AGENTIC_RAG_DEV_MEMFRAC"):  # several runs share one GPU: each frees its cache at this share
    import torch

    torch.cuda.set_per_process_memory_fraction(float(os.environ["AGENTIC_RAG_DEV_MEMFRAC"]))

if _CORPUS:
    import agentic_rag.search as _search

    _search.open_searcher = _open
