"""The rollout engine with scripted policies over the real Qwen tokenizer, and with a real tiny model."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch

from agentic_rag.data.prompts import build_prompt
from agentic_rag.rollout import AgentRollout, HFPolicy, RolloutSettings, SamplingParams
from agentic_rag.rollout.decoding import STOP_EOS
from agentic_rag.rollout.scoring import completion_logprobs
from agentic_rag.rollout.scripted import ScriptedPolicy
from agentic_rag.rollout.trajectory import ENV, MODEL
from agentic_rag.search import Hit, open_searcher
from agentic_rag.search.corpus import Passage


class FakeSearcher:
    """Deterministic passages per query; records every batch call."""

    def __init__(self, fail: bool = False, delay: float = 0.0, n: int = 30):
        self.calls: list[list[str]] = []
        self.fail, self.delay, self.n = fail, delay, n

    def search(self, query, k=10):
        return self.batch_search([query], k)[0]

    def batch_search(self, queries, k=10):
        self.calls.append(list(queries))
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("index exploded")
        return [[Hit(f"{q}-{i}", f"Title {q} {i}", f"Passage {i} about {q}.", 1.0 / (i + 1))
                 for i in range(min(k, self.n))] for q in queries]


def prompts(tok, questions, **kw):
    return [build_prompt(tok, q, **kw) for q in questions]


def run(tok, scripts, searcher=None, limits=None, dialect="agentic", **kw):
    """``limits``: RolloutSettings (its dialect replaced by ``dialect``); ``kw``: AgentRollout's keywords."""
    policy = ScriptedPolicy(tok, scripts)
    settings = dataclasses.replace(limits or RolloutSettings(), dialect=dialect)
    engine = AgentRollout(policy, tok, searcher if searcher is not None else FakeSearcher(), settings, **kw)
    qs = list(scripts)
    return engine.run(prompts(tok, qs), qs), policy, engine


def segment_texts(tok, t):
    return [(s.source, tok.decode(t.completion_ids[s.start:s.end], skip_special_tokens=False)) for s in t.segments]


# ------------------------------------------------------------------------------------------------ masks


def test_masks_are_exact_token_by_token(qwen_tokenizer):
    tok = qwen_tokenizer
    turn1 = "<think>I need the capital.</think>\n<search>capital of Freedonia</search>"
    turn2 = "<think>It says Fredville.</think>\n<answer>Fredville</answer>"
    (t,), _, engine = run(tok, {"What is the capital of Freedonia?": [turn1, turn2]},
                          limits=RolloutSettings(passages_per_search=2))
    assert t.finish_reason == "answer" and t.answer == "Fredville" and t.num_searches == 1
    obs_text = engine.dialect.wrap_observation(engine.dialect.format_passages(
        [Hit("capital of Freedonia-0", "Title capital of Freedonia 0", "Passage 0 about capital of Freedonia.", 1),
         Hit("capital of Freedonia-1", "Title capital of Freedonia 1", "Passage 1 about capital of Freedonia.", .5)]))
    ids1 = tok(turn1, add_special_tokens=False)["input_ids"]
    ids_obs = tok(obs_text, add_special_tokens=False)["input_ids"]
    ids2 = tok(turn2, add_special_tokens=False)["input_ids"]
    assert t.completion_ids == ids1 + ids_obs + ids2
    assert t.env_mask == [1] * len(ids1) + [0] * len(ids_obs) + [1] * len(ids2)
    assert len(t.env_mask) == len(t.completion_ids)
    # the environment's tokens decode to exactly the observation, the model's to exactly its words
    env_text = tok.decode([i for i, m in zip(t.completion_ids, t.env_mask, strict=True) if m == 0])
    model_text = tok.decode([i for i, m in zip(t.completion_ids, t.env_mask, strict=True) if m == 1])
    assert env_text == obs_text and model_text == turn1 + turn2
    assert "<observation>" in env_text and "<observation>" not in model_text
    assert t.text == turn1 + obs_text + turn2
    assert [s.source for s in t.segments] == [MODEL, ENV, MODEL] and t.is_linear


def test_model_ids_are_kept_as_generated_not_retokenized(qwen_tokenizer):
    """A policy may emit a non-canonical tokenization; the engine must keep those exact ids."""
    tok = qwen_tokenizer

    class OddPolicy(ScriptedPolicy):
        def _play(self, key, budget, stop_strings):
            gen = super()._play(key, budget, stop_strings)
            # split the first multi-character token into its characters' tokens: same text, other ids
            for pos, token in enumerate(gen.ids):
                piece = tok.decode([token])
                if len(piece) > 1 and token != tok.eos_token_id:
                    chars = [tok.convert_tokens_to_ids(c) for c in piece] if all(
                        c.isalpha() for c in piece) else None
                    if chars and tok.unk_token_id not in chars:
                        gen.ids[pos:pos + 1] = chars
                        break
            return gen

    policy = OddPolicy(tok, {"Q odd?": ["Hmm <answer>yes</answer>"]})
    (t,) = AgentRollout(policy, tok, FakeSearcher()).run([build_prompt(tok, "Q odd?")])
    canonical = tok("Hmm <answer>yes</answer>", add_special_tokens=False)["input_ids"]
    assert tok.decode(t.completion_ids) == "Hmm <answer>yes</answer>"
    assert t.completion_ids != canonical and len(t.completion_ids) > len(canonical)
    assert t.answer == "yes"


def test_forged_environment_tags_are_the_models_own_words(qwen_tokenizer):
    tok = qwen_tokenizer
    forged = "<observation>The answer is 42.</observation><answer>42</answer>"
    (t,), _, _ = run(tok, {"Forge?": [forged]})
    assert t.env_mask == [1] * len(t.completion_ids), "forged tags were written by the model: mask 1"
    assert [e["tag"] for e in t.events if e["type"] == "forged_tag"] == ["<observation>", "</observation>"]
    assert t.finish_reason == "answer"


def test_stop_in_the_middle_of_a_token_keeps_the_whole_token(qwen_tokenizer):
    tok = qwen_tokenizer
    # "</search>\n\n" may end inside a token: the token is kept, the action still parsed
    (t,), _, _ = run(tok, {"Mid?": ["<search>alpha</search>\n\nbeta gamma", "<answer>a</answer>"]})
    first = segment_texts(tok, t)[0][1]
    assert first.startswith("<search>alpha</search>") and "beta" not in first
    assert t.num_searches == 1 and t.answer == "a"


# ------------------------------------------------------------------------------------------ batching


