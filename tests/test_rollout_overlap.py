"""The continuous (HFPolicy session) path: searches overlap decoding deterministically, and a searching row
resumes while another row is still in a long turn. A real tiny model over the real Qwen tokenizer."""

from __future__ import annotations

import time

import torch

from agentic_rag.rollout import AgentRollout, HFPolicy, RolloutHooks, RolloutSettings, SamplingParams
from test_rollout import FakeSearcher, ForcedHFPolicy, prompts


class TimedSearcher(FakeSearcher):
    """Records when each batch call starts and ends."""

    def __init__(self, delay: float):
        super().__init__(delay=delay)
        self.windows: list[tuple[float, float]] = []

    def batch_search(self, queries, k=10):
        start = time.monotonic()
        out = super().batch_search(queries, k)
        self.windows.append((start, time.monotonic()))
        return out


class PartlyForced(HFPolicy):
    """Rows whose context holds a script key write that script; every other row samples freely."""

    def __init__(self, model, tok, scripts, sampling):
        self.scripts = {k: [tok(x, add_special_tokens=False)["input_ids"] for x in v] for k, v in scripts.items()}
        super().__init__(model, tok, sampling, processors=[self._force])

    def _plan(self, row):
        state = getattr(row, "_plan", None)
        if state is None or state[0] != row.turn_start:
            text = self.tokenizer.decode(row.context[:row.turn_start])
            keys = [k for k in self.scripts if k in text]
            n = 0 if state is None else state[1] + 1
            plan = None if not keys else (self.scripts[keys[0]] + [[]])[min(n, len(self.scripts[keys[0]]))]
            state = row._plan = (row.turn_start, n, plan)
        return state[2]

    def _force(self, scores, rows):
        for j, row in enumerate(rows):
            plan = self._plan(row)
            if plan is None:
                continue
            step = len(row.generated)
            scores[j] = float("-inf")
            scores[j, plan[step] if step < len(plan) else self.tokenizer.eos_token_id] = 0.0
        return scores


def test_a_search_overlaps_exactly_one_decode_step_and_runs_are_reproducible(qwen_tokenizer, tiny_qwen):
    """Row 0 searches (the tool sleeps 0.3 s) while row 1 samples a long turn. Row 1 decodes exactly one step
    while the call is in flight, row 0 resumes in the step after, and the trajectories do not depend on the
    tool's timing: the same seed gives the same rollout with a slow and an instant tool."""
    tok = qwen_tokenizer
    search_turn = "<search>slow</search>"
    scripts = {"Searcher?": [search_turn, "<answer>a</answer>"]}
    qs = ["Searcher?", "Talker?"]

    def once(delay: float):
        searcher = TimedSearcher(delay)
        policy = PartlyForced(tiny_qwen, tok, scripts, SamplingParams(do_sample=True))
        tokens: list[tuple[float, int, int]] = []
        hooks = RolloutHooks(on_token=lambda i, token: tokens.append((time.monotonic(), i, token)))
        torch.manual_seed(3)
        with AgentRollout(policy, tok, searcher, settings=RolloutSettings(max_tokens_per_turn=40,
                                                                       passages_per_search=1)) as engine:
            trajs = engine.run(prompts(tok, qs), qs, hooks)
        return trajs, tokens, searcher

    slow, tokens, searcher = once(0.3)
    assert [t.finish_reason for t in slow] == ["answer", "turn_token_limit"]
    assert searcher.calls == [["slow"]] and len(slow[1].completion_ids) == 40
    n_search = len(tok(search_turn, add_special_tokens=False)["input_ids"])
    order = [i for _, i, _ in tokens]
    stop_at = [k for k, i in enumerate(order) if i == 0][n_search - 1]  # row 0's token that closed </search>
    _, tool_end = searcher.windows[0]
    during = [(when, i) for when, i, _ in tokens[stop_at + 1:] if when < tool_end]
    # step t: row 0 stops (row 1 samples in the same step); step t + 1: row 1 alone, while the tool runs;
    # step t + 2: row 0 resumes with its observation, next to row 1
    assert order[stop_at + 1:stop_at + 4] == [1, 1, 0]
    assert [i for _, i in during] == [1, 1], "the other row must keep decoding while the tool call is in flight"
    assert tokens[stop_at + 2][0] < tool_end < tokens[stop_at + 3][0]

    again, _, _ = once(0.3)
    instant, _, _ = once(0.0)
    for other in (again, instant):
        for a, b in zip(slow, other, strict=True):
            assert a.completion_ids == b.completion_ids and a.env_mask == b.env_mask
            assert a.logprobs == b.logprobs and a.events == b.events


def test_a_searching_row_resumes_while_another_is_still_in_a_long_turn(qwen_tokenizer, tiny_qwen):
    """Continuous mode with a real model: two rows that close </search> in the same step share one batch
    call, get their observations and answer, all while a third row is still writing its first turn."""
    tok = qwen_tokenizer
    long_turn = " ".join(f"w{n}" for n in range(25)) + " <answer>z</answer>"
    scripts = {"Quick one?": ["<search>alpha</search>", "<answer>a</answer>"],
               "Quick two?": ["<search>gamma</search>", "<answer>g</answer>"],
               "Slow talker?": [long_turn]}
    policy = ForcedHFPolicy(tiny_qwen, tok, scripts)
    searcher = FakeSearcher()
    log: list[tuple[int, str]] = []
    hooks = RolloutHooks(on_token=lambda i, token: log.append((i, "token")),
                         on_event=lambda i, event: log.append((i, event["type"])))
    trajs = AgentRollout(policy, tok, searcher).run(prompts(tok, list(scripts)), list(scripts), hooks)
    assert [t.finish_reason for t in trajs] == ["answer", "answer", "answer"]
    assert [t.answer for t in trajs] == ["a", "g", "z"]
    assert searcher.calls == [["alpha", "gamma"]]  # one batch call for the rows that stopped in one step
    slow_turn = len(tok(long_turn, add_special_tokens=False)["input_ids"])
    for quick in (0, 1):
        finished = log.index((quick, "finish"))
        written = sum(1 for i, kind in log[:finished] if i == 2 and kind == "token")
        assert 0 < written < slow_turn - 10, f"row {quick} finished after {written} of {slow_turn} slow tokens"
