"""BM25 (real Lucene), dense (real FAISS + the offline MiniLM) and hybrid over a real 2Wiki subset."""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import string
import subprocess
import sys
import threading
from contextlib import contextmanager

import pytest

from agentic_rag.search import CachedSearcher, Hit, Searcher, open_searcher
from agentic_rag.search.build import build_index
from agentic_rag.search.hybrid import HybridSearcher, rrf_fuse, weighted_fuse
from agentic_rag.search.jvm import MAX_CLAUSES, set_max_clause_count
from agentic_rag.search.types import MAX_QUERY_CHARS, PartialSearchError, QueryError


@pytest.fixture(scope="module")
def bm25(wiki_index):
    return open_searcher(wiki_index, "bm25")


@pytest.fixture(scope="module")
def dense(wiki_index):
    return open_searcher(wiki_index, "dense")


def ids(hits: list[Hit]) -> list[str]:
    return [h.docid for h in hits]


def test_bm25_exact_docids(bm25):
    assert isinstance(bm25, Searcher)
    assert ids(bm25.search("Teutberga queen of Lotharingia", 3)) == ["0", "4", "7"]
    assert ids(bm25.search("I Can't See Myself Leaving You", 3)) == ["263", "260", "261"]
    assert ids(bm25.search("Who was the wife of Lothair II?", 3)) == ["8", "4", "6"]
    top = bm25.search("Teutberga queen of Lotharingia", 1)[0]
    assert top.title == "Teutberga" and top.text.startswith("Teutberga( died 11 November 875)")
    assert top.score == pytest.approx(7.804, abs=1e-3)


def test_bm25_batch_equals_single_and_keeps_order(bm25):
    queries = ["Aretha Franklin", "Teutberga", "Lothair II", "Aretha Franklin"]
    assert bm25.batch_search(queries, 5) == [bm25.search(q, 5) for q in queries]


@pytest.mark.parametrize("query", ["", "   ", "the of and", "\udc80\udcff", "\x00\x01\x02", "((( AND OR )))",
                                   "a" * 100_000, "🙂🙃 ∑∫ 中文", "field:value^3 ~2 \"unclosed"])
def test_bm25_odd_queries_return_lists_not_errors(bm25, query):
    hits = bm25.search(query, 5)
    assert isinstance(hits, list) and len(hits) <= 5


def many_terms_query() -> str:
    """A query under the length limit with ~1200 distinct 2-3 letter terms: more BM25 clauses than Lucene's
    default limit of 1024 (it raised IndexSearcher$TooManyClauses before the JVM start raised the limit)."""
    terms = ["".join(t) for n in (2, 3) for t in itertools.product(string.ascii_lowercase, repeat=n)]
    return " ".join(terms)[:MAX_QUERY_CHARS]


@contextmanager
def lucene_clause_limit(n: int):
    """Lucene's process-wide clause limit set to ``n`` (1024 is Lucene's own default), then restored."""
    previous = set_max_clause_count(n)
    try:
        yield
    finally:
        set_max_clause_count(previous)


def test_a_query_with_more_terms_than_lucenes_default_clause_limit_is_answered(bm25):
    query = many_terms_query()
    assert len(query) <= MAX_QUERY_CHARS and len(set(query.split())) > 1100
    assert set_max_clause_count(MAX_CLAUSES) == MAX_CLAUSES  # what the JVM start set (not Lucene's 1024)
    assert len(bm25.search(query, 5)) == 5
    both = bm25.batch_search([query, "Teutberga queen of Lotharingia"], 3)
    assert len(both[0]) == 3 and ids(both[1]) == ["0", "4", "7"]


