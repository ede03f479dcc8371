"""An MCP server's tools as tools of the agent.

A ``tools:`` entry ``mcp: {command: [python, units_server.py]}`` starts a stdio server as a child process (optional
``env``, added to the SDK's safe default environment, and ``cwd``); ``mcp: {url: http://127.0.0.1:PORT/mcp}``
connects to a streamable-HTTP server the user started. ``timeout_s`` (default 30) bounds the start-up and each call.

The ``mcp`` SDK is async; our engine is synchronous and calls tools from several threads. So each
:class:`MCPServer` runs its client (``mcp.Client``) on an event loop in a daemon thread of its own, and a tool call
is ``asyncio.run_coroutine_threadsafe`` onto that loop; the calls of one batch run together (``gather``). The
client lives in one task from connect to close, as anyio requires a context be left by the task that entered it.

A server that does not start is a :class:`~.python.ToolLoadError`: one line naming the server and why (its exit
code and the last line of its stderr). A call that fails (``isError``, a protocol error, a timeout) is a
:class:`~.base.ToolError` naming the tool, shown to the model. :meth:`MCPServer.close` (which
:meth:`~.base.ToolRegistry.close` calls, and interpreter exit too) ends the session and stops the process.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import os
import re
import shlex
import shutil
import signal
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import ToolError
from .python import ToolLoadError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
SPEC_KEYS = ("command", "url", "env", "cwd", "timeout_s")
_CLOSE_WAIT_S = 10.0  # the SDK's stdio shutdown: stdin closed, 2 s grace, SIGTERM, 2 s, SIGKILL
_MAX_ERROR_CHARS = 1000


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text).strip()


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside anyio's (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _parse_spec(spec: Any, base_dir: str | Path | None) -> dict[str, Any]:
    """The checked spec: ``label`` (the command or url, for messages), ``url`` or ``command`` (program resolved,
    path arguments made absolute from ``base_dir``), ``env``, ``cwd``, ``timeout_s``. A bad spec is a
    :class:`ToolLoadError`."""
    if not isinstance(spec, Mapping):
        raise ToolLoadError(f"mcp: must be a mapping with command: [program, args...] or url: http://..., got {spec!r}")
    unknown = [str(k) for k in spec if k not in SPEC_KEYS]
    has_command, has_url = spec.get("command") is not None, spec.get("url") is not None
    if unknown:
        raise ToolLoadError(f"mcp: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(SPEC_KEYS)})")
    if has_command == has_url:
        raise ToolLoadError("mcp: give exactly one of command: [program, args...] (a stdio server) or url: http://... "
                            f"(a streamable-HTTP server), got {sorted(map(str, spec))}")
    timeout = spec.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ToolLoadError(f"mcp: timeout_s must be a positive number of seconds, got {timeout!r}")
    out: dict[str, Any] = {"timeout_s": float(timeout)}
    if has_url:
        url = spec["url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ToolLoadError(f"mcp: url must be an http:// or https:// address, got {url!r}")
        if spec.get("env") is not None or spec.get("cwd") is not None:
            raise ToolLoadError(f"mcp {url}: env and cwd are for a command the toolkit starts, not a url")
        return {**out, "label": url, "url": url}
    command = spec["command"]
    if (not isinstance(command, list) or not command or
            not all(isinstance(a, str | int | float) and not isinstance(a, bool) for a in command)):
        raise ToolLoadError(f"mcp: command must be a list [program, args...] of strings, got {command!r}")
    command = [str(a) for a in command]
    label = shlex.join(command)
    env = spec.get("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
        raise ToolLoadError(f"mcp {label}: env must be a mapping of variable names to values, got {env!r}")
    env = {k: str(v) for k, v in env.items()}
    base = Path(base_dir) if base_dir is not None else None
    cwd = spec.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str | Path):
            raise ToolLoadError(f"mcp {label}: cwd must be a folder path, got {cwd!r}")
        cwd = base / cwd if base is not None and not Path(cwd).is_absolute() else Path(cwd)
        if not cwd.is_dir():
            raise ToolLoadError(f"mcp {label}: cwd {str(cwd)!r} is not a folder")
    return {**out, "label": label, "env": env, "cwd": str(cwd) if cwd is not None else None,
            "command": _resolve_command(command, label, base, cwd, env)}


def _resolve_command(command: list[str], label: str, base: Path | None, cwd: Path | None,
                     env: Mapping[str, str]) -> list[str]:
    """``command`` with its program found (a path from ``base``, then ``cwd``, then the working directory; a bare
    name on PATH) and each relative argument that names a file under ``base`` made absolute: the config file's
    folder is where its relative paths start."""
    program, *args = command
    if os.sep in program or (os.altsep and os.altsep in program):
        path = Path(program)
        if not path.is_absolute():
            candidates = [d / path for d in (base, cwd, Path.cwd()) if d is not None]
            path = next((c for c in candidates if c.is_file()), candidates[0])
        if not path.is_file():
            raise ToolLoadError(f'MCP server "{label}" did not start: no program {str(path)!r}')
        found = str(path.absolute())  # not resolve(): a venv's python is a symlink that must stay one
    else:
        found = shutil.which(program, path=env.get("PATH", os.environ.get("PATH")))
        if found is None:
            raise ToolLoadError(f'MCP server "{label}" did not start: no program {program!r} on PATH')
    if base is not None:
        args = [str(base / a) if a and not a.startswith("-") and not Path(a).is_absolute() and (base / a).exists()
                else a for a in args]
    return [found, *args]


class _StderrTail:
    """The stdio server's stderr: a pipe read on a daemon thread, each line logged at DEBUG, the last few kept for
    error messages (the server's own words on why it failed)."""

    def __init__(self, label: str):
        read_fd, write_fd = os.pipe()
        self.lines: collections.deque[str] = collections.deque(maxlen=20)
        self.writer = os.fdopen(write_fd, "w")  # handed to the child as its stderr, closed here once it is spawned
        self._thread = threading.Thread(target=self._read, args=(read_fd, label), daemon=True,
                                        name=f"mcp-stderr {label[:40]}")
        self._thread.start()

    def _read(self, fd: int, label: str) -> None:
        with open(fd, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    self.lines.append(line)
                    log.debug("MCP server %s: %s", label, line)

    def close_writer(self) -> None:
        if not self.writer.closed:
            self.writer.close()

    def last_line(self, wait_s: float = 1.0) -> str:
        """The last non-empty line, after waiting a moment for a dead server's last words."""
        self._thread.join(wait_s)
        return self.lines[-1][:300] if self.lines else ""


class _Connection:
    """What a running :class:`MCPServer` holds: the loop thread, the client task and the child process. Kept apart
    from the server (nothing here refers to it) so that ``weakref.finalize`` closes it when the server is collected
    or the interpreter exits."""

    def __init__(self, label: str):
        self.label = label
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name=f"mcp {label[:40]}")
        self.thread.start()
        self.client: Any = None
        self.process: Any = None  # the SDK's anyio Process of a stdio server, when it could be read
        self.stderr: _StderrTail | None = None
        self.stop: asyncio.Event | None = None
        self.scope: Any = None  # the client task's anyio CancelScope
        self.done = threading.Event()
        self.task: concurrent.futures.Future | None = None

    async def serve(self, client: Any, ready: concurrent.futures.Future) -> None:
        """The client's one task: connect, list the tools, then hold the session open until :meth:`close`. Its
        cancel scope is how :meth:`close` stops a start that hangs: an anyio cancel, which the SDK's shielded
        shutdown (stop the process) survives, where a native ``task.cancel()`` could cut it short."""
        import anyio

        self.stop = asyncio.Event()
        try:
            with anyio.CancelScope() as self.scope:
                async with client:
                    tools: list[Any] = []
                    cursor = None
                    while True:
                        page = await client.list_tools(cursor=cursor)
                        tools.extend(page.tools)
                        cursor = page.next_cursor
                        if not cursor:
                            break
                    self.client = client
                    ready.set_result(tools)
                    await self.stop.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the starting thread, or logged once running
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning("MCP server %s: the session ended: %s", self.label, _leaf(exc))
        finally:
            if not ready.done():
                ready.set_exception(RuntimeError("the start was cancelled"))
            self.client = None
            self.done.set()

    def close(self) -> None:
        """Ends the session (the SDK closes the child's stdin, then terminates it), then the loop; kills the
        process group if that did not stop it. Idempotent; safe from any thread."""
        if self.loop.is_closed():
            return
        if threading.current_thread() is self.thread:  # finalized on the loop itself: just ask it to wind down
            if self.stop is not None:
                self.stop.set()
            return
        if self.task is not None and not self.done.is_set():
            if self.client is not None and self.stop is not None:  # connected: leave the session in order
                self.loop.call_soon_threadsafe(self.stop.set)
            elif self.scope is not None:  # still starting: cancel the start
                self.loop.call_soon_threadsafe(self.scope.cancel)
            else:
                self.task.cancel()
            if not self.done.wait(_CLOSE_WAIT_S):
                self.task.cancel()
                self.done.wait(_CLOSE_WAIT_S / 2)
        self._kill_process()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(2.0)
        if not self.thread.is_alive():
            self.loop.close()
        if self.stderr is not None:
            self.stderr.close_writer()

    def _kill_process(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        try:  # the SDK starts the server in a session of its own: its group is its whole tree
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _spawned_process(transport: Any) -> Any:
    """The process ``mcp.client.stdio.stdio_client`` just spawned, read from its suspended generator (the SDK does
    not expose it): for the exit code in an error message and a last-resort kill. None when it cannot be read."""
    frame = getattr(getattr(transport, "gen", None), "ag_frame", None)
    process = frame.f_locals.get("process") if frame is not None else None
    return process if hasattr(process, "returncode") and hasattr(process, "pid") else None


class _StdioTransport:
    """``stdio_client`` as an ``mcp`` Transport that notes the spawned process and closes our end of the stderr
    pipe once the child holds it."""

    def __init__(self, params: Any, conn: _Connection, stderr: _StderrTail):
        from mcp.client.stdio import stdio_client

        self.conn, self.stderr = conn, stderr
        self.inner = stdio_client(params, errlog=stderr.writer)

    async def __aenter__(self) -> Any:
        try:
            streams = await self.inner.__aenter__()
        finally:
            self.stderr.close_writer()
        self.conn.process = _spawned_process(self.inner)
        return streams

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self.inner.__aexit__(*exc_info)


class MCPServer:
    """One MCP server, connected and its tools listed when made (see the module docstring). ``spec``: ``{"command":
    [...], "env": {...}, "cwd": ...}`` or ``{"url": ...}``, with an optional ``timeout_s``; ``base_dir``: where
    relative paths in the command start (the config file's folder). Raises :class:`ToolLoadError` when the spec is
    bad or the server does not start."""

    def __init__(self, spec: Mapping[str, Any], *, base_dir: str | Path | None = None):
        parsed = _parse_spec(spec, base_dir)
        self.label: str = parsed["label"]
        self.url: str | None = parsed.get("url")
        self.timeout_s: float = parsed["timeout_s"]
        self._closed = False
        self._conn = _Connection(self.label)
        self._finalizer = weakref.finalize(self, self._conn.close)
        try:
            self.tools: list[Any] = self._start(parsed)
        except BaseException:
            self.close()
            raise

    def _start(self, parsed: Mapping[str, Any]) -> list[Any]:
        try:
            from mcp import Client, StdioServerParameters
            from mcp_types import Implementation
        except ImportError as exc:
            raise ToolLoadError(f'MCP server "{self.label}": the mcp package is not installed ({exc})') from None
        from .. import __version__

        if self.url is not None:
            target: Any = self.url
        else:
            program, *args = parsed["command"]
            params = StdioServerParameters(command=program, args=args, env=parsed["env"] or None, cwd=parsed["cwd"])
            self._conn.stderr = _StderrTail(self.label)
            target = _StdioTransport(params, self._conn, self._conn.stderr)
        client = Client(target, read_timeout_seconds=self.timeout_s,
                        client_info=Implementation(name="agentic-rag", version=__version__))
        ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._conn.task = asyncio.run_coroutine_threadsafe(self._conn.serve(client, ready), self._conn.loop)
        try:
            return ready.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            why = f"no answer within {self.timeout_s:g} s (timeout_s)"
            self.close()
            raise ToolLoadError(_one_line(f'MCP server "{self.label}" did not start: {why}{self._stderr_note()}')
                                ) from None
        except Exception as exc:  # noqa: BLE001 - spawn, connection or handshake failure: one line says which
            self.close()
            raise ToolLoadError(_one_line(f'MCP server "{self.label}" did not start: {self._why(_leaf(exc))}'
                                          f'{self._stderr_note()}')) from None

    def _why(self, exc: BaseException) -> str:
        """Why the start failed, in words: the process's exit code when it died, else the error."""
        import httpx2  # the mcp SDK's HTTP client

        code = self._exit_code()
        if code is not None:
            return f"the process exited with code {code}" if code >= 0 else f"the process was killed (signal {-code})"
        if isinstance(exc, OSError) and exc.strerror:
            return f"cannot run it: {exc.strerror}"
        name = type(exc).__name__
        if isinstance(exc, httpx2.TransportError):  # nothing listens there, or it does not answer
            return f"cannot connect ({exc or name})"
        message = getattr(exc, "message", None) or str(exc)
        return f"{name}: {message}" if message else name

    def _exit_code(self) -> int | None:
        process = self._conn.process
        return getattr(process, "returncode", None) if process is not None else None

    def _stderr_note(self, wait_s: float = 1.0) -> str:
        if self._conn.stderr is None:
            return ""
        line = self._conn.stderr.last_line(wait_s)
        return f"; its stderr ends: {line}" if line else " (nothing on its stderr)"

    def call_many(self, name: str, arguments: Sequence[Mapping[str, Any]]) -> list[str | ToolError]:
        """Call tool ``name`` once per arguments mapping, all at once on the server; a result per call, in order."""
        client = self._conn.client
        if self._closed or client is None:
            why = "its server is closed" if self._closed else "its server's session has ended"
            return [ToolError(f"the MCP tool {name} failed: {why}") for _ in arguments]

        async def gather() -> list[str | ToolError]:
            return list(await asyncio.gather(*(self._call(client, name, dict(a)) for a in arguments)))

        future = asyncio.run_coroutine_threadsafe(gather(), self._conn.loop)
        try:
            return future.result(timeout=self.timeout_s + 10)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return [ToolError(f"the MCP tool {name} timed out after {self.timeout_s:g} s") for _ in arguments]

    async def _call(self, client: Any, name: str, arguments: dict[str, Any]) -> str | ToolError:
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        timed_out = ToolError(f"the MCP tool {name} timed out after {self.timeout_s:g} s")
        try:
            # the SDK's read timeout answers first; wait_for is the backstop for a call stuck before its request
            result = await asyncio.wait_for(client.call_tool(name, arguments, read_timeout_seconds=self.timeout_s),
                                            self.timeout_s + 5)
        except TimeoutError:
            return timed_out
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return timed_out
            if exc.code == CONNECTION_CLOSED:
                await self._await_exit(0.5)
            return ToolError(_one_line(f"the MCP tool {name} failed: {exc.message}{self._died_note()}"
                                       )[:_MAX_ERROR_CHARS])
        except Exception as exc:  # noqa: BLE001 - a broken connection, a bad result: the model sees one line
            return ToolError(_one_line(f"the MCP tool {name} failed ({type(exc).__name__}: {exc})"
                                       f"{self._died_note()}")[:_MAX_ERROR_CHARS])
        text = result_text(result)
        if result.is_error:
            return ToolError(f"the MCP tool {name} failed: {text or 'no message'}"[:_MAX_ERROR_CHARS])
        return text

    async def _await_exit(self, wait_s: float) -> None:
        """Give a stdio server that just closed the connection a moment to be seen dead (and its stderr read)."""
        if self._conn.process is None:
            return
        deadline = time.monotonic() + wait_s
        while self._exit_code() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)

    def _died_note(self) -> str:
        """Why a running stdio server stopped answering: its exit code and last stderr line (read without waiting:
        this runs on the loop)."""
        code = self._exit_code()
        if code is None:
            return ""
        return f" (the server exited with code {code}{self._stderr_note(wait_s=0)})"

    def close(self) -> None:
        """End the session and stop the server's process (a url server is left running). Idempotent."""
        self._closed = True
        self._finalizer()

    def __repr__(self) -> str:
        return f"MCPServer({self.label!r}{', closed' if self._closed else ''})"


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as the text the model sees: its content items' text joined by newlines (a placeholder
    for an image, audio or a linked resource), or its structured content as JSON when it has no text."""
    parts: list[str] = []
    has_text = False
    for item in result.content or ():
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
            has_text = True
        elif kind == "resource" and isinstance(getattr(item.resource, "text", None), str):
            parts.append(item.resource.text)
            has_text = True
        elif kind in ("resource", "resource_link"):
            uri = getattr(getattr(item, "resource", item), "uri", "")
            parts.append(f"[resource {uri}]" if uri else "[resource]")
        else:
            parts.append(f"[{kind or 'content'}]")
    if not has_text and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


class MCPTool:
    """One tool of an MCP server, an argument tool (see :mod:`.base`): ``call_batch`` sends the batch's calls to the
    server together. ``owner`` is the server, closed once by :meth:`~.base.ToolRegistry.close`."""

    retrieves = False
    state_key = None

    def __init__(self, owner: MCPServer, tool: Any, *, max_calls: int | None = None,
                 max_observation_tokens: int | None = None):
        self.owner = owner
        self.name: str = tool.name
        self.description: str = tool.description or getattr(tool, "title", None) or tool.name
        self.parameters: dict[str, Any] = dict(tool.input_schema or {"type": "object", "properties": {}})
        self.max_calls, self.max_observation_tokens = max_calls, max_observation_tokens

    def new_state(self, row: Mapping[str, Any]) -> None:
        return None

    def call_batch(self, calls: Sequence[tuple[Mapping[str, Any], Any]]) -> list[str | ToolError]:
        return self.owner.call_many(self.name, [arguments for arguments, _ in calls])

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r} of {self.owner.label!r})"


def mcp_tools(spec: Mapping[str, Any], *, base_dir: str | Path | None = None, max_calls: int | None = None,
              max_observation_tokens: int | None = None) -> list[MCPTool]:
    """Start (or connect to) the server ``spec`` names and return its tools, which share it. A server that does not
    start, or lists no tools, is a :class:`ToolLoadError`."""
    server = MCPServer(spec, base_dir=base_dir)
    if not server.tools:
        server.close()
        raise ToolLoadError(f'MCP server "{server.label}" lists no tools')
    return [MCPTool(server, tool, max_calls=max_calls, max_observation_tokens=max_observation_tokens)
            for tool in server.tools]