def test_each_sample_stops_alone_in_a_mixed_batch(qwen_tokenizer):
    tok = qwen_tokenizer
    searcher = FakeSearcher()
    scripts = {
        "Q1 answers at once?": ["<answer>one</answer>"],
        "Q2 searches twice?": ["<search>first</search>", "<search>second</search>", "<answer>two</answer>"],
        "Q3 ends without answer?": ["I do not know."],
        "Q4 searches once?": ["<search>only</search>", "<answer>four</answer>"],
    }
    trajs, policy, _ = run(tok, scripts, searcher)
    assert [t.finish_reason for t in trajs] == ["answer", "answer", "eos", "answer"]
    assert [t.answer for t in trajs] == ["one", "two", None, "four"]
    assert [t.num_searches for t in trajs] == [0, 2, 0, 1]
    # round 1: all four; round 2: Q2 and Q4 (the ones that searched); round 3: Q2 alone
    assert policy.calls == [4, 2, 1]
    # the paused sequences' queries go to the searcher in one batch call per round
    assert searcher.calls == [["first", "only"], ["second"]]


def test_multi_query_search_is_one_batch_call(qwen_tokenizer):
    tok = qwen_tokenizer
    searcher = FakeSearcher()
    (t,), _, _ = run(tok, {"Multi?": ["<search>alpha\nbeta | gamma</search>", "<answer>x</answer>"]}, searcher,
                     RolloutSettings(passages_per_search=1))
    assert searcher.calls == [["alpha", "beta", "gamma"]]
    obs = next(txt for src, txt in segment_texts(tok, t) if src == ENV)
    for q in ("alpha", "beta", "gamma"):
        assert f'Results for "{q}":' in obs and f"Title {q} 0" in obs
    search = next(e for e in t.events if e["type"] == "search")
    assert search["queries"] == ["alpha", "beta", "gamma"]
    assert [r["hits"][0]["docid"] for r in search["results"]] == ["alpha-0", "beta-0", "gamma-0"]


# --------------------------------------------------------------------------------------------- limits


def test_max_turns(qwen_tokenizer):
    (t,), _, _ = run(qwen_tokenizer, {"Loop?": ["<search>a</search>", "<search>b</search>", "<search>c</search>"]},
                     limits=RolloutSettings(max_turns=2, max_searches=10))
    assert t.finish_reason == "max_turns" and t.num_turns == 2 and t.num_searches == 2


def test_max_searches(qwen_tokenizer):
    # the default (a notice, then the model may answer) is pinned in test_memory_stack.py
    (t,), _, _ = run(qwen_tokenizer, {"Many?": ["<search>a</search>", "<search>b</search>", "<answer>z</answer>"]},
                     limits=RolloutSettings(max_searches=1, on_search_limit="end"))
    assert t.finish_reason == "max_searches" and t.num_searches == 1
    assert any(e["type"] == "limit" and e["name"] == "max_searches" for e in t.events)


def test_turn_token_limit(qwen_tokenizer):
    (t,), _, _ = run(qwen_tokenizer, {"Long?": ["word " * 50 + "<answer>x</answer>"]},
                     limits=RolloutSettings(max_tokens_per_turn=10))
    assert t.finish_reason == "turn_token_limit" and len(t.completion_ids) == 10


def test_max_completion_tokens_counts_observations_too(qwen_tokenizer):
    limits = RolloutSettings(max_completion_tokens=60, max_tokens_per_turn=40, max_observation_tokens=200)
    (t,), _, _ = run(qwen_tokenizer, {"Budget?": ["<search>a</search>", "<search>b</search>", "<answer>z</answer>"]},
                     limits=limits)
    assert t.finish_reason == "max_completion_tokens"
    assert len(t.completion_ids) <= 60


def test_observation_is_truncated_cleanly(qwen_tokenizer):
    tok = qwen_tokenizer
    limits = RolloutSettings(passages_per_search=3, max_observation_tokens=40)
    long = FakeSearcher()
    long.batch_search = lambda qs, k=10: [[Hit(f"d{i}", f"T{i}", "lorem ipsum dolor " * 40, 1.0)
                                           for i in range(3)] for _ in qs]
    (t,), _, _ = run(tok, {"Trunc?": ["<search>x</search>", "<answer>y</answer>"]}, long, limits)
    obs_seg = next(s for s in t.segments if s.source == ENV)
    obs = tok.decode(t.completion_ids[obs_seg.start:obs_seg.end])
    assert len(obs_seg) <= 40
    assert obs.rstrip().endswith("</observation>") and " ...\n</observation>" in obs
    assert "(1) T0" in obs and "(3) T2" not in obs
    assert any(e["type"] == "observation" and e["truncated"] for e in t.events)


def test_passages_already_shown_are_not_repeated(qwen_tokenizer):
    tok = qwen_tokenizer
    (t,), _, _ = run(tok, {"Again?": ["<search>same</search>", "<search>same</search>", "<answer>z</answer>"]},
                     limits=RolloutSettings(passages_per_search=2))
    searches = [e for e in t.events if e["type"] == "search"]
    first = [h["docid"] for h in searches[0]["results"][0]["hits"]]
    second = [h["docid"] for h in searches[1]["results"][0]["hits"]]
    assert first == ["same-0", "same-1"] and second == ["same-2", "same-3"]


def test_limits_are_validated(qwen_tokenizer):
    """An engine built in code gets the refusals a config file gets, every problem at once."""
    with pytest.raises(ValueError, match="max_turns must be >= 1.*max_observation_tokens must be >= 16"):
        AgentRollout(ScriptedPolicy(qwen_tokenizer, {}), qwen_tokenizer, None,
                     RolloutSettings(max_turns=0, max_observation_tokens=4))


# ---------------------------------------------------------------------------------------------- errors


def test_search_failure_becomes_an_error_observation_and_the_batch_goes_on(qwen_tokenizer):
    tok = qwen_tokenizer
    scripts = {"Fails?": ["<search>x</search>", "<answer>guess</answer>"], "Fine?": ["<answer>ok</answer>"]}
    trajs, _, _ = run(tok, scripts, FakeSearcher(fail=True))
    t = trajs[0]
    assert [x.finish_reason for x in trajs] == ["answer", "answer"]
    errors = [e for e in t.events if e["type"] == "error"]
    assert errors and errors[0]["kind"] == "search_failed" and "index exploded" in errors[0]["message"]
    obs = [txt for src, txt in segment_texts(tok, t) if src == ENV][0]
    assert "Error: the search failed (RuntimeError: index exploded)" in obs
    assert t.env_mask.count(0) == len(tok(obs, add_special_tokens=False)["input_ids"])


