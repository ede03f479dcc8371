"""SIGTERM under load: what happens to the requests in flight when a server is told to stop (issue 29).

    python experiments/reliability/shutdown_load.py [--servers search,chat] [--clients 16] [--sigterm-after 2]
                                                    [--src DIR] [--grace-s 10] [--search-backend-delay-s 0]
                                                    [--search-workers 1] [--chat-max-tokens 1024]

For each server it starts the real thing as its own process on 127.0.0.1 from the source tree ``--src`` (default:
this checkout's ``src``; give ``/work/base/src`` for the code before the fix):

* search: ``agentic-rag serve-search`` over a BM25 index it builds in a temporary directory from the 2Wiki corpus
  in ../shared/data (the gold passages of 20 dev questions plus the first 300 passages: the tests' index). With
  ``--search-backend-delay-s`` > 0 the server searches through a stand-in backend that takes that long a batch
  (``serve-search --index http://...``), so that requests are still waiting when the grace period ends.
* chat: ``service/chat_server.py`` of that tree, serving a tiny random-init Qwen2 (2 layers, hidden 64, the real
  Qwen2 vocabulary) over the same index; the model writes freely until ``--chat-max-tokens`` (greedy), so every
  reply takes a while; half the clients stream.

``--clients`` concurrent clients (threads, one keep-alive ``httpx.Client`` each) send requests one after another;
``--sigterm-after`` seconds into the load the server gets SIGTERM. A client stops when a new connection is refused
(the server no longer accepts: the expected end) or when the server has exited. The grace period is passed as
``--shutdown-grace-s`` / ``AGENTIC_RAG_CHAT_SHUTDOWN_GRACE_S`` where the tree knows them (the old search server had
none: it waited for ever; the old chat server had a fixed 10 s).

Each request ends as one of: ``ok`` (a complete answer: search hits; a chat completion; a stream whose last chunk
has ``finish_reason``, then ``[DONE]``), ``proper_error`` (a JSON error the client can read: ``{"detail"}`` from the
search server, OpenAI's ``{"error": {...}}`` from the chat server, or in a stream an error chunk then ``[DONE]``),
``improper_error`` (any other answer: a text/plain 500, a stream that ends without ``[DONE]``), ``reset`` (the
connection broke under a request already sent: reset, closed without an answer), ``refused`` (a new connection
refused after SIGTERM) or ``timeout``. Recorded per server: the requests in flight at SIGTERM and how each ended,
the requests sent after it, the totals, the seconds from SIGTERM to the process's exit, its exit code, and the
server's shutdown log lines. One JSON line per server, then one JSON line with both, last.
"""

from __future__ import annotations

import argparse
import collections
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("AGENTIC_RAG_SHARED_DATA", ROOT.parent / "shared" / "data"))
MODEL_NAME = "tiny"
OUTCOMES = ("ok", "proper_error", "improper_error", "reset", "refused", "timeout")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------- fixtures


def build_index(work: Path) -> Path:
    """BM25 over the tests' 2Wiki subset (built with this checkout's code; both trees read the same format)."""
    sys.path.insert(0, str(ROOT / "src"))
    from agentic_rag.search.build import build_index as build

    corpus = json.loads((SHARED / "hipporag" / "2wikimultihopqa_corpus.json").read_text())
    dev = json.loads((SHARED / "tts-project" / "2wikimultihopqa_dev500.json").read_text())[:20]
    gold = {t for q in dev for t in q["supporting_facts"]}
    rows = [{"id": str(i), "title": p["title"], "text": p["text"]} for i, p in enumerate(corpus)
            if i < 300 or p["title"] in gold]
    (work / "corpus.json").write_text(json.dumps(rows))
    build(work / "corpus.json", work / "index", bm25=True, progress=False)
    return work / "index"


def build_model(work: Path) -> Path:
    """A tiny random-init Qwen2 with the real Qwen tokenizer, saved so the server loads it by path."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok_dir = work / "tok"
    tok_dir.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(SHARED / "rtp-llm-qwen-tokenizer" / "qwen2_tokenizer" / name, tok_dir / name)
    shutil.copy(SHARED / "rtp-llm-qwen-tokenizer" / "qwen3_30b_tokenizer_config" / "tokenizer_config.json",
                tok_dir / "tokenizer_config.json")
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True)
    model_dir = work / "model"
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return model_dir


class SlowBackend(http.server.BaseHTTPRequestHandler):
    """A stand-in search backend that answers ``/batch_search`` after ``delay`` seconds."""

    delay = 0.0

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        time.sleep(self.delay)
        out = {"results": [[{"docid": "d", "title": q, "text": "t", "score": 1.0}] for q in body["queries"]]}
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(out).encode())
        except OSError:
            pass

    def do_GET(self) -> None:  # noqa: N802
        self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


# ---------------------------------------------------------------------------------------------- the server


def help_text(src: Path, argv: list[str]) -> str:
    """The ``--help`` of the command in ``src`` (to see which flags that tree has)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run([*argv, "--help"], capture_output=True, text=True, env=env, timeout=300).stdout


