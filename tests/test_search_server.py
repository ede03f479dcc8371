"""The retrieval server on 127.0.0.1 (a real uvicorn process) and the HTTP client."""

from __future__ import annotations

import http.server
import itertools
import json
import multiprocessing
import os
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from agentic_rag.search import SearchError, open_searcher
from agentic_rag.search.client import HTTPSearcher, SearchRequestError
from agentic_rag.search.jvm import set_max_clause_count
from agentic_rag.search.server import ServerLimits, TCPNoDelayConfig, create_app
from agentic_rag.search.types import MAX_QUERY_CHARS, PartialSearchError
from conftest import free_port, start_search_server


def many_terms_query() -> str:
    """~1200 distinct 2-3 letter terms in 4096 characters: over Lucene's default 1024 clauses (as in
    test_searchers.py)."""
    terms = ["".join(t) for n in (2, 3) for t in itertools.product(string.ascii_lowercase, repeat=n)]
    return " ".join(terms)[:MAX_QUERY_CHARS]


@contextmanager
def serve_in_thread(searcher, limits: ServerLimits | None = None) -> Iterator[str]:
    """``create_app(searcher)`` on a real uvicorn server on 127.0.0.1, in this process (its JVM, so a test can
    change Lucene's settings); yields the base URL."""
    server = uvicorn.Server(uvicorn.Config(create_app(searcher, limits=limits), host="127.0.0.1",
                                           port=free_port(), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            pytest.fail("the in-process search server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(wiki_index):
    proc, url = start_search_server(wiki_index, timeout_s=120)
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
    # strict: a boolean, a numeric string or a float is not a count
    ("/search", {"query": "x", "k": True}, 422, "k: Input should be a valid integer, got boolean true"),
    ("/search", {"query": "x", "k": "5"}, 422, "k: Input should be a valid integer, got string '5'"),
    ("/search", {"query": "x", "k": 5.0}, 422, "k: Input should be a valid integer, got number 5.0"),
    ("/search", {"query": 5, "k": 3}, 422, "query: Input should be a valid string, got number 5"),
    ("/search", {"query": "x", "K": 3}, 422, "K: not a field of this request (it takes query and k)"),
    ("/batch_search", {"queries": ["a", 1], "k": 3}, 422, "queries.1: Input should be a valid string, got number 1"),
    ("/batch_search", {"queries": ["a"], "k": False}, 422, "k: Input should be a valid integer, got boolean false"),
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


def test_a_batch_mixing_good_and_bad_queries(server, local_bm25):
    """Defined behaviour: a query that breaks a request limit rejects the whole request before any search
    (422 naming it); a query the backend cannot answer fails alone (see the in-process test below)."""
    r = httpx.post(server + "/batch_search", json={"queries": ["Teutberga", "x" * 5000, "Lothair II"], "k": 2})
    assert r.status_code == 422 and "queries[1] is 5000 characters" in r.json()["detail"]
    big = many_terms_query()  # more terms than Lucene's default clause limit: answered, with the others
    r = httpx.post(server + "/batch_search", json={"queries": ["Teutberga", big, "Lothair II"], "k": 2})
    assert r.status_code == 200 and "errors" not in r.json()
    results = r.json()["results"]
    assert [h["docid"] for h in results[0]] == [h.docid for h in local_bm25.search("Teutberga", 2)]
    assert len(results[1]) == 2
    assert [h["docid"] for h in results[2]] == [h.docid for h in local_bm25.search("Lothair II", 2)]


def test_a_query_the_backend_cannot_answer_fails_alone(local_bm25):
    """With Lucene's default clause limit (1024) the many-terms query fails in Lucene: only that query fails;
    requests batched with it, and the other queries of its own request, are answered."""
    bad, good = many_terms_query(), ["Teutberga", "Lothair II"]
    expected = [[h.docid for h in local_bm25.search(q, 3)] for q in good]
    previous = set_max_clause_count(1024)
    try:
        with serve_in_thread(local_bm25) as url:
            r = httpx.post(url + "/batch_search", json={"queries": [good[0], bad, good[1]], "k": 3})
            assert r.status_code == 200, r.text
            body = r.json()
            assert [[h["docid"] for h in hits] for hits in body["results"]] == [expected[0], [], expected[1]]
            assert body["errors"][0] is None and body["errors"][2] is None
            assert "TooManyClauses" in body["errors"][1]
            r = httpx.post(url + "/search", json={"query": bad, "k": 3})
            assert r.status_code == 422 and "TooManyClauses" in r.json()["detail"]

            # concurrent requests, batched together by the server as they arrive: the good ones all succeed
            statuses: dict[str, list[int]] = {"good": [], "bad": []}

            def send(kind: str, query: str) -> None:
                statuses[kind].append(httpx.post(url + "/search", json={"query": query, "k": 3}, timeout=60)
                                      .status_code)

            threads = [threading.Thread(target=send, args=("bad", bad) if n % 3 == 0 else ("good", good[n % 2]))
                       for n in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert statuses == {"good": [200] * 8, "bad": [422] * 4}

            with HTTPSearcher(url, cache_size=10) as client:  # the client raises for the failed query only
                with pytest.raises(PartialSearchError, match="TooManyClauses") as err:
                    client.batch_search([good[0], bad, good[1]], 3)
                assert [None if h is None else [x.docid for x in h] for h in err.value.results] == \
                    [expected[0], None, expected[1]]
                assert client.search(good[1], 3)[0].docid == expected[1][0] and client.requests == 1  # cached
            assert httpx.get(url + "/health").json()["query_errors"] >= 6
    finally:
        set_max_clause_count(previous)


def test_malformed_and_oversized_bodies(server):
    r = httpx.post(server + "/search", content=b'{"query": "x", "k": ', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "malformed JSON" in r.json()["detail"]
    r = httpx.post(server + "/search", content=b"query=x", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "Content-Type: application/json" in r.json()["detail"]
    r = httpx.post(server + "/search", content=b"x" * (5 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "body over" in r.json()["detail"]
    assert httpx.get(server + "/search").status_code == 405
    assert httpx.get(server + "/nope").status_code == 404


@pytest.mark.parametrize("headers", [{"content-type": "application/x-www-form-urlencoded"},  # curl -d
                                     {"content-type": "text/plain"}, {}])
def test_a_body_that_is_not_declared_json_gets_415(server, headers):
    """415 naming the content type to send, not a pydantic message about dictionaries; JSON with a charset, or
    an ``application/*+json`` type, is JSON."""
    for path in ("/search", "/batch_search"):
        r = httpx.post(server + path, content=b'{"query": "Teutberga", "queries": ["Teutberga"], "k": 1}',
                       headers=headers)
        assert r.status_code == 415, r.text
        assert r.json()["detail"].startswith("the body must be JSON: send Content-Type: application/json")
    for kind in ("application/json; charset=utf-8", "application/vnd.search+json"):
        r = httpx.post(server + "/search", content=b'{"query": "Teutberga", "k": 1}', headers={"content-type": kind})
        assert r.status_code == 200 and r.json()["hits"][0]["docid"] == "0"


@pytest.mark.parametrize("flag, value, reason", [
    ("--max-k", "0", "argument --max-k: must be >= 1, got 0"),
    ("--max-batch", "-1", "argument --max-batch: must be >= 1, got -1"),
    ("--port", "70000", "argument --port: must be a port between 1 and 65535, got 70000"),
    ("--workers", "0", "argument --workers: must be >= 1, got 0"),
    ("--cache-size", "-1", "argument --cache-size: must be >= 0, got -1"),
    ("--shutdown-grace-s", "-2", "argument --shutdown-grace-s: must be >= 0, got -2"),
])
def test_serve_search_refuses_bad_settings_before_opening_the_index(wiki_index, flag, value, reason):
    """A setting that would make the server refuse every request (``--max-k 0``), or cannot work, is a usage error
    at once: exit 2 naming the flag, before the JVM starts or the index opens (it used to start and serve 422s)."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "agentic_rag.cli", "--log-level", "INFO", "serve-search", "--index",
                        str(wiki_index), "--port", str(free_port()), flag, value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert reason in r.stderr and "JVM started" not in r.stderr and "serving" not in r.stderr
    assert time.monotonic() - t0 < 30


def test_a_chunked_body_over_the_limit_is_refused(server):
    """No content-length header (chunked transfer): the limit holds on the bytes received."""

    def chunks(total: int, size: int = 64 << 10):
        yield b'{"query": "'
        for _ in range(total // size):
            yield b"x" * size
        yield b'", "k": 1}'

    r = httpx.post(server + "/search", content=chunks(6 << 20), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413 and "body over" in r.json()["detail"]
    # a small chunked body is read whole and answered
    r = httpx.post(server + "/search", content=iter([b'{"query": "Teutb', b'erga", "k": 1}']),
                   headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["hits"][0]["docid"] == "0"


def test_garbage_queries_are_answered(server):
    for q in ["\udc80\udcff lone surrogates", "\u0000\u0001 nulls", "🙂 中文 ∑", "((( AND OR", "the of and",
              many_terms_query()]:
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
    with HTTPSearcher(server + "/nope", cache_size=0, retries=3) as s:
        with pytest.raises(SearchRequestError, match="HTTP 404"):
            s.search("Teutberga", 3)
        assert s.requests == 1


def test_client_caps_k_and_batches_at_the_servers_limits(local_bm25, caplog):
    """The rollout engine asks k = passages + 20; a server started with a smaller --max-k (or --max-batch)
    answers the client with at most max_k hits instead of a 422 on every search."""
    with serve_in_thread(local_bm25, ServerLimits(max_k=5, max_batch=2)) as url:
        assert httpx.post(url + "/search", json={"query": "Teutberga", "k": 23}).status_code == 422
        with HTTPSearcher(url, cache_size=0) as s, caplog.at_level("WARNING"):
            assert s.search("Teutberga", 23) == local_bm25.search("Teutberga", 5)
            queries = ["Teutberga", "Lothair II", "Aretha Franklin", "Detroit", "Waldrada"]
            assert s.batch_search(queries, 23) == local_bm25.batch_search(queries, 5)
            assert s.requests == 1 + 3  # five queries in requests of at most two
        assert "serves at most k=5" in caplog.text


def test_open_searcher_url_cache_size(flaky):
    """cache_size=0 means no cache, for a URL too; left out, a URL gets the default cache."""
    s = open_searcher(flaky, cache_size=0)
    assert s.cache.maxsize == 0
    s.search("q", 1)
    s.search("q", 1)
    assert _Flaky.seen == 2
    assert open_searcher(flaky).cache.maxsize == 10000
    with pytest.raises(ValueError, match="cache_size must be >= 0"):
        open_searcher(flaky, cache_size=-1)


class _Flaky(http.server.BaseHTTPRequestHandler):
    """A stand-in server: ``failures`` 503s first (with ``retry_after`` if set), then answers, or answers 200
    with ``raw_body`` (bytes, as given) when that is set."""

    failures = 0
    delay = 0.0
    seen = 0
    retry_after: str | None = None
    raw_body: bytes | None = None

    def do_POST(self):  # noqa: N802
        type(self).seen += 1
        n = json.loads(self.rfile.read(int(self.headers["content-length"])))
        time.sleep(self.delay)
        if type(self).failures > 0:
            type(self).failures -= 1
            self.send_response(503)
            self.send_header("content-type", "application/json")
            if self.retry_after is not None:
                self.send_header("retry-after", self.retry_after)
            self.end_headers()
            self.wfile.write(b'{"detail": "busy"}')
            return
        if self.raw_body is not None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(self.raw_body)))
            self.end_headers()
            self.wfile.write(self.raw_body)
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
    _Flaky.failures, _Flaky.delay, _Flaky.seen, _Flaky.retry_after, _Flaky.raw_body = 0, 0.0, 0, None, None
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


def test_client_caps_retry_after_at_the_request_timeout(flaky):
    _Flaky.failures, _Flaky.retry_after = 1, "30"
    with HTTPSearcher(flaky, timeout=0.5, retries=1, backoff=0.01, cache_size=0) as s:
        t = time.time()
        assert s.search("q", 1)[0].title == "q"
        assert 0.5 <= time.time() - t < 5 and _Flaky.seen == 2  # waited the 0.5 s timeout, not 30 s


@pytest.mark.parametrize("body", [b"<html>502 Bad Gateway</html>", b"", b'["a", "list"]', b"\xff\xfe not utf-8"])
def test_a_200_reply_that_is_not_a_json_object_raises_search_error(flaky, body):
    _Flaky.raw_body = body
    with HTTPSearcher(flaky, retries=0, cache_size=0) as s, \
            pytest.raises(SearchError, match="HTTP 200 with a body that is not a JSON object"):
        s.search("q", 1)


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


def _report_nodelay(listener: socket.socket, out) -> None:
    """In a spawned process (the listening socket pickled into it, as uvicorn's supervisor hands it to a worker):
    accept one connection through asyncio, as a worker's server does, and report its TCP_NODELAY."""
    import asyncio

    class Report(asyncio.Protocol):
        def connection_made(self, transport):
            sock = transport.get_extra_info("socket")
            out.put(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Report, sock=listener)
        async with server:
            await asyncio.sleep(30)

    asyncio.run(main())


def _nodelay_in_a_worker(config: uvicorn.Config) -> int:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    listener = config.bind_socket()
    listener.listen()  # so the connection below waits in the backlog until the child's server accepts it
    child = context.Process(target=_report_nodelay, args=(listener, out), daemon=True)
    child.start()
    try:
        with socket.create_connection(listener.getsockname()[:2], timeout=30):
            return out.get(timeout=60)
    finally:
        child.kill()
        child.join(30)
        listener.close()


def test_worker_processes_answer_without_nagles_delay():
    """``serve-search --workers N``: a connection a worker accepts has TCP_NODELAY set. uvicorn's own config binds
    the shared socket with protocol 0, so asyncio leaves Nagle's algorithm on and every keep-alive response waits
    for the client's delayed ACK (~40 ms on Linux; uvicorn issue #3149); ``TCPNoDelayConfig`` binds it declaring
    TCP. The uvicorn half shows the bug is still there: when it fails, uvicorn has fixed it and the subclass can go."""
    def config(cls):
        return cls("agentic_rag.search.server:app_from_environment", factory=True, host="127.0.0.1", port=0,
                   workers=2, log_level="warning")

    assert _nodelay_in_a_worker(config(TCPNoDelayConfig)) == 1
    assert _nodelay_in_a_worker(config(uvicorn.Config)) == 0


# ---------------------------------------------------------------------------------------------------- shutdown


class _SlowBackend(http.server.BaseHTTPRequestHandler):
    """A search backend for ``serve-search --index http://...``: answers ``/batch_search`` after ``delay`` seconds,
    so that the server's requests are still in flight when the test sends it SIGTERM."""

    delay = 0.0
    seen = 0

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).seen += 1
        time.sleep(self.delay)
        out = {"results": [[{"docid": f"d{i}", "title": q, "text": "t", "score": 1.0}]
                           for i, q in enumerate(body["queries"])]}
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(out).encode())
        except OSError:  # the search server exited without waiting (the cut-off test)
            pass

    def do_GET(self):  # noqa: N802 - no /health: the client then reads no limits
        self.send_error(404)

    def log_message(self, *a):
        pass


@pytest.fixture()
def slow_backend():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowBackend)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _SlowBackend.delay, _SlowBackend.seen = 0.0, 0
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _clients_in_a_loop(url: str, n: int, outcomes: list, stop: threading.Event) -> None:
    """One keep-alive client sending searches one after another until the server refuses its connection; each
    outcome is (sent, answered, status or exception name, body or message) in monotonic seconds."""
    with httpx.Client(timeout=60) as client:
        i = 0
        while not stop.is_set():
            sent = time.monotonic()
            try:
                r = client.post(url + "/search", json={"query": f"client {n} query {i}", "k": 1})
                outcomes.append((sent, time.monotonic(), r.status_code, r.json()))
            except httpx.ConnectError as exc:  # the listening socket is closed: new connections are refused
                outcomes.append((sent, time.monotonic(), "refused", str(exc)))
                return
            except httpx.TransportError as exc:  # a reset, or a connection closed under a sent request
                outcomes.append((sent, time.monotonic(), type(exc).__name__, str(exc)))
            i += 1


def _stop(proc: subprocess.Popen, timeout: float) -> tuple[int, float, str]:
    """SIGTERM, as a service manager sends it; the exit status, the seconds to exit and the server's output."""
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait(30)
    return rc, time.monotonic() - t0, proc.stdout.read()


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_answers_the_requests_in_flight_and_resets_no_connection(slow_backend, workers):
    """SIGTERM while 8 keep-alive clients search in a loop (each search takes the backend 0.4 s): every request the
    server took is answered 200, a client's next connection is refused cleanly, no connection is reset, and the
    server exits 0 within its grace period. It used to close kept-alive connections under requests already sent
    (ReadError / RemoteProtocolError at the client) and to end killed by the signal; with ``--workers 2`` each
    worker drains."""
    _SlowBackend.delay = 0.4
    proc, url = start_search_server(slow_backend, "--cache-size", "0", "--workers", str(workers), log_level="INFO",
                                    timeout_s=120)  # the default grace period: 10 s
    outcomes: list = []
    stop = threading.Event()
    threads = [threading.Thread(target=_clients_in_a_loop, args=(url, n, outcomes, stop)) for n in range(8)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while _SlowBackend.seen < 3:  # the clients are in their loops, and the backend is answering a batch
            assert time.monotonic() < deadline, "the clients' searches never reached the backend"
            time.sleep(0.05)
        signalled = time.monotonic()
        rc, took, output = _stop(proc, timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        if proc.poll() is None:
            proc.kill()
    kinds = [o[2] for o in outcomes]
    assert set(kinds) <= {200, "refused"}, [o for o in outcomes if o[2] not in (200, "refused")]
    assert kinds.count("refused") == 8  # each client ended on a refused new connection, none on a reset
    assert all(o[3]["hits"][0]["title"].startswith("client ") for o in outcomes if o[2] == 200)
    in_flight = [o for o in outcomes if o[2] == 200 and o[0] < signalled < o[1]]
    assert in_flight, "no request was in flight at SIGTERM"
    assert all(o[0] > signalled for o in outcomes if o[2] == "refused")
    assert rc == 0, output
    assert took < 10, output
    assert "search server shutting down:" in output and " 0 cut off" in output, output
    assert "Traceback" not in output, output


def test_sigterm_cuts_off_what_the_grace_period_cannot_finish_with_a_json_503(slow_backend):
    """The backend takes 20 s, the grace period is 1 s: the four requests in flight get 503
    ``{"detail": "server shutting down"}`` when it ends, and the process exits 0 without waiting for the backend."""
    _SlowBackend.delay = 20.0
    proc, url = start_search_server(slow_backend, "--cache-size", "0", "--shutdown-grace-s", "1", log_level="INFO",
                                    timeout_s=120)
    answers: list = []

    def ask(n: int) -> None:
        try:
            r = httpx.post(url + "/search", json={"query": f"slow {n}", "k": 1}, timeout=60)
            answers.append((r.status_code, r.headers.get("content-type"), r.json()))
        except httpx.TransportError as exc:
            answers.append((type(exc).__name__, None, str(exc)))

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while _SlowBackend.seen < 1:
            assert time.monotonic() < deadline, "the searches never reached the backend"
            time.sleep(0.05)
        time.sleep(0.3)  # the other three are queued behind the first batch
        rc, took, output = _stop(proc, timeout=30)
        for t in threads:
            t.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert answers == [(503, "application/json", {"detail": "server shutting down"})] * 4, answers
    assert rc == 0 and took < 1 + 8, (rc, took, output)
    assert "4 request(s) were in flight, 0 finished, 4 cut off" in output, output


def _ping_then_die(conn) -> None:
    conn.recv()  # the supervisor's ping
    os._exit(3)  # gone before answering it, as a worker that could not open its searcher is


def test_the_health_check_stops_waiting_for_a_worker_that_died():
    """uvicorn's health check waited the whole start-up allowance (600 s) for a worker that exited between the ping and
    its answer (the supervisor holds the worker's end of the pipe, so no end-of-file arrives): the server whose
    workers could not start then hung instead of exiting with the reason."""
    import types

    from agentic_rag.search.server import healthcheck_while_alive

    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=_ping_then_die, args=(child_conn,))
    child.start()
    worker = types.SimpleNamespace(parent_conn=parent_conn, child_conn=child_conn, process=child)
    started = time.monotonic()
    assert healthcheck_while_alive(worker, 600) is None
    assert time.monotonic() - started < 60
    child.join()
    assert child.exitcode == 3
