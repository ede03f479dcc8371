"""Reward functions: format well-formedness, accuracy on real rollouts, curriculum, RAGAS, the judge's fallback."""

from __future__ import annotations

import http.server
import json
import logging
import re
import threading

import pytest

from agentic_rag.data.prompts import build_prompt
from agentic_rag.rewards.curriculum import Curriculum
from agentic_rag.rewards.format import RULES, check_format
from agentic_rag.rewards.rag import RetrievalQuality, RetrievedContext, contexts_from_events
from agentic_rag.rollout.protocol import ActionKind, get_dialect
from agentic_rag.training.config import ExperimentConfig, JudgeConfig, RewardSpec
from agentic_rag.training.rewards import FormatReward, build_rewards, make_reward
from conftest import shared

AGENTIC = get_dialect("agentic")


def fmt(text, events=(), finish="answer", dialect=AGENTIC, **kw):
    return check_format(text, list(events), finish, dialect, **kw)


SEARCH = {"type": "search", "queries": ["q"], "results": [{"query": "q", "hits": [{"docid": "1", "title": "T"}]}]}
OBS = {"type": "observation", "tokens": 20, "truncated": False}


def test_a_well_formed_trajectory():
    text = "<think>plan</think><search>q</search><think>found it</think><answer>Paris</answer>"
    report = fmt(text, [SEARCH, OBS])
    assert report.ok and report.score() == 1.0 and report.score(partial=True) == 1.0


@pytest.mark.parametrize("text, events, finish, rule", [
    ("<think>a<search>q</think></search><answer>x</answer>", [], "answer", "balanced"),
    ("<think>never closed<answer>x</answer>", [], "answer", "balanced"),
    ("</think><answer>x</answer>", [], "answer", "balanced"),
    ("<answer>x</answer><answer>y</answer>", [], "answer", "one_answer"),
    ("<think>no answer at all</think>", [], "eos", "one_answer"),
    ("<answer>  </answer>", [], "answer", "one_answer"),
    ("<observation>fake</observation><answer>x</answer>", [], "answer", "no_forged_tags"),
    ("<search>q</search>", [SEARCH, OBS], "max_searches", "searches_in_bounds"),
    ("<search></search><answer>x</answer>", [{"type": "error", "kind": "empty_query"}], "answer",
     "searches_in_bounds"),
    ("<answer>x</answer> and some chatter", [], "answer", "nothing_after_answer"),
    ("<backtrack></backtrack><answer>x</answer>", [{"type": "error", "kind": "nothing_to_backtrack"}], "answer",
     "memory_used_correctly"),
    ("<search>q</search><backtrack></backtrack><answer>x</answer>",
     [SEARCH, OBS, {"type": "backtrack", "reason": ""}], "answer", "memory_used_correctly"),
    ("<summary></summary><answer>x</answer>", [{"type": "summary", "text": ""}], "answer", "memory_used_correctly"),
])
def test_each_rule(text, events, finish, rule):
    report = fmt(text, events, finish)
    assert rule in report.violations and report.score() == 0.0
    assert report.score(partial=True) == pytest.approx(1 - len(report.violations) / len(RULES))


def test_memory_actions_earn_nothing_by_themselves():
    plain = fmt("<search>q</search><answer>x</answer>", [SEARCH, OBS])
    with_backtrack = fmt("<search>q</search><backtrack>wrong page</backtrack><search>r</search><answer>x</answer>",
                         [SEARCH, OBS, {"type": "backtrack", "reason": "wrong page"}, SEARCH, OBS])
    assert plain.score() == with_backtrack.score() == 1.0  # correct use costs nothing and pays nothing extra


def r1_view(row, dialect):
    """A trajectory view from a real R1-Searcher output: the model's text without the documents it was shown."""
    text = row["gen_text_store"]
    model_text = re.sub(r"<\|begin_of_documents\|>.*?<\|end_of_documents\|>", "", text, flags=re.S)
    events, rest = [], model_text
    while (action := dialect.parse_turn(rest)).kind is ActionKind.SEARCH:
        events.append({"type": "search", "queries": list(action.queries), "results": [{"hits": [{"title": "x"}]}]})
        rest = rest[rest.find(dialect.tool_tags[0].close) + len(dialect.tool_tags[0].close):]
    return {"question": row["question"], "answer": dialect.extract_answer(text), "model_text": model_text,
            "events": events, "finish_reason": "answer", "prompt_tail": "Assistant: <think>"}


