"""Evaluation modes: what the model is given and allowed to do (the rows of Search-R1's Table 2 that are not agents).

* ``agent`` (default): the trained or prompted agent. The prompt is the dialect's (or ``prompt.system_prompt``)
  system prompt and the question as the user message; the model searches as it likes within ``rollout``'s limits.
* ``naive_rag`` (Search-R1's "RAG" baseline): the question itself is the one query, sent once to the searcher
  before the model writes anything; its top ``rollout.passages_per_search`` passages go into the user message
  after the question, laid out by the dialect (:meth:`~agentic_rag.rollout.protocol.Dialect.format_passages`)::

      {question}

      Passages:
      {passage 1}
      {passage 2} ...

  (``参考段落：`` in place of ``Passages:`` with ``prompt.language: zh``; ``No results.`` when the search found
  nothing or failed). The passages get the agent's budget for one observation, ``rollout.max_observation_tokens``,
  cut as an observation is cut (at a word boundary, marked `` ...``): the baseline reads what the agent's first
  search with the question would show it, no more (in full, one long Wikipedia passage padded every prompt of its
  batch: 2Wiki's naive RAG took 3x the prompted agent's time). The model then answers with no search
  action: ``rollout.max_searches`` is treated as 0, so a search it writes anyway is refused as
  ``rollout.on_search_limit`` says (``observe``: a notice that no searches are left, and it may still answer).
* ``direct`` (closed book): the question alone as the user message; no passages and no search (``max_searches`` 0
  as above). No index is opened (``search.index`` may be empty or ``none``).

The system prompt in ``naive_rag`` and ``direct`` is ``prompt.system_prompt`` when set (by you, or recorded by a
trained adapter: the adapter is evaluated as trained), else the mode's own (:data:`MODE_PROMPTS`), which asks for
the answer inside the dialect's answer tags and does not mention searching::

    direct:    Answer the question. You may think inside <think> </think> first. Give the final answer, a short
               phrase, inside <answer> </answer>, and write nothing after it.
    naive_rag: Answer the question using the passages given with it and what you know. You may think inside
               <think> </think> first. Give the final answer, ... (as above)

**Scoring the reply.** ``direct`` and ``naive_rag`` measure the model, not the protocol: a reply with no answer tag is
scored on its answer span (:func:`reply_answer`), as FlashRAG's and Search-R1's baselines score plain replies, and
the record says where its prediction came from (``answer_source``: ``tag``, ``reply`` or none); the summary counts
the replies that wrote the tag (``answer_tag_rate``). In ``agent`` mode only the answer tag counts: the agent's
format failures are its ``well_formed`` rate and its ``answer_tag_rate``, reported beside its answers.

The chat template, the language and every other rollout limit apply as in ``agent`` mode. The query's passages
are recorded with the example (``retrieval``: the query, the docids and titles shown, an error); the retrieval
counts as one search query carried out (or failed) for ``search.max_failure_rate``, though not in
``num_searches`` (the model made none).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from ..rollout.protocol import Dialect
from ..rollout.settings import RolloutSettings

MODES = {
    "agent": "the agent: the dialect's system prompt and the question; it searches as it likes (the default)",
    "naive_rag": "Search-R1's RAG baseline: the question's top rollout.passages_per_search passages (the question "
                 "is the query) after it in the user message; no search action",
    "direct": "closed book: the question alone; no passages, no search",
}

_TAIL = {"en": "You may think inside {think_open} {think_close} first. Give the final answer, a short phrase, inside "
               "{answer_open} {answer_close}, and write nothing after it.",
         "zh": "你可以先在 {think_open} {think_close} 中思考。最终答案用简短的短语写在 {answer_open} "
               "{answer_close} 中，之后不要再写任何内容。"}
MODE_PROMPTS = {
    "direct": {"en": "Answer the question. " + _TAIL["en"], "zh": "回答问题。" + _TAIL["zh"]},
    "naive_rag": {"en": "Answer the question using the passages given with it and what you know. " + _TAIL["en"],
                  "zh": "根据随问题给出的段落和你所知道的回答问题。" + _TAIL["zh"]},
}
PASSAGES_HEADER = {"en": "Passages:", "zh": "参考段落："}
NO_PASSAGES = {"en": "No results.", "zh": "没有结果。"}  # the search found nothing, or failed


def mode_names() -> tuple[str, ...]:
    return tuple(MODES)


def mode_rollout(settings: RolloutSettings, mode: str) -> RolloutSettings:
    """The rollout settings the engine runs ``mode`` with: the same, with ``max_searches`` 0 outside ``agent``."""
    return settings if mode == "agent" else dataclasses.replace(settings, max_searches=0)


def mode_system_prompt(mode: str, dialect: Dialect, language: str, own: str) -> str | None:
    """The system prompt of ``mode``: ``own`` when set; in ``agent`` mode None (the dialect's, as always);
    otherwise the mode's own in ``language`` with the dialect's think and answer tags."""
    if own or mode == "agent":
        return own or None
    return MODE_PROMPTS[mode][language].format(think_open=dialect.think_open, think_close=dialect.think_close,
                                               answer_open=dialect.answer_open, answer_close=dialect.answer_close)


def user_message(question: str, passages_text: str | None, language: str) -> str:
    """The user message: the question, then (``naive_rag``) the passages under a header (``No results.`` when
    the search found none or failed)."""
    if passages_text is None:
        return question
    return f"{question}\n\n{PASSAGES_HEADER[language]}\n{passages_text or NO_PASSAGES[language]}"


def retrieve(searcher: Any, queries: Sequence[str], k: int) -> list[tuple[list[Any], str | None]]:
    """``naive_rag``'s one search per question, in one batch call: each query's top ``k`` hits and its error
    (None when it was answered). A query the backend could not answer gets no passages and its reason; a failed
    batch call, every query the call's reason (counted against ``search.max_failure_rate``, as the agent's are)."""
    from ..search.types import PartialSearchError

    try:
        results = searcher.batch_search(list(queries), k)
        return [(list(hits)[:k], None) for hits in results]
    except PartialSearchError as exc:
        return [(list(hits or [])[:k], err) for hits, err in zip(exc.results, exc.errors, strict=True)]
    except Exception as exc:  # noqa: BLE001 - a failed search is counted, never a crash mid-run
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        return [([], reason) for _ in queries]


# "the answer is X", "Answer: X", "Final answer - X": the span after the last such cue
_CUE = re.compile(r"answer\s*(?:is\s*:?|:|-)\s*", re.IGNORECASE)
_TAG = re.compile(r"<[^<>\s]{1,40}>")


def reply_answer(text: str, dialect: Dialect) -> str | None:
    """The answer span of a reply that wrote no answer tag (``direct`` and ``naive_rag``): the reply before any
    search it attempted (what follows depends on the environment), its think block and tags removed; then the text
    after the last "answer is" / "answer:" cue if there is one, else the first non-empty line; cut at its first
    sentence end and stripped of quotes and trailing punctuation. None for a reply with no words."""
    for tag in dialect.tool_tags:
        text = text.split(tag.open, 1)[0]
    text = re.sub(re.escape(dialect.think_open) + r".*?(?:" + re.escape(dialect.think_close) + r"|$)", " ", text,
                  flags=re.DOTALL)
    text = _TAG.sub(" ", text)
    cues = list(_CUE.finditer(text))
    if cues:
        text = text[cues[-1].end():]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.split(r"(?<=[^A-Z.])[.!?](?:\s|$)", line, maxsplit=1)[0]
    line = line.strip().strip("\"'*`").rstrip(".,;:!? ").strip()
    return line or None

