"""Tools: wiki/doc search over a local index and over HTTP, a web-search API (fake server on 127.0.0.1),
user-defined tools registered by name and called by their own tag."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse

import pytest

from agentic_rag.data.prompts import build_prompt
from agentic_rag.rollout import AgentRollout, RolloutSettings
from agentic_rag.rollout.protocol import ToolTag, agentic_dialect
from agentic_rag.rollout.scripted import ScriptedPolicy
from agentic_rag.search.client import HTTPSearcher
from agentic_rag.search.server import create_app
from agentic_rag.tools import FunctionTool, SearchTool, ToolRegistry, WebSearchTool


class _WebAPI(http.server.BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_GET(self):  # noqa: N802
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        type(self).seen.append({"q": query["q"][0], "count": query["count"][0], "auth": self.headers["X-Key"]})
        if query["q"][0] == "boom":
            self.send_response(500)
            self.end_headers()
            return
        n = int(query["count"][0])
        body = {"data": {"web": [{"name": f"Page {i} on {query['q'][0]}", "desc": f"snippet {i}",
                                  "link": f"https://example.org/{i}"} for i in range(n + 2)]}}
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *a):
        pass


@pytest.fixture()
def web_api(monkeypatch):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WebAPI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _WebAPI.seen = []
    monkeypatch.setenv("TEST_WEB_KEY", "sekret")
    yield f"http://127.0.0.1:{srv.server_address[1]}/search"
    srv.shutdown()


def test_web_search_tool_against_a_configurable_api(web_api, qwen_tokenizer):
    tool = WebSearchTool(web_api, results_path=("data", "web"), title_field="name", text_field="desc",
                         url_field="link", api_key_env="TEST_WEB_KEY", api_key_header="X-Key", api_key_prefix="")
    out = tool.batch(["cats", "dogs"], 2)
    assert [[h.title for h in hits] for hits in out] == [["Page 0 on cats", "Page 1 on cats"],
                                                          ["Page 0 on dogs", "Page 1 on dogs"]]
    assert out[0][0].docid == "https://example.org/0" and out[0][0].text == "snippet 0"
    assert {s["auth"] for s in _WebAPI.seen} == {"sekret"}
    with pytest.raises(Exception, match="HTTP 500"):
        tool.batch(["boom"], 2)

    # through the engine: the web tool under its own tag, next to the wiki search
    dialect = agentic_dialect()
    dialect.tool_tags.append(ToolTag("<web>", "</web>", "web_search"))
    tok = qwen_tokenizer
    policy = ScriptedPolicy(tok, {"Web?": ["<web>cats</web>", "<web>boom</web>", "<answer>meow</answer>"]})
    engine = AgentRollout(policy, tok, ToolRegistry([tool]), RolloutSettings(passages_per_search=1), dialect=dialect)
    (t,) = engine.run([build_prompt(tok, "Web?")])
    assert t.finish_reason == "answer" and t.num_searches == 2
    assert "(1) Page 0 on cats\nsnippet 0" in t.text
    assert any(e["type"] == "error" and "HTTP 500" in e["message"] for e in t.events)


def test_missing_api_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(ValueError, match="NOPE_KEY is not set"):
        WebSearchTool("http://127.0.0.1:1/", api_key_env="NOPE_KEY")


def test_user_defined_tools_registered_by_name(qwen_tokenizer):
    calc = FunctionTool("calculator", lambda expr: str(eval(expr, {"__builtins__": {}})))  # noqa: S307
    registry = ToolRegistry([calc])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(FunctionTool("calculator", str))
    with pytest.raises(KeyError, match="registered: calculator"):
        registry.get("nope")
    dialect = agentic_dialect()
    dialect.tool_tags.append(ToolTag("<calc>", "</calc>", "calculator"))
    tok = qwen_tokenizer
    policy = ScriptedPolicy(tok, {"Math?": ["<calc>6 * 7</calc>", "<answer>42</answer>"]})
    (t,) = AgentRollout(policy, tok, registry, dialect=dialect).run([build_prompt(tok, "Math?")])
    assert "<observation>\n42\n</observation>" in t.text and t.answer == "42"
    assert "</calc>" in dialect.stop_strings
    # a calculator is not a search: its own count, its own event, the search limit untouched
    assert t.num_searches == 0 and t.tool_calls == {"calculator": 1}
    assert [e["tool"] for e in t.events if e["type"] == "tool"] == ["calculator"]


def test_a_typed_tool_under_its_own_tag_in_a_tag_dialect(qwen_tokenizer):
    """A typed Python tool mapped to a tag: the tag's content is its one argument; a bad one is an error result."""
    from agentic_rag.tools.python import PythonTool

    def calculate(expression: str) -> str:
        """Evaluate.

        Args:
            expression: The arithmetic.
        """
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307

    dialect = agentic_dialect()
    dialect.tool_tags.append(ToolTag("<calc>", "</calc>", "calculate"))
    tok = qwen_tokenizer
    policy = ScriptedPolicy(tok, {"Math?": ["<calc>6 * 7</calc>", "<calc>1/0</calc>", "<answer>42</answer>"]})
    (t,) = AgentRollout(policy, tok, ToolRegistry([PythonTool(calculate)]), dialect=dialect).run(
        [build_prompt(tok, "Math?")])
    assert "<observation>\n42\n</observation>" in t.text and t.num_searches == 0
    assert [e["kind"] for e in t.events if e["type"] == "error"] == ["tool_failed"]
    assert t.tool_calls == {"calculate": 2} and t.answer == "42"


