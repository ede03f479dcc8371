"""The LLM judge against a fake OpenAI-compatible chat endpoint on 127.0.0.1: yes, no, garbage, timeouts and
5xx are verdicts or counted failures, never a crash."""

from __future__ import annotations

import threading
import time

import openai  # noqa: F401 - imported up front: its import (seconds, cold) is not what the timings measure
import pytest

from agentic_rag.endpoints import EndpointError
from agentic_rag.rewards.judge import JUDGE_PROMPT, JUDGE_SYSTEM, JudgeClient, JudgeItem, JudgeSettings, parse_verdict
from conftest import free_port
from fake_openai import FakeOpenAI, chat_reply


class Behaviour:
    """The judge's reply chosen by the prediction in the prompt."""

    def __init__(self):
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, body):
        prompt = body["messages"][1]["content"]
        pred = prompt.split("Predicted answer: ", 1)[1].split("\n", 1)[0]
        with self.lock:
            self.seen[pred] = self.seen.get(pred, 0) + 1
            n = self.seen[pred]
        if pred == "right":
            return chat_reply("Yes.")
        if pred == "wrong":
            return chat_reply(" no ")
        if pred == "rambling":
            return chat_reply("Well, it depends on how you read the question.")
        if pred == "nothing":
            return chat_reply(None)
        if pred == "no-choices":
            return {"id": "x", "object": "chat.completion", "created": 0, "model": "judge", "choices": []}
        if pred == "slow":
            time.sleep(1.5)
            return chat_reply("yes")
        if pred == "flaky":
            return (500, {"error": {"message": "overloaded"}}) if n == 1 else chat_reply("**yes**")
        if pred == "broken":
            return 503, {"error": {"message": "down"}}
        if pred == "bad-request":
            return 400, {"error": {"message": "bad"}}
        return chat_reply("yes")


def settings(url, **kw):
    base = {"base_url": url, "model": "judge", "timeout_s": 0.6, "retries": 1, "backoff_s": 0.05, "max_concurrency": 4}
    return JudgeSettings(**{**base, **kw})


def test_parse_verdict():
    assert parse_verdict("yes") is True and parse_verdict(" Yes. ") is True and parse_verdict("**NO**") is False
    assert parse_verdict("'no'") is False
    for garbage in ("yes, mostly", "maybe", "", None, 42, "Yes it is"):
        assert parse_verdict(garbage) is None


def test_judge_verdicts_failures_and_garbage_are_counted(monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test")
    behaviour = Behaviour()
    preds = ["right", "wrong", "rambling", "nothing", "no-choices", "slow", "flaky", "broken", "bad-request", ""]
    with FakeOpenAI(chat=behaviour, models=("judge",)) as srv:
        client = JudgeClient(settings(srv.url, api_key_env="TEST_JUDGE_KEY"))
        client.check()
        items = [JudgeItem("Who shot at Fort Hood in 2009?", ["Nidal Hasan", "Nidal Malik Hasan"], p) for p in preds]
        t0 = time.time()
        verdicts = client.judge_batch_detailed(items)
        elapsed = time.time() - t0
    got = {p: (v.value, v.status) for p, v in zip(preds, verdicts, strict=True)}
    assert got == {"right": (True, "yes"), "wrong": (False, "no"), "rambling": (None, "garbage"),
                   "nothing": (None, "garbage"), "no-choices": (None, "garbage"), "slow": (None, "failed"),
                   "flaky": (True, "yes"), "broken": (None, "failed"), "bad-request": (None, "failed"),
                   "": (False, "skipped")}
    s = client.stats
    assert (s.yes, s.no, s.garbage, s.failed, s.skipped) == (2, 1, 3, 3, 1)
    # slow timed out twice (1 retry), flaky and broken were retried once each, bad-request was not retried
    assert behaviour.seen["bad-request"] == 1 and behaviour.seen["broken"] == 2 and behaviour.seen["flaky"] == 2
    assert s.retries == 3 and "" not in behaviour.seen  # an empty prediction costs no call
    assert elapsed < 4.0, "calls ran concurrently and timed out on time"
    # the fixed prompt went out as documented, with the key from the named variable
    body = srv.bodies("/v1/chat/completions")[0]
    assert body["messages"][0] == {"role": "system", "content": JUDGE_SYSTEM}
    assert body["messages"][1]["content"] == JUDGE_PROMPT.format(
        question="Who shot at Fort Hood in 2009?", golds="Nidal Hasan | Nidal Malik Hasan",
        prediction=body["messages"][1]["content"].split("Predicted answer: ")[1].split("\n")[0])
    assert body["temperature"] == 0.0 and body["model"] == "judge"


def test_judge_batch_sync_api_and_bounded_concurrency():
    with FakeOpenAI(chat=lambda body: chat_reply("yes"), models=("judge",), delay=0.2) as srv:
        client = JudgeClient({"base_url": srv.url, "model": "judge", "max_concurrency": 3, "timeout_s": 5})
        t0 = time.time()
        out = client.judge_batch([JudgeItem("q", ["a"], f"p{i}") for i in range(9)])
        elapsed = time.time() - t0
    assert out == [True] * 9
    assert srv.max_in_flight == 3  # never more than max_concurrency
    assert 0.55 < elapsed < 2.5  # 9 calls of 0.2 s, 3 at a time: about 0.6 s


def test_judge_inside_a_running_event_loop():
    import asyncio

    with FakeOpenAI(chat=lambda body: chat_reply("no"), models=("judge",)) as srv:
        client = JudgeClient(settings(srv.url))

        async def inside():
            return client.judge_batch([JudgeItem("q", ["a"], "b")])

        assert asyncio.run(inside()) == [False]


def test_unreachable_judge_fails_fast_with_its_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    client = JudgeClient(settings(url))
    t0 = time.time()
    with pytest.raises(EndpointError, match=f"cannot reach the judge endpoint at {url}"):
        client.check()
    assert time.time() - t0 < 5
    # and calls against it are failures, counted, not exceptions
    assert client.judge_batch([JudgeItem("q", ["a"], "b")]) == [None]
    assert client.stats.failed == 1


def test_judge_check_names_a_missing_model():
    with FakeOpenAI(chat=lambda body: chat_reply("yes"), models=("other-model",)) as srv:
        with pytest.raises(EndpointError, match="does not serve model 'judge'; it serves: other-model"):
            JudgeClient(settings(srv.url)).check()


def test_judge_settings_are_validated():
    with pytest.raises(ValueError, match="judge.base_url is empty.*judge.model is empty"):
        JudgeClient(JudgeSettings())
