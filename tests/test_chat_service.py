"""The chat service for real on 127.0.0.1: a tiny random-init Qwen2 model loaded by path (and a LoRA adapter),
the real BM25 index over the 2Wiki subset, the uvicorn server in a thread, the openai SDK and plain HTTP.

A random model never writes a search tag, so a forcing processor (:class:`ScriptedTurns`) makes it write
scripted turns keyed by the question: it searches the real index and answers. Everything else (the
decoder, stops, search, observation insertion, batching, streaming, cancellation) is the real thing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agentic_rag.serving.config import ServeConfig, config_for, env_names, is_loopback
from agentic_rag.serving.forcing import ScriptedTurns, keyed_script
from agentic_rag.serving.stream import AnswerSplitter, IncrementalDecoder, split_text
from agentic_rag.settings import known_names
from conftest import ROOT, free_port, tiny_qwen_config

Q_HENRIETTE = "Who is Henriette Of France (1727–1752)'s maternal grandfather?"
Q_SHANGHAI = "Who is the spouse of the director of film West Of Shanghai?"
Q_SLOW = "Please think for a long time about nothing?"
SCRIPTS = {
    Q_HENRIETTE: ["<think>Her mother first.</think>\n<search>Henriette of France 1727 mother</search>",
                  "<think>Marie Leszczyńska; now her father.</think>\n<search>Marie Leszczyńska father</search>",
                  "<think>Her father was the king of Poland.</think>\n<answer> Stanisław Leszczyński </answer>"],
    Q_SHANGHAI: ["<search>West of Shanghai director</search>",
                 "<think>John Farrow directed it.</think><search>John Farrow spouse</search>",
                 "<answer>Maureen O'Sullivan</answer>"],
    "CUSTOM-SYSTEM": ["<answer>custom system seen</answer>"],
    Q_SLOW: ["<think>" + "still thinking, " * 60 + "</think><answer>done</answer>"],
}
ANSWER = "Stanisław Leszczyński"
CLIENT = ROOT / "service" / "chat_client.py"


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def model_dir(qwen_tokenizer, tmp_path_factory) -> Path:
    """A tiny random-init Qwen2 and the real Qwen tokenizer, saved so the server loads them by path."""
    import torch
    from transformers import Qwen2ForCausalLM

    d = tmp_path_factory.mktemp("chat_model")
    torch.manual_seed(0)
    Qwen2ForCausalLM(tiny_qwen_config(len(qwen_tokenizer))).save_pretrained(d)
    qwen_tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def adapter_dir(model_dir, tmp_path_factory) -> Path:
    """A LoRA adapter with non-zero weights (so it visibly changes the model), saved with peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("chat_adapter") / "tiny-lora"
    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    peft_model.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def searcher(wiki_index):
    from agentic_rag.search import open_searcher

    return open_searcher(wiki_index, "bm25")


def dotted(settings: dict) -> list[str]:
    """``{"max_batch": 4}`` -> ``["server.max_batch=4"]``: each setting's leaf name (its flag's) to its dotted one."""
    names = {name.rsplit(".", 1)[1]: name for name in known_names(ServeConfig) if "." in name}
    return [f"{names[key]}={value}" for key, value in settings.items()]


@contextlib.contextmanager
def serve(model_dir, wiki_index, searcher=None, *, step_delay_s: float = 0.0, **overrides):
    """The chat server on a free 127.0.0.1 port in a thread; yields (base URL, app)."""
    import uvicorn

    from agentic_rag.models import load_tokenizer
    from agentic_rag.serving.agent import ChatAgent
    from agentic_rag.serving.app import create_app

    settings = {"model": str(model_dir), "index": str(wiki_index), "port": free_port(), "passages_per_search": 2,
                "max_batch": 4, **overrides}
    config = config_for(dotted(settings))  # checked as the command line's is (the model and the index included)
    tok = load_tokenizer(config.model.model)
    agent = ChatAgent.load(config, processors=[ScriptedTurns(tok, keyed_script(SCRIPTS), step_delay_s=step_delay_s)],
                           tokenizer=tok, searcher=searcher)
    app = create_app(agent, config)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.server.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "the chat server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{config.server.port}", app
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def server(model_dir, wiki_index):
    """The default server: loads the index by path itself; small prompt limit to test it."""
    with serve(model_dir, wiki_index, max_prompt_tokens=1024, model_name="tiny-agent") as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def slow_server(model_dir, wiki_index, searcher):
    """One request at a time (max batch 1, queue 1), each decoding step slowed to 20 ms."""
    with serve(model_dir, wiki_index, searcher, step_delay_s=0.02, max_batch=1, queue_size=1, model_name="slow",
               max_tokens_per_turn=512) as (url, app):
        yield url, app


def sdk(url: str, key: str = "unused"):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def ask(question: str, **kw) -> dict:
    return {"model": "tiny-agent", "messages": [{"role": "user", "content": question}], **kw}


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without a developer's AGENTIC_RAG_CHAT_* settings (a token, a URL), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTIC_RAG_CHAT_")}
    env.update(extra)
    return env


@contextlib.contextmanager
def process(argv: list[str], health_url: str, log_path: Path, *, env: dict[str, str] | None = None,
            timeout: float = 180.0):
    """Run ``argv`` until ``health_url`` answers 200; yields the process (stdout and stderr in ``log_path``)
    and kills it if the test did not stop it."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env or clean_env())
    try:
        deadline = time.time() + timeout
        while True:
            assert proc.poll() is None, f"{argv[1]} exited:\n{log_path.read_text()}"
            assert time.time() < deadline, f"{argv[1]} did not answer in {timeout} s:\n{log_path.read_text()}"
            try:
                if httpx.get(health_url, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@contextlib.contextmanager
def search_server(index: Path, log_path: Path):
    """The real retrieval server (agentic-rag serve-search) over ``index`` on a free 127.0.0.1 port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "agentic_rag.cli", "--log-level", "WARNING", "serve-search", "--index",
            str(index), "--port", str(port)]
    with process(argv, url + "/health", log_path) as proc:
        yield url
        proc.terminate()
        proc.wait(30)


# -------------------------------------------------------------------------------------------- the SDK