@pytest.fixture(scope="module")
def r1_rows():
    return [json.loads(line) for line in shared("r1-searcher/eval_results/hotpotqa_llama.jsonl").open()]


def test_rewards_on_real_r1_searcher_rollouts(r1_rows):
    d = get_dialect("r1-searcher")
    views = [r1_view(r, d) for r in r1_rows]
    answers = [[r["answer"]] for r in r1_rows]
    cfg = ExperimentConfig()
    cfg.rollout.dialect = "r1-searcher"
    cover = make_reward(RewardSpec("cover_em"), cfg)(None, None, None, trajectory=views, answers=answers)
    f1 = make_reward(RewardSpec("f1"), cfg)(None, None, None, trajectory=views, answers=answers)
    em = make_reward(RewardSpec("em"), cfg)(None, None, None, trajectory=views, answers=answers)
    assert sum(cover) / len(cover) == pytest.approx(0.634, abs=1e-3)  # the paper's ACC_R-style number
    assert sum(em) / len(em) == pytest.approx(0.582, abs=1e-3)
    assert 0.65 < sum(f1) / len(f1) < 0.75
    # the released model's output is well-formed under its own dialect (its prompt opened <think>)
    fr = FormatReward("r1-searcher")
    scores = fr(None, None, None, trajectory=views)
    assert sum(scores) / len(scores) > 0.95
    # ... and a real output with its documents left in is a forgery of the environment's tags
    forged = dict(views[0], model_text=r1_rows[0]["gen_text_store"])
    assert "no_forged_tags" in fr.report(forged).violations
    assert sum(make_reward(RewardSpec("retrieval"), cfg)(None, None, None, trajectory=views)) == len(views)


def curriculum_view(text, events, answer, finish="answer"):
    return {"question": "Capital of France?", "answer": answer, "model_text": text, "events": events,
            "finish_reason": finish}


NO_HITS = {"type": "search", "queries": ["q"], "results": [{"query": "q", "hits": [], "cut": []}]}
FAILED_CALL = {"type": "error", "kind": "search_failed", "message": "index unreachable", "queries": ["q"]}
# hand-written trajectories: (view, stage-1 reward, stage-2 reward) under R1-Searcher's curriculum
CURRICULUM_CASES = [
    # well formed, one search call: stage 1 format 0.5 + retrieval 0.5; stage 2 F1 1 + format 0
    (curriculum_view("<think>a</think><search>q</search><think>b</think><answer>Paris</answer>", [SEARCH, OBS],
                     "Paris"), 1.0, 1.0),
    # well formed without searching: format 0.5 only; stage 2 does not ask for retrieval
    (curriculum_view("<think>I know it</think><answer>Paris</answer>", [], "Paris"), 0.5, 1.0),
    # malformed (text after the answer) but a search call, though it found nothing: retrieval 0.5;
    # stage 2: F1("Paris France", "Paris") = 2/3, plus the format penalty -2
    (curriculum_view("<search>q</search><answer>Paris France</answer> chatter", [NO_HITS, OBS], "Paris France"),
     0.5, 2 / 3 - 2),
    # malformed, no answer, no search: nothing in stage 1; F1 0 - 2 in stage 2
    (curriculum_view("<think>rambling", [], None, finish="eos"), 0.0, -2.0),
    # a search call that failed outright retrieved nothing: no retrieval call; the trajectory is well formed
    (curriculum_view("<search>q</search><answer>Paris</answer>", [FAILED_CALL, OBS], "Paris"), 0.5, 1.0),
]


@pytest.mark.parametrize("view, stage1, stage2", CURRICULUM_CASES)
def test_curriculum_pays_r1_searchers_rewards_on_hand_written_trajectories(view, stage1, stage2):
    """R1-Searcher (Song et al. 2025, sec. 2.2): stage 1 = R_format (0.5 / 0) + R_retrieval (0.5 when the model
    searched at least once); stage 2 = R_answer (F1) + R'_format (0 / -2), so malformed trajectories are still
    ranked by their answer."""
    cfg = ExperimentConfig()
    cfg.curriculum.enabled, cfg.curriculum.stage2_step = True, 10
    reward = build_rewards(cfg)[0][0]
    state = type("S", (), {"global_step": 0})
    kw = {"trajectory": [view], "answers": [["Paris"]], "trainer_state": state}
    assert reward(None, None, None, **kw) == [pytest.approx(stage1)]
    state.global_step = 10
    assert reward(None, None, None, **kw) == [pytest.approx(stage2)]


