"""Evaluation for Search-R1's Table 2 in miniature: several samples per question (pass@n, the mixed share, resume),
the naive-RAG and closed-book modes (exact prompts), the random-passage ablation of search, closed book under the
search-failure threshold, and the breakdown by question kind and type (summary and report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rag.cli import main
from agentic_rag.data.prompts import build_prompt
from agentic_rag.data.questions import read_questions
from agentic_rag.evaluation.config import EvalConfigError, config_from_dict
from agentic_rag.evaluation.modes import MODE_PROMPTS, user_message
from agentic_rag.evaluation.runner import run_evaluation
from agentic_rag.rollout.policy import STOP_EOS, Generation
from agentic_rag.rollout.protocol import get_dialect
from agentic_rag.search.types import Hit
from conftest import shared

DEV = "tts-project/2wikimultihopqa_dev500.json"
WRONG = "zzz qqq"


def dev_rows(n: int) -> list[dict]:
    return json.loads(shared(DEV).read_text())[:n]


class TablePolicy:
    """Plays a table of turns keyed by question: the n-th context it is given that holds a question (a sample's
    turn) gets that question's n-th turn (the last one again past the end). Records every context it is given."""

    def __init__(self, tokenizer, turns: dict[str, list[str]]):
        self.tok, self.turns = tokenizer, turns
        self.given: dict[str, int] = {}
        self.contexts: list[list[int]] = []

    def generate(self, contexts, *, stop_strings, max_new_tokens):
        out = []
        for context in contexts:
            self.contexts.append(list(context))
            text = self.tok.decode(list(context), skip_special_tokens=False)
            key = max((q for q in self.turns if q in text), key=len)
            n = self.given.get(key, 0)
            self.given[key] = n + 1
            turn = self.turns[key][min(n, len(self.turns[key]) - 1)]
            stop = next((s for s in stop_strings if turn.endswith(s)), STOP_EOS)
            out.append(Generation(self.tok(turn, add_special_tokens=False)["input_ids"], None, stop))
        return out


class OneHitSearcher:
    """Every query finds one fixed passage (no index needed)."""

    def search(self, query, k=10):
        return [Hit("d1", "A title", "Some passage text.", 1.0)]

    def batch_search(self, queries, k=10):
        return [self.search(q, k) for q in queries]


def config(tmp_path: Path, path: Path | str, **over):
    """A run over ``path`` with a policy and tokenizer given in code (no model is loaded)."""
    data = {"dataset": {"path": str(path)}, "policy": {"type": "local", "model": "given-in-code"},
            "search": {"index": "none"}, "rollout": {"max_tokens_per_turn": 64, "max_completion_tokens": 512},
            "batch_size": 8, "output_dir": str(tmp_path / "run")}
    for key, value in over.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return config_from_dict(data, check_files=False)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ samples