def test_a_query_lucene_rejects_fails_alone_and_the_batch_is_answered(bm25, dense):
    """With Lucene's default clause limit the many-terms query is rejected: alone it raises QueryError, in a
    batch only it fails (Lucene's own batch call fails every query) and the others keep their hits."""
    bad = many_terms_query()
    good = ["Teutberga queen of Lotharingia", "Aretha Franklin"]
    expected = [bm25.search(q, 3) for q in good]
    hybrid = HybridSearcher(bm25, dense)
    expected_fused = [hybrid.search(q, 3) for q in good]
    with lucene_clause_limit(1024):
        with pytest.raises(QueryError, match="TooManyClauses"):
            bm25.search(bad, 3)
        with pytest.raises(PartialSearchError, match=r"1 of 4 queries.*queries\[1\].*TooManyClauses") as err:
            bm25.batch_search([good[0], bad, "", good[1]], 3)
        assert err.value.results == [expected[0], None, [], expected[1]]
        assert [e is None for e in err.value.errors] == [True, False, True, True]

        with pytest.raises(PartialSearchError) as err:  # hybrid: the other queries are still fused
            hybrid.batch_search([good[0], bad, good[1]], 3)
        fused = err.value.results  # ids: a batch encodes with other padding, so dense scores differ in ulps
        assert fused[1] is None and [ids(fused[0]), ids(fused[2])] == [ids(h) for h in expected_fused]

        cached = CachedSearcher(bm25, 100)  # the answered queries are cached, the failed one is not
        with pytest.raises(PartialSearchError) as err:
            cached.batch_search([good[0], bad, good[0]], 3)
        assert err.value.results == [expected[0], None, expected[0]] and err.value.errors[1] is not None
        assert cached.cache.stats()["size"] == 1 and cached.search(good[0], 3) == expected[0]
    assert len(bm25.search(bad, 3)) == 3  # the limit is back


def test_bm25_is_safe_from_many_python_threads(bm25):
    """pyjnius is not thread-safe; every JVM call is confined to one thread, so this has zero errors."""
    expected = {q: ids(bm25.search(q, 5)) for q in ["Teutberga", "Aretha Franklin", "Lothair II", "Detroit"]}
    errors: list[BaseException] = []
    mismatches = []

    def worker(n: int) -> None:
        try:
            for i in range(60):
                q = list(expected)[(n + i) % len(expected)]
                got = ids(bm25.batch_search([q, q], 5)[0]) if i % 2 else ids(bm25.search(q, 5))
                if got != expected[q]:
                    mismatches.append((q, got))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not mismatches


def _search_in_child(index, queue):
    from agentic_rag.search.jvm import JvmError

    try:
        open_searcher(index, "bm25")
        queue.put("no error")
    except JvmError as exc:
        queue.put(str(exc))


def test_a_forked_child_refuses_the_parents_jvm_instead_of_hanging(bm25, wiki_index):
    assert bm25.search("Teutberga", 1)  # the JVM runs in this process
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_search_in_child, args=(wiki_index, queue))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0, "the child hung or crashed"
    assert "forked from one that holds a JVM" in queue.get(timeout=5)


def test_dense_exact_docids(dense):
    assert ids(dense.search("Who was the wife of Lothair II?", 3)) == ["4", "8", "6"]
    # no word in common with the passage title: found by meaning
    assert ids(dense.search("soul music queen from Detroit", 1)) == ["261"]
    assert dense.search("soul music queen from Detroit", 1)[0].title == "Aretha Franklin"
    scores = [h.score for h in dense.search("Teutberga queen of Lotharingia", 5)]
    assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1.0001


def test_dense_batch_and_empty(dense):
    qs = ["Teutberga", "", "Aretha Franklin"]
    out = dense.batch_search(qs, 4)
    assert out[1] == [] and ids(out[0]) == ids(dense.search("Teutberga", 4))
    assert len(out[2]) == 4


def test_hybrid_over_real_parts(bm25, dense):
    hybrid = HybridSearcher(bm25, dense)
    hits = hybrid.search("Who was the wife of Lothair II?", 3)
    assert ids(hits) == ["8", "4", "6"]
    # every fused hit comes from one of the parts, text included
    pool = {h.docid: h for h in bm25.search("Who was the wife of Lothair II?", 50)
            + dense.search("Who was the wife of Lothair II?", 50)}
    assert all(pool[h.docid].text == h.text for h in hits)
    rrf = HybridSearcher(bm25, dense, fusion="rrf", alpha=0.5)
    assert ids(rrf.search("Aretha Franklin", 2)) == ["261", "263"]