def test_curriculum_golden_values():
    c = Curriculum(stage2_step=10)
    assert (c.format_reward, c.retrieval_bonus, c.format_penalty) == (0.5, 0.5, -2.0)  # the paper's values
    assert c.reward(0, format_ok=True, searches=2, answer_f1=0.3) == 1.0
    assert c.reward(9, format_ok=False, searches=1, answer_f1=0.3) == 0.5
    assert c.reward(9, format_ok=True, searches=0, answer_f1=1.0) == 0.5
    assert c.reward(10, format_ok=True, searches=1, answer_f1=0.3) == 0.3
    assert c.reward(11, format_ok=False, searches=0, answer_f1=1.0) == -1.0  # F1 + (-2), not a flat -2
    assert c.reward(11, format_ok=False, searches=3, answer_f1=0.25) == -1.75
    cfg = ExperimentConfig()
    cfg.curriculum.enabled = True
    funcs, weights = build_rewards(cfg)
    assert [f.__name__ for f in funcs] == ["curriculum"] and weights == [1.0]


def test_curriculum_fixed_stage_pays_that_stage_at_every_step():
    two = Curriculum(stage2_step=10, fixed_stage=2)
    assert two.stage(0) == 2 and two.reward(0, format_ok=True, searches=1, answer_f1=0.3) == 0.3
    assert Curriculum(stage2_step=10, fixed_stage=1).stage(500) == 1
    with pytest.raises(ValueError, match="fixed_stage must be 1, 2 or None"):
        Curriculum(fixed_stage=3)
    # through the training reward: a well-formed, retrieving trajectory at step 0
    cfg = ExperimentConfig()
    cfg.curriculum.enabled, cfg.curriculum.stage2_step = True, 100
    view = CURRICULUM_CASES[0][0]
    logged = {}
    kw = {"trajectory": [view], "answers": [["Paris"]], "trainer_state": type("S", (), {"global_step": 0}),
          "log_metric": lambda k, v: logged.update({k: v})}
    assert build_rewards(cfg)[0][0](None, None, None, **kw) == [1.0]  # stage 1: format 0.5 + retrieval 0.5
    assert logged["curriculum/stage"] == 1.0
    cfg.curriculum.stage = 2
    assert build_rewards(cfg)[0][0](None, None, None, **kw) == [1.0]  # stage 2: the answer's F1 + 0
    assert logged["curriculum/stage"] == 2.0


def test_ragas_non_llm_metrics_golden():
    q = RetrievalQuality("id_recall")
    items = [RetrievedContext("q", "a", ["A", "B", "C"], ["", "", ""], ["A", "D"]),
             RetrievedContext("q", "a", [], [], ["A"]),
             RetrievedContext("q", "a", ["A"], [""], [])]
    assert q.score_batch(items) == [0.5, 0.0, None]
    p = RetrievalQuality("id_precision")
    assert p.score_batch(items[:1]) == [pytest.approx(1 / 3)]
    events = [{"type": "search", "results": [{"hits": [{"title": "A", "text": "alpha"},
                                                        {"title": "B", "text": "beta"}]}]},
              {"type": "search", "results": [{"hits": [{"title": "A", "text": "alpha"}]}]}]
    ctx = contexts_from_events(events, "q", "ans", ["A"])
    assert ctx.titles == ["A", "B"] and ctx.texts == ["alpha", "beta"]


class _ChunkedSearcher:
    """A chunked corpus: two chunks of one article (same title, their own docids), and one long passage."""

    LONG = "Start " + "lorem ipsum " * 100 + "end."  # 1,210 characters (about 200 tokens): past the old cut

    def batch_search(self, queries, k=10):
        from agentic_rag.search import Hit

        return [[Hit("henriette#0", "Henriette of France", "Henriette was born at Versailles.", 3.0),
                 Hit("henriette#1", "Henriette of France", "She died of smallpox in 1752.", 2.0),
                 Hit("long#0", "Long", self.LONG, 1.0)] for _ in queries]

    def search(self, query, k=10):
        return self.batch_search([query], k)[0]


def _shown(tok, t):
    """What the observations showed the model, as one text."""
    from agentic_rag.rollout.trajectory import ENV

    return "".join(tok.decode(t.completion_ids[s.start:s.end]) for s in t.segments if s.source == ENV)


