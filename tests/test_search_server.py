"""The retrieval server on 127.0.0.1 (a real uvicorn process) and the HTTP client."""

from __future__ import annotations

import http.server
import itertools
import json
import multiprocessing
import socket
import string
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
    assert 400 <= r.status_code < 500
    r = httpx.post(server + "/search", content=b"x" * (5 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "body over" in r.json()["detail"]
    assert httpx.get(server + "/search").status_code == 405
    assert httpx.get(server + "/nope").status_code == 404


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
