"""The chat client: a small HTTP client of the chat server, and a terminal front end for it.

    python service/chat_client.py                          # interactive: streams the answer and the trace
    python service/chat_client.py --once "Who directed X?"  # one-shot: prints the answer (--json: everything)

Interactive mode shows the model's reasoning dimmed as it is written, each search as
``[search] "query" -> Title A; Title B``, then the answer and a one-line summary; the conversation is kept
(``/reset`` clears it, ``/quit`` or Ctrl-D leaves, Ctrl-C stops the reply being written, which cancels it on
the server). The client talks plain HTTP + server-sent events with httpx, so it shows the server's extra
fields (``reasoning_content``, ``agent_event``, ``agent_trace``) without any SDK.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

import httpx

DEFAULT_URL = "http://127.0.0.1:8001"


class ChatError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class ChatClient:
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, model: str | None = None,
                 timeout: float = 600.0):
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[:-3]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self._model = model

    def close(self) -> None:
        self.http.close()

    @property
    def model(self) -> str:
        if self._model is None:
            data = self._check(self.http.get("/v1/models")).json()
            self._model = data["data"][0]["id"]
        return self._model

    @staticmethod
    def _check(resp: httpx.Response) -> httpx.Response:
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:500]
            raise ChatError(resp.status_code, message)
        return resp

    def _body(self, messages: list[dict[str, str]], stream: bool, **params: Any) -> dict[str, Any]:
        body = {"model": self.model, "messages": messages, "stream": stream}
        body.update({k: v for k, v in params.items() if v is not None})
        return body

    def complete(self, messages: list[dict[str, str]], **params: Any) -> dict[str, Any]:
        return self._check(self.http.post("/v1/chat/completions", json=self._body(messages, False, **params))).json()

    def stream(self, messages: list[dict[str, str]], **params: Any) -> Iterator[dict[str, Any]]:
        """The reply's chunks as they arrive (closing the iterator closes the connection)."""
        body = self._body(messages, True, **params)
        with self.http.stream("POST", "/v1/chat/completions", json=body) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._check(resp)
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise ChatError(500, chunk["error"].get("message", "stream error"))
                yield chunk


# ----------------------------------------------------------------------------------------- rendering


def search_lines(event: dict[str, Any]) -> list[str]:
    """``[search] "query" -> Title A; Title B`` for each query of a search event."""
    lines = []
    for result in event.get("results", []):
        if "hits" in result:
            titles = "; ".join(h.get("title") or h.get("docid", "?") for h in result["hits"]) or "(nothing new)"
        else:
            titles = (result.get("text") or "")[:80]
        lines.append(f'[search] "{result.get("query", "")}" -> {titles}')
    return lines


def event_lines(event: dict[str, Any]) -> list[str]:
    kind = event.get("type")
    if kind == "search":
        return search_lines(event)
    if kind == "error":
        return [f"[error] {event.get('message') or event.get('kind')}"]
    if kind in ("backtrack", "summary", "limit"):
        detail = event.get("reason") or event.get("text") or event.get("name") or ""
        return [f"[{kind}] {detail}".rstrip()]
    return []


def summary_line(trace: dict[str, Any], seconds: float) -> str:
    n = trace.get("num_searches", 0)
    return (f"({n} search{'es' if n != 1 else ''}, {trace.get('num_turns', 0)} turns, "
            f"finish: {trace.get('finish_reason')}, {seconds:.1f} s)")