@pytest.mark.parametrize("budget", [1000, 60])
def test_ragas_judges_the_passages_as_the_observation_showed_them(qwen_tokenizer, budget):
    """Every chunk the model was shown is judged (not a title's first chunk only), with exactly the text the
    observation held: all of a long passage when it was shown whole, the kept part when it was cut."""
    from agentic_rag.rollout import AgentRollout, RolloutSettings
    from agentic_rag.rollout.scripted import ScriptedPolicy

    tok = qwen_tokenizer
    limits = RolloutSettings(max_observation_tokens=budget, max_completion_tokens=2048)
    policy = ScriptedPolicy(tok, {"Henriette?": ["<search>Henriette</search>", "<answer>1752</answer>"]})
    (t,) = AgentRollout(policy, tok, _ChunkedSearcher(), limits).run(
        [build_prompt(tok, "Henriette?")], ["Henriette?"])
    ctx = contexts_from_events(t.events, "Henriette?", t.answer, ["Henriette of France"])
    shown = _shown(tok, t)
    assert ctx.texts and all(text in shown for text in ctx.texts)
    if budget == 1000:  # everything fits: both chunks and the whole long passage
        assert ctx.texts == ["Henriette was born at Versailles.", "She died of smallpox in 1752.",
                             _ChunkedSearcher.LONG]
        assert ctx.titles == ["Henriette of France", "Long"]  # the ID metrics compare titles, once each
    else:  # cut partway through the long passage: its judged text ends where the observation did
        assert ctx.texts[:2] == ["Henriette was born at Versailles.", "She died of smallpox in 1752."]
        assert len(ctx.texts) == 3 and _ChunkedSearcher.LONG.startswith(ctx.texts[2])
        assert 0 < len(ctx.texts[2]) < len(_ChunkedSearcher.LONG)


def test_ragas_contexts_are_deduplicated_by_docid_then_text():
    hit = {"docid": "a#0", "title": "A", "text": "alpha"}
    events = [{"type": "search", "results": [{"hits": [hit, {"docid": "a#1", "title": "A", "text": "alpha two"}]}]},
              {"type": "search", "results": [{"hits": [hit, {"title": "B", "text": "beta"},
                                                        {"title": "C", "text": "beta"}]}]}]
    ctx = contexts_from_events(events, "q", "ans", ["A"])
    assert ctx.texts == ["alpha", "alpha two", "beta"]  # a#0 once; "beta" (no docid) once by its text
    assert ctx.titles == ["A", "B", "C"]


