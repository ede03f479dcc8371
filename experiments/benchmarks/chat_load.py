"""Load test of the chat service: concurrent clients against a real server process, zero 5xx expected.

    python experiments/benchmarks/chat_load.py [--clients 16] [--requests-per-client 4] [--max-batch 8]
                                               [--queue-size 64] [--time-limit 600] [--index DIR]

Server: ``service``'s app in its own process on 127.0.0.1 (uvicorn, one worker), serving a random-init
Qwen2-architecture model (4 layers, hidden 128, the real Qwen2 vocabulary from ../shared/data) loaded by
path, searching a real BM25 index over the 2WikiMultiHopQA corpus (6,119 passages; built into a temporary
directory unless ``--index`` names one). A random model never writes tags, so a forcing processor makes it
write, for each 2Wiki dev question, ``<think>..</think><search>question</search>`` and then
``<think>..</think><answer>gold answer</answer>``: every reply decodes, searches the real index, streams and
answers for real; only the choice of token is forced.

Clients: ``--clients`` concurrent clients (asyncio + httpx), each sending ``--requests-per-client`` requests
one after another, alternately streaming and not, greedy; a load phase is bounded by ``--time-limit`` seconds
and each request by ``--request-timeout``, and the load runs ``--phases`` times in a row. Recorded: status
codes (5xx must be zero), throughput (requests/s, model tokens/s from ``usage``), latency p50/p99 (whole
reply) and time to the first streamed text, the server's RSS (psutil) after a warm-up request and after each
phase (flat across phases: no leak), and how the scheduler batched.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
SHARED = Path(os.environ.get("AGENTIC_RAG_SHARED_DATA", ROOT.parent / "shared" / "data"))
MODEL_NAME = "tiny-agent"


def load_questions(n: int) -> list[dict]:
    rows = json.loads((SHARED / "tts-project" / "2wikimultihopqa_dev500.json").read_text())
    return [{"question": r["question"], "answer": r["answer"]} for r in rows[:n]]


def turns_for(q: dict) -> list[str]:
    return [f"<think>I should look this up.</think>\n<search>{q['question']}</search>",
            f"<think>The passages answer it.</think>\n<answer>{q['answer']}</answer>"]


# ------------------------------------------------------------------------------------------ the server


def prepare(work: Path, index: str | None) -> tuple[Path, Path]:
    """The tiny model + real tokenizer saved by path, and the BM25 index over the whole 2Wiki corpus."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok_dir = work / "tok"
    tok_dir.mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(SHARED / "rtp-llm-qwen-tokenizer" / "qwen2_tokenizer" / name, tok_dir / name)
    shutil.copy(SHARED / "rtp-llm-qwen-tokenizer" / "qwen3_30b_tokenizer_config" / "tokenizer_config.json",
                tok_dir / "tokenizer_config.json")
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True)
    model_dir = work / "model"
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    if index:
        return model_dir, Path(index)
    from agentic_rag.search.build import build_index

    index_dir = work / "index"
    build_index(SHARED / "hipporag" / "2wikimultihopqa_corpus.json", index_dir, bm25=True, progress=False)
    return model_dir, index_dir


def serve(args: argparse.Namespace) -> None:
    """The server process: the real app, with the forcing processor for the benchmark's questions."""
    import torch
    import uvicorn

    from agentic_rag.models import load_tokenizer
    from agentic_rag.serving.agent import ChatAgent
    from agentic_rag.serving.app import create_app
    from agentic_rag.serving.config import config_for
    from agentic_rag.serving.forcing import ScriptedTurns, keyed_script

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    config = config_for([f"model.model={args.model}", f"search.index={args.index}", f"server.port={args.port}",
                         f"server.max_batch={args.max_batch}", f"server.queue_size={args.queue_size}",
                         f"model.model_name={MODEL_NAME}", "model.dtype=float32"])
    tok = load_tokenizer(config.model.model)
    script = keyed_script({q["question"]: turns_for(q) for q in load_questions(args.questions)})
    agent = ChatAgent.load(config, processors=[ScriptedTurns(tok, script)], tokenizer=tok)
    uvicorn.run(create_app(agent, config), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ the clients


async def one_request(http, q: dict, stream: bool, timeout: float) -> dict:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": q["question"]}], "stream": stream,
            "temperature": 0}
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    out = {"stream": stream, "status": None, "latency_s": None, "ttft_s": None, "tokens": 0, "answer": None,
           "searches": 0}
    try:
        if not stream:
            r = await http.post("/v1/chat/completions", json=body, timeout=timeout)
            out["status"] = r.status_code
            if r.status_code == 200:
                data = r.json()
                out["tokens"] = data["usage"]["completion_tokens"]
                out["answer"] = data["choices"][0]["message"]["content"]
                out["searches"] = data["agent_trace"]["num_searches"]
        else:
            async with http.stream("POST", "/v1/chat/completions", json=body, timeout=timeout) as r:
                out["status"] = r.status_code
                content = []
                async for line in r.aiter_lines():
                    if not line.startswith("data:") or line.endswith("[DONE]"):
                        continue
                    chunk = json.loads(line[5:])
                    if "error" in chunk:
                        out["status"] = 500
                        break
                    for c in chunk.get("choices", []):
                        d = c.get("delta") or {}
                        if (d.get("content") or d.get("reasoning_content")) and out["ttft_s"] is None:
                            out["ttft_s"] = time.perf_counter() - t0
                        content.append(d.get("content") or "")
                    if chunk.get("usage"):
                        out["tokens"] = chunk["usage"]["completion_tokens"]
                    if chunk.get("agent_trace"):
                        out["searches"] = chunk["agent_trace"]["num_searches"]
                out["answer"] = "".join(content)
    except Exception as exc:  # noqa: BLE001 - a transport failure is recorded, not fatal
        out["status"] = f"transport:{type(exc).__name__}"
    out["latency_s"] = time.perf_counter() - t0
    return out


