"""An LLM judge (ACC_L): asks any OpenAI-compatible chat endpoint whether a prediction answers a question.

Lexical metrics miss correct answers in other words ("JFK" for "John F. Kennedy"); R1-Searcher and others
therefore also report an LLM judge's accuracy. This client is used by ``agentic-rag eval`` (metric
``judge``) and by the trainer (a reward that falls back to a lexical metric where the judge gave no
verdict).

**The prompt** is fixed, so numbers are comparable across runs. The judge model receives the system
message :data:`JUDGE_SYSTEM` and the user message :data:`JUDGE_PROMPT` with ``{question}``, ``{golds}``
(every acceptable gold answer, joined by `` | ``) and ``{prediction}`` filled in; it is called with
temperature 0. It must answer exactly ``yes`` or ``no``: the reply is lower-cased and stripped of spaces and
surrounding ``.!*`'"``; anything else is **garbage**.

**Verdicts**: for each item ``True`` (yes), ``False`` (no), or ``None`` when the judge failed (connection
error, timeout, HTTP error, after retries) or replied garbage. An empty prediction is ``False`` without a
call. Nothing here raises on a judge's behaviour: failures and garbage are counted in :class:`JudgeStats`.

**Robustness**: at most ``max_concurrency`` calls in flight; each call has a timeout; connection errors,
timeouts, 429 and 5xx are retried ``retries`` times with exponential backoff (``backoff_s * 2**attempt``);
other 4xx (bad request, unknown model) are not retried.

.. code-block:: python

    judge = JudgeClient(JudgeSettings(base_url="http://127.0.0.1:8001/v1", model="qwen2.5-72b-instruct"))
    judge.judge_batch([JudgeItem("Who wrote Hamlet?", ["William Shakespeare"], "Shakespeare")])  # [True]
    judge.stats.to_dict()
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..endpoints import api_key_from_env, check_endpoint

log = logging.getLogger(__name__)

JUDGE_SYSTEM = "You grade answers to questions. Reply with exactly one word: yes or no."

JUDGE_PROMPT = """Question: {question}
Gold answer(s): {golds}
Predicted answer: {prediction}

