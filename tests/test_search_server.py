"""The retrieval server on 127.0.0.1 (a real uvicorn process) and the HTTP client."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from agentic_rag.search import SearchError, open_searcher
from agentic_rag.search.client import HTTPSearcher, SearchRequestError
from conftest import free_port


@pytest.fixture(scope="module")
def server(wiki_index):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentic_rag.cli", "--log-level", "WARNING", "serve-search",
                             "--index", str(wiki_index), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.3)
        if proc.poll() is not None:
            pytest.fail("server exited:\n" + proc.stdout.read())
    else:
        proc.kill()
        pytest.fail("server did not start in 120 s")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def local_bm25(wiki_index):
    return open_searcher(wiki_index, "bm25")


def test_search_batch_and_health(server, local_bm25):
    r = httpx.post(server + "/search", json={"query": "Teutberga queen of Lotharingia", "k": 3})
    assert r.status_code == 200
    assert [h["docid"] for h in r.json()["hits"]] == ["0", "4", "7"]
    assert set(r.json()["hits"][0]) == {"docid", "title", "text", "score"}
    r = httpx.post(server + "/batch_search", json={"queries": ["Aretha Franklin", "Lothair II"], "k": 2})
    assert [[h["docid"] for h in hits] for hits in r.json()["results"]] == \
        [[h.docid for h in hits] for hits in local_bm25.batch_search(["Aretha Franklin", "Lothair II"], 2)]
    health = httpx.get(server + "/health").json()
    assert health["status"] == "ok" and health["retriever"] == "bm25"


BAD = [
    ("/search", {"query": "", "k": 3}, 422, "query is empty"),
    ("/search", {"query": "   \n ", "k": 3}, 422, "query is empty"),
    ("/search", {"query": "x" * 5000, "k": 3}, 422, "limit is 4096"),
    ("/search", {"query": "x", "k": 0}, 422, "k must be between 1 and 100"),
    ("/search", {"query": "x", "k": 101}, 422, "k must be between 1 and 100"),
    ("/search", {"query": "x", "k": "five"}, 422, "k: Input should be a valid integer"),
    ("/search", {"k": 3}, 422, "query: Field required"),
    ("/search", {"query": ["a", "b"]}, 422, "query: Input should be a valid string"),
    ("/search", ["not", "an", "object"], 422, "valid dictionary"),
    ("/batch_search", {"queries": [], "k": 3}, 422, "queries is empty"),
    ("/batch_search", {"queries": ["ok", ""], "k": 3}, 422, "queries[1] is empty"),
    ("/batch_search", {"queries": ["q"] * 257, "k": 3}, 422, "limit is 256"),
    ("/batch_search", {"queries": "not a list", "k": 3}, 422, "queries: Input should be a valid list"),
]


@pytest.mark.parametrize("path, body, status, reason", BAD)
def test_bad_requests_get_4xx_with_a_reason(server, path, body, status, reason):
    r = httpx.post(server + path, json=body)
    assert r.status_code == status and reason in r.json()["detail"]


def test_malformed_and_oversized_bodies(server):
    r = httpx.post(server + "/search", content=b'{"query": "x", "k": ', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "malformed JSON" in r.json()["detail"]
    r = httpx.post(server + "/search", content=b"query=x", headers={"content-type": "text/plain"})
    assert 400 <= r.status_code < 500
    r = httpx.post(server + "/search", content=b"x" * (5 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "body over" in r.json()["detail"]
    assert httpx.get(server + "/search").status_code == 405
    assert httpx.get(server + "/nope").status_code == 404


def test_garbage_queries_are_answered(server):
    for q in ["\udc80\udcff lone surrogates", "\u0000\u0001 nulls", "🙂 中文 ∑", "((( AND OR", "the of and"]:
        body = json.dumps({"query": q, "k": 3})  # json.dumps escapes lone surrogates as \\udc80
        r = httpx.post(server + "/search", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, (q, r.text)


def test_server_keeps_serving_after_bad_requests(server):
    for path, body, _, _ in BAD:
        httpx.post(server + path, json=body)
    r = httpx.post(server + "/search", json={"query": "Teutberga", "k": 1})
    assert r.status_code == 200 and r.json()["hits"][0]["docid"] == "0"
    assert httpx.get(server + "/health").json()["errors_4xx"] >= len(BAD)


def test_concurrent_clients_zero_errors(server, local_bm25):
    queries = ["Teutberga", "Aretha Franklin", "Lothair II", "Detroit", "Waldrada", "soul singer"]
    expected = {q: [h.docid for h in local_bm25.search(q, 5)] for q in queries}
    errors, wrong, done = [], [], []

    def client(n: int) -> None:
        with HTTPSearcher(server, cache_size=0) as s:
            for i in range(40):
                try:
                    q = queries[(n + i) % len(queries)]
                    hits = s.batch_search([q, queries[i % len(queries)]], 5)[0] if i % 3 == 0 else s.search(q, 5)
                    if [h.docid for h in hits] != expected[q]:
                        wrong.append(q)
                    done.append(1)
                except Exception as exc:  # noqa: BLE001
                    errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == [] and len(done) == 320


def test_client_cache_answers_repeats_without_requests(server):
    with HTTPSearcher(server, cache_size=100) as s:
        first = s.batch_search(["Teutberga", "Teutberga", "Lothair II"], 3)
        sent = s.requests
        again = s.batch_search(["Lothair II", "Teutberga"] * 8, 3)
        assert s.requests == sent == 1  # one request for two distinct queries; none for the repeats
        assert again[0] == first[2] and again[1] == first[0]
        assert s.cache.stats()["hits"] >= 16
        assert s.search("", 3) == [] and s.requests == 1  # an empty query never travels


def test_client_rejects_4xx_without_retrying(server):
    with HTTPSearcher(server, cache_size=0, retries=3) as s:
        with pytest.raises(SearchRequestError, match="k must be between 1 and 100"):
            s.search("Teutberga", 1000)
        assert s.requests == 1


class _Flaky(http.server.BaseHTTPRequestHandler):
    failures = 0
    delay = 0.0
    seen = 0

    def do_POST(self):  # noqa: N802
        type(self).seen += 1
        n = json.loads(self.rfile.read(int(self.headers["content-length"])))
        time.sleep(self.delay)
        if type(self).failures > 0:
            type(self).failures -= 1
            self.send_response(503)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"detail": "busy"}')
            return
        body = {"results": [[{"docid": "d", "title": q, "text": "t", "score": 1.0}] for q in n["queries"]]}
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())
        except BrokenPipeError:  # the client timed out and left, as the timeout test intends
            pass

    def log_message(self, *a):
        pass


@pytest.fixture()
def flaky():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Flaky.failures, _Flaky.delay, _Flaky.seen = 0, 0.0, 0
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_client_retries_5xx_with_backoff_then_succeeds(flaky):
    _Flaky.failures = 2
    with HTTPSearcher(flaky, retries=3, backoff=0.05, cache_size=0) as s:
        t = time.time()
        assert s.search("q", 1)[0].title == "q"
        assert s.retried == 2 and _Flaky.seen == 3
        assert time.time() - t >= 0.05 + 0.1  # backoff 0.05 then 0.1


def test_client_gives_up_after_bounded_retries(flaky):
    _Flaky.failures = 10
    with HTTPSearcher(flaky, retries=2, backoff=0.01, cache_size=0) as s, \
            pytest.raises(SearchError, match="failed after 3 attempts: HTTP 503: busy"):
        s.search("q", 1)
    assert _Flaky.seen == 3


def test_client_times_out(flaky):
    _Flaky.delay = 1.0
    with HTTPSearcher(flaky, timeout=0.2, retries=1, backoff=0.01, cache_size=0) as s, \
            pytest.raises(SearchError, match="ReadTimeout"):
        s.search("q", 1)


def test_unreachable_server_fails_with_the_url():
    port = free_port()
    with HTTPSearcher(f"http://127.0.0.1:{port}", retries=1, backoff=0.01) as s, \
            pytest.raises(SearchError, match=f"127.0.0.1:{port}.*ConnectError"):
        s.search("q", 1)
