"""The format reward: is a trajectory well-formed? Not tag counting.

A trajectory is checked on what the *model* wrote (observations are the environment's) and on its events.
Each rule either holds or names what broke it:

1. ``balanced``: the dialect's tags open and close in a properly nested order; none is left open; no
   close tag without its open tag.
2. ``one_answer``: exactly one answer block, and it is not empty.
3. ``no_forged_tags``: the model never wrote an environment tag (``<observation>``, ``<information>``,
   ``<|begin_of_documents|>``, ...).
4. ``searches_in_bounds``: every search had a query, no search went past ``max_searches`` (the engine refuses
   it with a notice, a ``limit`` event, under ``on_search_limit="observe"``; a trajectory that then answers
   well is still out of bounds), no other tool went past its ``max_calls``, every tool call could be read (no
   ``malformed_call``: bad JSON, an unknown tool, wrong arguments), and the trajectory did not end on a search, turn
   or token limit.
5. ``nothing_after_answer``: only whitespace (and the end-of-sequence token) follows the answer.
6. ``memory_used_correctly``: a backtrack follows a search step and says why; a summary follows at least
   one observation and is not empty. Writing ``<backtrack></backtrack>`` earns nothing: memory actions are
   never rewarded by themselves, only their misuse costs.

``score`` is 1.0 when every rule holds; with ``partial=True`` it is the fraction of rules that hold.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..rollout.protocol import Dialect

RULES = ("balanced", "one_answer", "no_forged_tags", "searches_in_bounds", "nothing_after_answer",
         "memory_used_correctly")
LIMIT_ENDINGS = ("max_searches", "max_turns", "turn_token_limit", "max_completion_tokens")


@dataclass
class FormatReport:
    violations: dict[str, str] = field(default_factory=dict)  # rule -> what broke it

    @property
    def ok(self) -> bool:
        return not self.violations

    def score(self, partial: bool = False) -> float:
        if not partial:
            return 1.0 if self.ok else 0.0
        return 1.0 - len(self.violations) / len(RULES)


def _pairs(dialect: Dialect) -> list[tuple[str, str]]:
    pairs = [(t.open, t.close) for t in dialect.tool_tags] + [(dialect.answer_open, dialect.answer_close)]
    pairs += list(dialect.content_tags)
    for pair in (dialect.backtrack, dialect.summary):
        if pair:
            pairs.append(pair)
    return list(dict.fromkeys(pairs))


def open_at_prompt_end(prompt_text: str, dialect: Dialect) -> list[str]:
    """Tags the prompt leaves open for the model (a template that ends with ``<think>``, say)."""
    tail = prompt_text.rstrip()
    return [o for o, _ in _pairs(dialect) if tail.endswith(o)][:1]


def check_format(model_text: str, events: Sequence[dict[str, Any]], finish_reason: str, dialect: Dialect,
                 *, eos_tokens: Sequence[str] = (), open_at_start: Sequence[str] = ()) -> FormatReport:
    """Check one trajectory. ``model_text`` is the concatenation of the model's own turns (no observations);
    ``open_at_start`` lists tags the prompt already opened (R1-Searcher's prompt ends with ``<think>``)."""
    report = FormatReport()
    text = model_text
    for eos in eos_tokens:
        text = text.replace(eos, "")
    pairs = _pairs(dialect)
    opens = {o: c for o, c in pairs}
    closes = {c: o for o, c in pairs}
    pattern = re.compile("|".join(re.escape(t) for t in sorted(list(opens) + list(closes), key=len, reverse=True)))
    stack: list[str] = list(open_at_start)
    for m in pattern.finditer(text):
        tag = m.group(0)
        if tag in opens:
            if tag in stack:
                report.violations["balanced"] = f"{tag} opened inside itself"
                break
            stack.append(tag)
        else:
            expected = closes[tag]
            if not stack or stack[-1] != expected:
                report.violations["balanced"] = f"{tag} closes {stack[-1] if stack else 'nothing'}"
                break
            stack.pop()
    if stack and "balanced" not in report.violations:
        report.violations["balanced"] = f"{stack[-1]} is never closed"

    n_open = text.count(dialect.answer_open)
    n_close = text.count(dialect.answer_close)
    if n_open != 1 or n_close != 1:
        report.violations["one_answer"] = f"{min(n_open, n_close)} answer blocks"
    else:
        start = text.index(dialect.answer_open) + len(dialect.answer_open)
        end = text.index(dialect.answer_close)
        if end < start or not text[start:end].strip():
            report.violations["one_answer"] = "the answer is empty"
        elif text[end + len(dialect.answer_close):].strip():
            report.violations["nothing_after_answer"] = "text after the answer"

    forged = [e.get("tag", "") for e in events if e.get("type") == "forged_tag"]
    forged += [t for t in dialect.environment_tags if t in text and t not in forged]
    if forged:
        report.violations["no_forged_tags"] = f"wrote {forged[0]}"

    if finish_reason in LIMIT_ENDINGS:
        report.violations["searches_in_bounds"] = f"ended on the {finish_reason} limit"
    elif any(e.get("type") == "limit" and e.get("name") == "max_searches" for e in events):
        report.violations["searches_in_bounds"] = "searched past max_searches"
    elif any(e.get("type") == "limit" and e.get("name") == "max_calls" for e in events):
        report.violations["searches_in_bounds"] = "called a tool past its max_calls"
    elif any(e.get("type") == "error" and e.get("kind") == "empty_query" for e in events):
        report.violations["searches_in_bounds"] = "a search without a query"
    elif any(e.get("type") == "error" and e.get("kind") == "malformed_call" for e in events):
        report.violations["searches_in_bounds"] = "a malformed tool call"

    searched = False
    observed = False
    for e in events:
        kind = e.get("type")
        if kind == "search":
            searched = True
        elif kind == "observation" and e.get("tokens", 0) > 0:
            observed = True
        elif kind == "backtrack" and (not searched or not str(e.get("reason", "")).strip()):
            report.violations["memory_used_correctly"] = "backtrack without a reason or a search step"
        elif kind == "error" and e.get("kind") == "nothing_to_backtrack":
            report.violations["memory_used_correctly"] = "backtrack with no search step to abandon"
        elif kind == "summary" and (not observed or not str(e.get("text", "")).strip()):
            report.violations["memory_used_correctly"] = "empty summary, or a summary of nothing"
    return report
