"""MCP servers' tools as the agent's tools (agentic_rag.tools.mcp), against real server processes: the units server
(tests/mcp_units_server.py) over stdio and over streamable HTTP, commands that fail to start, and close()."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from agentic_rag.tools.base import ToolError, ToolRegistry, is_argument_tool
from agentic_rag.tools.mcp import MCPServer, MCPTool, mcp_tools
from agentic_rag.tools.python import ToolLoadError
from conftest import free_port

SERVER = Path(__file__).resolve().parent / "mcp_units_server.py"


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(scope="module")
def units():
    tools = mcp_tools({"command": [sys.executable, str(SERVER)]}, max_calls=3)
    yield {tool.name: tool for tool in tools}
    tools[0].owner.close()


def test_lists_the_servers_tools(units):
    assert sorted(units) == ["convert_units", "lookup_constant"]
    convert, lookup = units["convert_units"], units["lookup_constant"]
    assert convert.description == "Convert a length between units (km, m, mi)."
    assert lookup.description.startswith("Look up a physical constant by name")
    assert convert.parameters["type"] == "object"
    assert {k: v["type"] for k, v in convert.parameters["properties"].items()} == {
        "value": "number", "from_unit": "string", "to_unit": "string"}
    assert sorted(convert.parameters["required"]) == ["from_unit", "to_unit", "value"]
    assert lookup.parameters["properties"]["name"]["type"] == "string"
    assert lookup.parameters["required"] == ["name"]
    for tool in units.values():
        assert isinstance(tool, MCPTool) and is_argument_tool(tool)
        assert tool.retrieves is False and tool.state_key is None and tool.new_state({"question": "q"}) is None
        assert tool.max_calls == 3 and tool.max_observation_tokens is None
        assert isinstance(tool.owner, MCPServer)
    assert convert.owner is lookup.owner


def test_call_batch_runs_calls_and_reports_errors(units):
    out = units["convert_units"].call_batch([
        ({"value": 2, "from_unit": "km", "to_unit": "m"}, None),
        ({"value": 1, "from_unit": "mi", "to_unit": "m"}, None),
        ({"value": 1, "from_unit": "furlong", "to_unit": "m"}, None),
    ])
    assert out[:2] == ["2000 m", "1609.34 m"]
    assert not any(isinstance(r, ToolError) for r in out[:2])
    assert isinstance(out[2], ToolError)
    assert "convert_units" in out[2] and "unknown unit 'furlong'" in out[2]
    assert units["lookup_constant"].call_batch([({"name": "speed_of_light"}, None)]) == ["299792458 m/s"]
    [bad] = units["lookup_constant"].call_batch([({"name": "hbar_typo"}, None)])
    assert isinstance(bad, ToolError) and "unknown constant 'hbar_typo'" in bad


def test_call_batch_from_several_threads(units):
    from concurrent.futures import ThreadPoolExecutor

    def convert(value: int) -> list:
        return units["convert_units"].call_batch([({"value": value, "from_unit": "km", "to_unit": "m"}, None)])

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(convert, range(8))) == [[f"{v * 1000:g} m"] for v in range(8)]


def test_a_command_that_exits_is_a_one_line_load_error():
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(ToolLoadError) as info:
        mcp_tools({"command": command})
    message = str(info.value)
    assert "\n" not in message and sys.executable in message and "sys.exit(3)" in message
    assert "exited with code 3" in message


def test_the_servers_last_stderr_line_says_why():
    code = "import sys; print('starting', file=sys.stderr); print('RuntimeError: no API key', file=sys.stderr); " \
           "sys.exit(2)"
    with pytest.raises(ToolLoadError) as info:
        mcp_tools({"command": [sys.executable, "-c", code]})
    message = str(info.value)
    assert "\n" not in message and "exited with code 2" in message and "RuntimeError: no API key" in message


def test_a_missing_program_is_a_one_line_load_error():
    with pytest.raises(ToolLoadError) as info:
        mcp_tools({"command": ["no-such-mcp-server-program", "--stdio"]})
    message = str(info.value)
    assert "\n" not in message and "no-such-mcp-server-program" in message
    with pytest.raises(ToolLoadError, match="no program"):
        mcp_tools({"command": ["./missing_server.py"]}, base_dir=SERVER.parent)


def test_a_server_that_never_answers_times_out():
    before = _children()
    started = time.monotonic()
    with pytest.raises(ToolLoadError) as info:
        mcp_tools({"command": [sys.executable, "-c", "import time; time.sleep(60)"], "timeout_s": 1})
    assert "no answer within 1 s" in str(info.value) and "\n" not in str(info.value)
    assert time.monotonic() - started < 10
    assert not _alive(_children() - before)


@pytest.mark.parametrize("spec", [
    {}, {"command": [sys.executable], "url": "http://127.0.0.1:1/mcp"}, {"command": "python server.py"},
    {"command": []}, {"url": 8080}, {"url": "127.0.0.1:8080/mcp"}, {"command": ["x"], "args": ["y"]},
    {"command": [sys.executable], "timeout_s": 0}, {"command": [sys.executable], "env": ["A=1"]},
    {"url": "http://127.0.0.1:1/mcp", "cwd": "/tmp"}, ["python", "server.py"],
])
def test_a_bad_spec_is_a_load_error(spec):
    with pytest.raises(ToolLoadError) as info:
        mcp_tools(spec)
    assert "\n" not in str(info.value)


def test_a_relative_command_path_starts_at_base_dir():
    tools = mcp_tools({"command": [sys.executable, SERVER.name]}, base_dir=SERVER.parent)
    try:
        assert {t.name for t in tools} == {"convert_units", "lookup_constant"}
    finally:
        tools[0].owner.close()


def test_close_stops_the_process_once():
    before = _children()
    tools = mcp_tools({"command": [sys.executable, str(SERVER)]})
    spawned = _alive(_children() - before)
    assert spawned, "the server runs as a child process"
    registry = ToolRegistry(tools)
    registry.close()
    assert not _alive(spawned)
    tools[0].owner.close()  # idempotent
    [closed] = tools[0].call_batch([({"value": 1, "from_unit": "km", "to_unit": "m"}, None)])
    assert isinstance(closed, ToolError) and "closed" in closed


def test_a_dropped_server_is_closed_when_collected():
    import gc

    before = _children()
    tools = mcp_tools({"command": [sys.executable, str(SERVER)]})
    spawned = _alive(_children() - before)
    assert spawned
    del tools
    gc.collect()
    assert not _alive(spawned)


def test_no_server_outlives_the_interpreter(tmp_path):
    script = tmp_path / "leave_open.py"
    script.write_text(textwrap.dedent(f"""
        import sys, psutil
        from agentic_rag.tools.mcp import mcp_tools
        tools = mcp_tools({{"command": [sys.executable, {str(SERVER)!r}]}})
        print(*(p.pid for p in psutil.Process().children(recursive=True)), flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pids = {int(p) for p in out.stdout.split()}
    assert pids
    time.sleep(0.2)
    assert not _alive(pids)


@pytest.fixture(scope="module")
def http_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the HTTP units server did not start: {proc.communicate()[1]}")
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


def test_the_same_server_over_streamable_http(http_server):
    tools = {t.name: t for t in mcp_tools({"url": http_server, "timeout_s": 10})}
    try:
        assert sorted(tools) == ["convert_units", "lookup_constant"]
        assert tools["convert_units"].parameters["required"] == ["value", "from_unit", "to_unit"]
        out = tools["convert_units"].call_batch([
            ({"value": 3, "from_unit": "km", "to_unit": "m"}, None),
            ({"value": 5, "from_unit": "m", "to_unit": "parsec"}, None),
        ])
        assert out[0] == "3000 m"
        assert isinstance(out[1], ToolError) and "unknown unit 'parsec'" in out[1]
    finally:
        tools["convert_units"].owner.close()
    # a url server is the user's: closing our session leaves it running, and a second client connects
    again = mcp_tools({"url": http_server})
    try:
        assert again[0].owner.call_many("lookup_constant", [{"name": "planck"}]) == ["6.62607015e-34 J s"]
    finally:
        again[0].owner.close()


def test_nothing_listening_at_a_url_is_a_load_error():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(ToolLoadError) as info:
        mcp_tools({"url": url})
    assert url in str(info.value) and "cannot connect" in str(info.value) and "\n" not in str(info.value)
