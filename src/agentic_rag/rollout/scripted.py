"""A scripted policy: plays back written turns as if a model had generated them (tests, demos, benchmarks).

Each script is keyed by a string that appears in the prompt (the question, usually). On its n-th call for
that key, the policy tokenizes turn n of the script and emits the tokens one by one, stopping exactly as a
model would: when the text written so far contains a stop string (the token that completes it is kept,
whatever else it holds), when the budget is spent, or at the end of the turn with an end-of-sequence token.
All contexts of one key in one call advance together, so repeated prompts (GRPO groups) share a script.
"""

from __future__ import annotations

from collections.abc import Sequence

from .policy import STOP_EOS, STOP_LENGTH, Generation, per_sequence_budgets


class ScriptedPolicy:
    def __init__(self, tokenizer, scripts: dict[str, list[str]], *, eos_at_end: bool = True):
        self.tokenizer = tokenizer
        self.scripts = dict(scripts)
        self.eos_at_end = eos_at_end
        self.turn: dict[str, int] = {k: 0 for k in self.scripts}
        self.calls: list[int] = []  # number of contexts in each call

    def _key(self, context_text: str) -> str:
        matches = [k for k in self.scripts if k in context_text]
        if not matches:
            raise KeyError(f"no script for a context ending {context_text[-120:]!r}")
        return max(matches, key=len)

    def generate(self, contexts: Sequence[Sequence[int]], *, stop_strings: Sequence[str],
                 max_new_tokens: int | Sequence[int]) -> list[Generation]:
        budgets = per_sequence_budgets(max_new_tokens, len(contexts))
        self.calls.append(len(contexts))
        keys = [self._key(self.tokenizer.decode(list(c), skip_special_tokens=False)) for c in contexts]
        out = [self._play(key, budget, stop_strings) for key, budget in zip(keys, budgets, strict=True)]
        for key in set(keys):
            self.turn[key] += 1
        return out

    def _play(self, key: str, budget: int, stop_strings: Sequence[str]) -> Generation:
        script = self.scripts[key]
        n = self.turn[key]
        text = script[n] if n < len(script) else ""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        out: list[int] = []
        for token in ids:
            if len(out) == budget:
                return Generation(out, None, STOP_LENGTH)
            out.append(token)
            written = self.tokenizer.decode(out, skip_special_tokens=False)
            stop = next((s for s in stop_strings if s in written), None)
            if stop is not None:
                return Generation(out, None, stop)
        if len(out) == budget:
            return Generation(out, None, STOP_LENGTH)
        if self.eos_at_end:
            out.append(self.tokenizer.eos_token_id)
            return Generation(out, None, STOP_EOS)
        return Generation(out, None, STOP_LENGTH)