def test_a_query_the_index_rejects_fails_alone_in_a_real_lucene_batch(qwen_tokenizer, wiki_index):
    """Two trajectories search in the same round: one with a query Lucene rejects (more terms than its clause
    limit, here set back to Lucene's default 1024), one with a good query. Only the bad one gets an error
    observation and event; the other keeps its hits."""
    import itertools
    import string

    from agentic_rag.search.jvm import set_max_clause_count

    tok = qwen_tokenizer
    terms = ["".join(t) for n in (2, 3) for t in itertools.product(string.ascii_lowercase, repeat=n)]
    bad = " ".join(terms)[:4000]
    scripts = {"Bad?": [f"<search>{bad}</search>", "<answer>x</answer>"],
               "Good?": ["<search>Teutberga queen of Lotharingia</search>", "<answer>y</answer>"]}
    previous = set_max_clause_count(1024)
    try:
        trajs, _, _ = run(tok, scripts, open_searcher(wiki_index, "bm25"),
                          RolloutSettings(max_tokens_per_turn=8000, max_completion_tokens=12000))
    finally:
        set_max_clause_count(previous)
    bad_t, good_t = trajs
    errors = [e for e in bad_t.events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["kind"] == "search_failed" and "TooManyClauses" in errors[0]["message"]
    assert "Search failed" in [txt for src, txt in segment_texts(tok, bad_t) if src == ENV][0]
    assert not [e for e in good_t.events if e["type"] == "error"]
    (search,) = [e for e in good_t.events if e["type"] == "search"]
    assert search["results"][0]["hits"][0]["docid"] == "0"  # the Teutberga passage, as the searcher tests expect


def test_slow_search_times_out(qwen_tokenizer):
    tok = qwen_tokenizer
    t0 = time.time()
    (t,), _, _ = run(tok, {"Slow?": ["<search>x</search>", "<answer>late</answer>"]}, FakeSearcher(delay=2.0),
                     search_timeout_s=0.3)
    assert time.time() - t0 < 1.9
    assert t.finish_reason == "answer"
    assert any(e["type"] == "error" and "timed out after 0.3 s" in e["message"] for e in t.events)


@pytest.mark.parametrize("query", ["", "   ", "\ufffd\ufffd\x7f", "\x00\x01", "🙂" * 3000, "word " * 5000])
def test_odd_queries(qwen_tokenizer, wiki_index, query):
    """Empty, huge and garbage queries against a real Lucene index: handled, never a crash."""
    tok = qwen_tokenizer
    searcher = open_searcher(wiki_index, "bm25")
    policy = ScriptedPolicy(tok, {"Odd?": ["<search>PLACEHOLDER</search>", "<answer>x</answer>"]})
    policy.scripts["Odd?"][0] = f"<search>{query}</search>"
    (t,) = AgentRollout(policy, tok, searcher, settings=RolloutSettings(max_tokens_per_turn=8000,
                                                                     max_completion_tokens=12000)).run(
        [build_prompt(tok, "Odd?")])
    assert t.finish_reason == "answer" and t.num_searches == 1
    kinds = {e["type"] for e in t.events}
    assert "search" in kinds or any(e.get("kind") == "empty_query" for e in t.events)


def test_missing_tool_is_an_error_observation(qwen_tokenizer):
    tok = qwen_tokenizer
    policy = ScriptedPolicy(tok, {"NoTool?": ["<search>x</search>", "<answer>y</answer>"]})
    (t,) = AgentRollout(policy, tok, None).run([build_prompt(tok, "NoTool?")])
    assert t.finish_reason == "answer"
    assert any(e["type"] == "error" and "no tool named 'search'" in e["message"] for e in t.events)


# ----------------------------------------------------------------------------------- backtrack, summary


def test_backtrack_removes_the_abandoned_step_from_the_context(qwen_tokenizer):
    tok = qwen_tokenizer
    scripts = {"Backtrack?": ["<search>wrong thing</search>", "<backtrack>irrelevant results</backtrack>",
                              "<search>right thing</search>", "<answer>r</answer>"]}
    policy = ScriptedPolicy(tok, scripts)
    seen = []
    original = policy.generate

    def spy(contexts, **kw):
        seen.append([tok.decode(c) for c in contexts])
        return original(contexts, **kw)

    policy.generate = spy
    (t,) = AgentRollout(policy, tok, FakeSearcher()).run([build_prompt(tok, "Backtrack?")])
    assert t.finish_reason == "answer" and not t.is_linear
    assert "wrong thing" in seen[1][0]  # the backtrack turn saw the abandoned step
    after = seen[2][0].split("<|im_start|>assistant\n", 1)[1]  # the turn after the backtrack does not
    assert "wrong thing" not in after and "<backtrack>" not in after
    assert "Backtracked: the previous search step was removed. Reason: irrelevant results" in after
    assert "wrong thing" in t.text  # the trajectory still holds everything, in order
    assert any(e["type"] == "backtrack" for e in t.events)


def test_summary_replaces_earlier_observations(qwen_tokenizer):
    tok = qwen_tokenizer
    scripts = {"Summarise?": ["<search>topic</search>", "<summary>topic is 7</summary>", "<answer>7</answer>"]}
    policy = ScriptedPolicy(tok, scripts)
    seen = []
    original = policy.generate
    policy.generate = lambda contexts, **kw: (seen.append(tok.decode(contexts[0])), original(contexts, **kw))[1]
    (t,) = AgentRollout(policy, tok, FakeSearcher()).run([build_prompt(tok, "Summarise?")])
    assert "Passage 0 about topic" in seen[1] and "Passage 0 about topic" not in seen[2]
    assert seen[2].split("<|im_start|>assistant\n", 1)[1].startswith("\n\n<observation>\nSummary")
    assert "Summary of the earlier steps: topic is 7" in seen[2]
    (k,) = AgentRollout(ScriptedPolicy(tok, scripts), tok, FakeSearcher(), RolloutSettings(summary_mode="keep")).run(
        [build_prompt(tok, "Summarise?")])
    assert k.is_linear


# ----------------------------------------------------------------------------------------- dialects


def test_search_r1_dialect(qwen_tokenizer):
    tok = qwen_tokenizer
    scripts = {"SR1?": ["<think>need info</think>\n<search> Fort Hood 2009 </search>",
                        "<think>got it</think>\n<answer> Nidal Hasan </answer>"]}
    (t,), _, engine = run(tok, scripts, dialect="search-r1", limits=RolloutSettings(passages_per_search=2))
    obs = [txt for src, txt in segment_texts(tok, t) if src == ENV][0]
    assert obs.startswith("\n\n<information>\nDoc 1(Title: \"Title Fort Hood 2009 0\") Passage 0 about Fort Hood 2009.")
    assert obs.endswith("</information>\n\n") and t.answer == "Nidal Hasan"
    assert engine.dialect.stop_strings == ["</search>", "</answer>"]


def test_r1_searcher_dialect_replays_a_real_rollout(qwen_tokenizer, wiki_index):
    """A real R1-Searcher trajectory's model turns replayed through the engine with a real index."""
    import json

    from conftest import shared

    row = json.loads(shared("r1-searcher/eval_results/hotpotqa_llama.jsonl").open().readline())
    text = row["gen_text_store"]
    turns, rest = [], text
    while "<|begin_of_documents|>" in rest:
        head, _, tail = rest.partition("<|begin_of_documents|>")
        turns.append(head.rstrip("\n"))
        rest = tail.partition("<|end_of_documents|>")[2].lstrip("\n")
    turns.append(rest)
    tok = qwen_tokenizer
    policy = ScriptedPolicy(tok, {row["question"]: turns})
    engine = AgentRollout(policy, tok, open_searcher(wiki_index, "bm25"),
                          RolloutSettings(dialect="r1-searcher", max_tokens_per_turn=1024,
                                          max_completion_tokens=4096))
    (t,) = engine.run([build_prompt(tok, row["question"], "r1-searcher")])
    assert t.finish_reason == "answer" and t.answer == row["pred_ans"] == "Nidal Malik Hasan"
    search = next(e for e in t.events if e["type"] == "search")
    assert search["queries"] == ["The 2009 Fort Hood mass shooting perpetrator"]
    obs = [txt for src, txt in segment_texts(tok, t) if src == ENV][0]
    assert obs.startswith("\n\n<|begin_of_documents|>\n(1)Title: ") and " Text: " in obs
    assert obs.endswith("<|end_of_documents|>\n\n")


def test_r1_searcher_real_outputs_parse(qwen_tokenizer):
    """All 500 real rollouts: queries and answers come out of the dialect's parser like the paper's."""
    import json

    from agentic_rag.rollout.protocol import ActionKind, get_dialect
    from conftest import shared

    d = get_dialect("r1-searcher")
    rows = [json.loads(line) for line in shared("r1-searcher/eval_results/hotpotqa_llama.jsonl").open()]
    agree = searches = 0
    for row in rows:
        text = row["gen_text_store"]
        queries = []
        rest = text
        while True:
            action = d.parse_turn(rest)
            if action.kind is not ActionKind.SEARCH:
                break
            queries.extend(action.queries)
            rest = rest[rest.find(d.tool_tags[0].close) + len(d.tool_tags[0].close):]
        searches += len(queries)
        agree += d.extract_answer(text) == row["pred_ans"].strip()
    assert agree / len(rows) > 0.95  # the rest: answers the paper's own extraction post-processed
    assert searches > len(rows)  # a search-heavy model: more than one query per question on average


# ---------------------------------------------------------------------------------------- real model


class ForcedHFPolicy(HFPolicy):
    """A real model whose choices are forced to scripted text; its log-probabilities stay the model's own.

    The forcing is a processor: for a row's n-th turn (found from its context), the scripted text's tokens
    are forced one by one, then end-of-sequence. Everything else (the decoder, the cache, stops) is real."""

    def __init__(self, model, tok, scripts, **kw):
        self.scripts = {k: [tok(x, add_special_tokens=False)["input_ids"] for x in v] for k, v in scripts.items()}
        self.turns: dict[tuple[int, int], list[int]] = {}
        self.count: dict[int, int] = {}
        super().__init__(model, tok, SamplingParams(do_sample=False), processors=[self._force], **kw)

    def _plan(self, row) -> list[int]:
        key = (row.id, row.turn_start)
        if key not in self.turns:
            text = self.tokenizer.decode(row.context[:row.turn_start])
            script = self.scripts[max((k for k in self.scripts if k in text), key=len)]
            n = self.count.get(row.id, 0)
            self.count[row.id] = n + 1
            self.turns[key] = script[n] if n < len(script) else []
        return self.turns[key]

    def _force(self, scores, rows):
        out = torch.full_like(scores, float("-inf"))
        for j, row in enumerate(rows):
            plan, step = self._plan(row), len(row.generated)
            out[j, plan[step] if step < len(plan) else self.tokenizer.eos_token_id] = 0
        return out


@pytest.mark.parametrize("backtrack", [False, True])
def test_logprobs_recomputed_the_training_way_equal_the_rollouts(qwen_tokenizer, tiny_qwen, backtrack):
    tok = qwen_tokenizer
    if backtrack:
        script = ["<think>look</think><search>wrong</search>", "<backtrack>off topic</backtrack>",
                  "<search>right</search>", "<summary>found right</summary>", "<answer>r</answer>"]
    else:
        script = ["<think>look</think><search>alpha</search>", "<search>beta</search>", "<answer>b</answer>"]
    scripts = {"Consistent?": script, "Other question?": ["<search>gamma</search>", "<answer>g</answer>"]}
    policy = ForcedHFPolicy(tiny_qwen, tok, scripts)
    engine = AgentRollout(policy, tok, FakeSearcher(), settings=RolloutSettings(passages_per_search=1))
    trajs = engine.run(prompts(tok, list(scripts)), list(scripts))
    assert [t.finish_reason for t in trajs] == ["answer", "answer"]
    assert (not trajs[0].is_linear) == backtrack
    recomputed = completion_logprobs(tiny_qwen, trajs, pad_id=tok.pad_token_id)
    for t, lp in zip(trajs, recomputed, strict=True):
        model = torch.tensor(t.env_mask, dtype=torch.bool)
        rollout = torch.tensor(t.logprobs)
        assert model.sum() > 10
        assert torch.allclose(rollout[model], lp[model], atol=1e-4), (rollout[model] - lp[model]).abs().max()
        assert (rollout[~model] == 0).all()
    if backtrack:
        # scoring the branched trajectory as if it were linear would be wrong: the check has teeth
        from agentic_rag.rollout.trajectory import Segment

        t = trajs[0]
        linear = type(t)(prompt_ids=t.prompt_ids, completion_ids=t.completion_ids, env_mask=t.env_mask,
                         segments=[Segment(s.start, s.end, s.source, i - 1) for i, s in enumerate(t.segments)])
        wrong = completion_logprobs(tiny_qwen, [linear], pad_id=tok.pad_token_id)[0]
        model = torch.tensor(t.env_mask, dtype=torch.bool)
        assert (torch.tensor(t.logprobs)[model] - wrong[model]).abs().max() > 1e-2


def test_sampled_rollout_logprobs_match_with_temperature(qwen_tokenizer, tiny_qwen):
    tok = qwen_tokenizer
    torch.manual_seed(1)
    policy = HFPolicy(tiny_qwen, tok, SamplingParams(do_sample=True, temperature=0.7, top_p=0.9, top_k=50))
    engine = AgentRollout(policy, tok, FakeSearcher(), settings=RolloutSettings(max_tokens_per_turn=24))
    qs = ["A?", "Bee bee?", "Sea sea sea?"]
    trajs = engine.run(prompts(tok, qs), qs)
    recomputed = completion_logprobs(tiny_qwen, trajs, pad_id=tok.pad_token_id, temperature=0.7)
    for t, lp in zip(trajs, recomputed, strict=True):
        assert len(t.completion_ids) > 0
        assert torch.allclose(torch.tensor(t.logprobs), lp, atol=1e-4)


def test_hf_policy_stops_each_sequence_on_its_own(qwen_tokenizer, tiny_qwen):
    tok = qwen_tokenizer
    scripts = {"Stop early?": ["<search>x</search> never seen"], "Stop late?": ["a b c d e f g h <answer>z</answer>"],
               "No stop?": ["one two three four five six seven eight nine ten eleven twelve"]}
    policy = ForcedHFPolicy(tiny_qwen, tok, scripts)
    gens = policy.generate(prompts(tok, list(scripts)), stop_strings=["</search>", "</answer>"],
                           max_new_tokens=[50, 50, 6])
    assert [g.stop for g in gens] == ["</search>", "</answer>", "length"]
    assert tok.decode(gens[0].ids) == "<search>x</search>"
    assert tok.decode(gens[1].ids) == "a b c d e f g h <answer>z</answer>"
    assert len(gens[2].ids) == 6 and all(len(g.logprobs) == len(g.ids) for g in gens)
    eos = ForcedHFPolicy(tiny_qwen, tok, {"Eos?": ["short"]})
    (g,) = eos.generate(prompts(tok, ["Eos?"]), stop_strings=["</answer>"], max_new_tokens=20)
    assert g.stop == STOP_EOS and g.ids[-1] == tok.eos_token_id


# ------------------------------------------------------------------------------------------- prompts


def test_prompts_in_english_and_chinese_for_chat_and_base_models(qwen_tokenizer):
    tok = qwen_tokenizer
    chat = tok.decode(build_prompt(tok, "Who?"))
    assert chat.startswith("<|im_start|>system\nYou answer questions by searching")
    assert chat.endswith("<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n")
    zh = tok.decode(build_prompt(tok, "谁？", language="zh"))
    assert "你通过检索文档库来回答问题" in zh and "谁？" in zh
    base = tok.decode(build_prompt(tok, "Who?", "r1-searcher", chat=False))
    assert "<|im_start|>" not in base and base.endswith("User: Who?\nAssistant:")
    assert "<|begin_of_query|>" in base
    with pytest.raises(ValueError, match="unknown prompt language"):
        build_prompt(tok, "Who?", language="fr")


def test_engine_is_deterministic_under_threads(qwen_tokenizer):
    """Two engines in two threads (e.g. a chat server) do not mix their state."""
    tok = qwen_tokenizer
    results = {}

    def go(name):
        (t,), _, _ = run(tok, {f"{name}?": [f"<search>{name}</search>", f"<answer>{name}</answer>"]})
        results[name] = t.answer

    threads = [threading.Thread(target=go, args=(n,)) for n in ("red", "green", "blue")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == {"red": "red", "green": "green", "blue": "blue"}


def test_passage_dataclass_roundtrip():
    p = Passage("1", "T", "x")
    assert p.contents == "T\nx"


# ------------------------------------------------------------------------------------ streaming hooks


@pytest.mark.parametrize("real_model", [False, True])
def test_hooks_stream_tokens_and_events_and_cancel(qwen_tokenizer, tiny_qwen, real_model):
    from agentic_rag.rollout import RolloutHooks

    tok = qwen_tokenizer
    scripts = {"Stream one?": ["<search>alpha</search>", "<answer>a</answer>"],
               "Stream two?": ["<search>beta</search>", "<search>gamma</search>", "<answer>b</answer>"],
               "Cancel me?": ["<search>delta</search>", "<search>eps</search>", "<search>zeta</search>",
                              "<answer>never</answer>"]}
    policy = ForcedHFPolicy(tiny_qwen, tok, scripts) if real_model else ScriptedPolicy(tok, scripts)
    tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
    events: dict[int, list[str]] = {0: [], 1: [], 2: []}

    def cancelled(i):
        return i == 2 and sum(e == "search" for e in events[2]) >= 1

    hooks = RolloutHooks(on_token=lambda i, tid: tokens[i].append(tid),
                         on_event=lambda i, ev: events[i].append(ev["type"]), cancelled=cancelled)
    trajs = AgentRollout(policy, tok, FakeSearcher()).run(prompts(tok, list(scripts)), list(scripts), hooks)
    assert [t.finish_reason for t in trajs] == ["answer", "answer", "cancelled"]
    for i, t in enumerate(trajs):
        model_ids = [x for x, m in zip(t.completion_ids, t.env_mask, strict=True) if m == 1]
        assert tokens[i] == model_ids  # every model token streamed, in order, nothing else
        assert events[i] == [e["type"] for e in t.events]
    assert events[0] == ["search", "observation", "answer", "finish"]
    assert trajs[2].num_searches == 1 and events[2][-1] == "finish"


def test_slots_refill_when_more_prompts_than_batch(qwen_tokenizer, tiny_qwen):
    """With max_batch_size 2 and five prompts, finished trajectories hand their slot to the next prompt;
    results are identical to running all five together (greedy, forced)."""
    tok = qwen_tokenizer
    scripts = {f"Slot {n}?": [f"<search>q{n}</search>"] * (n % 3) + [f"<answer>{n}</answer>"] for n in range(5)}
    together = AgentRollout(ForcedHFPolicy(tiny_qwen, tok, scripts), tok, FakeSearcher()).run(
        prompts(tok, list(scripts)), list(scripts))
    policy = ForcedHFPolicy(tiny_qwen, tok, scripts, max_batch_size=2)
    sizes = []
    original = policy.open_session

    def spy(stops):
        session = original(stops)
        step = session.step

        def counted():
            sizes.append(len(session.rows))
            return step()

        session.step = counted
        return session

    policy.open_session = spy
    slotted = AgentRollout(policy, tok, FakeSearcher()).run(prompts(tok, list(scripts)), list(scripts))
    assert max(sizes) == 2
    assert [t.answer for t in slotted] == [str(n) for n in range(5)]
    for a, b in zip(together, slotted, strict=True):
        assert a.completion_ids == b.completion_ids and a.env_mask == b.env_mask
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


# ------------------------------------------------------------------------- truncation: shown, dropped


class LongPassages(FakeSearcher):
    """Eight passages per query, each long enough that a tight observation budget cuts into the second."""

    def batch_search(self, queries, k=10):
        self.calls.append(list(queries))
        return [[Hit(f"d{i}", f"T{i}", f"alpha{i} " + "lorem " * 12 + f"omega{i}", 1.0) for i in range(8)]
                for _ in queries]


def test_only_passages_the_observation_kept_count_as_shown(qwen_tokenizer):
    """A passage cut off by truncation is not 'shown': the event lists it as cut and a later search may bring
    it back; one cut partway counts as shown and is marked partial."""
    tok = qwen_tokenizer
    limits = RolloutSettings(passages_per_search=3, max_observation_tokens=45)
    (t,), _, _ = run(tok, {"Cut?": ["<search>x</search>", "<search>x</search>", "<answer>y</answer>"]},
                     LongPassages(), limits)
    first_obs = [txt for src, txt in segment_texts(tok, t) if src == ENV][0]
    assert "omega0" in first_obs and "alpha1" in first_obs and "omega1" not in first_obs and "T2" not in first_obs
    first, second = [e["results"][0] for e in t.events if e["type"] == "search"]
    assert [(h["docid"], h["partial"]) for h in first["hits"]] == [("d0", False), ("d1", True)]
    assert [h["docid"] for h in first["cut"]] == ["d2"]  # selected, never seen by the model
    # d2 was cut off, so it was not shown: the next search shows it first (d0 and d1 are not repeated)
    assert [h["docid"] for h in second["hits"]][0] == "d2"
    assert "d0" not in [h["docid"] for h in second["hits"] + second["cut"]]


@pytest.mark.parametrize("case", ["search", "search_real_model", "summary"])
def test_an_observation_that_does_not_fit_ends_the_trajectory(qwen_tokenizer, tiny_qwen, case):
    """No room even for the observation's tags: the trajectory ends (max_completion_tokens) instead of
    resuming right after its action tag with no observation."""
    tok = qwen_tokenizer
    first = ("<summary>" + "the topic is seven " * 3 + "</summary>") if case == "summary" else "<search>x</search>"
    scripts = {"Full?": [first, "more words here", "<answer>z</answer>"]}
    room = 5  # fewer tokens than the observation's tags need
    budget = len(tok(first, add_special_tokens=False)["input_ids"]) + room
    limits = RolloutSettings(max_completion_tokens=budget, max_tokens_per_turn=min(256, budget),
                             max_observation_tokens=16)
    if case == "search_real_model":
        policy = ForcedHFPolicy(tiny_qwen, tok, scripts)
        (t,) = AgentRollout(policy, tok, FakeSearcher(), limits, min_turn_tokens=1).run(prompts(tok, ["Full?"]),
                                                                                        ["Full?"])
    else:
        (t,), policy, _ = run(tok, scripts, limits=limits, min_turn_tokens=1)
        assert policy.calls == [1]  # no second turn
    assert t.finish_reason == "max_completion_tokens" and t.num_turns == 1
    assert [s.source for s in t.segments] == [MODEL] and t.env_mask == [1] * len(t.completion_ids)
    obs = [e for e in t.events if e["type"] == "observation"]
    assert obs == [{"type": "observation", "turn": 1, "tokens": 0, "truncated": True, "dropped": "no room left"}]
    assert t.events[-1]["type"] == "finish"


# --------------------------------------------------------------------------- logprobs with a penalty


def test_logprobs_with_repetition_penalty_are_what_the_trainer_recomputes(qwen_tokenizer, caplog):
    """The penalty shapes sampling; the recorded log-probabilities stay log_softmax(raw logits / T), the
    quantity TRL's GRPOTrainer (and completion_logprobs) recomputes, and the policy warns about it."""
    from transformers import Qwen2ForCausalLM

    from conftest import tiny_qwen_config

    tok = qwen_tokenizer
    config = tiny_qwen_config(len(tok))
    config.initializer_range = 0.2  # logits far enough from 0 for the penalty to move the log-probabilities
    torch.manual_seed(0)
    tiny_qwen = Qwen2ForCausalLM(config).eval()
    qs = ["A?", "Bee bee?"]
    outs = {}
    for penalty in (1.0, 1.5):
        torch.manual_seed(5)
        policy = HFPolicy(tiny_qwen, tok, SamplingParams(temperature=0.7, repetition_penalty=penalty))
        with caplog.at_level("WARNING", logger="agentic_rag.rollout.policy"):
            trajs = AgentRollout(policy, tok, FakeSearcher(), settings=RolloutSettings(max_tokens_per_turn=24)).run(
                prompts(tok, qs), qs)
        recomputed = completion_logprobs(tiny_qwen, trajs, pad_id=tok.pad_token_id, temperature=0.7)
        for t, lp in zip(trajs, recomputed, strict=True):
            assert len(t.completion_ids) > 5
            assert torch.allclose(torch.tensor(t.logprobs), lp, atol=1e-4), (torch.tensor(t.logprobs) - lp).abs().max()
        outs[penalty] = [t.completion_ids for t in trajs]
    assert outs[1.0] != outs[1.5], "the penalty must change what is sampled (same seed)"
    assert "repetition_penalty=1.5" in caplog.text and "off-policy" in caplog.text


# -------------------------------------------------------------- masks with the plain Qwen2 tokenizer


@pytest.mark.parametrize("real_model", [False, True])
def test_masks_are_exact_with_multi_token_tags(qwen2_tokenizer, tiny_qwen, real_model):
    """The plain shipped Qwen2 tokenizer has no tag tokens: <think>, <search>, <observation> are several
    tokens each, and '</search>\\n\\n' ends inside the token '>\\n\\n'. Every token is checked: the model's
    (a forged <observation> included) have mask 1, the environment's 0, ids exactly as generated."""
    tok = qwen2_tokenizer
    for tag in ("<think>", "</search>", "<observation>", "</observation>", "<answer>"):
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) > 1, tag
    turn1 = ("<think>I need the capital.</think>\n<observation>The capital is Fakeville.</observation>\n"
             "<search>capital of Freedonia</search>\n\n")
    turn2 = "<think>It says Fredville.</think>\n<answer>Fredville</answer>"
    ids1, ids2 = (tok(x, add_special_tokens=False)["input_ids"] for x in (turn1, turn2))
    assert tok.decode(ids1[-1:]) == ">\n\n"  # the stop string ends inside the turn's last token
    scripts = {"What is the capital of Freedonia?": [turn1, turn2]}
    limits = RolloutSettings(passages_per_search=1)
    if real_model:
        policy = ForcedHFPolicy(tiny_qwen, tok, scripts)
    else:
        policy = ScriptedPolicy(tok, scripts)
    engine = AgentRollout(policy, tok, FakeSearcher(), settings=limits)
    (t,) = engine.run(prompts(tok, list(scripts)), list(scripts))
    assert t.finish_reason == "answer" and t.answer == "Fredville" and t.num_searches == 1
    obs_text = engine.dialect.wrap_observation(engine.dialect.format_passages(
        [Hit("capital of Freedonia-0", "Title capital of Freedonia 0", "Passage 0 about capital of Freedonia.", 1)]))
    ids_obs = tok(obs_text, add_special_tokens=False)["input_ids"]
    assert t.completion_ids == ids1 + ids_obs + ids2
    assert t.env_mask == [1] * len(ids1) + [0] * len(ids_obs) + [1] * len(ids2)
    # token by token: each token's mask says who wrote the characters it decodes to
    text = turn1 + obs_text + turn2
    forged = (text.index("<observation>The capital"), text.index("</observation>\n<search>") + len("</observation>"))
    real = (len(turn1), len(turn1) + len(obs_text))
    pos = 0
    for token, mask in zip(t.completion_ids, t.env_mask, strict=True):
        piece = tok.decode([token])
        assert text[pos:pos + len(piece)] == piece
        inside_real = real[0] <= pos < real[1]
        assert mask == (0 if inside_real else 1), (pos, piece)
        if forged[0] <= pos < forged[1]:
            assert mask == 1, f"forged tag token {piece!r} must be the model's"
        pos += len(piece)
    assert pos == len(text) == len(t.text)
    assert [e["tag"] for e in t.events if e["type"] == "forged_tag"] == ["<observation>", "</observation>"]
    if real_model:
        lp = completion_logprobs(tiny_qwen, [t], pad_id=tok.pad_token_id)[0]
        model = torch.tensor(t.env_mask, dtype=torch.bool)
        assert torch.allclose(torch.tensor(t.logprobs)[model], lp[model], atol=1e-4)


def test_sample_categorical_draws_the_distribution_and_never_a_zero_probability_token():
    """The two-level inverse-CDF sampler (blocks of the vocabulary, then a token inside the block) against the
    probabilities it is given: a chi-square test over 200k draws, with a vocabulary that is not a multiple of the
    block size, zeros inside blocks, a whole zero block, and unnormalised rows."""
    from agentic_rag.rollout.decoding import sample_categorical

    p = torch.tensor([0.05, 0.0, 0.2, 0.05, 0.0, 0.0, 0.0, 0.0, 0.3, 0.1, 0.0, 0.25, 0.05])  # 13 = 3 blocks of 4 + 1
    torch.manual_seed(0)
    draws = torch.cat([sample_categorical(p.repeat(20_000, 1) * 7.0, block=4) for _ in range(10)])
    counts = torch.bincount(draws, minlength=len(p)).double()
    assert counts[p == 0].sum() == 0, "a zero-probability token was drawn"
    expected = p.double() * len(draws)
    chi2 = float((((counts - expected) ** 2 / expected)[p > 0]).sum())
    assert chi2 < 26.1, chi2  # the 99.95% quantile of chi-square with 6 degrees of freedom
    # a one-hot row (a forced token) always gives that token
    one_hot = torch.zeros(5, 13)
    one_hot[torch.arange(5), torch.tensor([0, 3, 4, 12, 7])] = 1.0
    assert sample_categorical(one_hot, block=4).tolist() == [0, 3, 4, 12, 7]


def test_reserved_cache_decodes_what_hf_dynamic_cache_decodes(qwen_tokenizer, monkeypatch):
    """The decoder's cache appends in place into reserved room (rollout/kv_cache.py) instead of Hugging Face's
    torch.cat of the whole cache at every step. With no room (HF's DynamicLayer), with 3 entries of room (the buffer
    moves at almost every step) and with the default, the same scripted rollouts (searches mid-turn, rows fed
    apart, compaction) decode the same tokens with the same log-probabilities; and within its room a step writes
    into the same buffer."""
    from transformers import Qwen2ForCausalLM
    from transformers.cache_utils import DynamicLayer

    from agentic_rag.rollout import decoding, kv_cache
    from conftest import tiny_qwen_config

    config = tiny_qwen_config(len(qwen_tokenizer))
    config.initializer_range = 0.2
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    tok = qwen_tokenizer
    scripts = {"Searches twice?": ["<think>" + "x " * 30 + "</think><search>alpha</search>", "<search>beta</search>",
                                   "<answer>a</answer>"],
               "Answers at once?": ["<answer>now</answer>"],
               "Searches once?": ["<search>gamma</search>", "<answer>g</answer>"]}
    real = kv_cache.reserve_room
    layer_types, moves = [], []

    def run(room: int | None):
        def reserve(cache, _default):
            if room is not None:
                real(cache, room)
            layer_types.append({type(layer) for layer in cache.layers})
        monkeypatch.setattr(decoding, "reserve_room", reserve)
        engine = AgentRollout(ForcedHFPolicy(model, tok, scripts), tok, FakeSearcher(),
                              settings=RolloutSettings(passages_per_search=2, max_tokens_per_turn=256))
        return engine.run(prompts(tok, list(scripts)), list(scripts))

    dynamic = run(None)
    assert layer_types[-1] == {DynamicLayer}
    for room in (3, kv_cache.RESERVE):
        trajs = run(room)
        assert layer_types[-1] == {kv_cache.ReservedLayer}
        for a, b in zip(dynamic, trajs, strict=True):
            assert a.completion_ids == b.completion_ids and a.env_mask == b.env_mask
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6)
    # in place: appends within the room keep the buffer; past it the buffer moves, and the view is the same values
    layer = kv_cache.ReservedLayer(reserve=4)
    plain = DynamicLayer()
    for n in (5, 1, 1, 1, 1, 1, 2):
        k, v = torch.randn(2, 3, n, 8), torch.randn(2, 3, n, 8)
        before = layer._k.data_ptr() if layer._k is not None else None
        layer.update(k, v)
        plain.update(k, v)
        moves.append(before != layer._k.data_ptr())
        assert torch.equal(layer.keys, plain.keys) and torch.equal(layer.values, plain.values)
    assert moves == [True, False, False, False, False, True, False]
    layer.batch_select_indices(torch.tensor([1]))  # an assignment: the buffer is what was assigned
    plain.batch_select_indices(torch.tensor([1]))
    layer.update(k[:1], v[:1])
    plain.update(k[:1], v[:1])
    assert torch.equal(layer.keys, plain.keys) and layer.get_seq_length() == plain.get_seq_length() == 14


