"""Forcing a real model to write scripted turns (tests, benchmarks, demos of the service).

A random-init model never writes a search tag by itself. :class:`ScriptedTurns` is a logits processor for
:class:`~agentic_rag.rollout.HFPolicy`: for each row's n-th turn it asks ``script(context_text, n)`` for the
text to write, and forces its tokens one by one, then end-of-sequence. The model still runs its forward
pass for every token, the decoder, stops, searches and streaming are all real; only the choice of token
is made for it. ``script`` returning None leaves the turn to the model. ``step_delay_s`` slows every
decoding step (to hold a batch busy in tests of the queue and of disconnects).

The turn count lives on the decoder's row object, so it starts again for every new engine run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

Script = Callable[[str, int], str | None]


class ScriptedTurns:
    def __init__(self, tokenizer: Any, script: Script, *, eos_id: int | None = None, step_delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.script = script
        self.eos_id = tokenizer.eos_token_id if eos_id is None else eos_id
        self.step_delay_s = step_delay_s

    def _plan(self, row: Any) -> list[int] | None:
        state = getattr(row, "_scripted", None)
        if state is None or state[0] != row.turn_start:
            turn = 0 if state is None else state[1] + 1
            text = self.script(self.tokenizer.decode(row.context[:row.turn_start]), turn)
            ids = None if text is None else self.tokenizer(text, add_special_tokens=False)["input_ids"]
            state = (row.turn_start, turn, ids)
            row._scripted = state
        return state[2]

    def __call__(self, scores: torch.Tensor, rows: list[Any]) -> torch.Tensor:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        for j, row in enumerate(rows):
            plan = self._plan(row)
            if plan is None:
                continue
            step = len(row.generated)
            token = plan[step] if step < len(plan) else self.eos_id
            scores[j].fill_(float("-inf"))
            scores[j, token] = 0.0
        return scores


def keyed_script(scripts: dict[str, list[str]]) -> Script:
    """A script from ``{key: [turn texts]}``: the longest key found in the context picks the turns."""

    def script(context: str, turn: int) -> str | None:
        keys = [k for k in scripts if k in context]
        if not keys:
            return None
        turns = scripts[max(keys, key=len)]
        return turns[turn] if turn < len(turns) else None

    return script