def supports(src: Path, argv: list[str], flag: str) -> bool:
    """Whether the command in ``src`` has ``flag`` (the code before the fix lacks the grace-period flag)."""
    return flag in help_text(src, argv)


def start(argv: list[str], env: dict[str, str], url: str, log_path: Path, timeout: float = 300) -> subprocess.Popen:
    import httpx

    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited:\n{log_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the server did not answer in {timeout:.0f} s")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)


# --------------------------------------------------------------------------------------------- the clients


def classify_search(r: Any) -> str:
    try:
        body = r.json()
    except ValueError:
        return "improper_error"
    if r.status_code == 200 and isinstance(body, dict) and isinstance(body.get("hits"), list):
        return "ok"
    return "proper_error" if isinstance(body, dict) and isinstance(body.get("detail"), str) else "improper_error"


def classify_chat(r: Any) -> str:
    try:
        body = r.json()
    except ValueError:
        return "improper_error"
    if r.status_code == 200 and isinstance(body, dict) and body.get("choices"):
        return "ok"
    error = body.get("error") if isinstance(body, dict) else None
    return "proper_error" if isinstance(error, dict) and {"message", "type", "code"} <= set(error) \
        else "improper_error"


def classify_stream(lines: list[str]) -> str:
    """A 200 stream's data lines: a finish chunk then [DONE] is ok; an error chunk then [DONE] a proper error."""
    if len(lines) < 2 or lines[-1] != "[DONE]":
        return "improper_error"  # ended without [DONE]
    chunks = [json.loads(x) for x in lines[:-1]]
    error = chunks[-1].get("error")
    if error is not None:
        return "proper_error" if isinstance(error, dict) and {"message", "type", "code"} <= set(error) \
            else "improper_error"
    finished = any(c["choices"][0].get("finish_reason") for c in chunks if c.get("choices"))
    return "ok" if finished else "improper_error"


def one_request(client: Any, url: str, kind: str, n: int, i: int, max_tokens: int) -> str:
    import httpx

    try:
        if kind == "search":
            r = client.post(url + "/search", json={"query": f"Teutberga queen {n} {i}", "k": 3})
            return classify_search(r)
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": f"Question {n}.{i}?"}],
                "max_tokens": max_tokens, "temperature": 0}
        if n % 2 == 0:
            r = client.post(url + "/v1/chat/completions", json=body)
            return classify_chat(r)
        lines: list[str] = []
        with client.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as r:
            if r.status_code != 200:
                r.read()
                return classify_chat(r)
            for line in r.iter_lines():
                if line.startswith("data:"):
                    lines.append(line[5:].strip())
        return classify_stream(lines)
    except httpx.ConnectError:
        return "refused"
    except httpx.TimeoutException:
        return "timeout"
    except httpx.TransportError as exc:  # reset, or closed with the request sent and no answer
        return f"reset: {type(exc).__name__}: {exc}"


def client_loop(url: str, kind: str, n: int, max_tokens: int, records: list, stop: threading.Event) -> None:
    import httpx

    with httpx.Client(timeout=120) as client:
        i = 0
        while not stop.is_set():
            sent = time.monotonic()
            outcome = one_request(client, url, kind, n, i, max_tokens)
            detail = None
            if outcome.startswith("reset: "):
                outcome, detail = "reset", outcome[len("reset: "):]
            records.append((sent, time.monotonic(), outcome, detail))
            if outcome == "refused":
                return
            if outcome in ("reset", "timeout"):
                time.sleep(0.05)
            i += 1


def counts(records: list) -> dict[str, int]:
    c = collections.Counter(r[2] for r in records)
    return {k: c.get(k, 0) for k in OUTCOMES}