def test_cache_surgery_keeps_every_logprob_exact(qwen_tokenizer, monkeypatch):
    """Observations fed apart from the rows that keep decoding (their cache sliced out, extended and merged
    back) and the timeline compacted by moving cache entries: both must leave every token's log-probability
    what the training-way re-scoring computes. Both paths are counted, so the test checks they ran; the model's
    weights are drawn large enough that a position off by one moves the log-probabilities past the tolerance."""
    from transformers import Qwen2ForCausalLM

    from agentic_rag.rollout.decoding import DecodeSession
    from conftest import tiny_qwen_config

    config = tiny_qwen_config(len(qwen_tokenizer))
    config.initializer_range = 0.2
    torch.manual_seed(0)
    tiny_qwen = Qwen2ForCausalLM(config).eval()

    calls = {"apart": 0, "apart_rows": 0, "compact": 0}
    for name, key in (("_prefill_apart", "apart"), ("_compact", "compact")):
        original = getattr(DecodeSession, name)

        def spy(self, *a, _original=original, _key=key):
            if _key == "compact":
                calls[_key] += 1
            else:
                wide = sum(1 for r in a[0] if len(r.pending) > 1)
                if 0 < wide < len(a[0]) and self._cache is not None:  # rows fed apart while others decode
                    calls[_key] += 1
                    calls["apart_rows"] += wide
            return _original(self, *a)

        monkeypatch.setattr(DecodeSession, name, spy)
    tok = qwen_tokenizer
    think = "<think>" + " ".join(f"step {i}" for i in range(40)) + "</think>"
    scripts = {
        "Searches early and often?": ["<search>alpha</search>", "<search>beta</search>", "<search>gamma</search>",
                                      "<answer>a</answer>"],
        "Thinks long first?": [think + "<search>delta</search>", "<answer>d</answer>"],
        "Searches twice late?": ["<think>hm</think>" * 6 + "<search>eps</search>", "<search>zeta</search>",
                                 "<answer>z</answer>"],
        "Answers at once?": ["<answer>now</answer>"],
        "Twin one?": ["<search>left</search>", "<answer>l</answer>"],  # the twins search in the same step
        "Twin two?": ["<search>rite</search>", "<answer>r</answer>"],
    }
    policy = ForcedHFPolicy(tiny_qwen, tok, scripts)
    engine = AgentRollout(policy, tok, FakeSearcher(), settings=RolloutSettings(passages_per_search=2,
                                                                            max_tokens_per_turn=256))
    trajs = engine.run(prompts(tok, list(scripts)), list(scripts))
    assert [t.finish_reason for t in trajs] == ["answer"] * 6
    assert [t.num_searches for t in trajs] == [3, 1, 2, 0, 1, 1]
    assert calls["apart"] > 0 and calls["compact"] > 0 and calls["apart_rows"] > calls["apart"], calls
    recomputed = completion_logprobs(tiny_qwen, trajs, pad_id=tok.pad_token_id)
    for t, lp in zip(trajs, recomputed, strict=True):
        model = torch.tensor(t.env_mask, dtype=torch.bool)
        assert torch.allclose(torch.tensor(t.logprobs)[model], lp[model], atol=1e-4), \
            (torch.tensor(t.logprobs)[model] - lp[model]).abs().max()


