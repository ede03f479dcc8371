"""Retrieval quality through RAGAS.

Without an LLM (the default; well under a millisecond a sample): RAGAS's ID-based context recall or
precision, with the titles of the passages the trajectory retrieved as the retrieved context ids and the
question's gold titles (``supporting_facts``) as the reference ids; or, when reference passages are known,
RAGAS's non-LLM (string-similarity) context recall over their text.

With a judge endpoint configured: the LLM-judged RAGAS metrics (``context_relevance``, ``faithfulness``,
``context_precision`` without reference), through an ``AsyncOpenAI`` client of any OpenAI-compatible
server, as RAGAS requires. A judge call that fails (an error, a timeout, no parsable verdict, NaN) is
counted in ``failures`` / ``last_failures`` and the sample is scored by the ``fallback`` ID metric
(``id_recall`` unless configured) instead: a failure is never "not applicable".

A score is ``None`` ("not applicable") only when the trajectory retrieved nothing that could be judged: no
gold titles for the ID metrics (a failed LLM call falling back to one included), no contexts for the LLM
metrics.

**What is judged** (:func:`contexts_from_events`): the passages as the model was shown them. Each search
event lists the passages its observation showed, with exactly the text it held (a passage cut by the
observation's budget only up to the cut); every one of them is a context, in the order shown, once each (a
docid or a text seen before is skipped), so every chunk of a chunked article counts, not only its first.
The ID metrics compare titles (the gold ``supporting_facts`` are titles), each title once.

**API key.** The judge's key is read from the environment variable ``api_key_env`` names; when it is unset the
client sends the placeholder ``EMPTY``, which a local server started without a key accepts and a hosted API
refuses (every call then fails and the fallback scores). :meth:`RetrievalQuality.describe` says which scorer
will actually run; the training reward logs it once at start-up.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..endpoints import NO_KEY, api_key_from_env

ID_METRICS = ("id_recall", "id_precision")
NON_LLM = (*ID_METRICS, "text_recall")
LLM = ("context_relevance", "faithfulness", "context_precision")
METRICS = NON_LLM + LLM


@dataclass
class RetrievedContext:
    """What a trajectory retrieved (from its search events) and what the question needed."""

    question: str
    answer: str
    titles: list[str]
    texts: list[str]
    gold_titles: list[str]
    reference_texts: list[str] | None = None


@dataclass
class LLMEndpoint:
    base_url: str
    model: str
    api_key_env: str = "JUDGE_API_KEY"
    timeout_s: float = 30.0


class RetrievalQuality:
    """One RAGAS metric, scored for a batch of trajectories."""

    def __init__(self, metric: str = "id_recall", llm: LLMEndpoint | None = None, max_concurrency: int = 8,
                 fallback: str = "id_recall"):
        if metric not in METRICS:
            raise ValueError(f"unknown RAGAS metric {metric!r}; choose one of {', '.join(METRICS)}")
        if metric in LLM and llm is None:
            raise ValueError(f"the RAGAS metric {metric!r} needs a judge endpoint (judge.base_url)")
        if fallback not in ID_METRICS:
            raise ValueError(f"the RAGAS fallback must be one of {', '.join(ID_METRICS)}, got {fallback!r}")
        self.metric_name = metric
        self._llm = llm if metric in LLM else None
        self.max_concurrency = max_concurrency
        self.failures = 0  # failed LLM calls, all batches
        self.last_failures = 0  # ... in the last batch
        self.fallback = RetrievalQuality(fallback) if metric in LLM else None
        if metric == "id_recall":
            from ragas.metrics import IDBasedContextRecall

            self._metric = IDBasedContextRecall()
        elif metric == "id_precision":
            from ragas.metrics import IDBasedContextPrecision

            self._metric = IDBasedContextPrecision()
        elif metric == "text_recall":
            from ragas.metrics import NonLLMContextRecall

            self._metric = NonLLMContextRecall()
        else:
            self._metric = _llm_metric(metric, llm)

    def describe(self) -> str:
        """Which scorer will run, in one line: the metric and, for an LLM metric, the judge model, its endpoint,
        where its API key comes from (never the key itself) and the fallback."""
        if self.metric_name not in LLM:
            what = "the text of the passages shown against reference passages" if self.metric_name == "text_recall" \
                else "the titles of the passages shown against the gold titles"
            return f"{self.metric_name} (RAGAS, no LLM): {what}"
        llm = self._llm
        assert llm is not None and self.fallback is not None
        if os.environ.get(llm.api_key_env):
            key = f"API key from {llm.api_key_env}"
        else:
            key = (f"no API key: {llm.api_key_env} is unset, so the placeholder key '{NO_KEY}' is sent, which only "
                   f"a server started without a key accepts (a hosted API refuses every call)")
        return (f"{self.metric_name} judged by {llm.model} at {llm.base_url} ({key}); a failed call is scored by "
                f"{self.fallback.metric_name}")

    def score_batch(self, items: Sequence[RetrievedContext]) -> list[float | None]:
        if self.metric_name not in LLM:
            return [self._non_llm(item) for item in items]
        scores = asyncio.run(self._llm_batch(items))
        failed = [i for i, s in enumerate(scores) if s is _FAILED]
        self.last_failures = len(failed)
        self.failures += len(failed)
        assert self.fallback is not None
        out: list[float | None] = list(scores)  # type: ignore[arg-type]
        for i in failed:
            out[i] = self.fallback._non_llm(items[i])
        return out

    def _non_llm(self, item: RetrievedContext) -> float | None:
        from ragas.dataset_schema import SingleTurnSample

        if self.metric_name == "text_recall":
            if not item.reference_texts:
                return None
            sample = SingleTurnSample(retrieved_contexts=item.texts or [""],
                                      reference_contexts=item.reference_texts)
        else:
            if not item.gold_titles:
                return None
            if not item.titles:
                return 0.0
            sample = SingleTurnSample(retrieved_context_ids=item.titles, reference_context_ids=item.gold_titles)
        return float(self._metric.single_turn_score(sample))

    async def _llm_batch(self, items: Sequence[RetrievedContext]) -> list[float | object | None]:
        """Each item's score, ``None`` when it has no contexts, ``_FAILED`` when the judge gave none."""
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(item: RetrievedContext) -> float | object | None:
            if not item.texts:
                return None
            async with gate:
                try:
                    if self.metric_name == "context_relevance":
                        result = await self._metric.ascore(user_input=item.question, retrieved_contexts=item.texts)
                    else:
                        result = await self._metric.ascore(user_input=item.question, response=item.answer or "",
                                                           retrieved_contexts=item.texts)
                    value = None if result.value is None else float(result.value)
                except Exception:  # noqa: BLE001 - a failed judge call is counted and falls back, never a crash
                    value = None
                if value is None or math.isnan(value):  # RAGAS reports some failures as NaN
                    return _FAILED
                return value

        return list(await asyncio.gather(*(one(i) for i in items)))