def test_openai_sdk_non_streaming_answer_and_trace(server, qwen_tokenizer):
    from agentic_rag.data.prompts import build_prompt

    url, _ = server
    r = sdk(url).chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": Q_HENRIETTE}])
    assert r.object == "chat.completion" and r.model == "tiny-agent" and r.id.startswith("chatcmpl-")
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content == ANSWER and r.choices[0].finish_reason == "stop"
    reasoning = msg.model_extra["reasoning_content"]
    assert "<search>Henriette of France 1727 mother</search>" in reasoning and ANSWER not in reasoning
    trace = r.model_extra["agent_trace"]
    assert trace["answer"] == ANSWER and trace["finish_reason"] == "answer"
    assert trace["num_searches"] == 2 and trace["num_turns"] == 3
    searches = [e for e in trace["events"] if e["type"] == "search"]
    assert [s["queries"] for s in searches] == [["Henriette of France 1727 mother"], ["Marie Leszczyńska father"]]
    first = [h["docid"] for h in searches[0]["results"][0]["hits"]]
    second = [h["docid"] for h in searches[1]["results"][0]["hits"]]
    assert first == ["3558", "976"]  # the real BM25 ranking: Henriette, then her mother
    assert searches[0]["results"][0]["hits"][0]["title"] == "Henriette of France (1727–1752)"
    assert second and not set(first) & set(second)  # passages already shown are not repeated
    # the second observation is truncated: only passages whose text the model saw count as shown, the one
    # cut off entirely is listed under "cut" (and may come back in a later search)
    second_result = searches[1]["results"][0]
    assert second == ["229"] and second_result["hits"][0]["partial"] is True
    assert [h["docid"] for h in second_result["cut"]] == ["167"]
    # usage: the prompt is exactly the training prompt; completion counts the model's own tokens
    assert r.usage.prompt_tokens == len(build_prompt(qwen_tokenizer, Q_HENRIETTE))
    assert r.usage.completion_tokens == trace["model_tokens"] > 0 and trace["observation_tokens"] > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_openai_sdk_streaming_shows_searches_then_the_answer(server):
    url, _ = server
    client = sdk(url)
    chunks = list(client.chat.completions.create(model="tiny-agent", stream=True,
                                                 messages=[{"role": "user", "content": Q_HENRIETTE}],
                                                 stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks) and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content_at = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.content]
    events = [(c.model_extra or {}).get("agent_event") or {} for c in chunks]
    search_at = [i for i, e in enumerate(events) if e.get("type") == "search"]
    finish_at = [i for i, e in enumerate(events) if e.get("type") == "finish"]
    assert len(search_at) == 2 and content_at and len(finish_at) == 1
    assert max(search_at) < min(content_at), "search events arrive before the answer"
    # the answer was streamed as the model wrote it: its first piece came before the engine's finish event
    # (a reply assembled from the finished trajectory would only send it after)
    assert min(content_at) < finish_at[0]
    assert "".join(chunks[i].choices[0].delta.content for i in content_at) == ANSWER
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content", "")
                        for c in chunks if c.choices)
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.choices[0].finish_reason == "stop"
    trace = final.model_extra["agent_trace"]
    assert trace["answer"] == ANSWER and trace["reasoning"] == reasoning and trace["num_searches"] == 2
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == trace["model_tokens"]
    # the non-streaming reply carries the same trace and the same reasoning
    plain = client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": Q_HENRIETTE}])
    assert plain.choices[0].message.model_extra["reasoning_content"] == reasoning
    assert plain.model_extra["agent_trace"]["events"] == trace["events"]


def test_concurrent_requests_are_batched(server):
    url, app = server
    runs_before = app.state.scheduler.stats.runs
    results: dict[str, str] = {}

    def go(q):
        r = sdk(url).chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": q}],
                                             temperature=0.5)
        results[q] = r.choices[0].message.content

    threads = [threading.Thread(target=go, args=(q,)) for q in (Q_HENRIETTE, Q_SHANGHAI) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {Q_HENRIETTE: ANSWER, Q_SHANGHAI: "Maureen O'Sullivan"}
    stats = app.state.scheduler.stats
    assert stats.runs - runs_before < 4, "four concurrent requests with the same settings share engine runs"
    assert max(int(k) for k in stats.batch_sizes) > 1


def test_models_health_and_multi_turn_with_a_client_system_message(server):
    url, _ = server
    client = sdk(url)
    assert [m.id for m in client.models.list().data] == ["tiny-agent"]
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny-agent" and health["retriever"] == "bm25"
    assert health["adapter"] is None and health["search"].endswith("wiki") and health["active"] == 0
    assert health["dialect"] == "agentic" and health["rollout"]["passages_per_search"] == 2
    assert health["scheduler"]["queue_size"] == 32 and health["scheduler"]["max_batch"] == 4
    messages = [{"role": "system", "content": "You are terse. CUSTOM-SYSTEM"},
                {"role": "user", "content": "First question?"}, {"role": "assistant", "content": "First answer."},
                {"role": "user", "content": [{"type": "text", "text": "And the "},
                                             {"type": "text", "text": "second?"}]}]
    r = client.chat.completions.create(model="tiny-agent", messages=messages)
    assert r.choices[0].message.content == "custom system seen"


def test_sampling_settings_and_max_tokens_are_honoured(server):
    url, _ = server
    client = sdk(url)

    def free(**kw):  # an unscripted question: the random model writes freely until max_tokens runs out
        return client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": "Free?"}],
                                              max_tokens=12, **kw)

    greedy = [free(temperature=0) for _ in range(2)]
    sampled = [free(temperature=1.5) for _ in range(2)]
    text = [r.choices[0].message.model_extra["reasoning_content"] for r in greedy + sampled]
    assert text[0] == text[1] != "" and text[2] != text[3]
    for r in greedy + sampled:
        assert r.usage.completion_tokens <= 12 and r.choices[0].finish_reason == "length"
        assert r.model_extra["agent_trace"]["finish_reason"] == "max_completion_tokens"


def test_requests_with_other_sampling_settings_run_in_other_batches(qwen_tokenizer):
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.rollout import AgentRollout
    from agentic_rag.rollout.scripted import ScriptedPolicy
    from agentic_rag.serving.scheduler import Job, Scheduler
    from agentic_rag.serving.schema import Sampling

    tok = qwen_tokenizer
    questions = [f"Group {n}?" for n in range(5)]
    policy = ScriptedPolicy(tok, {q: [f"<answer>{q}</answer>"] for q in questions})
    sched = Scheduler(AgentRollout(policy, tok, None), max_batch=2, queue_size=8)
    done: dict[int, str] = {}
    settings = [Sampling(1.0, 1.0, 64), Sampling(0.0, 1.0, 64), Sampling(1.0, 1.0, 64), Sampling(1.0, 1.0, 64),
                Sampling(0.0, 1.0, 64)]
    for n, (q, s) in enumerate(zip(questions, settings, strict=True)):
        sched.submit(Job(build_prompt(tok, q), q, s, lambda kind, t, n=n: done.__setitem__(n, t.answer)))
    sched.start()
    wait_for(lambda: len(done) == 5, what="all five jobs")
    sched.stop()
    assert done == {n: q for n, q in enumerate(questions)}
    # oldest first; same settings share a run, at most max_batch: [0, 2], [1, 4], [3]
    assert policy.calls == [2, 2, 1] and sched.stats.batch_sizes == {2: 2, 1: 1}
    with pytest.raises(RuntimeError, match="closed"):  # stopping the scheduler closed its engine
        sched.engine.run([build_prompt(tok, questions[0])], questions[:1])


