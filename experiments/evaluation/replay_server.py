"""Serve a released model's recorded rollouts as if the model were live: an OpenAI-compatible ``/v1/completions``
endpoint on 127.0.0.1 that answers each turn with the turn the model actually wrote.

    python experiments/evaluation/replay_server.py \
        --rollouts ../shared/data/r1-searcher/eval_results/hotpotqa_llama.jsonl --port 8011 [--vllm]

Each record's ``gen_text_store`` (R1-Searcher's Llama-3.1-8B on hotpotqa_500) is cut into model turns at
its ``<|begin_of_documents|> ... <|end_of_documents|>`` observations. A request's question is read from the
base-model prompt (``User: QUESTION``), its turn from the number of observations the assistant part already
holds. Like a real server, the reply stops at the first of the request's ``stop`` strings and strips it;
``finish_reason`` is ``stop``. With ``--vllm`` the matched stop is reported in ``stop_reason`` as vLLM does;
without it (the default) nothing says which stop matched, so the client must infer it.

What this measures: the evaluation pipeline (endpoint policy, stop handling, the engine with a real index,
answer extraction, scoring) on 500 real multi-turn trajectories. The model's turns are fixed, so the
observations our index returns do not change them, and the scores should land next to the released
predictions' own (``agentic-rag score`` on the same file).
"""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import time

DOCS_OPEN, DOCS_CLOSE = "<|begin_of_documents|>", "<|end_of_documents|>"


def model_turns(text: str) -> list[str]:
    turns, rest = [], text
    while DOCS_OPEN in rest:
        head, _, tail = rest.partition(DOCS_OPEN)
        turns.append(head.rstrip("\n"))
        rest = tail.partition(DOCS_CLOSE)[2].lstrip("\n")
    turns.append(rest)
    return turns


class Replay:
    def __init__(self, path: str, vllm: bool):
        self.turns: dict[str, list[str]] = {}
        with open(path, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                self.turns.setdefault(row["question"].strip(), model_turns(row["gen_text_store"]))
        self.vllm = vllm

    def complete(self, body: dict) -> tuple[int, dict]:
        prompt = body.get("prompt", "")
        # the base-model prompt ends in "Assistant:" with no space after it; the model's turns follow
        question = prompt.rsplit("\nUser: ", 1)[-1].split("\nAssistant:", 1)[0].strip()
        turns = self.turns.get(question)
        if turns is None:
            return 404, {"error": {"message": f"no recorded rollout for {question[:80]!r}"}}
        assistant = prompt.rsplit("\nAssistant:", 1)[-1]
        n = assistant.count(DOCS_CLOSE)
        text = turns[n] if n < len(turns) else ""
        hits = [(text.find(s), s) for s in body.get("stop") or [] if s in text]
        extra: dict = {}
        if hits:
            pos, stop = min(hits)
            text = text[:pos]
            if self.vllm:
                extra["stop_reason"] = stop
        elif self.vllm:
            extra["stop_reason"] = None
        choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None, **extra}
        return 200, {"id": "replay", "object": "text_completion", "created": int(time.time()),
                     "model": body.get("model"), "choices": [choice],
                     "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


def serve(replay: Replay, port: int, model: str) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.wfile.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}"
                             f"\r\n\r\n".encode() + data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/v1/models":
                self._reply(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self._reply(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/v1/completions":
                self._reply(*replay.complete(body))
            else:
                self._reply(404, {"error": {"message": "not found"}})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"replaying {len(replay.turns)} rollouts on http://127.0.0.1:{port}/v1 as model {model!r}", flush=True)
    server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", required=True)
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--model", default="r1-searcher-replay")
    ap.add_argument("--vllm", action="store_true", help="report the matched stop string in stop_reason, as vLLM")
    args = ap.parse_args()
    serve(Replay(args.rollouts, args.vllm), args.port, args.model)


if __name__ == "__main__":
    main()