Is the predicted answer correct? It is correct when it means the same as one of the gold answers: the same \
entity, date, number or fact, in any wording, spelling, abbreviation or level of detail that does not change \
the meaning. It is not correct when it names something else, hedges between several answers, or is empty.
Reply with exactly one word: yes or no."""

YES, NO, GARBAGE, FAILED, SKIPPED = "yes", "no", "garbage", "failed", "skipped"


@dataclass
class JudgeSettings:
    base_url: str = ""  # OpenAI-compatible base URL, e.g. http://127.0.0.1:8001/v1
    model: str = ""  # the judge model's name on that endpoint
    api_key_env: str = "JUDGE_API_KEY"  # environment variable holding the key (unset: no key)
    timeout_s: float = 30.0  # one call
    max_concurrency: int = 8  # calls in flight
    retries: int = 2  # extra attempts after a retryable error
    backoff_s: float = 0.5  # first retry waits this long, then doubles (with jitter)
    max_tokens: int | None = 16  # None: do not send max_tokens (APIs that want max_completion_tokens)

    @classmethod
    def from_any(cls, config: Any) -> JudgeSettings:
        """Settings from any object (or dict) with these attribute names, e.g. the trainer's JudgeConfig."""
        if isinstance(config, cls):
            return config
        get = config.get if isinstance(config, dict) else lambda k, d: getattr(config, k, d)
        defaults = cls()
        return cls(**{f: get(f, getattr(defaults, f)) for f in asdict(defaults)})

    def problems(self, prefix: str = "judge") -> list[str]:
        p = []
        if not self.base_url:
            p.append(f"{prefix}.base_url is empty: the judge's OpenAI-compatible URL (e.g. http://host:8000/v1)")
        elif not self.base_url.startswith(("http://", "https://")):
            p.append(f"{prefix}.base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.model:
            p.append(f"{prefix}.model is empty: the judge model's name on its endpoint")
        if self.timeout_s <= 0:
            p.append(f"{prefix}.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_concurrency < 1:
            p.append(f"{prefix}.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.retries < 0:
            p.append(f"{prefix}.retries must be >= 0, got {self.retries}")
        return p


@dataclass
class JudgeItem:
    question: str
    golds: list[str]
    prediction: str | None


@dataclass
class Verdict:
    value: bool | None  # True = yes, False = no, None = no verdict
    status: str  # yes, no, garbage, failed, skipped (empty prediction: False without a call)
    raw: str = ""  # the judge's reply, or the error


@dataclass
class JudgeStats:
    calls: int = 0  # HTTP attempts, retries included
    yes: int = 0
    no: int = 0
    garbage: int = 0
    failed: int = 0
    skipped: int = 0
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # error kind -> count (last attempt of each item)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_verdict(reply: str | None) -> bool | None:
    """``yes`` -> True, ``no`` -> False, anything else -> None (see the module docstring)."""
    if not isinstance(reply, str):
        return None
    word = reply.strip().strip(" \t\n.!*`'\"").lower()
    return True if word == "yes" else False if word == "no" else None


def judge_messages(item: JudgeItem) -> list[dict[str, str]]:
    golds = " | ".join(g.strip() for g in item.golds if g and g.strip()) or "(none)"
    prediction = (item.prediction or "").strip()
    prompt = JUDGE_PROMPT.format(question=item.question.strip(), golds=golds, prediction=prediction)
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": prompt}]


class JudgeClient:
    """Batched, bounded-concurrency judge calls; ``judge_batch`` is the synchronous entry point."""

    def __init__(self, config: Any):
        self.settings = JudgeSettings.from_any(config)
        problems = self.settings.problems()
        if problems:
            raise ValueError("invalid judge settings: " + "; ".join(problems))
        self.stats = JudgeStats()
        self._lock = threading.Lock()

    def check(self) -> None:
        """Fail fast (EndpointError naming the URL) when the judge cannot be reached or lacks the model."""
        s = self.settings
        check_endpoint(s.base_url, api_key_from_env(s.api_key_env), model=s.model,
                       timeout_s=min(5.0, s.timeout_s), what="judge endpoint")

    # ------------------------------------------------------------------------------------------ entry

    def judge_batch(self, items: Sequence[JudgeItem]) -> list[bool | None]:
        return [v.value for v in self.judge_batch_detailed(items)]

    def judge_batch_detailed(self, items: Sequence[JudgeItem]) -> list[Verdict]:
        """Synchronous: runs its own event loop (in a helper thread when called from inside a running loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ajudge_batch(items))
        out: list[Verdict] = []
        thread = threading.Thread(target=lambda: out.extend(asyncio.run(self.ajudge_batch(items))))
        thread.start()
        thread.join()
        return out

    async def ajudge_batch(self, items: Sequence[JudgeItem]) -> list[Verdict]:
        from openai import AsyncOpenAI

        s = self.settings
        sem = asyncio.Semaphore(s.max_concurrency)
        async with AsyncOpenAI(base_url=s.base_url, api_key=api_key_from_env(s.api_key_env),
                               timeout=s.timeout_s, max_retries=0) as client:
            async def one(item: JudgeItem) -> Verdict:
                if not (item.prediction or "").strip():
                    return self._count(Verdict(False, SKIPPED))
                async with sem:
                    return self._count(await self._call(client, item))

            return list(await asyncio.gather(*(one(item) for item in items)))

    # ------------------------------------------------------------------------------------------ calls

    async def _call(self, client: Any, item: JudgeItem) -> Verdict:
        import openai

        s = self.settings
        kwargs: dict[str, Any] = {"model": s.model, "messages": judge_messages(item), "temperature": 0.0}
        if s.max_tokens is not None:
            kwargs["max_tokens"] = s.max_tokens
        error = ""
        for attempt in range(s.retries + 1):
            if attempt:
                with self._lock:
                    self.stats.retries += 1
                await asyncio.sleep(s.backoff_s * 2 ** (attempt - 1) * (1 + 0.25 * random.random()))
            with self._lock:
                self.stats.calls += 1
            try:
                resp = await asyncio.wait_for(client.chat.completions.create(**kwargs), timeout=s.timeout_s)
            except (TimeoutError, openai.APIConnectionError, openai.RateLimitError,
                    openai.InternalServerError) as exc:
                error = _kind(exc)
                continue
            except openai.APIStatusError as exc:  # other 4xx: retrying will not help
                return Verdict(None, FAILED, _kind(exc))
            except Exception as exc:  # noqa: BLE001 - a malformed body or an SDK surprise is a failed call
                return Verdict(None, FAILED, _kind(exc))
            try:
                reply = resp.choices[0].message.content
            except (AttributeError, IndexError, TypeError):
                return Verdict(None, GARBAGE, repr(resp)[:200])
            value = parse_verdict(reply)
            if value is None:
                return Verdict(None, GARBAGE, str(reply)[:200])
            return Verdict(value, YES if value else NO, str(reply)[:200])
        return Verdict(None, FAILED, error)

    def _count(self, v: Verdict) -> Verdict:
        with self._lock:
            setattr(self.stats, v.status, getattr(self.stats, v.status) + 1)
            if v.status == FAILED:
                kind = v.raw.split(":", 1)[0] or "error"
                self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
            elif v.status == GARBAGE:
                log.debug("judge replied garbage: %r", v.raw)
        return v


def _kind(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__ if not isinstance(exc, TimeoutError) else "Timeout"
    return f"{name}: HTTP {status}" if status else f"{name}: {str(exc)[:160]}"
