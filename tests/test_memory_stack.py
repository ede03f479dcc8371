"""The memory stack: sequences of backtracks and summaries, checked by the exact context the model sees at
every turn and by the ``dropped_tokens`` each backtrack reports; and the search limit's notice.

The policy is scripted, so each test drives an exact sequence of actions. A turn's visible context is read
where the policy receives it (the ids it is asked to continue), never rebuilt from the trajectory's
structure, so the tests hold the structure to what the model really saw.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentic_rag.data.prompts import build_prompt
from agentic_rag.rewards.format import check_format
from agentic_rag.rollout import AgentRollout, RolloutSettings
from agentic_rag.rollout.protocol import get_dialect
from agentic_rag.rollout.scoring import completion_logprobs
from agentic_rag.rollout.scripted import ScriptedPolicy
from agentic_rag.rollout.trajectory import ENV, MODEL
from agentic_rag.search import Hit
from test_rollout import FakeSearcher, ForcedHFPolicy, prompts

QUESTION = "Stack?"


class OneHit:
    """One deterministic passage per query."""

    def batch_search(self, queries, k=10):
        return [[Hit(f"{q}-{i}", f"T{q}{i}", f"P{i} {q}.", 1.0) for i in range(k)] for q in queries]


def obs(query: str) -> str:
    return f"\n\n<observation>\n(1) T{query}0\nP0 {query}.\n</observation>\n\n"


def note(text: str) -> str:
    return f"\n\n<observation>\n{text}\n</observation>\n\n"


def back(reason: str) -> str:
    return note(f"Backtracked: the previous search step was removed. Reason: {reason}")


NOTHING = note("There is no search step to backtrack from.")


def summ(text: str) -> str:
    return note(f"Summary of the earlier steps: {text}")


def S(q: str) -> str:  # noqa: N802 - a search turn
    return f"<search>{q}</search>"


def B(reason: str) -> str:  # noqa: N802 - a backtrack turn
    return f"<backtrack>{reason}</backtrack>"


def play(tok, script, limits=None, summary_mode="replace"):
    """Run ``script`` (one question) and return the trajectory, the visible completion (decoded) at the start
    of every turn, and its length in tokens."""
    policy = ScriptedPolicy(tok, {QUESTION: script})
    prompt = build_prompt(tok, QUESTION)
    seen: list[list[int]] = []
    original = policy.generate

    def spy(contexts, **gen_kw):
        (context,) = contexts
        assert list(context[:len(prompt)]) == list(prompt)  # every context starts with the whole prompt
        seen.append(list(context[len(prompt):]))
        return original(contexts, **gen_kw)

    policy.generate = spy
    settings = dataclasses.replace(limits or RolloutSettings(passages_per_search=1), summary_mode=summary_mode)
    engine = AgentRollout(policy, tok, OneHit(), settings)
    (t,) = engine.run([prompt], [QUESTION])
    return t, [tok.decode(ids, skip_special_tokens=False) for ids in seen], [len(ids) for ids in seen]


def dropped(t):
    return [e["dropped_tokens"] for e in t.events if e["type"] == "backtrack"]


def n(tok, *segments: str) -> int:
    """Tokens of ``segments``, each tokenized on its own as the engine and the scripted policy do."""
    return sum(len(tok(text, add_special_tokens=False)["input_ids"]) for text in segments)


# ------------------------------------------------------------------------------------------ backtracks


def test_two_backtracks_in_a_row_abandon_two_search_steps(qwen_tokenizer):
    tok = qwen_tokenizer
    t, seen, lengths = play(tok, [S("q1"), S("q2"), B("b1"), B("b2"), "<answer>a</answer>"])
    assert seen == ["",
                    S("q1") + obs("q1"),
                    S("q1") + obs("q1") + S("q2") + obs("q2"),
                    S("q1") + obs("q1") + back("b1"),  # search 2 and its results are gone
                    back("b2")]  # and now search 1: no query is left without its results
    assert t.finish_reason == "answer" and t.answer == "a"
    # what each backtrack dropped: the context it wrote in, plus itself, minus what stays before its note
    assert dropped(t) == [lengths[2] + n(tok, B("b1")) - (lengths[3] - n(tok, back("b1"))),
                          lengths[3] + n(tok, B("b2")) - (lengths[4] - n(tok, back("b2")))]
    assert dropped(t)[1] == n(tok, S("q1"), obs("q1"), back("b1"), B("b2"))


def test_three_backtracks_reach_the_prompt_and_then_have_nothing_to_abandon(qwen_tokenizer):
    tok = qwen_tokenizer
    t, seen, _ = play(tok, [S("q1"), S("q2"), B("b1"), B("b2"), B("b3"), "<answer>a</answer>"])
    assert seen[4] == back("b2")
    assert seen[5] == back("b2") + B("b3") + NOTHING  # the refused backtrack stays, with the reply
    assert len(dropped(t)) == 2
    assert [e["kind"] for e in t.events if e["type"] == "error"] == ["nothing_to_backtrack"]


def test_backtrack_with_nothing_to_abandon(qwen_tokenizer):
    tok = qwen_tokenizer
    t, seen, _ = play(tok, [B("early"), S("q1"), B("b1"), "<answer>a</answer>"])
    assert seen == ["",
                    B("early") + NOTHING,
                    B("early") + NOTHING + S("q1") + obs("q1"),
                    B("early") + NOTHING + back("b1")]  # the refused backtrack was no search step
    assert dropped(t) == [n(tok, S("q1"), obs("q1"), B("b1"))]
    assert t.finish_reason == "answer"


def test_backtrack_after_a_summary_stops_at_the_summary(qwen_tokenizer):
    tok = qwen_tokenizer
    t, seen, _ = play(tok, [S("q1"), "<summary>s1</summary>", S("q2"), B("b1"), B("b2"), "<answer>a</answer>"])
    assert seen == ["",
                    S("q1") + obs("q1"),
                    summ("s1"),
                    summ("s1") + S("q2") + obs("q2"),
                    summ("s1") + back("b1"),
                    summ("s1") + back("b1") + B("b2") + NOTHING]  # search 1 lives on only in the summary
    assert dropped(t) == [n(tok, S("q2"), obs("q2"), B("b1"))]


def test_summary_after_backtracks(qwen_tokenizer):
    tok = qwen_tokenizer
    t, seen, _ = play(tok, [S("q1"), S("q2"), B("b1"), "<summary>s1</summary>", S("q3"), B("b2"),
                            "<answer>a</answer>"])
    assert seen[3] == S("q1") + obs("q1") + back("b1")
    assert seen[4] == summ("s1")
    assert seen[5] == summ("s1") + S("q3") + obs("q3")
    assert seen[6] == summ("s1") + back("b2")
    assert t.finish_reason == "answer"


def test_kept_summary_is_abandoned_with_the_step_before_it(qwen_tokenizer):
    tok = qwen_tokenizer
    t, seen, _ = play(tok, [S("q1"), S("q2"), B("b1"), "<summary>s1</summary>", B("b2"), "<answer>a</answer>"],
                      summary_mode="keep")
    assert seen[3] == S("q1") + obs("q1") + back("b1")
    assert seen[4] == S("q1") + obs("q1") + back("b1") + "<summary>s1</summary>"
    assert seen[5] == back("b2")
    assert dropped(t)[1] == n(tok, S("q1"), obs("q1"), back("b1"), "<summary>s1</summary>", B("b2"))


def test_failed_and_empty_searches_are_search_steps(qwen_tokenizer):
    tok = qwen_tokenizer
    t, seen, _ = play(tok, [S("q1"), S(" "), B("b1"), B("b2"), "<answer>a</answer>"])
    empty = note("The search query was empty. Write a query inside the search tags.")
    assert seen[2] == S("q1") + obs("q1") + S(" ") + empty
    assert seen[3] == S("q1") + obs("q1") + back("b1")
    assert seen[4] == back("b2")


# ------------------------------------------------------------------------------------- search limit


def test_search_past_the_limit_is_told_and_can_answer(qwen_tokenizer):
    tok = qwen_tokenizer
    limits = RolloutSettings(max_searches=2, passages_per_search=1)
    t, seen, _ = play(tok, [S("q1"), S("q2"), S("q3"), "<answer>a</answer>"], limits)
    notice = note("You have no searches left (the limit is 2). Answer with what you know.")
    assert seen[3] == S("q1") + obs("q1") + S("q2") + obs("q2") + S("q3") + notice
    assert t.finish_reason == "answer" and t.answer == "a" and t.num_searches == 2
    assert [e["type"] for e in t.events if e["turn"] == 3] == ["limit", "observation"]
    (seg,) = [s for s in t.segments if s.source == ENV and s.kind == "notice"]
    assert set(t.env_mask[seg.start:seg.end]) == {0}
    assert tok.decode(t.completion_ids[seg.start:seg.end]) == notice
    assert [e["queries"] for e in t.events if e["type"] == "search"] == [["q1"], ["q2"]]
    # the refused search still costs the format reward: it was out of bounds, however well the answer came out
    model_text = "".join(tok.decode(t.completion_ids[s.start:s.end]) for s in t.segments if s.source == MODEL)
    report = check_format(model_text, t.events, t.finish_reason, get_dialect("agentic"))
    assert report.violations == {"searches_in_bounds": "searched past max_searches"}
    within, _, _ = play(tok, [S("q1"), S("q2"), "<answer>a</answer>"], limits)
    model_text = "".join(tok.decode(within.completion_ids[s.start:s.end]) for s in within.segments
                         if s.source == MODEL)
    assert check_format(model_text, within.events, within.finish_reason, get_dialect("agentic")).ok


def test_search_limit_can_still_end_the_trajectory(qwen_tokenizer):
    tok = qwen_tokenizer
    limits = RolloutSettings(max_searches=2, passages_per_search=1, on_search_limit="end")
    t, seen, _ = play(tok, [S("q1"), S("q2"), S("q3"), "<answer>a</answer>"], limits)
    assert len(seen) == 3 and t.finish_reason == "max_searches" and t.answer is None
    assert t.events[-2]["type"] == "limit" and t.events[-1] == {"type": "finish", "turn": 3, "reason": "max_searches"}


def test_search_limit_setting_is_checked(qwen_tokenizer):
    """RolloutSettings check nothing when built; the engine checks them as a config would, naming the fix."""
    settings = RolloutSettings(on_search_limit="stop")
    with pytest.raises(ValueError, match=r"invalid rollout settings: on_search_limit must be one of observe, end; "
                                         r"got 'stop'"):
        AgentRollout(ScriptedPolicy(qwen_tokenizer, {}), qwen_tokenizer, OneHit(), settings)


class _EngineBuilt(Exception):
    pass


def test_search_limit_setting_reaches_the_engine_from_every_config(world_dir, tiny_model_dir, qwen_tokenizer,
                                                                  tmp_path, monkeypatch):
    """One RolloutSettings shape under ``rollout:`` everywhere: the object a training, evaluation or serve config
    holds is the very one its rollout engine runs with."""
    import agentic_rag.rollout
    from agentic_rag.evaluation.config import EvalConfigError
    from agentic_rag.evaluation.config import config_from_dict as eval_config
    from agentic_rag.evaluation.runner import run_evaluation
    from agentic_rag.serving.agent import ChatAgent
    from agentic_rag.serving.config import config_for
    from agentic_rag.settings import SettingsError
    from agentic_rag.training import trainer as trainer_module
    from agentic_rag.training.config import ConfigError, config_from_dict, load_config
    from agentic_rag.training.train import run
    from test_launch import config

    built = []

    class Spy(AgentRollout):  # the engine as each path builds it: recorded, then the run stops there
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            built.append(self.settings)
            raise _EngineBuilt

    # training: cfg.rollout -> the trainer -> the engine of its first rollout
    train = {"model": {"name_or_path": str(tiny_model_dir)},
             "data": {"train_file": str(world_dir / "world" / "train.jsonl")},
             "search": {"index": str(world_dir / "index")}}
    assert config_from_dict(train, env={}).rollout.on_search_limit == "observe"
    with pytest.raises(ConfigError, match="rollout.on_search_limit must be one of observe, end; got 'stop'"):
        config_from_dict({**train, "rollout": {"on_search_limit": "stop"}}, env={})
    cfg = load_config(config(tmp_path, tiny_model_dir, world_dir, rollout__on_search_limit="end"), env={})
    assert cfg.rollout.on_search_limit == "end"
    monkeypatch.setattr(trainer_module, "AgentRollout", Spy)
    with pytest.raises(_EngineBuilt):
        run(cfg)
    assert built[-1] is cfg.rollout

    # evaluation: cfg.rollout -> the runner's engine
    evaluation = {"dataset": {"path": str(world_dir / "world" / "test.jsonl"), "limit": 2},
                  "policy": {"model": str(tiny_model_dir)}, "search": {"index": str(world_dir / "index")},
                  "rollout": {"on_search_limit": "end"}, "output_dir": str(tmp_path / "eval")}
    with pytest.raises(EvalConfigError, match="rollout.on_search_limit must be one of observe, end; got 'stop'"):
        eval_config({**evaluation, "rollout": {"on_search_limit": "stop"}})
    ecfg = eval_config(evaluation)
    assert ecfg.rollout.on_search_limit == "end"
    monkeypatch.setattr(agentic_rag.rollout, "AgentRollout", Spy)
    with pytest.raises(_EngineBuilt):
        run_evaluation(ecfg, policy=ScriptedPolicy(qwen_tokenizer, {}), tokenizer=qwen_tokenizer, searcher=OneHit(),
                       progress=False)
    assert built[-1] is ecfg.rollout

    # serving: the config's rollout -> the agent -> the engine of each request
    base = [f"model.model={tiny_model_dir}", f"search.index={world_dir / 'index'}"]
    with pytest.raises(SettingsError, match=r"rollout.on_search_limit must be one of observe, end; got 'stop' "
                                            r"\(from --set rollout.on_search_limit\)"):
        config_for([*base, "rollout.on_search_limit=stop"])
    served = config_for([*base, "rollout.on_search_limit=end"])
    assert served.rollout.on_search_limit == "end"
    agent = ChatAgent.load(served, policy=ScriptedPolicy(qwen_tokenizer, {}), tokenizer=qwen_tokenizer,
                           searcher=OneHit())
    assert agent.settings is served.rollout
    engine = agent.engine()
    assert engine.settings is served.rollout and engine.settings.on_search_limit == "end"
    direct = ChatAgent(ScriptedPolicy(qwen_tokenizer, {}), qwen_tokenizer, OneHit(), served.rollout, served.prompt)
    assert direct.engine().settings is served.rollout
    assert len(built) == 2  # the serving engines are real ones: the spies were only the two runs'


def test_backtrack_passes_over_the_search_limit_notice(qwen_tokenizer):
    tok = qwen_tokenizer
    limits = RolloutSettings(max_searches=1, passages_per_search=1)
    t, seen, _ = play(tok, [S("q1"), S("q2"), B("b1"), "<answer>a</answer>"], limits)
    assert seen[3] == back("b1")  # the refused search was no search step: the real one is abandoned


# ---------------------------------------------------------------------------- training-way re-scoring


def test_logprobs_of_stacked_backtracks_equal_the_training_way_rescoring(qwen_tokenizer, tiny_qwen):
    """Reuses test_rollout's forced real-model policy: the log-probs recorded while decoding a trajectory with
    backtrack x2, a summary and a backtrack after it (and, beside it, one with a refused backtrack and a search
    past the limit) equal the tree-masked single-pass re-scoring."""
    tok = qwen_tokenizer
    script = ["<think>look</think>" + S("alpha"), S("beta"), B("off"), B("also off"), S("gamma"),
              "<summary>gamma</summary>", S("delta"), B("no"), "<answer>g</answer>"]
    other = [B("none yet"), S("eps"), S("zeta"), S("eta"), S("theta"), S("iota"), "<answer>e</answer>"]
    scripts = {"Stacked?": script, "Other question?": other}
    policy = ForcedHFPolicy(tiny_qwen, tok, scripts)
    engine = AgentRollout(policy, tok, FakeSearcher(), RolloutSettings(passages_per_search=1, max_turns=12,
                                                                            max_searches=4))
    trajs = engine.run(prompts(tok, list(scripts)), list(scripts))
    assert [t.finish_reason for t in trajs] == ["answer", "answer"]
    t = trajs[0]
    assert len(dropped(t)) == 3 and not any(e["type"] in ("error", "limit") for e in t.events)
    kinds = [s.kind for s in trajs[1].segments if s.source == ENV]
    assert kinds == ["notice"] + ["observation"] * 4 + ["notice"] and trajs[1].answer == "e"
    gamma = next(i for i, s in enumerate(t.segments) if "gamma" in tok.decode(t.completion_ids[s.start:s.end]))
    context = tok.decode([x for i in t.path(gamma) for x in t.completion_ids[t.segments[i].start:t.segments[i].end]])
    assert context == back("also off") + S("gamma")  # the second backtrack took the alpha step too
    recomputed = completion_logprobs(tiny_qwen, trajs, pad_id=tok.pad_token_id)
    for traj, lp in zip(trajs, recomputed, strict=True):
        model = torch.tensor(traj.env_mask, dtype=torch.bool)
        rollout = torch.tensor(traj.logprobs)
        assert torch.allclose(rollout[model], lp[model], atol=1e-4), (rollout[model] - lp[model]).abs().max()