async def load(url: str, questions: list[dict], clients: int, per_client: int, time_limit: float,
               request_timeout: float) -> tuple[list[dict], float]:
    import httpx

    results: list[dict] = []
    deadline = time.perf_counter() + time_limit
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)

    async with httpx.AsyncClient(base_url=url, limits=limits) as http:
        async def client(c: int) -> None:
            for k in range(per_client):
                if time.perf_counter() > deadline:
                    return
                q = questions[(c * per_client + k) % len(questions)]
                res = await one_request(http, q, stream=(c + k) % 2 == 0, timeout=request_timeout)
                res["expected"] = q["answer"]
                results.append(res)

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(clients))), time_limit + request_timeout)
        return results, time.perf_counter() - t0


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)  # nearest rank
    return round(v[min(len(v) - 1, max(0, math.ceil(p / 100 * len(v)) - 1))], 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--queue-size", type=int, default=64)
    ap.add_argument("--phases", type=int, default=2, help="times the whole load is repeated (a leak check)")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds for one load phase")
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--index", default=None, help="an existing BM25 index of the 2Wiki corpus (else built)")
    ap.add_argument("--questions", type=int, default=64, help="distinct 2Wiki dev questions to ask")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch threads in the server (default: torch's own choice; 1 helps on a busy small CPU)")
    # the server process
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args)
        return

    import httpx
    import psutil

    work = Path(tempfile.mkdtemp(prefix="chat_load_"))
    proc = None
    try:
        t_prep = time.perf_counter()
        model_dir, index_dir = prepare(work, args.index)
        prep_s = time.perf_counter() - t_prep
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(work / "server.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([sys.executable, __file__, "--serve", "--model", str(model_dir), "--index",
                                 str(index_dir), "--port", str(port), "--max-batch", str(args.max_batch),
                                 "--queue-size", str(args.queue_size), "--questions", str(args.questions),
                                 "--torch-threads", str(args.torch_threads)],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit("server exited:\n" + (work / "server.log").read_text()[-3000:])
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                raise SystemExit("server did not start in 300 s")
            time.sleep(0.3)
        server = psutil.Process(proc.pid)
        questions = load_questions(args.questions)
        first = {"model": MODEL_NAME, "messages": [{"role": "user", "content": questions[0]["question"]}]}
        warm = httpx.post(url + "/v1/chat/completions", timeout=120, json=first)
        warm.raise_for_status()
        rss_before = server.memory_info().rss
        load_before = os.getloadavg()[0]
        results, wall, phases = [], 0.0, []
        for _ in range(args.phases):  # the same load again: RSS that keeps growing would be a leak
            res, w = asyncio.run(load(url, questions, args.clients, args.requests_per_client, args.time_limit,
                                      args.request_timeout))
            results += res
            wall += w
            ok_phase = [r["latency_s"] for r in res if r["status"] == 200]
            phases.append({"requests": len(res), "wall_s": round(w, 2), "requests_per_s": round(len(ok_phase) / w, 3),
                           "latency_p50_s": pct(ok_phase, 50), "latency_p99_s": pct(ok_phase, 99),
                           "server_rss_mb_after": round(server.memory_info().rss / 2**20, 1)})
        rss_after = server.memory_info().rss
        health = httpx.get(url + "/health", timeout=10).json()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)

    codes: dict[str, int] = {}
    for r in results:
        codes[str(r["status"])] = codes.get(str(r["status"]), 0) + 1
    ok = [r for r in results if r["status"] == 200]
    lat = [r["latency_s"] for r in ok]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    tokens = sum(r["tokens"] for r in ok)
    n_5xx = sum(v for k, v in codes.items() if k.startswith("5") or k.startswith("transport"))
    out = {
        "benchmark": "chat_load",
        "clients": args.clients, "requests_per_client": args.requests_per_client, "phases_run": args.phases,
        "requests": len(results),
        "max_batch": args.max_batch, "queue_size": args.queue_size, "status_counts": codes, "errors_5xx": n_5xx,
        "wall_s": round(wall, 2), "requests_per_s": round(len(ok) / wall, 3),
        "completion_tokens_per_s": round(tokens / wall, 1),
        "latency_s": {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": round(max(lat), 3) if lat else None,
                      "mean": round(statistics.mean(lat), 3) if lat else None},
        "time_to_first_text_s": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "answers_correct": sum(r["answer"] == r["expected"] for r in ok),
        "searches_per_reply": round(statistics.mean(r["searches"] for r in ok), 2) if ok else None,
        "server_rss_mb_before": round(rss_before / 2**20, 1), "server_rss_mb_after": round(rss_after / 2**20, 1),
        "phases": phases,
        "scheduler": {k: health["scheduler"][k] for k in ("runs", "batch_sizes", "finish_reasons", "completed",
                                                           "rejected_queue_full")},
        "setup_s": round(prep_s, 1),
        "model": "random-init Qwen2 (4 layers, hidden 128, Qwen2 vocab), forced to search once and answer",
        "index": "BM25 over the 2WikiMultiHopQA corpus (6,119 passages)",
        "cpu_count": os.cpu_count(), "torch_threads": args.torch_threads or "default",
        "load_average_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
    }
    print(json.dumps(out))
    if n_5xx:
        sys.exit(1)


if __name__ == "__main__":
    main()