def test_samples_give_exact_pass_at_n_mean_and_mixed_share_and_resume(tmp_path, qwen_tokenizer):
    rows = dev_rows(3)
    gold = [r["answer"] for r in rows]
    # question 0: right twice (pass, not mixed); 1: wrong then right (pass, mixed); 2: wrong twice (fail)
    per_sample = [[gold[0], gold[0]], [WRONG, gold[1]], [WRONG, WRONG]]
    turns = {r["question"]: [f"<answer>{a}</answer>" for a in answers] for r, answers in zip(rows, per_sample,
                                                                                             strict=True)}
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 3}, samples=2, sampling={"temperature": 1.0},
                 batch_size=1)
    policy = TablePolicy(qwen_tokenizer, turns)

    def stop_after_first(index, recs):
        if index == 0:
            raise KeyboardInterrupt  # interrupted after the first question's batch

    with pytest.raises(KeyboardInterrupt):
        run_evaluation(cfg, policy=policy, tokenizer=qwen_tokenizer, progress=False, on_batch=stop_after_first)
    first = records(tmp_path / "run")
    assert len(first) == 1 and len(first[0]["samples"]) == 2  # written once both samples were done
    summary = run_evaluation(cfg, policy=policy, tokenizer=qwen_tokenizer, progress=False)
    # each question was rolled out exactly twice (its two samples, side by side), nothing redone on resume
    assert policy.given == {r["question"]: 2 for r in rows} and len(policy.contexts) == 6
    recs = records(tmp_path / "run")
    assert [r["id"] for r in recs] == [r["id"] for r in rows]
    # the record is the first sample's; every sample is listed
    assert [r["prediction"] for r in recs] == [gold[0], WRONG, WRONG]
    assert [[s["prediction"] for s in r["samples"]] for r in recs] == per_sample
    assert [[s["metrics"]["em"] for s in r["samples"]] for r in recs] == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    assert recs[0]["samples"][0]["metrics"] == recs[0]["metrics"]
    s = summary["samples"]
    assert s["n"] == 2 and s["mixed_on"] == "em"
    assert s["pass_at_n"]["em"] == pytest.approx(2 / 3) and s["pass_at_n"]["cover_em"] == pytest.approx(2 / 3)
    assert s["mean_over_samples"]["em"] == pytest.approx(3 / 6)
    assert s["mixed_share"] == pytest.approx(1 / 3)
    assert summary["metrics"]["em"] == pytest.approx(1 / 3)  # first samples only, as before
    assert summary["mode"] == "agent" and summary["n"] == 3
    out = tmp_path / "report.md"
    assert main(["eval-report", "--runs", str(tmp_path / "run"), "--names", "sampled", "--out", str(out)]) == 0
    md = out.read_text()
    assert ("| run | samples/q | pass@n EM | pass@n F1 | pass@n cover-EM (ACC_R) | mean EM | mean F1 | "
            "mean cover-EM (ACC_R) | mixed share |") in md
    assert "| sampled | 2 | 0.667 | 0.667 | 0.667 | 0.500 | 0.500 | 0.500 | 0.333 |" in md


def test_each_sample_lists_its_own_queries(tmp_path, qwen_tokenizer):
    """Rejection sampling replays a right sample's searches: each sample records the queries it made."""
    row = dev_rows(1)[0]
    # side by side: sample 0 gets the first turn (a search), sample 1 the second (an answer); then sample 0 answers
    turns = {row["question"]: ["<search>alpha query</search>", f"<answer>{WRONG}</answer>",
                               f"<answer>{row['answer']}</answer>"]}
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 1}, samples=2, sampling={"temperature": 1.0},
                 search={"index": ""})
    run_evaluation(cfg, policy=TablePolicy(qwen_tokenizer, turns), tokenizer=qwen_tokenizer,
                   searcher=OneHitSearcher(), progress=False)
    (rec,) = records(tmp_path / "run")
    assert [s["queries"] for s in rec["samples"]] == [["alpha query"], []]
    assert [s["metrics"]["em"] for s in rec["samples"]] == [1.0, 0.0]
    assert rec["queries"] == ["alpha query"]  # the record is the first sample's


def test_samples_need_a_temperature_and_reach_the_command_line(tmp_path, capsys):
    with pytest.raises(EvalConfigError, match=r"samples is 3 but sampling.temperature is 0 \(greedy\)"):
        config(tmp_path, shared(DEV), samples=3)
    with pytest.raises(EvalConfigError, match="samples must be >= 1"):
        config(tmp_path, shared(DEV), samples=0, sampling={"temperature": 1.0})
    assert main(["eval", "--model", "m", "--questions", str(shared(DEV)), "--index", "none", "--samples", "4",
                 "--mode", "direct", "--set", "sampling.temperature=0.7", "--describe"]) == 0
    described = capsys.readouterr().out.splitlines()
    assert ["samples", "4"] in [line.split()[:2] for line in described]
    assert ["mode", "'direct'"] in [line.split()[:2] for line in described]


def test_a_tiny_model_draws_its_samples_in_one_batch(tmp_path, tiny_model_dir):
    """A real sampling run: two questions, three samples each, closed book (no index at all)."""
    data = {"dataset": {"path": str(shared(DEV)), "limit": 2},
            "policy": {"type": "local", "model": str(tiny_model_dir), "device": "cpu"},
            "mode": "direct", "samples": 3, "sampling": {"temperature": 1.0},
            "rollout": {"max_tokens_per_turn": 8, "max_completion_tokens": 16}, "output_dir": str(tmp_path / "run")}
    summary = run_evaluation(config_from_dict(data), progress=False)
    recs = records(tmp_path / "run")
    assert len(recs) == 2 and all(len(r["samples"]) == 3 for r in recs)
    assert all(s["num_searches"] == 0 and s["finish_reason"] for r in recs for s in r["samples"])
    assert summary["samples"]["n"] == 3 and summary["mode"] == "direct"
    assert "not_counted" in summary["search_failures"]