class Renderer:
    """Writes a streamed reply readably: reasoning dimmed, searches on their own lines, then the answer."""

    def __init__(self, out: TextIO = sys.stdout, color: bool = True, show_reasoning: bool = True):
        self.out, self.color, self.show_reasoning = out, color, show_reasoning
        self._in_answer = False
        self._col0 = True

    def _style(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self._col0 = text.endswith("\n")

    def _line(self, text: str) -> None:
        self._write(("" if self._col0 else "\n") + text + "\n")

    def chunk(self, chunk: dict[str, Any]) -> None:
        event = chunk.get("agent_event")
        if event:
            for line in event_lines(event):
                self._line(self._style(line, "36"))
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content") and self.show_reasoning:
                self._write(self._style(delta["reasoning_content"], "2"))
            if delta.get("content"):
                if not self._in_answer:
                    self._line(self._style("answer:", "1"))
                    self._in_answer = True
                self._write(delta["content"])

    def finish(self, trace: dict[str, Any] | None, seconds: float) -> None:
        if trace is not None:
            self._line(self._style(summary_line(trace, seconds), "2"))
        self._in_answer = False


def stream_reply(client: ChatClient, messages: list[dict[str, str]], renderer: Renderer,
                 **params: Any) -> tuple[str, dict[str, Any] | None]:
    """Stream one reply through ``renderer``; returns (answer text, trace)."""
    t0, content, trace = time.monotonic(), [], None
    chunks = client.stream(messages, **params)
    try:
        for chunk in chunks:
            renderer.chunk(chunk)
            for choice in chunk.get("choices", []):
                content.append((choice.get("delta") or {}).get("content") or "")
            trace = chunk.get("agent_trace", trace)
    finally:
        chunks.close()  # closes the connection: the server cancels the reply if it was cut short
    renderer.finish(trace, time.monotonic() - t0)
    return "".join(content), trace


# ------------------------------------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="chat_client", description="Terminal client of the agentic-rag chat server.")
    p.add_argument("--url", default=os.environ.get("AGENTIC_RAG_CHAT_URL") or DEFAULT_URL,
                   help=f"server URL; env AGENTIC_RAG_CHAT_URL (default {DEFAULT_URL})")
    p.add_argument("--token", default=os.environ.get("AGENTIC_RAG_CHAT_API_TOKEN") or None,
                   help="bearer token; env AGENTIC_RAG_CHAT_API_TOKEN")
    p.add_argument("--model", default=None, help="model id (default: the one the server serves)")
    p.add_argument("--once", metavar="QUESTION", help="ask one question, print the answer, exit")
    p.add_argument("--json", action="store_true", help="with --once: print the whole response as JSON")
    p.add_argument("--trace", action="store_true", help="with --once: print the search steps to stderr")
    p.add_argument("--system", default=None, help="a system message replacing the agent's own")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--hide-reasoning", action="store_true", help="interactive: do not show the reasoning")
    p.add_argument("--no-color", action="store_true", help="no ANSI colors (default when not a terminal)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a reply")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    params = {"temperature": args.temperature, "top_p": args.top_p, "max_tokens": args.max_tokens}
    client = ChatClient(args.url, args.token, args.model, args.timeout)
    system = [{"role": "system", "content": args.system}] if args.system else []
    try:
        if args.once is not None:
            return _once(client, system + [{"role": "user", "content": args.once}], args, params)
        return _repl(client, system, args, params)
    except ChatError as exc:
        print(f"chat_client: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"chat_client: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _once(client: ChatClient, messages: list[dict[str, str]], args: argparse.Namespace,
          params: dict[str, Any]) -> int:
    response = client.complete(messages, **params)
    if args.json:
        print(json.dumps(response, ensure_ascii=False, indent=2))
        return 0
    trace = response.get("agent_trace") or {}
    if args.trace:
        for event in trace.get("events", []):
            for line in event_lines(event):
                print(line, file=sys.stderr)
        print(summary_line(trace, 0.0).replace(", 0.0 s", ""), file=sys.stderr)
    print(response["choices"][0]["message"]["content"])
    return 0


def _repl(client: ChatClient, system: list[dict[str, str]], args: argparse.Namespace,
          params: dict[str, Any]) -> int:
    color = not args.no_color and sys.stdout.isatty()
    renderer = Renderer(sys.stdout, color=color, show_reasoning=not args.hide_reasoning)
    print(f"connected to {client.url} ({client.model}); /reset clears the conversation, /quit leaves")
    history: list[dict[str, str]] = []
    while True:
        try:
            line = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line:
            continue
        if line in ("/quit", "/exit"):
            return 0
        if line == "/reset":
            history = []
            print("(conversation cleared)")
            continue
        messages = system + history + [{"role": "user", "content": line}]
        try:
            answer, _ = stream_reply(client, messages, renderer, **params)
        except KeyboardInterrupt:
            print("\n(reply stopped)")
            continue
        except ChatError as exc:
            print(f"error: {exc}", file=sys.stderr)
            continue
        history += [{"role": "user", "content": line}, {"role": "assistant", "content": answer}]