def test_the_prompts_common_prefix_is_fed_once_and_changes_nothing(qwen_tokenizer, monkeypatch):
    """A batch of new prompts shares its system prompt (and, in GRPO, each question's generations share the whole
    prompt): the decoder feeds the common prefix once, as a batch of one, and copies its cache entries to every row.
    The same scripted rollouts with it off decode the same tokens with the same log-probabilities (to float noise),
    each one what the training-way re-scoring computes."""
    from transformers import Qwen2ForCausalLM

    from agentic_rag.rollout import decoding
    from conftest import tiny_qwen_config

    config = tiny_qwen_config(len(qwen_tokenizer))
    config.initializer_range = 0.2
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    tok = qwen_tokenizer
    scripts = {"Searches then answers?": ["<search>alpha</search>", "<answer>a</answer>"],
               "Answers at once?": ["<answer>now</answer>"],
               "Thinks, then answers?": ["<think>" + "x " * 20 + "</think><answer>b</answer>"]}
    questions = [q for q in scripts for _ in range(2)]  # two generations a question, as in a GRPO group
    shared: list[int] = []
    original = decoding.DecodeSession._prefill_shared

    def spy(self, live):
        before = self._cache
        original(self, live)
        if before is None and self._cache is not None:
            shared.append(int(self._mask.shape[1]))

    monkeypatch.setattr(decoding.DecodeSession, "_prefill_shared", spy)

    def run():
        policy = ForcedHFPolicy(model, tok, scripts)
        engine = AgentRollout(policy, tok, FakeSearcher(), settings=RolloutSettings(max_tokens_per_turn=128))
        return engine.run(prompts(tok, questions), questions)

    on = run()
    prefix = len(build_prompt(tok, "Q"))  # the system prompt and the template's opening: at least this much
    assert shared and shared[0] >= prefix - 8, (shared, prefix)
    monkeypatch.setattr(decoding, "MIN_SHARED", 10 ** 9)
    shared.clear()
    off = run()
    assert not shared
    for a, b in zip(on, off, strict=True):
        assert a.completion_ids == b.completion_ids and a.env_mask == b.env_mask and a.answer == b.answer
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    recomputed = completion_logprobs(model, on, pad_id=tok.pad_token_id)
    for t, lp in zip(on, recomputed, strict=True):
        mask = torch.tensor(t.env_mask, dtype=torch.bool)
        assert torch.allclose(torch.tensor(t.logprobs)[mask], lp[mask], atol=1e-4)