def run_load(kind: str, url: str, proc: subprocess.Popen, args: argparse.Namespace, log_path: Path) -> dict:
    records: list = []
    stop = threading.Event()
    threads = [threading.Thread(target=client_loop, args=(url, kind, n, args.chat_max_tokens, records, stop),
                                daemon=True) for n in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(args.sigterm_after)
    signalled = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    try:
        rc = proc.wait(args.exit_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = f"killed after {args.exit_timeout:g} s"
    exit_s = time.monotonic() - signalled
    time.sleep(1.0)  # let the clients see the closed port
    stop.set()
    for t in threads:
        t.join(150)
    in_flight = [r for r in records if r[0] < signalled < r[1]]
    after = [r for r in records if r[0] >= signalled]
    lines = [line.split(": ", 1)[-1] for line in log_path.read_text(errors="replace").splitlines()
             if "agentic_rag.graceful" in line]
    return {"in_flight_at_sigterm": len(in_flight), "in_flight": counts(in_flight), "sent_after_sigterm": counts(after),
            "requests": len(records), "totals": counts(records),
            "connection_errors": sum(1 for r in records if r[2] in ("reset", "timeout")),
            "reset_examples": sorted({r[3] for r in records if r[3]})[:5],
            "sigterm_to_exit_s": round(exit_s, 2), "exit_code": rc, "shutdown_log": lines}


# -------------------------------------------------------------------------------------------------- main


def measure_search(args: argparse.Namespace, src: Path, work: Path, index: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = [sys.executable, "-m", "agentic_rag.cli", "--log-level", "INFO", "serve-search"]
    backend = None
    target = str(index)
    if args.search_backend_delay_s > 0:
        SlowBackend.delay = args.search_backend_delay_s
        backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowBackend)
        backend.daemon_threads = True
        threading.Thread(target=backend.serve_forever, daemon=True).start()
        target = f"http://127.0.0.1:{backend.server_address[1]}"
    argv = [*cli, "--index", target, "--port", str(port), "--cache-size", "0", "--workers", str(args.search_workers)]
    grace: Any = "none (waits for ever)"
    if supports(src, cli, "--shutdown-grace-s"):
        argv += ["--shutdown-grace-s", str(args.grace_s)]
        grace = args.grace_s
    env = {**os.environ, "PYTHONPATH": str(src)}
    log_path = work / "search.log"
    proc = start(argv, env, url, log_path)
    try:
        result = run_load("search", url, proc, args, log_path)
    finally:
        if proc.poll() is None:
            proc.kill()
        if backend is not None:
            backend.shutdown()
    return {"server": "search", "workers": args.search_workers, "backend_delay_s": args.search_backend_delay_s,
            "grace_s": grace, **result}


def measure_chat(args: argparse.Namespace, src: Path, work: Path, index: Path) -> dict:
    import httpx

    model = build_model(work)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    entry = src.parent / "service" / "chat_server.py"
    argv = [sys.executable, str(entry), "--model", str(model), "--index", str(index), "--port", str(port),
            "--model-name", MODEL_NAME, "--max-tokens-per-turn", "4096", "--log-level", "INFO"]
    chat_help = help_text(src, [sys.executable, str(entry)])
    if "--max-completion-tokens" in chat_help:  # a tree with a total budget refuses a turn larger than it
        argv += ["--max-completion-tokens", "4096"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIC_RAG_CHAT_")}
    env.update({"AGENTIC_RAG_CHAT_SHUTDOWN_GRACE_S": str(args.grace_s), "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1"})
    grace: Any = args.grace_s if "--shutdown-grace-s" in chat_help else "10 (fixed)"
    log_path = work / "chat.log"
    proc = start(argv, env, url, log_path)
    try:
        warm = httpx.post(url + "/v1/chat/completions", timeout=300, json={
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "Warm up?"}], "max_tokens": 8})
        warm.raise_for_status()
        result = run_load("chat", url, proc, args, log_path)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {"server": "chat", "max_tokens": args.chat_max_tokens, "grace_s": grace, **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="search,chat", help="comma-separated: search, chat")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--sigterm-after", type=float, default=2.0, help="seconds of load before SIGTERM")
    ap.add_argument("--src", default=str(ROOT / "src"), help="source tree to run the servers from")
    ap.add_argument("--grace-s", type=float, default=10.0, help="shutdown grace period, where the tree has one")
    ap.add_argument("--search-backend-delay-s", type=float, default=0.0,
                    help="> 0: search through a stand-in backend this slow instead of the BM25 index directly")
    ap.add_argument("--search-workers", type=int, default=1)
    ap.add_argument("--chat-max-tokens", type=int, default=1024,
                    help="max_tokens of every chat request (the default keeps them running past a 10 s grace period "
                         "on a CPU; a small value shows replies finishing within it)")
    ap.add_argument("--exit-timeout", type=float, default=120.0, help="seconds to wait for the exit before SIGKILL")
    args = ap.parse_args()
    src = Path(args.src).resolve()
    work = Path(tempfile.mkdtemp(prefix="shutdown_load_"))
    results = {}
    try:
        index = build_index(work)
        for name in [s.strip() for s in args.servers.split(",") if s.strip()]:
            measure = {"search": measure_search, "chat": measure_chat}[name]
            results[name] = {"src": str(src), "clients": args.clients, "sigterm_after_s": args.sigterm_after,
                             **measure(args, src, work, index)}
            print(json.dumps(results[name]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"benchmark": "shutdown_load", "src": str(src), "cpu_count": os.cpu_count(), **results}))


if __name__ == "__main__":
    main()
