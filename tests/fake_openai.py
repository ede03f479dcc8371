"""A fake OpenAI-compatible server on 127.0.0.1 for tests: ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions``, each answered by a Python function of the request body.

A handler returns a payload dict (HTTP 200), ``(status, payload)``, or raises :class:`Hang` to sleep before
answering. The server records every request and, per route, the most requests it had in flight at once.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

Handler = Callable[[dict[str, Any]], Any]


class FakeOpenAI:
    def __init__(self, *, completions: Handler | None = None, chat: Handler | None = None,
                 models: tuple[str, ...] = ("fake-model",), delay: float = 0.0):
        self.completions, self.chat, self.models, self.delay = completions, chat, models, delay
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.in_flight: dict[str, int] = {}
        self.max_in_flight_by_path: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def max_in_flight(self) -> int:
        """The most requests of one route ever in flight at once."""
        return max(self.max_in_flight_by_path.values(), default=0)

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [b for p, b in self.requests if p == path]

    def _handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if method == "GET" and path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]}
        fn = {"/v1/completions": self.completions, "/v1/chat/completions": self.chat}.get(path)
        if method != "POST" or fn is None:
            return 404, {"error": {"message": f"no route {method} {path}"}}
        with self._lock:
            self.requests.append((path, body))
            self.in_flight[path] = self.in_flight.get(path, 0) + 1
            self.max_in_flight_by_path[path] = max(self.max_in_flight_by_path.get(path, 0), self.in_flight[path])
        try:
            if self.delay:
                time.sleep(self.delay)
            out = fn(body)
        finally:
            with self._lock:
                self.in_flight[path] -= 1
        return out if isinstance(out, tuple) else (200, out)

    def _handler_class(self):
        fake = self

        class _H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, payload: Any) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                head = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(data)}\r\n\r\n").encode()
                self.wfile.write(head + data)  # one write: no Nagle / delayed-ACK stall
                self.wfile.flush()

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._reply(*fake._handle("GET", self.path, {}))

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                self._reply(*fake._handle("POST", self.path, body))

        return _H


def completion(text: str, finish_reason: str = "stop", **extra: Any) -> dict[str, Any]:
    """A /v1/completions response body with one choice (extra fields, e.g. vLLM's stop_reason, included)."""
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None, **extra}
    return {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()), "model": "fake-model",
            "choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def chat_reply(content: Any) -> dict[str, Any]:
    return {"id": "chat-fake", "object": "chat.completion", "created": int(time.time()), "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class ScriptedCompletions:
    """Plays scripted turns like a served model: the script is chosen by the question found in the prompt, the
    turn by how many observations the assistant part already holds. Like a real server it stops at the first
    stop string and strips it; ``vllm=True`` reports it in ``stop_reason`` (None for EOS), else nothing."""

    def __init__(self, scripts: dict[str, list[str]], *, vllm: bool | Callable[[str], bool] = True,
                 observation_close: str = "</observation>", assistant_marker: str = "<|im_start|>assistant"):
        self.scripts, self.vllm = scripts, vllm
        self.observation_close, self.assistant_marker = observation_close, assistant_marker
        self.first_turns: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        key = max((k for k in self.scripts if k in prompt), key=len, default=None)
        if key is None:
            return 400, {"error": {"message": "no script for this prompt"}}
        assistant = prompt.rsplit(self.assistant_marker, 1)[-1]
        turn = assistant.count(self.observation_close)
        if turn == 0:
            with self._lock:
                self.first_turns[key] = self.first_turns.get(key, 0) + 1
        script = self.scripts[key]
        text = script[turn] if turn < len(script) else ""
        stops = body.get("stop") or []
        hits = [(text.find(s), s) for s in stops if s in text]
        vllm = self.vllm(key) if callable(self.vllm) else self.vllm
        if hits:
            pos, stop = min(hits)
            extra = {"stop_reason": stop} if vllm else {}
            return completion(text[:pos], "stop", **extra)
        return completion(text, "stop", **({"stop_reason": None} if vllm else {}))
