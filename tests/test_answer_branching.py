"""Answer branching: trunks cut after their answer tag and continued by the real engine, exact log-probabilities on a
real tiny model, and GRPO steps whose groups are one trunk's answers."""

from __future__ import annotations

import torch

from agentic_rag.rollout import AgentRollout, HFPolicy, RolloutSettings, SamplingParams
from agentic_rag.rollout.branching import answer_branch_point, answer_branches
from agentic_rag.rollout.scoring import completion_logprobs
from agentic_rag.rollout.scripted import ScriptedPolicy
from agentic_rag.rollout.trajectory import ENV, MODEL
from test_rollout import FakeSearcher, ForcedHFPolicy, prompts

SETTINGS = RolloutSettings(passages_per_search=1)


def trunks_and_branches(tok, trunk_scripts, branch_scripts, n):
    searcher = FakeSearcher()
    qs = list(trunk_scripts)
    trunks = AgentRollout(ScriptedPolicy(tok, trunk_scripts), tok, searcher, SETTINGS).run(prompts(tok, qs), qs)
    calls = len(searcher.calls)
    engine = AgentRollout(ScriptedPolicy(tok, branch_scripts), tok, searcher, SETTINGS)
    return trunks, answer_branches(engine, trunks, n), searcher, calls


def test_branches_share_the_trunk_and_write_their_own_answers(qwen_tokenizer):
    tok = qwen_tokenizer
    trunk_scripts = {"Capital of Freedonia?": ["<think>look</think><search>Freedonia</search>",
                                               "<think>it says</think><answer>Fredville</answer>"],
                     "Who wrote it?": ["<search>book</search>", "I do not know."]}
    branch_scripts = {"Capital of Freedonia?": [" Marxburg </answer>"], "Who wrote it?": ["never used"]}
    trunks, groups, searcher, calls = trunks_and_branches(tok, trunk_scripts, branch_scripts, 3)
    answered, unanswered = trunks
    assert answered.answer == "Fredville" and unanswered.finish_reason == "eos"
    assert len(searcher.calls) == calls, "branching searched again"

    point = answer_branch_point(answered, tok, "<answer>")
    turn = answered.segments[point.segment]
    forced = point.forced(answered)
    # Qwen writes "<answer>F" with a last token ">F": that token is re-encoded up to the tag, no branch starts with "F"
    assert tok.decode(forced) == "<think>it says</think><answer>" and point.tail
    assert forced[:point.kept - turn.start] == answered.completion_ids[turn.start:point.kept]
    new = tok(" Marxburg </answer>", add_special_tokens=False)["input_ids"]
    for b in groups[0]:
        assert b.branch_start == turn.start + len(forced)
        assert b.completion_ids == answered.completion_ids[:turn.start] + forced + new
        assert b.env_mask == answered.env_mask[:turn.start] + [1] * (len(forced) + len(new))
        assert b.answer == "Marxburg" and b.finish_reason == "answer"
        assert (b.num_searches, b.num_turns) == (answered.num_searches, answered.num_turns)
        # the answer turn is one model segment again (forced prefix + new tokens), after the trunk's observation
        assert [(s.source, s.kind) for s in b.segments] == [(MODEL, "search"), (ENV, "observation"), (MODEL, "answer")]
        assert b.segments[-1].start == turn.start and b.segments[-1].end == len(b.completion_ids)
        kinds = [e["type"] for e in b.events]
        assert kinds.count("search") == 1 and kinds.count("answer") == 1 and kinds.count("finish") == 1
        assert [e["text"] for e in b.events if e["type"] == "answer"] == ["Marxburg"]
    assert answered.answer == "Fredville", "the trunk is left as it was"
    # a trunk that never answered has no branch point: copies with nothing after it
    assert answer_branch_point(unanswered, tok, "<answer>") is None
    for c in groups[1]:
        assert c.completion_ids == unanswered.completion_ids and c.branch_start == len(c.completion_ids)
        assert c.finish_reason == "eos"


def test_a_branch_that_does_not_close_its_answer_ends_as_a_turn_would(qwen_tokenizer):
    tok = qwen_tokenizer
    trunk = {"Q?": ["<search>x</search>", "<answer>y</answer>"]}
    _, groups, _, _ = trunks_and_branches(tok, trunk, {"Q?": [" never closed"]}, 2)
    for b in groups[0]:
        assert b.finish_reason == "eos" and b.answer is None