def _h(docid: str, score: float) -> Hit:
    return Hit(docid, docid.upper(), "text " + docid, score)


def test_rrf_golden_values():
    a = [_h("x", 9), _h("y", 5), _h("z", 1)]
    b = [_h("y", 0.9), _h("w", 0.8)]
    fused = rrf_fuse([a, b], k=4, rrf_k=60)
    assert ids(fused) == ["y", "x", "w", "z"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1].score == pytest.approx(1 / 61)
    assert fused[2].score == pytest.approx(1 / 62)
    assert fused[0].text == "text y"


def test_weighted_golden_values():
    a = [_h("x", 10), _h("y", 6), _h("z", 2)]  # normalised 1, .5, 0
    b = [_h("y", 0.9), _h("w", 0.5)]  # normalised 1, 0
    fused = weighted_fuse([a, b], k=4, weights=[0.7, 0.3])
    assert [(h.docid, round(h.score, 6)) for h in fused] == [("x", 0.7), ("y", 0.65), ("w", 0.0), ("z", 0.0)]
    with pytest.raises(ValueError, match="alpha"):
        HybridSearcher(None, None, alpha=1.5)
    with pytest.raises(ValueError, match="fusion"):
        HybridSearcher(None, None, fusion="max")


def test_chinese_index_uses_the_cjk_analyzer(tmp_path):
    corpus = tmp_path / "zh.jsonl"
    docs = [("z1", "长江", "长江是中国最长的河流，流经上海入海。"),
            ("z2", "黄河", "黄河是中国第二长河，被称为母亲河。"),
            ("z3", "泰山", "泰山位于山东省，是五岳之首。")]
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}, ensure_ascii=False) + "\n"
                              for i, t, x in docs))
    build_index(corpus, tmp_path / "idx", language="zh", progress=False)
    zh = open_searcher(tmp_path / "idx", "bm25")
    assert ids(zh.search("母亲河", 1)) == ["z2"]
    assert ids(zh.search("五岳", 1)) == ["z3"]
    assert ids(zh.search("最长的河流", 1)) == ["z1"]


def _search_cli(index, heap: str):
    env = dict(os.environ, AGENTIC_RAG_JVM_HEAP=heap)
    return subprocess.run([sys.executable, "-m", "agentic_rag.cli", "search", "--index", str(index), "-k", "1",
                           "Teutberga"], env=env, capture_output=True, text=True, timeout=300)


def test_a_bad_jvm_heap_is_refused_by_name_and_a_blank_one_means_the_default(wiki_index, monkeypatch):
    """The JVM dies without a word on a heap it cannot parse (pyjnius: "JVM failed to start: -6", reported as our
    bug); the search command must name the variable instead, and treat a blank one as unset."""
    from agentic_rag.search.jvm import DEFAULT_HEAP, JvmError, default_heap, jvm_heap

    bad = _search_cli(wiki_index, "lots")
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "AGENTIC_RAG_JVM_HEAP='lots' is not a Java heap size" in bad.stderr
    assert "internal error" not in bad.stderr
    blank = _search_cli(wiki_index, "")
    assert blank.returncode == 0, blank.stderr[-2000:]
    assert "Teutberga" in blank.stdout
    for value, heap in [("", DEFAULT_HEAP), ("  ", DEFAULT_HEAP), ("512m", "512m"), ("2G", "2G")]:
        monkeypatch.setenv("AGENTIC_RAG_JVM_HEAP", value)
        assert jvm_heap() == heap
    for value in ["4 g", "0g", "-1g", "4gb"]:
        monkeypatch.setenv("AGENTIC_RAG_JVM_HEAP", value)
        with pytest.raises(JvmError, match="not a Java heap size"):
            jvm_heap()
    env = {"AGENTIC_RAG_JVM_HEAP": " "}
    default_heap(env, "1g")
    assert env == {"AGENTIC_RAG_JVM_HEAP": "1g"}
    default_heap(env, "3g")
    assert env == {"AGENTIC_RAG_JVM_HEAP": "1g"}