def test_ragas_says_once_at_start_which_scorer_runs(fake_llm, caplog, monkeypatch):
    cfg = ExperimentConfig()
    cfg.judge = JudgeConfig(base_url=fake_llm, model="judge-7b", timeout_s=5, api_key_env="TEST_RAGAS_KEY")
    monkeypatch.delenv("TEST_RAGAS_KEY", raising=False)
    with caplog.at_level(logging.INFO, logger="agentic_rag"):
        make_reward(RewardSpec("ragas", params={"metric": "context_relevance"}), cfg)
    lines = [r.getMessage() for r in caplog.records if "RAGAS reward" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"context_relevance judged by judge-7b at {fake_llm}" in lines[0]
    assert "TEST_RAGAS_KEY is unset" in lines[0] and "placeholder key 'EMPTY'" in lines[0]
    assert "failed call is scored by id_recall" in lines[0]
    caplog.clear()
    monkeypatch.setenv("TEST_RAGAS_KEY", "sk-test")
    with caplog.at_level(logging.INFO, logger="agentic_rag"):
        make_reward(RewardSpec("ragas", params={"metric": "faithfulness", "fallback": "id_precision"}), cfg)
        make_reward(RewardSpec("ragas"), cfg)
    lines = [r.getMessage() for r in caplog.records if "RAGAS reward" in r.getMessage()]
    assert "faithfulness judged by judge-7b" in lines[0] and "API key from TEST_RAGAS_KEY" in lines[0]
    assert "sk-test" not in lines[0]
    assert "id_recall" in lines[1] and "no LLM" in lines[1]


# ------------------------------------------------------------------------------------------ cover-EM


def test_cover_em_tokens_is_a_training_reward():
    cfg = ExperimentConfig()
    reward = make_reward(RewardSpec("cover_em_tokens"), cfg)
    views = [{"answer": a} for a in ("nothing", "no", "yes it is", "Paris or Lyon", "It was Paris.", None)]
    golds = [["no"], ["no"], ["yes"], ["Paris"], ["Paris"], ["Paris"]]
    assert reward.__name__ == "cover_em_tokens"
    assert reward(None, None, None, trajectory=views, answers=golds) == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    cover = make_reward(RewardSpec("cover_em"), cfg)(None, None, None, trajectory=views, answers=golds)
    assert cover == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    strict = make_reward(RewardSpec("cover_em_tokens", params={"max_extra_tokens": 1}), cfg)
    assert strict(None, None, None, trajectory=views, answers=golds)[4] == 0.0  # "it was paris": 2 extra


def _config(rewards, **extra):
    from agentic_rag.training.config import config_from_dict

    data = {"model": {"name_or_path": "m"}, "data": {"train_file": "t.jsonl"}, "search": {"index": "i"},
            "rewards": rewards, **extra}
    return config_from_dict(data, env={}, check_files=False)


def test_cover_em_as_a_training_reward_warns_once_at_the_config_check(caplog):
    with caplog.at_level(logging.WARNING, logger="agentic_rag"):
        _config([{"name": "cover_em"}, {"name": "format"}])
    found = [r.getMessage() for r in caplog.records if "cover_em" in r.getMessage()]
    assert len(found) == 1, found
    assert "rewards[0] is cover_em" in found[0] and '"nothing" covers "no"' in found[0]
    assert "cover_em_tokens" in found[0]  # the fix
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agentic_rag"):
        _config([{"name": "cover_em_tokens", "params": {"max_extra_tokens": 2}}, {"name": "format"}])
    assert not [r for r in caplog.records if "cover_em" in r.getMessage()]
    from agentic_rag.training.config import ConfigError

    with pytest.raises(ConfigError, match="rewards.0..params.max_extra_tokens must be int"):
        _config([{"name": "cover_em_tokens", "params": {"max_extra_tokens": "two"}}])
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.params\.max_extra_tokens must be >= 0, got -1"):
        _config([{"name": "cover_em_tokens", "params": {"max_extra_tokens": -1}}])


class _FakeLLM(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint: answers every call with ``reply`` (or fails with ``status``)."""

    reply = '{"rating": 2}'
    status = 200
    calls = 0

    def do_POST(self):  # noqa: N802
        type(self).calls += 1
        self.rfile.read(int(self.headers["content-length"]))
        if self.status != 200:
            self.send_response(self.status)
            self.end_headers()
            return
        body = {"id": "x", "object": "chat.completion", "created": 0, "model": "judge",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": type(self).reply}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *a):
        pass


@pytest.fixture()
def fake_llm():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeLLM)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _FakeLLM.reply, _FakeLLM.status, _FakeLLM.calls = '{"rating": 2}', 200, 0
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_ragas_llm_metric_through_an_openai_compatible_endpoint(fake_llm):
    from agentic_rag.rewards.rag import LLMEndpoint

    q = RetrievalQuality("context_relevance", LLMEndpoint(fake_llm, "judge", timeout_s=5))
    items = [RetrievedContext("Who?", "A", ["T", "U"], ["some passage", "another"], ["T", "V"]),
             RetrievedContext("Who?", "A", [], [], ["T"]),
             RetrievedContext("Who?", "A", ["T"], ["some passage"], [])]
    assert q.score_batch(items) == [1.0, None, 1.0]  # None: nothing retrieved, nothing to judge
    assert _FakeLLM.calls >= 2 and q.failures == 0 and q.last_failures == 0
    _FakeLLM.status = 400  # a client error: failed at once, no retries
    # a failed call is counted and scored by the fallback (id_recall: 1 of 2 gold titles), never "not applicable";
    # None only where the fallback itself does not apply (no gold titles)
    assert q.score_batch(items) == [0.5, None, None]
    assert q.failures == 2 and q.last_failures == 2
    p = RetrievalQuality("context_relevance", LLMEndpoint(fake_llm, "judge", timeout_s=5), fallback="id_precision")
    assert p.score_batch(items[:1]) == [0.5] and p.last_failures == 1
    with pytest.raises(ValueError, match="needs a judge endpoint"):
        RetrievalQuality("faithfulness")
    with pytest.raises(ValueError, match="fallback must be one of id_recall, id_precision"):
        RetrievalQuality("faithfulness", LLMEndpoint(fake_llm, "judge"), fallback="text_recall")


def test_ragas_reward_falls_back_and_says_so(fake_llm, caplog):
    cfg = ExperimentConfig()
    cfg.judge = JudgeConfig(base_url=fake_llm, model="judge", timeout_s=5)
    reward = make_reward(RewardSpec("ragas", params={"metric": "context_relevance"}), cfg)
    hits = [{"title": "T", "text": "about T"}, {"title": "U", "text": "about U"}]
    views = [{"question": "Who?", "answer": "A", "events": [{"type": "search", "results": [{"hits": hits}]}]},
             {"question": "Who?", "answer": "A", "events": []}]
    logged = {}
    kw = {"trajectory": views, "gold_titles": [["T", "V"], ["T"]], "log_metric": lambda k, v: logged.update({k: v})}
    assert reward(None, None, None, **kw) == [1.0, None]
    assert logged["rewards/ragas/failures"] == 0.0 and "RAGAS" not in caplog.text
    _FakeLLM.status = 400  # a client error: failed at once, no retries
    assert reward(None, None, None, **kw) == [0.5, None]  # id_recall decides instead
    assert logged["rewards/ragas/failures"] == 1.0
    assert "RAGAS context_relevance failed on 1 of 2 completions; scored them with id_recall instead" in caplog.text


def test_judge_reward_falls_back_and_says_so(fake_llm, caplog):
    cfg = ExperimentConfig()
    cfg.judge = JudgeConfig(base_url=fake_llm, model="judge", timeout_s=5, fallback="cover_em")
    reward = make_reward(RewardSpec("judge"), cfg)
    views = [{"question": "Capital?", "answer": "Paris, France"}, {"question": "Capital?", "answer": "Lyon"}]
    logged = {}
    kw = {"trajectory": views, "answers": [["Paris"], ["Paris"]], "log_metric": lambda k, v: logged.update({k: v})}
    _FakeLLM.reply = "yes"
    assert reward(None, None, None, **kw) == [1.0, 1.0]
    assert logged["rewards/judge/failures"] == 0
    _FakeLLM.reply = "I am not sure what you mean"  # garbage: no verdict
    assert reward(None, None, None, **kw) == [1.0, 0.0]  # cover_em decides instead, never a silent 0
    assert logged["rewards/judge/failures"] == 2
    assert "LLM judge failed on 2 of 2 completions; scored them with cover_em" in caplog.text
    _FakeLLM.status = 500
    assert reward(None, None, None, **kw) == [1.0, 0.0]


# ------------------------------------------------------------------------------------------- the registry


def test_every_reward_name_of_the_registry_builds_and_no_builder_lacks_a_name():
    from agentic_rag.rewards.registry import get_scorer, reward_names
    from agentic_rag.training.rewards import BUILDERS

    # an answer comparison (a registry scorer with ``compare``) is built from the registry alone; every other
    # reward has exactly one builder, and no builder is for a name the registry lacks or already builds
    comparisons = {n for n in reward_names() if get_scorer(n).compare}
    assert comparisons >= {"em", "f1", "cover_em", "cover_em_tokens"}
    assert set(BUILDERS) == set(reward_names()) - comparisons
    cfg = ExperimentConfig()
    for name in reward_names():
        if name in ("judge", "ragas"):  # they open an LLM endpoint or start the accelerate state
            continue
        assert make_reward(RewardSpec(name), cfg).__name__ == name


def test_a_registry_reward_without_a_builder_fails_loudly(monkeypatch):
    from agentic_rag.training import rewards

    monkeypatch.delitem(rewards.BUILDERS, "retrieval")
    with pytest.raises(NotImplementedError, match="'retrieval' is in the scorer registry .* no builder"):
        make_reward(RewardSpec("retrieval"), ExperimentConfig())


def test_an_unknown_reward_names_the_known_ones_and_a_renamed_one_its_new_name():
    with pytest.raises(ValueError, match=r"unknown reward 'cover-em' \(did you mean 'cover_em'\?\); known rewards: "
                                         r"em, f1, cover_em, "):
        make_reward(RewardSpec("cover-em"), ExperimentConfig())
    with pytest.raises(ValueError, match="unknown reward 'well_formed'"):  # an evaluation metric, not a reward
        make_reward(RewardSpec("well_formed"), ExperimentConfig())
    with pytest.raises(ValueError, match=r"unknown reward 'exact_match' \('exact_match' was renamed 'em'\)"):
        make_reward(RewardSpec("exact_match"), ExperimentConfig())