# ------------------------------------------------------------------------------------------------ modes


def test_naive_rag_puts_the_questions_top_passages_in_the_prompt_and_never_searches(tmp_path, qwen_tokenizer,
                                                                                      wiki_index):
    from agentic_rag.search import open_searcher

    rows = dev_rows(2)
    # the second question's model tries to search anyway: refused (no searches left), it still answers
    turns = {rows[0]["question"]: [f"<answer>{rows[0]['answer']}</answer>"],
             rows[1]["question"]: ["<search>more</search>", f"<answer>{rows[1]['answer']}</answer>"]}
    policy = TablePolicy(qwen_tokenizer, turns)
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 2}, mode="naive_rag",
                 search={"index": str(wiki_index), "retriever": "bm25"}, rollout={"passages_per_search": 2})
    summary = run_evaluation(cfg, policy=policy, tokenizer=qwen_tokenizer, progress=False)
    bm25 = open_searcher(wiki_index, "bm25")
    dialect = get_dialect("agentic")
    system = MODE_PROMPTS["naive_rag"]["en"].format(think_open="<think>", think_close="</think>",
                                                    answer_open="<answer>", answer_close="</answer>")
    recs = records(tmp_path / "run")
    for i, (row, rec) in enumerate(zip(rows, recs, strict=True)):
        hits = bm25.search(row["question"], 2)
        shown = dialect.format_passages(hits)  # within the default observation budget (384 tokens): in full
        assert len(qwen_tokenizer(dialect.wrap_observation(shown))["input_ids"]) <= 384
        message = f"{row['question']}\n\nPassages:\n{shown}"
        assert message == user_message(row["question"], shown, "en")
        expected = build_prompt(qwen_tokenizer, message, "agentic", system=system)
        assert policy.contexts[i] == expected  # the first turn's context is exactly that prompt
        assert rec["retrieval"] == {"query": row["question"], "docids": [h.docid for h in hits],
                                    "titles": [h.title for h in hits], "error": None}
        assert rec["num_searches"] == 0 and rec["queries"] == [] and rec["metrics"]["em"] == 1.0
    assert "Aretha Franklin" in qwen_tokenizer.decode(policy.contexts[0])  # the gold passage made it in
    assert "search" not in system and "<answer> </answer>" in system
    # the refused search left a notice in the trajectory, no search event
    assert "no searches left" in recs[1]["trajectory"] and recs[1]["finish_reason"] == "answer"
    assert summary["mode"] == "naive_rag" and summary["searches_per_question"] == 0
    # the question's search counts as a search carried out for the failure threshold
    assert summary["search_failures"]["searches"] == 2 and summary["search_failures"]["failed"] == 0


def test_naive_rag_passages_get_the_agents_observation_budget(tmp_path, qwen_tokenizer, wiki_index):
    from agentic_rag.rollout.engine import AgentRollout
    from agentic_rag.rollout.settings import RolloutSettings
    from agentic_rag.search import open_searcher

    rows = dev_rows(1)
    policy = TablePolicy(qwen_tokenizer, {rows[0]["question"]: [f"<answer>{rows[0]['answer']}</answer>"]})
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 1}, mode="naive_rag",
                 search={"index": str(wiki_index), "retriever": "bm25"},
                 rollout={"passages_per_search": 2, "max_observation_tokens": 40})
    run_evaluation(cfg, policy=policy, tokenizer=qwen_tokenizer, progress=False)
    hits = open_searcher(wiki_index, "bm25").search(rows[0]["question"], 2)
    full = get_dialect("agentic").format_passages(hits)
    # what the agent's observation of the same two hits would hold: cut at a word, marked, within 40 tokens
    engine = AgentRollout(policy, qwen_tokenizer, None, RolloutSettings(max_observation_tokens=40))
    shown = engine.observation_text(full)
    assert shown.endswith(" ...") and full.startswith(shown[:-4]) and len(shown) < len(full) // 2
    assert len(qwen_tokenizer(get_dialect("agentic").wrap_observation(shown))["input_ids"]) <= 40
    context = qwen_tokenizer.decode(policy.contexts[0])
    assert shown in context and full not in context