# ----------------------------------------------------------------------------------------- bad requests

LONG = "x" * 40000
BAD = [
    ("not json", {}, 400, "malformed JSON body"),
    ("[" * 100000 + "]" * 100000, {}, 400, "malformed JSON body"),
    (r'{"model": "tiny-agent", "messages": [{"role": "user", "content": "hi \ud800"}]}', {}, 400,
     "not valid Unicode"),
    ('{"model": "tiny-agent", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', {}, 400,
     "temperature must be between 0 and 2, got nan"),
    ([1, 2], {}, 400, "must be a JSON object"),
    ({"messages": [{"role": "user", "content": "hi"}]}, {}, 400, "model is required"),
    (ask("hi", model="gpt-4"), {}, 404, "does not exist"),
    ({"model": "tiny-agent"}, {}, 400, "messages is required"),
    ({"model": "tiny-agent", "messages": []}, {}, 400, "messages is empty"),
    ({"model": "tiny-agent", "messages": "hi"}, {}, 400, "messages"),
    ({"model": "tiny-agent", "messages": [{"content": "hi"}]}, {}, 400, "messages.0.role is required"),
    ({"model": "tiny-agent", "messages": [{"role": "wizard", "content": "hi"}]}, {}, 400, "role must be one of"),
    ({"model": "tiny-agent", "messages": [{"role": "tool", "content": "hi"}]}, {}, 400, "is not supported"),
    ({"model": "tiny-agent", "messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                                          {"role": "user", "content": "c"}]}, {}, 400, "may only come first"),
    ({"model": "tiny-agent", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, {},
     400, "alternate"),
    ({"model": "tiny-agent", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
     {}, 400, "last message must be from the user"),
    ({"model": "tiny-agent", "messages": [{"role": "system", "content": "s"}]}, {}, 400, "no user message"),
    ({"model": "tiny-agent", "messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]},
     {}, 400, "'user' was expected"),
    (ask("   "), {}, 400, "content is empty"),
    ({"model": "tiny-agent", "messages": [{"role": "user", "content": None}]}, {}, 400, "content is missing"),
    ({"model": "tiny-agent", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     {}, 400, "only text parts"),
    (ask(LONG), {}, 400, "40000 characters; the limit is 32000"),
    (ask("谁 " * 3000), {}, 400, "the limit is 1024"),  # over max_prompt_tokens
    ({"model": "tiny-agent", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 40
      + [{"role": "user", "content": "c"}]}, {}, 400, "the limit is 64"),
    (ask("hi", max_tokens=0), {}, 400, "max_tokens must be between 1 and 4096"),
    (ask("hi", max_tokens=5000), {}, 400, "max_tokens must be between 1 and 4096"),
    (ask("hi", max_completion_tokens=-3), {}, 400, "max_completion_tokens must be between"),
    (ask("hi", max_tokens="many"), {}, 400, "max_tokens"),
    # strict types: a boolean, a numeric string or a float is not a count, a string is not a flag
    (ask("hi", max_tokens=True), {}, 400, "max_tokens: Input should be a valid integer, got boolean true"),
    (ask("hi", max_tokens="5"), {}, 400, "max_tokens: Input should be a valid integer, got string '5'"),
    (ask("hi", max_tokens=5.0), {}, 400, "max_tokens: Input should be a valid integer, got number 5.0"),
    (ask("hi", max_completion_tokens=False), {}, 400, "max_completion_tokens: Input should be a valid integer"),
    (ask("hi", n=True), {}, 400, "n: Input should be a valid integer, got boolean true"),
    (ask("hi", n="1"), {}, 400, "n: Input should be a valid integer, got string '1'"),
    (ask("hi", stream="true"), {}, 400, "stream: Input should be a valid boolean, got string 'true'"),
    (ask("hi", stream=1), {}, 400, "stream: Input should be a valid boolean, got number 1"),
    (ask("hi", temperature="0.5"), {}, 400, "temperature: Input should be a valid number, got string '0.5'"),
    (ask("hi", top_p=True), {}, 400, "top_p: Input should be a valid number, got boolean true"),
    (ask("hi", logprobs="false"), {}, 400, "logprobs: Input should be a valid boolean, got string 'false'"),
    (ask("hi", stream=True, stream_options={"include_usage": "yes"}), {}, 400,
     "stream_options.include_usage: Input should be a valid boolean"),
    (ask("hi", temperature=-0.1), {}, 400, "temperature must be between 0 and 2"),
    (ask("hi", temperature=2.5), {}, 400, "temperature must be between 0 and 2"),
    (ask("hi", top_p=0), {}, 400, "top_p must be in (0, 1]"),
    (ask("hi", top_p=1.5), {}, 400, "top_p must be in (0, 1]"),
    (ask("hi", n=2), {}, 400, "n must be 1"),
    (ask("hi", stop=["\n"]), {}, 400, "stop sequences are not supported"),
    (ask("hi", tools=[{"type": "function", "function": {"name": "f"}}]), {}, 400, "tools are not supported"),
    (ask("hi", stream_options={"include_usage": True}), {}, 400, "only allowed with stream"),
    (ask("hi", stream="sometimes"), {}, 400, "stream"),
]


@pytest.mark.parametrize("body,headers,status,reason", BAD, ids=[f"{i}-{b[3][:24]}" for i, b in enumerate(BAD)])
def test_every_bad_request_gets_a_4xx_with_a_reason(server, body, headers, status, reason):
    url, _ = server
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(url + "/v1/chat/completions", content=content.encode(),
                   headers={"content-type": "application/json", **headers})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert reason in err["message"] and err["type"] == "invalid_request_error"


class _BrokenSearch:
    """A searcher that fails the way a remote one does, with its address and the transport's words in the message;
    a query with "Marie" in it fails alone (PartialSearchError), any other batch fails whole."""

    URL = "http://10.20.30.40:8000/batch_search"

    def search(self, query, k=10):
        return self.batch_search([query], k)[0]

    def batch_search(self, queries, k=10):
        from agentic_rag.search.types import PartialSearchError, SearchError

        if any("Marie" in q for q in queries):
            raise PartialSearchError([None] * len(queries), [f"TooManyClauses at {self.URL}"] * len(queries))
        raise SearchError(f"search server {self.URL} failed after 4 attempts: ConnectError: [Errno 111] "
                          "Connection refused")


def test_a_failed_search_shows_the_client_search_failed_and_nothing_internal(model_dir, wiki_index, caplog):
    """The search server's address and the exception text stay in the server log: the trace's error events say
    "search failed", in a plain reply and in a stream, and the model's observation has no internals to copy."""
    with serve(model_dir, wiki_index, _BrokenSearch(), model_name="broken") as (url, app), \
            caplog.at_level("WARNING", logger="agentic_rag.serving.agent"):
        body = {"model": "broken", "messages": [{"role": "user", "content": Q_HENRIETTE}]}
        plain = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        streamed = httpx.post(url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60)
    assert plain.status_code == 200 and streamed.status_code == 200
    for text in (plain.text, streamed.text):
        assert "10.20.30.40" not in text and "Connection refused" not in text and "TooManyClauses" not in text
    errors = [e for e in plain.json()["agent_trace"]["events"] if e["type"] == "error"]
    assert [(e["kind"], e["message"]) for e in errors] == [("search_failed", "search failed")] * 2
    events = [json.loads(line[5:]).get("agent_event") for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    assert [(e["kind"], e["message"]) for e in events if e and e["type"] == "error"] == \
        [("search_failed", "search failed")] * 2
    # the operator still learns what happened
    assert "10.20.30.40" in caplog.text and "Connection refused" in caplog.text and "TooManyClauses" in caplog.text


def test_an_oversized_body_is_refused_before_it_is_read(server):
    import socket

    url, _ = server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1073741824\r\n\r\n{")
        data = b""
        while b"request body over" not in data and (chunk := sock.recv(65536)):
            data += chunk
    assert data.startswith(b"HTTP/1.1 413") and b"request body over" in data


def test_bad_requests_through_the_sdk_and_the_server_keeps_serving(server):
    import openai

    url, _ = server
    client = sdk(url)
    with pytest.raises(openai.BadRequestError, match="temperature must be between 0 and 2"):
        client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": "hi"}], temperature=9)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert httpx.get(url + "/v1/nothing-here").status_code == 404
    r = client.chat.completions.create(model="tiny-agent", messages=[{"role": "user", "content": Q_SHANGHAI}])
    assert r.choices[0].message.content == "Maureen O'Sullivan"


# ------------------------------------------------------------------------------------------------- auth


def test_bearer_token_auth(model_dir, wiki_index, searcher):
    import openai

    with serve(model_dir, wiki_index, searcher, api_token="s3cret-token", model_name="secure") as (url, _):
        body = {"model": "secure", "messages": [{"role": "user", "content": Q_SHANGHAI}]}
        missing = httpx.post(url + "/v1/chat/completions", json=body)
        assert missing.status_code == 401 and "missing bearer token" in missing.json()["error"]["message"]
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "invalid bearer token" in wrong.json()["error"]["message"]
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Basic s3cret-token"}).status_code == 401
        assert httpx.get(url + "/v1/models").status_code == 401
        right = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer s3cret-token"})
        assert right.status_code == 200 and right.json()["choices"][0]["message"]["content"] == "Maureen O'Sullivan"
        with pytest.raises(openai.AuthenticationError):
            sdk(url, "wrong").models.list()
        assert sdk(url, "s3cret-token").chat.completions.create(**body).choices[0].message.content
        # /health answers without the token, but only with status and load
        assert set(httpx.get(url + "/health").json()) == {"status", "uptime_s", "queue_depth", "active"}
        full = httpx.get(url + "/health", headers={"Authorization": "Bearer s3cret-token"}).json()
        assert full["model"] == "secure" and "scheduler" in full


def test_no_token_means_loopback_only():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    from agentic_rag.settings import SettingsError, load

    def config(**server):  # the settings alone: the model and the index are not looked at here
        return load(ServeConfig, data={"model": {"model": "m"}, "search": {"index": "i"}, "server": server},
                    env={})[0]

    with pytest.raises(SettingsError, match="refusing to bind '0.0.0.0' without an API token"):
        config(host="0.0.0.0")
    assert config(host="0.0.0.0", api_token="t").server.api_token == "t"
    assert config(host="0.0.0.0", insecure_public=True).server.insecure_public is True
    assert config(host="::1").server.host == "::1"


def test_run_server_script_checks_the_whole_config_before_loading(tmp_path):
    # set-but-empty variables also keep a developer's .env out of the way (the environment wins)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AGENTIC_RAG_CHAT_HOST": "0.0.0.0",
           "AGENTIC_RAG_CHAT_MAX_BATCH": "0", "AGENTIC_RAG_CHAT_MODEL": "", "AGENTIC_RAG_CHAT_INDEX": "",
           "AGENTIC_RAG_CHAT_SEARCH_URL": "", "AGENTIC_RAG_CHAT_API_TOKEN": "", "AGENTIC_RAG_CHAT_INSECURE_PUBLIC": ""}
    r = subprocess.run(["bash", str(ROOT / "script" / "run_server.sh"), "--temperature", "3"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    for problem in ("--model (AGENTIC_RAG_CHAT_MODEL) is required", "--index (AGENTIC_RAG_CHAT_INDEX) is required",
                    "server.max_batch must be >= 1, got 0 (from AGENTIC_RAG_CHAT_MAX_BATCH",
                    "server.temperature must be <= 2, got 3", "refusing to bind '0.0.0.0'"):
        assert problem in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------ queue, disconnect, slots


def _stream_lines(url: str, body: dict, seen: list, stop_after: int | None = None,
                  hang_up: threading.Event | None = None) -> None:
    """Read a stream's data lines into ``seen``; hang up after ``stop_after`` lines or once ``hang_up`` is set."""
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        seen.append(r.status_code)
        for line in r.iter_lines():
            if line.startswith("data:"):
                seen.append(line)
                if (stop_after is not None and len(seen) > stop_after) or (hang_up is not None and hang_up.is_set()):
                    return  # leaving the block closes the connection mid-stream


def test_full_queue_answers_429_with_retry_after(slow_server):
    url, app = slow_server
    sched = app.state.scheduler
    body = {"model": "slow", "messages": [{"role": "user", "content": Q_SLOW}], "stream": True}
    first: list = []
    hang_up = threading.Event()
    runner = threading.Thread(target=_stream_lines, args=(url, body, first), kwargs={"hang_up": hang_up})
    runner.start()
    wait_for(lambda: sched.active == 1, what="the first request to run")
    second: dict = {}
    waiter = threading.Thread(target=lambda: second.update(r=httpx.post(url + "/v1/chat/completions", timeout=60,
                                                                         json={**body, "stream": False})))
    waiter.start()
    wait_for(lambda: sched.queue_depth == 1, what="the second request to queue")
    full = httpx.post(url + "/v1/chat/completions", json=body)
    assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
    assert int(full.headers["retry-after"]) >= 1
    hang_up.set()  # the first client leaves; the queued request runs next
    runner.join(60)
    waiter.join(60)
    assert second["r"].status_code == 200 and second["r"].json()["choices"][0]["message"]["content"] == "done"
    assert sched.stats.rejected >= 1


def test_a_client_that_disconnects_mid_stream_frees_its_slot(slow_server):
    url, app = slow_server
    sched = app.state.scheduler
    cancelled_before = sched.stats.finish_reasons["cancelled"]
    body = {"model": "slow", "messages": [{"role": "user", "content": Q_SLOW}], "stream": True}
    seen: list = []
    _stream_lines(url, body, seen, stop_after=5)  # read a few chunks, then hang up
    hung_up = time.time()
    assert seen[0] == 200 and len(seen) == 6
    wait_for(lambda: sched.stats.finish_reasons["cancelled"] == cancelled_before + 1, what="the cancellation")
    # the whole reply takes ~185 steps x 20 ms; the cancelled one ended within a few steps of the hang-up
    assert time.time() - hung_up < 1.5 and sched.active == 0
    nxt = httpx.post(url + "/v1/chat/completions", json={**body, "stream": False, "messages": [
        {"role": "user", "content": Q_SHANGHAI}]}, timeout=60)
    assert nxt.status_code == 200 and nxt.json()["choices"][0]["message"]["content"] == "Maureen O'Sullivan"
    # a plain (non-streaming) request whose client gives up is cancelled too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", json={**body, "stream": False}, timeout=0.5)
    wait_for(lambda: sched.stats.finish_reasons["cancelled"] == cancelled_before + 2, what="the second cancellation")
    health = httpx.get(url + "/health").json()
    assert health["scheduler"]["finish_reasons"]["cancelled"] >= 2 and health["active"] == 0


# --------------------------------------------------------------------------------------- adapter, client


def test_lora_adapter_loads_and_serves(model_dir, adapter_dir, wiki_index, searcher, qwen_tokenizer):
    import torch
    from peft import PeftModel

    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.models import load_causal_lm

    with serve(model_dir, wiki_index, searcher, adapter=str(adapter_dir)) as (url, app):
        policy = app.state.agent.policy
        assert isinstance(policy.model, PeftModel)
        ids = torch.tensor([build_prompt(qwen_tokenizer, "Adapter?")])
        with torch.no_grad():
            with_adapter = policy.model(ids).logits
            base = load_causal_lm(str(model_dir))(ids).logits
        assert (with_adapter - base).abs().max() > 1e-3, "the adapter changes the model"
        assert [m.id for m in sdk(url).models.list().data] == ["tiny-lora"]  # named after the adapter
        health = httpx.get(url + "/health").json()
        assert health["adapter"] == str(adapter_dir)
        r = sdk(url).chat.completions.create(model="tiny-lora", messages=[{"role": "user", "content": Q_SHANGHAI}])
        assert r.choices[0].message.content == "Maureen O'Sullivan"


def test_terminal_client_one_shot(server):
    url, _ = server
    r = subprocess.run([sys.executable, str(CLIENT), "--url", url, "--once", Q_HENRIETTE, "--trace"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ANSWER + "\n"
    assert '[search] "Henriette of France 1727 mother" -> Henriette of France (1727–1752); Marie Leszczyńska' \
        in r.stderr
    assert "(2 searches, 3 turns, finish: answer)" in r.stderr
    j = subprocess.run([sys.executable, str(CLIENT), "--url", url, "--once", Q_SHANGHAI, "--json"],
                       capture_output=True, text=True, timeout=60)
    data = json.loads(j.stdout)
    assert data["choices"][0]["message"]["content"] == "Maureen O'Sullivan" and data["agent_trace"]["num_searches"] == 2
    bad = subprocess.run([sys.executable, str(CLIENT), "--url", url, "--once", "hi", "--model", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "HTTP 404" in bad.stderr


def test_terminal_client_sends_its_token(model_dir, wiki_index, searcher):
    with serve(model_dir, wiki_index, searcher, api_token="client-s3cret", model_name="secure") as (url, _):
        def client(*args: str, **env: str):
            return subprocess.run([sys.executable, str(CLIENT), "--url", url, "--once", Q_SHANGHAI, *args],
                                  capture_output=True, text=True, timeout=60, env=clean_env(**env))

        ok = client("--token", "client-s3cret")
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout == "Maureen O'Sullivan\n"
        missing = client()
        assert missing.returncode != 0 and missing.stdout == ""
        assert "HTTP 401: missing bearer token" in missing.stderr
        wrong = client("--token", "nope")
        assert wrong.returncode != 0 and "HTTP 401: invalid bearer token" in wrong.stderr
        from_env = client(AGENTIC_RAG_CHAT_API_TOKEN="client-s3cret")
        assert from_env.returncode == 0 and from_env.stdout == "Maureen O'Sullivan\n", from_env.stderr


# --------------------------------------------------------------------------------------- processes


def test_chat_server_searches_through_a_search_server(model_dir, wiki_index, searcher, server, tmp_path):
    from agentic_rag.search.client import HTTPSearcher

    question = {"messages": [{"role": "user", "content": Q_HENRIETTE}]}
    local = sdk(server[0]).chat.completions.create(model="tiny-agent", **question)
    with search_server(wiki_index, tmp_path / "search.log") as search_url, \
            serve(model_dir, wiki_index, index=search_url, model_name="remote") as (url, app):
        assert isinstance(app.state.agent.searcher, HTTPSearcher)
        health = httpx.get(url + "/health").json()
        assert health["search"] == search_url and health["retriever"] is None
        r = sdk(url).chat.completions.create(model="remote", **question)
    assert r.choices[0].message.content == ANSWER
    trace = r.model_extra["agent_trace"]

    def hits(t):
        return [[(h["docid"], h["title"]) for res in e["results"] for h in res["hits"]]
                for e in t["events"] if e["type"] == "search"]

    remote = hits(trace)
    assert len(remote) == 2 and remote == hits(local.model_extra["agent_trace"])
    # the same ranking the local index gives
    assert [d for d, _ in remote[0]] == [h.docid for h in searcher.search("Henriette of France 1727 mother", 2)]
    assert [d for d, _ in remote[0]] == ["3558", "976"]


def test_the_chat_server_entry_point_starts_serves_and_stops(model_dir, wiki_index, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    argv = [sys.executable, str(ROOT / "service" / "chat_server.py"), "--model", str(model_dir), "--index",
            str(wiki_index), "--port", str(port), "--model-name", "smoke", "--max-completion-tokens", "16",
            "--max-tokens-per-turn", "16"]
    with process(argv, url + "/health", log) as proc:
        health = httpx.get(url + "/health").json()
        assert health["model"] == "smoke" and health["search"] == str(wiki_index) and health["retriever"] == "bm25"
        assert health["limits"]["max_tokens"] == 16 and health["rollout"]["max_completion_tokens"] == 16
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["smoke"]
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "smoke", "messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 6,
            "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion" and body["model"] == "smoke"
        assert 0 < body["usage"]["completion_tokens"] <= 6 and body["choices"][0]["finish_reason"] in ("stop", "length")
        assert body["agent_trace"]["model_tokens"] == body["usage"]["completion_tokens"]
        proc.send_signal(signal.SIGTERM)  # what a service manager sends
        # a graceful shutdown, then exit 0 (uvicorn alone re-raises the signal: "terminated by SIGTERM")
        assert proc.wait(60) == 0, log.read_text()
    text = log.read_text()
    assert "Application shutdown complete" in text and "Finished server process" in text, text
    assert "Traceback" not in text and " ERROR " not in text, text
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)


def _entry_point() -> Path:
    """``service/chat_server.py`` of the source tree under test (the one ``agentic_rag`` is imported from)."""
    import agentic_rag

    return Path(agentic_rag.__file__).resolve().parents[2] / "service" / "chat_server.py"


def _plain_request(url: str, body: dict, out: dict, key: str) -> None:
    try:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=180)
        out[key] = {"status": r.status_code, "type": r.headers.get("content-type", ""), "text": r.text,
                    "at": time.monotonic()}
    except httpx.TransportError as exc:
        out[key] = {"status": type(exc).__name__, "text": str(exc), "at": time.monotonic()}


def _streamed_request(url: str, body: dict, out: dict, key: str) -> None:
    """A stream, then (as a client in a loop would) one more request on the same keep-alive connection."""
    lines: list[str] = []
    out[key] = {"status": None, "lines": lines, "error": None}
    with httpx.Client(timeout=180) as client:
        try:
            with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                out[key]["status"] = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        lines.append(line[5:].strip())
        except httpx.TransportError as exc:  # the stream was cut off
            out[key]["error"] = f"{type(exc).__name__}: {exc}"
        out[key]["at"] = time.monotonic()
        try:
            r = client.post(url + "/v1/chat/completions", json={**body, "stream": False})
            out[key]["next"] = (r.status_code, r.json())
        except httpx.TransportError as exc:
            out[key]["next"] = (type(exc).__name__, str(exc))


def test_sigterm_finishes_replies_in_grace_and_answers_the_rest_with_openai_errors(model_dir, wiki_index, tmp_path):
    """SIGTERM to the real server process while four replies are in flight: the two running (a plain one and a
    stream) finish within the grace period and are answered in full; the two queued behind them (long ones) cannot,
    and when the grace period ends the plain one gets a 503 in OpenAI's error shape and the stream an error chunk
    and ``data: [DONE]``. The process exits 0 soon after the grace period, logging the start and the end.

    It used to answer the cut-off plain request with a text/plain "Internal Server Error", end the stream without a
    last chunk or [DONE], and die killed by the signal. The grace period comes from AGENTIC_RAG_CHAT_SHUTDOWN_GRACE_S
    (8 s here; the old code ignores the variable and waited its fixed 10 s)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    argv = [sys.executable, str(_entry_point()), "--model", str(model_dir), "--index", str(wiki_index), "--port",
            str(port), "--model-name", "tiny", "--max-batch", "4", "--max-tokens-per-turn", "4096",
            "--max-completion-tokens", "4096"]
    env = clean_env(AGENTIC_RAG_CHAT_SHUTDOWN_GRACE_S="8")

    def body(max_tokens: int, stream: bool = False) -> dict:
        return {"model": "tiny", "messages": [{"role": "user", "content": "Tell me everything?"}],
                "max_tokens": max_tokens, "temperature": 0, "stream": stream}

    with process(argv, url + "/health", log, env=env) as proc:
        # how fast this machine decodes: the running replies should take ~2 s, the queued ones far past the grace
        assert httpx.post(url + "/v1/chat/completions", json=body(8), timeout=180).status_code == 200  # warm-up
        t0 = time.monotonic()
        assert httpx.post(url + "/v1/chat/completions", json=body(32), timeout=180).status_code == 200
        per_token = (time.monotonic() - t0) / 32
        short, long = max(16, min(2000, int(2.0 / per_token))), 3800
        out: dict = {}
        # a reply of ~1 s keeps the engine busy while the two short ones queue, so they run together
        threads = [threading.Thread(target=_plain_request, args=(url, body(max(4, short // 2)), out, "blocker"))]
        threads[0].start()
        wait_for(lambda: httpx.get(url + "/health").json()["active"] == 1, what="the first reply to run")
        threads += [threading.Thread(target=_plain_request, args=(url, body(short), out, "short plain")),
                    threading.Thread(target=_streamed_request, args=(url, body(short, True), out, "short stream"))]
        for t in threads[1:]:
            t.start()
        wait_for(lambda: httpx.get(url + "/health").json()["active"] == 2, what="the short replies to run")
        threads += [threading.Thread(target=_plain_request, args=(url, body(long), out, "long plain")),
                    threading.Thread(target=_streamed_request, args=(url, body(long, True), out, "long stream"))]
        for t in threads[3:]:
            t.start()
        wait_for(lambda: httpx.get(url + "/health").json()["queue_depth"] == 2, what="the long replies to queue")
        wait_for(lambda: len(out["short stream"]["lines"]) >= 3, what="the short stream to start")
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(httpx.ConnectError):  # no new connections once the shutdown has begun
            time.sleep(0.5)
            httpx.get(url + "/health", timeout=5)
        rc = proc.wait(60)
        exit_s = time.monotonic() - signalled
        for t in threads:
            t.join(60)
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert exit_s < 8 + 8, (exit_s, text[-3000:])
    timing = {"per_token_s": round(per_token, 4), "short": short, "exit_s": round(exit_s, 2)}

    # running at SIGTERM, finished in full within the grace period
    plain = out["short plain"]
    assert plain["status"] == 200 and plain["at"] > signalled, (plain, timing, plain["at"] - signalled)
    assert json.loads(plain["text"])["usage"]["completion_tokens"] == short
    stream = out["short stream"]
    assert stream["status"] == 200 and stream["error"] is None and stream["at"] > signalled, stream
    assert stream["lines"][-1] == "[DONE]"
    assert json.loads(stream["lines"][-2])["choices"][0]["finish_reason"] == "length"

    # queued at SIGTERM, cut off when the grace period ended: OpenAI's error shape, never a bare 500
    plain = out["long plain"]
    assert plain["status"] == 503 and plain["type"] == "application/json", plain
    error = json.loads(plain["text"])["error"]
    assert error["type"] == "server_error" and error["code"] == "server_shutting_down"
    assert "shutting down" in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert 8 - 1 < plain["at"] - signalled < 8 + 5, (plain["at"] - signalled, timing)
    stream = out["long stream"]
    assert stream["status"] == 200 and stream["error"] is None, stream
    assert stream["lines"][-1] == "[DONE]"
    last = json.loads(stream["lines"][-2])
    assert last["error"]["code"] == "server_shutting_down" and last["error"]["type"] == "server_error", last
    assert json.loads(stream["lines"][0])["choices"][0]["delta"]["role"] == "assistant"

    # a stream began before the shutdown, so its headers could not say Connection: close: its client reused the
    # connection right after [DONE], and that request was answered 503, not reset under it
    for key in ("short stream", "long stream"):
        status, answer = out[key]["next"]
        assert status == 503 and answer["error"]["code"] == "server_shutting_down", (key, out[key]["next"])

    assert "chat server shutting down: 4 request(s) in flight, 8 s to finish them" in text, text[-3000:]
    assert "4 request(s) were in flight, 2 finished, 2 cut off, 2 refused" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_terminal_client_interactive_session(server):
    url, _ = server
    r = subprocess.run([sys.executable, str(CLIENT), "--url", url], input=f"{Q_SHANGHAI}\n/reset\n/quit\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"connected to {url} (tiny-agent)") and "\033[" not in out  # no colors off a terminal
    assert '[search] "West of Shanghai director" -> West of Shanghai; James Tinling' in out
    assert "answer:\nMaureen O'Sullivan\n" in out and "(conversation cleared)" in out


def test_terminal_client_renders_a_stream(server):
    import io

    from agentic_rag.serving.client import ChatClient, Renderer, stream_reply

    class Recording(Renderer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.chunks: list[dict] = []

        def chunk(self, chunk):
            self.chunks.append(chunk)
            super().chunk(chunk)

    url, _ = server
    out = io.StringIO()
    client = ChatClient(url)
    renderer = Recording(out, color=False)
    answer, trace = stream_reply(client, [{"role": "user", "content": Q_SHANGHAI}], renderer)
    client.close()
    text = out.getvalue()
    assert answer == "Maureen O'Sullivan" and trace["num_searches"] == 2
    # the renderer got the answer while it was generated, before the engine's finish event
    kinds = [(c.get("agent_event") or {}).get("type") for c in renderer.chunks]
    content_at = [i for i, c in enumerate(renderer.chunks) if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content_at and kinds.count("finish") == 1 and min(content_at) < kinds.index("finish")
    assert '[search] "West of Shanghai director" -> West of Shanghai; James Tinling\n' in text
    assert text.index("[search]") < text.index("answer:\nMaureen O'Sullivan")
    assert "<think>John Farrow directed it.</think>" in text and "(2 searches, 3 turns, finish: answer" in text


# --------------------------------------------------------------------------------------- pure pieces


def test_incremental_decoding_never_shows_half_characters(qwen_tokenizer):
    tok = qwen_tokenizer
    text = "Stanisław Leszczyński 谁是 🙂🙂 naïve — done. " * 5
    ids = tok(text, add_special_tokens=False)["input_ids"]
    dec = IncrementalDecoder(tok, window=6)
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_answer_splitter_is_the_same_whole_or_in_pieces():
    text = "<think>a <answ</think>\n<answer>\n  Fred  ville \n</answer> tail <answer"
    reasoning, content = split_text(text)
    assert content == "Fred  ville"
    assert reasoning == "<think>a <answ</think>\n tail <answer"
    for size in (1, 2, 3, 7):
        s = AnswerSplitter()
        got = {"reasoning": "", "content": ""}
        for k in range(0, len(text), size):
            for channel, piece in s.feed(text[k:k + size]):
                got[channel] += piece
        for channel, piece in s.flush():
            got[channel] += piece
        assert (got["reasoning"], got["content"]) == (reasoning, content)


def test_one_reply_writer_makes_the_streamed_and_the_whole_reply(qwen_tokenizer, searcher):
    """Engine output -> reply text and chunks in one place: the streamed deltas join to exactly the fields of the
    non-streamed reply, with the same trace and usage, also when the model leaves its answer tag open."""
    from agentic_rag.data.prompts import build_prompt
    from agentic_rag.rollout import AgentRollout, RolloutHooks
    from agentic_rag.rollout.protocol import get_dialect
    from agentic_rag.rollout.scripted import ScriptedPolicy
    from agentic_rag.rollout.settings import RolloutSettings
    from agentic_rag.serving.replies import ReplyWriter

    tok, dialect = qwen_tokenizer, get_dialect("agentic")
    scripts = {Q_SHANGHAI: SCRIPTS[Q_SHANGHAI], "No tag?": ["<think>hm</think> Paris, I guess"],
               "Open tag?": ["<think>so</think><answer> Lyon"]}
    questions = list(scripts)
    fed: list[list[tuple[str, object]]] = [[] for _ in questions]
    hooks = RolloutHooks(on_token=lambda i, token: fed[i].append(("token", token)),
                         on_event=lambda i, event: fed[i].append(("event", dict(event))))
    with AgentRollout(ScriptedPolicy(tok, scripts), tok, searcher, RolloutSettings(dialect=dialect.name)) as engine:
        trajs = engine.run([build_prompt(tok, q) for q in questions], questions, hooks)
    contents = []
    for items, t in zip(fed, trajs, strict=True):
        streamed = ReplyWriter("m", tok, dialect, include_usage=True)
        chunks = streamed.opening() + [c for kind, payload in [*items, ("done", t)]
                                       for c in streamed.feed(kind, payload)]
        assert streamed.finished
        whole = ReplyWriter("m", tok, dialect).completion(t)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        message = whole["choices"][0]["message"]
        assert "".join(d.get("content", "") for d in deltas) == message["content"]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
        final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(final) == 1 and final[0]["agent_trace"] == whole["agent_trace"]
        assert final[0]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
        contents.append(message["content"])
    assert contents == ["Maureen O'Sullivan", "<think>hm</think> Paris, I guess", "Lyon"]


def test_every_server_setting_is_documented_in_env_format():
    documented = {line.split("=", 1)[0] for line in (ROOT / ".env_format").read_text().splitlines()
                  if line and not line.startswith("#")}
    missing = set(env_names()) - documented
    assert not missing, f"document these in .env_format: {sorted(missing)}"
    assert "AGENTIC_RAG_CHAT_URL" in documented


def parsed(argv: list[str], env: dict[str, str]):
    """The server's config from a command line and an environment, as ``agentic-rag serve`` resolves it (no
    model or index looked at)."""
    from agentic_rag.serving.config import build_parser, resolve

    parser, dests = build_parser()
    return resolve(parser.parse_args(argv), dests, env, check_files=False)[0]


def test_config_from_env_and_flags():
    from agentic_rag.settings import SettingsError

    env = {"AGENTIC_RAG_CHAT_PORT": "9100", "AGENTIC_RAG_CHAT_INSECURE_PUBLIC": "yes",
           "AGENTIC_RAG_CHAT_MODEL": "/m"}
    cfg = parsed([], env)
    assert cfg.server.port == 9100 and cfg.server.insecure_public is True
    cfg = parsed(["--port", "9200", "--max-batch", "2"], env)  # a flag wins over its environment variable
    assert (cfg.server.port, cfg.server.max_batch, cfg.model.model, cfg.served_name) == (9200, 2, "/m", "m")
    with pytest.raises(SettingsError, match=r"server.port must be an integer, got 'eighty' \(from "
                                            r"AGENTIC_RAG_CHAT_PORT in the environment"):
        parsed([], {"AGENTIC_RAG_CHAT_PORT": "eighty"})
    assert parsed([], {"AGENTIC_RAG_CHAT_SHUTDOWN_GRACE_S": "2.5"}).server.shutdown_grace_s == 2.5
    with pytest.raises(SettingsError, match="server.shutdown_grace_s must be >= 0, got -1"):
        parsed(["--shutdown-grace-s", "-1"], {})
    # the renamed settings under their new names: flags, environment variables, values
    cfg = parsed(["--max-completion-tokens", "300", "--passages-per-search", "5", "--index", "http://127.0.0.1:8000",
                  "--chat-template", "false", "--max-searches", "2"], {"AGENTIC_RAG_CHAT_MAX_TURNS": "6"})
    assert (cfg.rollout.max_completion_tokens, cfg.rollout.passages_per_search, cfg.rollout.max_searches,
            cfg.rollout.max_turns) == (300, 5, 2, 6)
    assert cfg.search.index == "http://127.0.0.1:8000" and cfg.prompt.chat_template is False
    assert parsed(["--chat-template", "true"], {}).prompt.chat_template is True
    assert parsed(["--chat-template", "null"], {}).prompt.chat_template is None
    cfg = parsed([], {"AGENTIC_RAG_CHAT_PASSAGES_PER_SEARCH": "4", "AGENTIC_RAG_CHAT_MAX_COMPLETION_TOKENS": "64",
                      "AGENTIC_RAG_CHAT_MAX_TOKENS_PER_TURN": "32"})
    assert (cfg.rollout.passages_per_search, cfg.rollout.max_completion_tokens) == (4, 64)
    with pytest.raises(SettingsError, match="prompt.chat_template must be true or false or null, got 'auto'"):
        parsed(["--chat-template", "auto"], {})


def test_old_settings_names_are_refused_with_the_new_name(capsys):
    """A variable or flag of earlier versions is never silently ignored: it is refused, naming what replaced it."""
    from agentic_rag.settings import SettingsError

    with pytest.raises(SettingsError) as err:
        parsed([], {"AGENTIC_RAG_CHAT_MAX_TOKENS": "5"})
    assert "AGENTIC_RAG_CHAT_MAX_TOKENS is no longer read: use AGENTIC_RAG_CHAT_MAX_COMPLETION_TOKENS" in \
        str(err.value)
    with pytest.raises(SettingsError) as err:
        parsed([], {"AGENTIC_RAG_CHAT_PASSAGES": "2", "AGENTIC_RAG_CHAT_SEARCH_URL": "http://127.0.0.1:8000",
                    "AGENTIC_RAG_CHAT_MAX_SERCHES": "2", "AGENTIC_RAG_CHAT_PORT": "0"})
    text = str(err.value)
    assert "AGENTIC_RAG_CHAT_PASSAGES is no longer read: use AGENTIC_RAG_CHAT_PASSAGES_PER_SEARCH" in text
    assert "AGENTIC_RAG_CHAT_SEARCH_URL is no longer read: use AGENTIC_RAG_CHAT_INDEX" in text
    assert "AGENTIC_RAG_CHAT_MAX_SERCHES is not a setting of the chat server; did you mean " \
        "AGENTIC_RAG_CHAT_MAX_SEARCHES?" in text
    assert "server.port must be >= 1, got 0" in text  # reported with the others, all at once
    # set but empty sets nothing (a .env template's blank line): neither read nor refused
    assert parsed([], {"AGENTIC_RAG_CHAT_MAX_TOKENS": ""}).rollout.max_completion_tokens == 1024
    # the old flags are gone: argparse refuses them (--max-tokens is now ambiguous, --search-url unknown)
    for argv, said in ((["--max-tokens", "16"], "ambiguous option: --max-tokens"),
                       (["--search-url", "http://127.0.0.1:8000"], "unrecognized arguments: --search-url")):
        with pytest.raises(SystemExit) as exit_:
            parsed(argv, {})
        assert exit_.value.code == 2
        assert said in capsys.readouterr().err


@pytest.mark.parametrize("how", ["agentic-rag serve", "service/chat_server.py"])
def test_describe_prints_every_setting_without_loading_a_model(how):
    """``--describe`` prints every setting as resolved, one per line (``dotted.name  value  help``), and exits:
    no model is loaded (the one named does not even exist), and the API token shows as "(set)", never itself."""
    secret = "s3cret-describe-token"
    argv = ([sys.executable, "-m", "agentic_rag.cli", "serve"] if how == "agentic-rag serve"
            else [sys.executable, str(_entry_point())])
    r = subprocess.run([*argv, "--describe", "--model", "/no/model", "--index", "/no/index",
                        "--max-searches", "2", "--port", "9123"], capture_output=True, text=True, timeout=120,
                       env=clean_env(AGENTIC_RAG_CHAT_API_TOKEN=secret, AGENTIC_RAG_CHAT_MAX_TURNS="6"))
    assert r.returncode == 0, r.stderr
    assert secret not in r.stdout + r.stderr
    lines = r.stdout.splitlines()
    names = known_names(ServeConfig)
    assert len(lines) == len(names)
    rows = {}
    for name, line in zip(names, lines, strict=True):
        assert line.startswith(name + " "), (name, line)
        value, _, help_text = line[len(name):].strip().partition("  ")
        assert help_text.strip(), line  # every setting with its help
        rows[name] = (value.strip(), help_text)
    assert rows["server.api_token"][0] == "'(set)'"
    assert rows["rollout.max_searches"][0] == "2" and "--set rollout.max_searches" in rows["rollout.max_searches"][1]
    assert rows["rollout.max_turns"][0] == "6" and "AGENTIC_RAG_CHAT_MAX_TURNS" in rows["rollout.max_turns"][1]
    assert rows["server.port"][0] == "9123" and rows["rollout.passages_per_search"][0] == "3"
    assert rows["model.model"][0] == "'/no/model'" and rows["search.index"][0] == "'/no/index'"
    assert "loaded model" not in r.stderr and "Traceback" not in r.stderr
    # without a token it shows empty
    r = subprocess.run([*argv, "--describe"], capture_output=True, text=True, timeout=120, env=clean_env())
    assert r.returncode == 0, r.stderr
    assert next(line for line in r.stdout.splitlines() if line.startswith("server.api_token ")).split()[1] == "''"
