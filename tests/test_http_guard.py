"""Both HTTP servers against untrusted clients (:mod:`agentic_rag.http_guard`), each a real server process on
127.0.0.1 started as a user starts it, with ``--client-timeout-s 2``:

* a 100 MiB chunked upload (no content-length) is refused with 413 while it arrives, and the server's resident
  memory grows by far less than the body (the chat server used to read the whole body first: +186 MB);
* a client that sends its request head one byte every half second (slowloris) is disconnected once the 2 s
  deadline passes, and the server goes on answering others;
* a client that sends a complete head and then its body one byte a second is answered 408 once the deadline passes;
* a keep-alive client that pauses between its requests (longer than the deadline, shorter than the keep-alive
  timeout) keeps its connection: the head deadline runs from a request's first byte, not from the connection's
  opening or the last response.

Timings are asserted loosely (a few seconds either way): the machine is shared.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import ROOT, free_port, start_search_server
from test_chat_service import model_dir, parsed, process  # noqa: F401 - model_dir is a fixture

TIMEOUT_S = 2.0  # the servers' client_timeout_s here
UPLOAD_BYTES = 100 << 20
MAX_RSS_GROWTH = 32 << 20


@dataclass
class Server:
    """A server under test: its name, base URL, process id, and a POST route with a small valid JSON body."""

    name: str
    url: str
    pid: int
    post_path: str
    post_body: bytes

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def reason(self, body: dict) -> str:
        """The reason in an error response's body, checked to be in the server's own error shape (the chat
        server's OpenAI's)."""
        if self.name == "chat":
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
            return body["error"]["message"]
        return body["detail"]


@pytest.fixture(scope="module")
def chat(model_dir, wiki_index, tmp_path_factory):  # noqa: F811 - model_dir is the imported fixture
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, str(ROOT / "service" / "chat_server.py"), "--model", str(model_dir), "--index",
            str(wiki_index), "--port", str(port), "--client-timeout-s", str(TIMEOUT_S)]
    with process(argv, url + "/health", tmp_path_factory.mktemp("chat") / "server.log") as proc:
        yield Server("chat", url, proc.pid, "/v1/chat/completions", b"{}")
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def search(wiki_index):
    proc, url = start_search_server(wiki_index, "--client-timeout-s", str(TIMEOUT_S), timeout_s=120)
    yield Server("search", url, proc.pid, "/search", b'{"query": "Teutberga", "k": 1}')
    proc.terminate()
    proc.wait(30)


@pytest.fixture(params=["chat", "search"])
def server(request) -> Server:
    return request.getfixturevalue(request.param)


def memory(pid: int, field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (the peak) of process ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> None:
    """Start ``VmHWM`` again from the resident size now (Linux 4.0+; our own child, so we may)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def chunked(total: int, size: int = 64 << 10):
    """A body of ``total`` bytes in pieces: httpx sends a generator chunked, without a content-length."""
    yield b'{"query": "'
    for _ in range(total // size):
        yield b"x" * size
    yield b'"}'


def dribble(sock: socket.socket, data: bytes, every_s: float, give_up_s: float) -> tuple[float | None, bytes]:
    """Send ``data`` on ``sock`` one byte every ``every_s`` seconds, reading whatever the server sends meanwhile.
    Returns how many seconds after the call the server closed the connection (None if it had not after
    ``give_up_s``, or before all of ``data`` was sent) and the bytes it sent."""
    received = b""
    t0 = time.monotonic()
    for i in range(len(data)):
        try:
            sock.sendall(data[i:i + 1])
        except OSError:  # reset: the server closed the connection
            return time.monotonic() - t0, received
        until = time.monotonic() + every_s
        while (left := until - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                continue
            try:
                chunk = sock.recv(65536)
            except OSError:
                return time.monotonic() - t0, received
            if not chunk:
                return time.monotonic() - t0, received
            received += chunk
        if time.monotonic() - t0 > give_up_s:
            return None, received
    return None, received


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def post(server: Server, content) -> httpx.Response:
    return httpx.post(server.url + server.post_path, content=content, timeout=120,
                      headers={"content-type": "application/json"})


# ------------------------------------------------------------------------------------------------ bodies


def test_a_100_mib_chunked_upload_is_refused_without_being_held_in_memory(server):
    """The peak resident size while the upload is refused, not the size after it: a body read whole and then
    refused is freed again at once (the process hands blocks this large back to the system)."""
    post(server, chunked(1 << 20))  # warm up: whatever a first large request allocates once
    before = memory(server.pid, "VmRSS")
    reset_peak(server.pid)
    r = post(server, chunked(UPLOAD_BYTES))
    assert "content-length" not in r.request.headers and r.request.headers["transfer-encoding"] == "chunked"
    assert r.status_code == 413 and "request body over" in server.reason(r.json()), r.text
    grown = memory(server.pid, "VmHWM") - before
    assert grown < MAX_RSS_GROWTH, f"{server.name} server: RSS grew {grown / 2**20:.1f} MiB for a refused upload"
    # and it goes on answering
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_a_body_that_arrives_one_byte_a_second_is_answered_408(server):
    body = b'{"query": "' + b"x" * 60 + b'"}'
    head = (f"POST {server.post_path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with connect(server) as sock:
        sock.sendall(head)  # the whole head at once: only the body is slow
        closed_after, received = dribble(sock, body, every_s=1.0, give_up_s=12)
    assert closed_after is not None, f"{server.name} server: still reading a body sent at 1 byte/s after 12 s"
    assert closed_after < 4 * TIMEOUT_S
    assert received.startswith(b"HTTP/1.1 408 "), received[:300]
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    assert server.reason(json.loads(body)) == "the request body did not arrive within 2 s"


# ------------------------------------------------------------------------------------------------ heads


def test_a_head_sent_one_byte_every_half_second_is_dropped(server):
    head = (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\n"
            + b"X-Pad: " + b"a" * 60 + b"\r\n\r\n")  # ~130 bytes: a minute at this pace
    with connect(server) as sock:
        closed_after, received = dribble(sock, head, every_s=0.5, give_up_s=12)
    assert closed_after is not None, f"{server.name} server: still reading a head sent at 2 bytes/s after 12 s"
    assert TIMEOUT_S * 0.75 <= closed_after < 4 * TIMEOUT_S, closed_after
    assert received == b""  # dropped, not answered
    # the server goes on answering others
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_a_connection_that_never_sends_a_byte_is_dropped(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=12) as sock:
        t0 = time.monotonic()
        try:
            assert sock.recv(1) == b""
        except TimeoutError:
            pytest.fail(f"{server.name} server: an idle new connection was still open after 12 s")
        except ConnectionResetError:
            pass
    assert time.monotonic() - t0 < 4 * TIMEOUT_S


def test_a_keep_alive_client_that_pauses_between_requests_keeps_its_connection(server):
    """Pauses of 1.5 x the head deadline (under uvicorn's 5 s keep-alive timeout): three requests, one connection."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/health")
        assert conn.getresponse().read() and conn.sock is not None
        first = conn.sock
        for _ in range(2):
            time.sleep(1.5 * TIMEOUT_S)
            conn.request("POST", server.post_path, body=server.post_body,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status < 500 and conn.sock is first, (response.status, conn.sock)
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------ settings


def test_serve_search_refuses_a_client_timeout_that_is_not_positive(wiki_index):
    r = subprocess.run([sys.executable, "-m", "agentic_rag.cli", "serve-search", "--index", str(wiki_index),
                        "--port", str(free_port()), "--client-timeout-s", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "argument --client-timeout-s: must be > 0, got 0" in r.stderr, r.stderr[-2000:]


def test_serve_search_help_states_the_default_it_uses():
    from agentic_rag.cli import build_parser
    from agentic_rag.http_guard import DEFAULT_CLIENT_TIMEOUT_S

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["serve-search"]
    flag = next(a for a in sub._actions if a.dest == "client_timeout_s")
    assert f"(default {DEFAULT_CLIENT_TIMEOUT_S:g})" in flag.help


def test_the_chat_servers_client_timeout_setting():
    from agentic_rag.http_guard import DEFAULT_CLIENT_TIMEOUT_S
    from agentic_rag.settings import SettingsError

    assert parsed([], {}).server.client_timeout_s == DEFAULT_CLIENT_TIMEOUT_S == 20.0
    assert parsed([], {"AGENTIC_RAG_CHAT_CLIENT_TIMEOUT_S": "7.5"}).server.client_timeout_s == 7.5
    assert parsed(["--set", "server.client_timeout_s=3"], {}).server.client_timeout_s == 3
    for bad in ("0", "-1", ".inf"):
        with pytest.raises(SettingsError, match="server.client_timeout_s must be a finite number > 0"):
            parsed(["--client-timeout-s", bad], {})


def test_health_advertises_the_search_servers_client_timeout(search):
    assert httpx.get(search.url + "/health").json()["limits"]["client_timeout_s"] == TIMEOUT_S


def test_a_request_without_the_token_is_refused_before_its_body_is_read(model_dir, wiki_index,  # noqa: F811
                                                                        tmp_path):
    """With an API token, a /v1 request that lacks it is answered 401 at once: the server never waits for (nor holds)
    the body a client without the token announces."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, str(ROOT / "service" / "chat_server.py"), "--model", str(model_dir), "--index",
            str(wiki_index), "--port", str(port), "--client-timeout-s", "30", "--api-token", "s3cret"]
    with process(argv, url + "/health", tmp_path / "server.log") as proc:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 5000000\r\n\r\n")  # and no body: a server that reads it first waits
                t0 = time.monotonic()
                data = sock.recv(65536)
                waited = time.monotonic() - t0
                while chunk := sock.recv(65536):  # the rest of the answer, until the server closes
                    data += chunk
            head = data.decode(errors="replace")
            assert head.startswith("HTTP/1.1 401"), head[:300]
            assert waited < 5, waited
            assert "www-authenticate: bearer" in head.lower() and "invalid_api_key" in head
        finally:
            proc.terminate()
            proc.wait(30)