_FAILED = object()  # an LLM metric's judge gave no score


def _llm_metric(metric: str, llm: LLMEndpoint):
    from openai import AsyncOpenAI
    from ragas.llms import llm_factory
    from ragas.metrics.collections import ContextPrecisionWithoutReference, ContextRelevance, Faithfulness

    client = AsyncOpenAI(base_url=llm.base_url, api_key=api_key_from_env(llm.api_key_env),
                         timeout=llm.timeout_s, max_retries=2)
    judge = llm_factory(llm.model, client=client)
    cls = {"context_relevance": ContextRelevance, "faithfulness": Faithfulness,
           "context_precision": ContextPrecisionWithoutReference}[metric]
    return cls(llm=judge)


def contexts_from_events(events: Sequence[dict], question: str, answer: str | None,
                         gold_titles: Sequence[str]) -> RetrievedContext:
    """What a trajectory's observations showed, from its search events: ``texts``, each passage's text as
    shown, in order, once per docid and once per text; ``titles``, their titles, once each."""
    titles: list[str] = []
    texts: list[str] = []
    seen_ids: set[str] = set()
    seen_texts: set[str] = set()
    for e in events:
        if e.get("type") != "search":
            continue
        for result in e.get("results", []):
            for hit in result.get("hits", []):
                title, text, docid = hit.get("title", ""), hit.get("text", ""), str(hit.get("docid") or "")
                if title and title not in titles:
                    titles.append(title)
                if not text.strip() or (docid and docid in seen_ids) or text in seen_texts:
                    continue
                seen_ids.add(docid)
                seen_texts.add(text)
                texts.append(text)
    return RetrievedContext(question=question, answer=answer or "", titles=titles, texts=texts,
                            gold_titles=list(gold_titles))