def test_continued_turns_are_scored_exactly_under_the_trunks_context(qwen_tokenizer, tiny_qwen):
    """The trunk's recorded log-probabilities (forced prefix included) and the sampled answers' equal what the
    training-time scoring computes on the whole branch: every token was generated under exactly that context."""
    tok = qwen_tokenizer
    scripts = {"Consistent?": ["<think>look</think><search>alpha</search>", "<search>beta</search>",
                               "<think>so</think><answer>b</answer>"]}
    trunks = AgentRollout(ForcedHFPolicy(tiny_qwen, tok, scripts), tok, FakeSearcher(), SETTINGS).run(
        prompts(tok, list(scripts)), list(scripts))
    torch.manual_seed(0)
    sampler = HFPolicy(tiny_qwen, tok, SamplingParams(do_sample=True, temperature=1.0))
    engine = AgentRollout(sampler, tok, FakeSearcher(), RolloutSettings(passages_per_search=1, max_tokens_per_turn=20))
    (group,) = answer_branches(engine, trunks, 3)
    assert len({tuple(b.completion_ids) for b in group}) > 1, "the sampled answers differ"
    recomputed = completion_logprobs(tiny_qwen, group, pad_id=tok.pad_token_id)
    kept = answer_branch_point(trunks[0], tok, "<answer>").kept
    for b, lp in zip(group, recomputed, strict=True):
        model = torch.tensor(b.env_mask, dtype=torch.bool)
        model[kept:b.branch_start] = False  # the re-encoded tail of the tag: recorded as 0.0 (never trained on)
        assert len(b.completion_ids) > b.branch_start > kept
        assert torch.allclose(torch.tensor(b.logprobs)[model], lp[model], atol=1e-4)
        assert b.logprobs[:kept] == trunks[0].logprobs[:kept]
        assert b.logprobs[kept:b.branch_start] == [0.0] * (b.branch_start - kept)


def test_grpo_steps_train_only_the_answers_of_one_trunk(tiny_model_dir, world_dir, tmp_path):
    """A real GRPO step with answer branching: each group is one greedy trunk (its search, its passage) and its
    answers; the loss sees only the tokens after the branch point, a trunk with no answer gives nothing to train on,
    and the adapter changes."""
    from agentic_rag.models import load_tokenizer
    from agentic_rag.serving.forcing import ScriptedTurns
    from test_training import lora_state, make_trainer

    def script(context: str, turn: int) -> str | None:
        if context.rstrip().endswith("<answer>"):
            return None  # a branch: the model writes its answer
        if turn == 0:
            return "<search>Where</search>"
        return "I do not know." if "guild" in context else "<answer>here</answer>"  # the guild question: no answer

    tok = load_tokenizer(str(tiny_model_dir))
    rows = [{"prompt": "Where was Sigun Dal born?", "answers": ["Treistholwick"]},
            {"prompt": "Which guild does Damzim Dal work for?", "answers": ["Hollow Amber Guild"]}]
    trainer = make_trainer(tiny_model_dir, world_dir, tmp_path, max_steps=1, answer_branching=True, rows=rows,
                           processors=[ScriptedTurns(tok, script)],
                           settings=RolloutSettings(max_turns=3, max_tokens_per_turn=12, max_completion_tokens=96,
                                                    passages_per_search=1, max_observation_tokens=48))
    seen = []
    original = trainer._rollout

    def spy(prompts_, t):
        out = original(prompts_, t)
        seen.append((list(prompts_), trainer._last_trajectories, out))
        return out

    trainer.rollout_func = spy
    before = lora_state(trainer.model)
    trainer.train()
    after = lora_state(trainer.model)
    assert seen
    kinds = set()
    for prompts_, trajs, out in seen:
        g = trainer.num_generations
        for start in range(0, len(trajs), g):
            group = trajs[start:start + g]
            assert len(set(prompts_[start:start + g])) == 1
            point = group[0].branch_start
            kinds.add("guild" in prompts_[start])
            if "guild" in prompts_[start]:  # no answer, no branch point: copies, nothing trained on
                assert all(b.completion_ids == group[0].completion_ids and b.finish_reason == "eos" for b in group)
                assert all(sum(mask) == 0 for mask in out["env_mask"][start:start + g])
                continue
            assert 0 < point < len(group[0].completion_ids)
            for b, mask in zip(group, out["env_mask"][start:start + g], strict=True):
                assert b.branch_start == point and b.completion_ids[:point] == group[0].completion_ids[:point]
                assert b.completion_ids[point:] != [], "a branch wrote after its branch point"
                assert tok.decode(b.completion_ids[:point]).endswith("<answer>")
                assert b.num_searches == 1
                assert mask == [0] * point + b.env_mask[point:] and sum(mask) > 0
    assert kinds == {True, False}
    history = trainer.state.log_history
    assert [h["agentic/answer_branched_groups"] for h in history if "agentic/answer_branched_groups" in h] == [0.5]
    assert all(torch.isfinite(after[n]).all() for n in after)
    assert any(not torch.equal(before[n], after[n]) for n in before), "the adapter did not change"


def test_the_config_switch_reaches_the_trainer(tiny_model_dir, world_dir, tmp_path):
    """``algorithm.answer_branching`` in a YAML config, through ``agentic_rag.training.train.run``: the run's groups
    are branched (its log has the branched-group share, which only branching writes); without it, no such key."""
    import json

    from agentic_rag.training.config import load_config
    from agentic_rag.training.train import run
    from test_launch import config

    def logged_keys(branching: bool) -> set[str]:
        out = tmp_path / f"branching-{branching}"
        out.mkdir()
        cfg = config(out, tiny_model_dir, world_dir, algorithm__max_steps=1, algorithm__answer_branching=branching,
                     checkpoint__save_steps=10)
        run(load_config(cfg))
        history = json.loads((out / "out" / "train_summary.json").read_text())["log_history"]
        return {k for h in history for k in h}

    assert "agentic/answer_branched_groups" in logged_keys(True)
    assert "agentic/answer_branched_groups" not in logged_keys(False)