def test_naive_rag_needs_an_index(tmp_path):
    with pytest.raises(EvalConfigError, match="mode naive_rag retrieves with the question, and search.index is none"):
        config(tmp_path, shared(DEV), mode="naive_rag")


def test_direct_shows_the_question_alone_and_searches_nothing(tmp_path, qwen_tokenizer):
    rows = dev_rows(2)
    turns = {rows[0]["question"]: [f"<answer>{rows[0]['answer']}</answer>"],
             rows[1]["question"]: ["<search>anything</search>", f"<answer>{WRONG}</answer>"]}
    policy = TablePolicy(qwen_tokenizer, turns)
    searcher = OneHitSearcher()
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 2}, mode="direct", search={"index": ""})
    summary = run_evaluation(cfg, policy=policy, tokenizer=qwen_tokenizer, searcher=searcher, progress=False)
    system = MODE_PROMPTS["direct"]["en"].format(think_open="<think>", think_close="</think>",
                                                 answer_open="<answer>", answer_close="</answer>")
    assert policy.contexts[0] == build_prompt(qwen_tokenizer, rows[0]["question"], "agentic", system=system)
    assert "Passages:" not in qwen_tokenizer.decode(policy.contexts[0])
    recs = records(tmp_path / "run")
    assert [r["num_searches"] for r in recs] == [0, 0] and all("retrieval" not in r for r in recs)
    assert "A title" not in recs[1]["trajectory"]  # the search was refused, never run
    assert [r["metrics"]["em"] for r in recs] == [1.0, 0.0]
    fails = summary["search_failures"]
    assert fails["searches"] == 0 and not fails["over_threshold"] and "mode: direct" in fails["not_counted"]
    # the user's own system prompt wins in every mode
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 1}, mode="direct", prompt={"system_prompt": "Be brief."},
                 output_dir=str(tmp_path / "own"))
    policy = TablePolicy(qwen_tokenizer, turns)
    run_evaluation(cfg, policy=policy, tokenizer=qwen_tokenizer, progress=False)
    assert policy.contexts[0] == build_prompt(qwen_tokenizer, rows[0]["question"], "agentic", system="Be brief.")


def test_closed_book_search_errors_are_not_a_failed_run(tmp_path, qwen_tokenizer):
    """``search.index: none`` in agent mode: every search gets an error observation; the run is not failed."""
    rows = dev_rows(2)
    turns = {r["question"]: ["<search>x</search>", f"<answer>{r['answer']}</answer>"] for r in rows}
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 2})
    summary = run_evaluation(cfg, policy=TablePolicy(qwen_tokenizer, turns), tokenizer=qwen_tokenizer,
                             progress=False)
    fails = summary["search_failures"]
    assert fails["failed"] == 2 and fails["searches"] == 2 and fails["rate"] == 1.0
    assert fails["over_threshold"] is False and "search.index: none" in fails["not_counted"]
    assert all("Error:" in r["trajectory"] for r in records(tmp_path / "run"))


def test_a_run_written_before_mode_and_samples_existed_resumes(tmp_path, qwen_tokenizer):
    rows = dev_rows(2)
    turns = {r["question"]: [f"<answer>{r['answer']}</answer>"] for r in rows}
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 1})
    run_evaluation(cfg, policy=TablePolicy(qwen_tokenizer, turns), tokenizer=qwen_tokenizer, progress=False)
    saved = tmp_path / "run" / "config.json"
    old = json.loads(saved.read_text())
    del old["mode"], old["samples"]
    saved.write_text(json.dumps(old))
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 2})
    assert run_evaluation(cfg, policy=TablePolicy(qwen_tokenizer, turns), tokenizer=qwen_tokenizer,
                          progress=False)["n"] == 2
    with pytest.raises(EvalConfigError, match=r"differs in: mode"):
        run_evaluation(config(tmp_path, shared(DEV), dataset={"limit": 2}, mode="direct"), progress=False)


