"""Retrieval throughput and latency: in-process BM25, the HTTP server with 1 and 4 clients, the client cache.

    python experiments/benchmarks/retrieval.py [--corpus ../shared/data/hipporag/2wikimultihopqa_corpus.json]
        [--questions ../shared/data/tts-project/2wikimultihopqa_dev500.json] [--index outputs/bench/2wiki-bm25]

Queries are the 500 2WikiMultiHopQA dev questions; k = 5. The server runs with its own cache off, so the
server numbers measure HTTP + batching + Lucene, not a cache. Two extra one-client runs leave Nagle's
algorithm on: httpx without TCP_NODELAY, and the standard library's http.client (which writes headers and
body separately, so each request waits for the server's delayed ACK). The last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from agentic_rag.data.questions import read_questions  # noqa: E402
from agentic_rag.search import open_searcher  # noqa: E402
from agentic_rag.search.build import build_index  # noqa: E402
from agentic_rag.search.client import HTTPSearcher  # noqa: E402

K = 5


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(index: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentic_rag.cli", "--log-level", "WARNING", "serve-search",
                             "--index", str(index), "--port", str(port), "--cache-size", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def timed_queries(searcher, queries: list[str]) -> tuple[float, list[float]]:
    lat = []
    t0 = time.perf_counter()
    for q in queries:
        t = time.perf_counter()
        searcher.search(q, K)
        lat.append(time.perf_counter() - t)
    return time.perf_counter() - t0, lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/data/hipporag/2wikimultihopqa_corpus.json"))
    ap.add_argument("--questions", default=str(ROOT.parent / "shared/data/tts-project/2wikimultihopqa_dev500.json"))
    ap.add_argument("--index", default=str(ROOT / "outputs/bench/2wiki-bm25"))
    args = ap.parse_args()

    build_index(args.corpus, args.index, bm25=True, progress=False)
    queries = [r.question for r in read_questions(args.questions)]

    # The server is measured first, before this process starts a JVM of its own to compete for the cores.
    # Each JVM is warmed with one full pass first (the JIT compiles Lucene's hot paths on the first queries).
    proc, url = start_server(Path(args.index))
    try:
        with HTTPSearcher(url, cache_size=0) as one:
            timed_queries(one, queries)
            t_one, lat = timed_queries(one, queries)

        def client(qs: list[str], out: list[float]) -> None:
            with HTTPSearcher(url, cache_size=0) as s:
                out.extend(timed_queries(s, qs)[1])

        lat4: list[float] = []
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(queries[i::4], lat4)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_four = time.perf_counter() - t0

        # Nagle on: the same client without TCP_NODELAY
        nagle = HTTPSearcher(url, cache_size=0)
        nagle._client = httpx.Client(timeout=10.0)
        t_nagle, _ = timed_queries(nagle, queries)

        # The standard library's http.client (headers and body in separate writes, Nagle on): 100 queries
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        stdlib_queries = queries[:100]
        t0 = time.perf_counter()
        for q in stdlib_queries:
            conn.request("POST", "/search", body=json.dumps({"query": q, "k": K}),
                         headers={"content-type": "application/json"})
            conn.getresponse().read()
        t_stdlib = (time.perf_counter() - t0) * len(queries) / len(stdlib_queries)
        conn.close()

        cached = HTTPSearcher(url, cache_size=10000)
        t_cold, _ = timed_queries(cached, queries)
        t_warm, _ = timed_queries(cached, queries)
        health = httpx.get(url + "/health").json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    local = open_searcher(args.index, "bm25")
    timed_queries(local, queries)
    t_local, _ = timed_queries(local, queries)
    t0 = time.perf_counter()
    for i in range(0, len(queries), 64):
        local.batch_search(queries[i:i + 64], K)
    t_local_batch = time.perf_counter() - t0

    lat_ms = sorted(x * 1000 for x in lat)
    result = {
        "queries": len(queries), "k": K, "index": args.index,
        "qps_inprocess": round(len(queries) / t_local, 1),
        "qps_inprocess_batch64": round(len(queries) / t_local_batch, 1),
        "qps_server_1client": round(len(queries) / t_one, 1),
        "qps_server_4clients": round(len(queries) / t_four, 1),
        "qps_server_1client_httpx_no_nodelay": round(len(queries) / t_nagle, 1),
        "qps_server_1client_stdlib_no_nodelay": round(len(queries) / t_stdlib, 1),
        "p50_ms": round(statistics.median(lat_ms), 2),
        "p99_ms": round(lat_ms[int(0.99 * (len(lat_ms) - 1))], 2),
        "p99_ms_4clients": round(sorted(x * 1000 for x in lat4)[int(0.99 * (len(lat4) - 1))], 2),
        "cache_speedup": round(t_cold / t_warm, 1),
        "server_batches": health["batches"], "server_queries": health["queries"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
