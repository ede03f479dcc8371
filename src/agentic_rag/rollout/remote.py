"""A policy served elsewhere: any OpenAI-compatible ``/v1/completions`` endpoint (vLLM, SGLang, ...).

:class:`OpenAICompletionsPolicy` implements the :class:`~.policy.Policy` protocol, so the rollout engine runs
a released search-RL model (or your adapter merged and served by vLLM) exactly as it runs a local one, in
synchronous rounds. Each context is decoded to text with the model's tokenizer (special tokens kept, so the
chat template's markers go through) and sent as one ``prompt`` with ``max_tokens`` (the turn budget),
``stop`` (the dialect's close tags) and the sampling settings; the contexts of a round are sent
concurrently, at most ``concurrency`` at a time. ``extra_body`` adds server-specific fields: with vLLM,
``skip_special_tokens: false`` keeps special tokens (``<think>`` in Qwen3) in the reply, and for tokenizers
that add a BOS token (Llama 3) ``add_special_tokens: false`` stops the server from adding a second one in
front of the decoded prompt, which already holds it.

How the reply maps back to a :class:`~.decoding.Generation`:

* OpenAI-compatible servers **strip the stop string** from the returned text, and the engine needs it to
  parse the action. The matched stop is read from vLLM's ``stop_reason`` (the stop string; ``None`` means
  EOS) or SGLang's ``matched_stop``; failing both, when ``finish_reason`` is ``stop`` and the text leaves an
  action tag open (``<search>`` with no ``</search>`` after it), that tag's close is the stop. The stop
  string is appended to the text (unless the server already kept it).
* ``finish_reason == "length"`` is a spent budget; a ``stop`` with no stop string is EOS, and the
  tokenizer's EOS token is appended, as a local model's generation ends with it.
* The text is tokenized back to ids. **For evaluation only**: those ids are a re-tokenization of the
  server's output, not the ids it sampled, and no log-probabilities come back, so these trajectories must
  not be trained on.

A context whose text the server would tokenize into other control tokens than the context holds is sent as its
token ids instead (the completions API's token-array ``prompt``, which vLLM, SGLang and llama.cpp take): a passage
or a question holding the text of a control token (``<|im_end|>``) is encoded as text in the context
(:mod:`.encoding`), and sent as text the server would read it as the control token itself.

The endpoint is checked when the policy is built (``GET /models`` with a short timeout, and the model must
be served): an unreachable server fails at once with its URL instead of after the first batch's timeouts.
A request that still fails after the client's retries raises :class:`~agentic_rag.endpoints.EndpointError`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..endpoints import EndpointError, api_key_from_env, check_endpoint
from .decoding import STOP_EOS, STOP_LENGTH, Generation, SamplingParams
from .encoding import control_token_ids
from .policy import per_sequence_budgets

log = logging.getLogger(__name__)


def open_tag_for(close: str) -> str | None:
    """The opening tag of a close tag: ``</x>`` -> ``<x>``, ``<|end_of_x|>`` -> ``<|begin_of_x|>``."""
    m = re.fullmatch(r"</([^<>/]+)>", close)
    if m:
        return f"<{m.group(1)}>"
    m = re.fullmatch(r"<\|end_of_([^|]+)\|>", close)
    if m:
        return f"<|begin_of_{m.group(1)}|>"
    return None


def infer_stop(text: str, stop_strings: Sequence[str], open_tags: Mapping[str, str] | None = None) -> str | None:
    """The stop string a server stripped from ``text``: the close of the last action tag left open."""
    best: tuple[int, str] | None = None
    for stop in stop_strings:
        opener = (open_tags or {}).get(stop) or open_tag_for(stop)
        if not opener:
            continue
        start = text.rfind(opener)
        if start >= 0 and stop not in text[start:] and (best is None or start > best[0]):
            best = (start, stop)
    return best[1] if best else None


class OpenAICompletionsPolicy:
    """The Policy protocol over ``POST {base_url}/completions``; see the module docstring."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, sampling: SamplingParams | None = None, *,
                 api_key: str | None = None, api_key_env: str | None = None, concurrency: int = 8,
                 timeout_s: float = 300.0, retries: int = 2, extra_body: Mapping[str, Any] | None = None,
                 open_tags: Mapping[str, str] | None = None, check: bool = True):
        from openai import OpenAI

        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.base_url, self.model, self.tokenizer = base_url, model, tokenizer
        self.sampling = sampling or SamplingParams()
        self.concurrency = concurrency
        self.extra_body = dict(extra_body or {})
        self.open_tags = dict(open_tags or {})
        key = api_key if api_key is not None else api_key_from_env(api_key_env)
        if check:
            check_endpoint(base_url, key, model=model, what="policy endpoint")
        self._client = OpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=retries)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="completions")
        self.requests = 0
        self.max_in_flight = 0  # the most requests seen in flight at once
        self._in_flight = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def generate(self, contexts: Sequence[Sequence[int]], *, stop_strings: Sequence[str],
                 max_new_tokens: int | Sequence[int]) -> list[Generation]:
        budgets = per_sequence_budgets(max_new_tokens, len(contexts))
        futures = [self._pool.submit(self._one, list(c), list(stop_strings), b)
                   for c, b in zip(contexts, budgets, strict=True)]
        return [f.result() for f in futures]

    # ------------------------------------------------------------------------------------------ one call

    def _request(self, prompt: str | list[int], stop: list[str], budget: int) -> Any:
        import openai

        s = self.sampling
        body: dict[str, Any] = dict(self.extra_body)
        if s.top_k:
            body.setdefault("top_k", s.top_k)
        if s.repetition_penalty != 1.0:
            body.setdefault("repetition_penalty", s.repetition_penalty)
        kwargs: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": budget,
                                  "temperature": s.temperature if s.do_sample else 0.0, "top_p": s.top_p}
        if stop:
            kwargs["stop"] = stop
        if body:
            kwargs["extra_body"] = body
        try:
            return self._client.completions.create(**kwargs)
        except openai.APIConnectionError as exc:
            raise EndpointError(f"the policy endpoint at {self.base_url} failed ({type(exc).__name__}: "
                                f"{exc})") from None
        except openai.APIStatusError as exc:
            raise EndpointError(f"the policy endpoint at {self.base_url} answered HTTP {exc.status_code}: "
                                f"{str(exc)[:300]}") from None

    def _one(self, context: list[int], stop_strings: list[str], budget: int) -> Generation:
        prompt: str | list[int] = self.tokenizer.decode(context, skip_special_tokens=False)
        control = control_token_ids(self.tokenizer)
        if "<" in prompt and sum(i in control for i in self.tokenizer(prompt, add_special_tokens=False)[
                "input_ids"]) != sum(i in control for i in context):
            prompt = list(context)  # as text, a control token's text in a passage would become the token itself
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            resp = self._request(prompt, stop_strings, budget)
        finally:
            with self._lock:
                self._in_flight -= 1
                self.requests += 1
        if not getattr(resp, "choices", None):
            raise EndpointError(f"the policy endpoint at {self.base_url} returned no choices")
        choice = resp.choices[0]
        return self.to_generation(choice.text or "", choice.finish_reason,
                                  _extra(choice, "stop_reason", "matched_stop"), stop_strings, budget)

    def to_generation(self, text: str, finish_reason: str | None, matched: Any, stop_strings: Sequence[str],
                      budget: int) -> Generation:
        """Map one completion to a Generation. ``matched`` is the server's report of the stop that matched
        (a stop string; ``None``: EOS; an int: a stop token, treated as EOS) or :data:`UNREPORTED` when the
        server does not say, in which case an action tag left open tells which stop was stripped."""
        stop: str | None = None
        if finish_reason == "stop" or (isinstance(matched, str) and matched in stop_strings):
            if isinstance(matched, str) and matched in stop_strings:
                stop = matched
            else:
                stop = next((s for s in stop_strings if text.endswith(s)), None)  # a server told to keep it
                if stop is None and (matched is UNREPORTED or isinstance(matched, str)):
                    stop = infer_stop(text, stop_strings, self.open_tags)
        if stop is not None and not text.endswith(stop):
            text += stop
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        if stop is not None:
            return Generation(ids, None, stop)
        if finish_reason == "stop":
            eos = self.tokenizer.eos_token_id
            return Generation(ids + ([eos] if eos is not None else []), None, STOP_EOS)
        if finish_reason not in ("length", None):
            log.warning("unexpected finish_reason %r from %s: treated as length", finish_reason, self.base_url)
        return Generation(ids[:budget], None, STOP_LENGTH)


UNREPORTED = object()  # the server did not report which stop matched


def _extra(choice: Any, *names: str) -> Any:
    """A non-standard field of a choice (vLLM's ``stop_reason``, SGLang's ``matched_stop``) when the server
    sent one (its value may be None: EOS), else :data:`UNREPORTED`."""
    extra = getattr(choice, "model_extra", None) or {}
    for name in names:
        if name in extra:
            return extra[name]
        if name in getattr(choice, "__dict__", {}):
            return getattr(choice, name)
    return UNREPORTED