# ------------------------------------------------------------------------------------------------ random retriever


def test_the_random_retriever_draws_seeded_passages_of_the_index(wiki_index, wiki_corpus):
    from agentic_rag.search import open_searcher

    corpus = {p["id"]: p for p in json.loads(wiki_corpus.read_text())}
    question = dev_rows(1)[0]["question"]
    a, b = open_searcher(wiki_index, "random", seed=0), open_searcher(wiki_index, "random", seed=0)
    hits = a.search(question, 5)
    assert len(hits) == 5 and len({h.docid for h in hits}) == 5
    assert hits == b.search(question, 5) == a.batch_search(["other", question], 5)[1]  # any order, any instance
    assert hits != open_searcher(wiki_index, "random", seed=1).search(question, 5)
    assert a.search("another question", 5) != hits and a.search("   ", 5) == []
    for h in hits:  # real passages of the index, text and title as stored
        assert h.docid in corpus and (h.title, h.text) == (corpus[h.docid]["title"], corpus[h.docid]["text"])
    bm25 = [h.docid for h in open_searcher(wiki_index, "bm25").search(question, 5)]
    assert [h.docid for h in hits] != bm25 and len(set(bm25) & {h.docid for h in hits}) < 3


def test_the_random_retriever_needs_an_index_directory(tmp_path):
    from agentic_rag.search import open_searcher

    with pytest.raises(EvalConfigError, match="search.retriever random reads an index directory's passage store"):
        config(tmp_path, shared(DEV), search={"index": "http://127.0.0.1:1", "retriever": "random"})
    with pytest.raises(ValueError, match="retriever 'random' reads an index directory"):
        open_searcher("http://127.0.0.1:1", "random")


def test_eval_with_the_random_retriever_uses_the_runs_seed(tmp_path, qwen_tokenizer, wiki_index):
    from agentic_rag.search import open_searcher

    row = dev_rows(1)[0]
    turns = {row["question"]: [f"<search>{row['question']}</search>", f"<answer>{row['answer']}</answer>"]}
    cfg = config(tmp_path, shared(DEV), dataset={"limit": 1}, seed=7, rollout={"passages_per_search": 2},
                 search={"index": str(wiki_index), "retriever": "random"})
    summary = run_evaluation(cfg, policy=TablePolicy(qwen_tokenizer, turns), tokenizer=qwen_tokenizer, progress=False)
    expected = open_searcher(wiki_index, "random", seed=7).search(row["question"], 2)
    trajectory = records(tmp_path / "run")[0]["trajectory"]
    assert all(h.text[:40] in trajectory for h in expected)
    assert summary["search"]["retriever"] == "random" and summary["search_failures"]["failed"] == 0


# ------------------------------------------------------------------------------------------------ kinds and types