def test_document_search_over_a_local_index_and_over_http(wiki_index, qwen_tokenizer):
    """The same SearchTool over the real Lucene index in process and through the retrieval server."""
    import socket

    import uvicorn

    from agentic_rag.search import open_searcher

    local = open_searcher(wiki_index, "bm25")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(local), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        import time

        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        tok = qwen_tokenizer
        script = {"Lothair?": ["<search>Who was the wife of Lothair II?</search>", "<answer>Teutberga</answer>"]}
        texts = []
        for tool in (SearchTool(local), SearchTool(HTTPSearcher(f"http://127.0.0.1:{port}"))):
            (t,) = AgentRollout(ScriptedPolicy(tok, script), tok, tool).run([build_prompt(tok, "Lothair?")])
            hits = next(e for e in t.events if e["type"] == "search")["results"][0]["hits"]
            assert [h["docid"] for h in hits] == ["8", "4", "6"]
            texts.append(t.text)
        assert texts[0] == texts[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_hung_tool_calls_never_starve_later_calls(qwen_tokenizer):
    """More timed-out calls than any pool has workers: each is abandoned on its own daemon thread, and a
    normal search afterwards still completes within its timeout. The engine closes as a context manager."""
    import time

    from agentic_rag.search import Hit

    tok = qwen_tokenizer
    release = threading.Event()

    def search(queries, k):
        if any(q.startswith("hang") for q in queries):
            release.wait(60)
        return [[Hit(f"{q}-{i}", f"T {q} {i}", f"text {q} {i}", 1.0) for i in range(k)] for q in queries]

    n = 6  # the engine used to run tools on a pool of 4 workers
    script = [f"<search>hang{j}</search>" for j in range(n)] + ["<search>fine</search>", "<answer>ok</answer>"]
    limits = RolloutSettings(max_searches=n + 1, max_turns=n + 2, passages_per_search=1)
    tools = ToolRegistry([FunctionTool("search", search, batched=True)])
    try:
        with AgentRollout(ScriptedPolicy(tok, {"Hang?": script}), tok, tools, limits, search_timeout_s=0.3) as engine:
            t0 = time.monotonic()
            (t,) = engine.run([build_prompt(tok, "Hang?")])
            elapsed = time.monotonic() - t0
            assert engine._tool_runner.abandoned == n
            stuck = [th for th in threading.enumerate() if th.name.startswith("rollout-tool-search")]
            assert len(stuck) >= n and all(th.daemon for th in stuck)  # they never block interpreter exit
        assert t.finish_reason == "answer" and t.num_searches == n + 1
        errors = [e for e in t.events if e["type"] == "error"]
        assert len(errors) == n and all("timed out after 0.3 s" in e["message"] for e in errors)
        (fine,) = [e for e in t.events if e["type"] == "search"]
        assert fine["queries"] == ["fine"] and [h["docid"] for h in fine["results"][0]["hits"]] == ["fine-0"]
        assert elapsed < n * 0.3 + 2.0
        with pytest.raises(RuntimeError, match="closed"):
            engine.run([build_prompt(tok, "Hang?")])
    finally:
        release.set()