def test_by_kind_and_by_type_are_exact_in_the_summary_and_the_report(tmp_path, qwen_tokenizer):
    qs = [("q1", "Is water wet?", "yes", "yes_no", "comparison", True, 1),
          ("q2", "Is fire cold?", "no", "yes_no", "comparison", False, 0),
          ("q3", "Which is older, A or B?", "A", "pick_one", "comparison", True, 2),
          ("q4", "Who directed the film of X?", "Y", "multi_hop", "compositional", True, 1),
          ("q5", "Who is the father of Z's director?", "W", "multi_hop", "inference", False, 1)]
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"id": i, "question": q, "answer": a, "kind": k, "type": t}) + "\n"
                            for i, q, a, k, t, _, _ in qs))
    assert [r.meta for r in read_questions(path)][0] == {"kind": "yes_no", "type": "comparison"}
    turns = {q: ["<search>s</search>"] * n + [f"<answer>{a if right else WRONG}</answer>"]
             for _, q, a, _, _, right, n in qs}
    cfg = config(tmp_path, path, rollout={"max_searches": 4})
    summary = run_evaluation(cfg, policy=TablePolicy(qwen_tokenizer, turns), tokenizer=qwen_tokenizer,
                             searcher=OneHitSearcher(), progress=False)
    assert records(tmp_path / "run")[0]["meta"] == {"kind": "yes_no", "type": "comparison"}
    by_kind, by_type = summary["by_kind"], summary["by_type"]
    assert list(by_kind) == ["yes_no", "pick_one", "multi_hop"]
    assert by_kind["yes_no"]["n"] == 2 and by_kind["yes_no"]["metrics"]["em"] == 0.5
    assert by_kind["yes_no"]["searches_per_question"] == 0.5
    assert by_kind["pick_one"] == {"n": 1, "metrics": {"em": 1.0, "f1": 1.0, "cover_em": 1.0},
                                   "searches_per_question": 2.0}
    assert by_kind["multi_hop"]["metrics"]["em"] == 0.5 and by_kind["multi_hop"]["searches_per_question"] == 1.0
    assert list(by_type) == ["comparison", "compositional", "inference"]
    assert by_type["comparison"]["n"] == 3 and by_type["comparison"]["metrics"]["em"] == pytest.approx(2 / 3)
    assert by_type["comparison"]["searches_per_question"] == 1.0
    assert by_type["inference"] == {"n": 1, "metrics": {"em": 0.0, "f1": 0.0, "cover_em": 0.0},
                                    "searches_per_question": 1.0}
    out = tmp_path / "report.md"
    assert main(["eval-report", "--runs", str(tmp_path / "run"), "--names", "scripted", "--out", str(out)]) == 0
    md = out.read_text()
    assert "## By kind" in md and "## By type" in md
    assert "| run | kind | n | EM | F1 | cover-EM (ACC_R) | searches/q |" in md
    assert "| scripted | yes_no | 2 | 0.500 | 0.500 | 0.500 | 0.50 |" in md
    assert "| scripted | comparison | 3 | 0.667 | 0.667 | 0.667 | 1.00 |" in md
    assert "## Samples" not in md and "mode agent" in md


# ------------------------------------------------------------------------------------------------ plain replies


def test_direct_scores_a_plain_reply_on_its_answer_span_and_the_agent_does_not(tmp_path, qwen_tokenizer):
    """Baselines measure the model, not the protocol: a closed-book reply with no answer tag is scored on its
    answer span (``answer_source: reply``); the agent's untagged reply scores 0 and counts as a format failure."""
    rows = dev_rows(3)
    turns = {rows[0]["question"]: [f"<think>let me recall</think> The answer is {rows[0]['answer']}. I am sure."],
             rows[1]["question"]: [f"<answer>{rows[1]['answer']}</answer>"],
             rows[2]["question"]: [f"{WRONG}\nand more"]}
    for mode, expected_em, sources in (("direct", [1.0, 1.0, 0.0], ["reply", "tag", "reply"]),
                                       ("agent", [0.0, 1.0, 0.0], [None, "tag", None])):
        cfg = config(tmp_path, shared(DEV), dataset={"limit": 3}, mode=mode, output_dir=str(tmp_path / mode))
        summary = run_evaluation(cfg, policy=TablePolicy(qwen_tokenizer, turns), tokenizer=qwen_tokenizer,
                                 searcher=OneHitSearcher(), progress=False)
        recs = records(tmp_path / mode)
        assert [r["metrics"]["em"] for r in recs] == expected_em, mode
        assert [r["answer_source"] for r in recs] == sources, mode
        assert summary["answer_tag_rate"] == pytest.approx(1 / 3), mode
        assert [r["metrics"]["well_formed"] for r in recs] == [0.0, 1.0, 0.0], mode
    assert recs[0]["prediction"] is None and records(tmp_path / "direct")[0]["prediction"] == rows[0]["answer"]
    assert records(tmp_path / "direct")[2]["prediction"] == WRONG


@pytest.mark.parametrize("reply, span", [
    ("<think>hmm</think> Paris.", "Paris"),
    ("The answer is Paris. It is the capital.", "Paris"),
    ('Answer: "Barack Obama"\nmore', "Barack Obama"),
    ("I think the answer is: yes", "yes"),
    ("\n\nJohn Smith was born in 1950. He moved", "John Smith was born in 1950"),
    ("U.S.A. is the country.", "U.S.A. is the country"),
    ("<search>who is it</search>", None),
    ("<think>unfinished thought", None),
])
def test_the_answer_span_of_a_plain_reply(reply, span):
    from agentic_rag.evaluation.modes import reply_answer

    assert reply_answer(reply, get_dialect("agentic")) == span
