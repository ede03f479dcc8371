"""The 2WikiMultiHopQA task (issue 31) on the real files: the merged corpus, the split, kinds and types, the hop
queries, and gold trajectories played through the real engine against a real BM25 index of the merged corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rag.data.questions import QARow
from agentic_rag.data.wiki import (
    answer_kind,
    build_wiki_corpus,
    hop_queries,
    hops,
    infer_type,
    missing_gold_titles,
    read_dev500,
    read_sampled480,
    type_accuracy,
    wiki_splits,
    wiki_type,
    write_splits,
)
from agentic_rag.errors import OutputError
from agentic_rag.rollout.settings import PromptSettings, RolloutSettings
from conftest import SHARED, shared

# the probe's settings (/work/shared/notes/wiki-probe.md), which the first SFT run uses
PROBE_ROLLOUT = RolloutSettings(max_observation_tokens=128, passages_per_search=1, max_searches=4, max_turns=5,
                                max_tokens_per_turn=32, max_completion_tokens=720)
PROBE_PROMPT = PromptSettings(system_prompt="Answer the question by searching.")


@pytest.fixture(scope="module")
def sampled() -> list[QARow]:
    shared("tts-project/2wikimultihopqa_sampled480.json")
    return read_sampled480(SHARED)


@pytest.fixture(scope="module")
def dev() -> list[QARow]:
    return read_dev500(SHARED)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("wiki") / "corpus.jsonl"
    return path, build_wiki_corpus(path, SHARED)


@pytest.fixture(scope="module")
def wiki_bm25(corpus, tmp_path_factory) -> Path:
    from agentic_rag.search.build import build_index

    out = tmp_path_factory.mktemp("wiki_index") / "index"
    build_index(corpus[0], out, bm25=True, progress=False)
    return out


# ------------------------------------------------------------------------------------------------- corpus

def test_corpus_merges_hipporag_and_sampled480_contexts(corpus, sampled, dev):
    path, counts = corpus
    assert {k: counts[k] for k in ("hipporag", "added_from_sampled480", "total")} == {
        "hipporag": 6119, "added_from_sampled480": 2532, "total": 8651}
    assert counts["sampled480_context_titles"] == 3199 and counts["sampled480_titles_already_in_hipporag"] == 667
    passages = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(passages) == 8651
    assert len({p["id"] for p in passages}) == len({p["title"] for p in passages}) == 8651
    assert all(p["contents"] == f"{p['title']}\n{p['text']}" for p in passages)
    first = passages[0]
    assert first["id"] == "hipporag-0" and first["title"] == "Teutberga"
    # a context paragraph the HippoRAG corpus lacks: its sentences joined with one space, as HippoRAG's are
    by_title = {p["title"]: p for p in passages}
    mathew = by_title["Charles Mathew"]
    assert mathew["id"].startswith("sampled480-")
    assert mathew["text"].startswith("Charles James Mathew, CBE, KC (24 October 1872 – 8 January 1923) was a British "
                                     "barrister and Labour politician. He was elected as the Member")
    assert missing_gold_titles(by_title, sampled + dev) == {}


def test_corpus_refuses_to_overwrite_an_input(tmp_path):
    with pytest.raises(OutputError, match="overwrite"):
        build_wiki_corpus(shared("hipporag/2wikimultihopqa_corpus.json"), SHARED)


# ------------------------------------------------------------------------------------------------- split

def test_split_holds_out_the_tail_of_dev500_without_repeats(dev, sampled):
    train, validation = wiki_splits(SHARED)
    assert (len(train), len(validation)) == (764, 200)
    # the cut is dev500[295:]; the 5 questions of it that sampled480 also holds are dropped
    repeats = {322, 393, 407, 454, 459}
    assert [r.id for r in validation] == [r.id for i, r in enumerate(dev) if i >= 295 and i not in repeats]
    assert [r.id for r in train[:480]] == [r.id for r in sampled]
    assert {r.meta["source"] for r in train[480:]} == {"dev500"}
    ids, texts = {r.id for r in train}, {r.question.lower() for r in train}
    assert len(ids) == len(train) and not ids & {r.id for r in validation}
    assert not texts & {r.question.lower() for r in validation}
    again = wiki_splits(SHARED)
    assert [r.id for r in again[0]] == [r.id for r in train] and [r.id for r in again[1]] == [r.id for r in validation]


def test_write_splits_records(tmp_path):
    counts = write_splits(tmp_path, SHARED)
    assert counts["validation"]["questions"] == 200 and counts["train"]["questions"] == 764
    assert counts["validation"]["by_kind"] == {"multi_hop": 103, "pick_one": 73, "yes_no": 24}
    assert counts["validation"]["by_type"] == {"compositional": 82, "inference": 21, "bridge_comparison": 49,
                                               "comparison": 48}
    first = json.loads((tmp_path / "train.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first == {
        "id": "100c512a0bde11eba7f7acde48001122",
        "question": "Where was the place of burial of Charles Mathew's father?",
        "answer": "Cork", "answer_aliases": [], "supporting_facts": ["Charles Mathew", "James Charles Mathew"],
        "type": "compositional", "type_source": "given",
        "evidences": [["Charles James Mathew", "father", "Sir James Charles Mathew"],
                      ["Sir James Charles Mathew", "place of burial", "Cork"]],
        "kind": "multi_hop", "hops": 2, "hop_queries": ["Charles Mathew", "Sir James Charles Mathew"],
        "hop_titles": ["Charles Mathew", "James Charles Mathew"], "source": "sampled480"}
    val = json.loads((tmp_path / "validation.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert val["type_source"] == "inferred" and "evidences" not in val


# ------------------------------------------------------------------------------------------------- kinds, types

def test_answer_kinds_of_real_questions(sampled, dev):
    expected = {0: "multi_hop", 14: "pick_one", 235: "pick_one", 305: "yes_no", 411: "multi_hop"}
    assert {i: answer_kind(sampled[i].question, sampled[i].answers) for i in expected} == expected
    assert [answer_kind(dev[i].question, dev[i].answers) for i in (0, 2, 3, 4)] == [
        "multi_hop", "pick_one", "multi_hop", "pick_one"]
    assert answer_kind("Is it?", "No") == "yes_no"


def test_type_inference(sampled, dev):
    accuracy = type_accuracy(sampled)
    assert accuracy["questions"] == 480 and accuracy["accuracy"] >= 0.98  # measured: 1.000
    assert [infer_type(dev[i].question) for i in (0, 2, 3, 4, 9)] == [
        "compositional", "comparison", "inference", "bridge_comparison", "compositional"]
    assert infer_type("Who is the father-in-law of Aemilia Tertia?") == "inference"
    assert infer_type("Who is the mother of the director of film Sleepers?") == "compositional"
    assert infer_type("Was Judith S. Beck or Félix Erviti Barcelona born first?") == "comparison"
    assert infer_type("Do both films Across The Badlands and A Gutter Magdalene have the directors that share the "
                      "same nationality?") == "bridge_comparison"
    assert wiki_type(sampled[14]) == "bridge_comparison" and wiki_type(dev[4]) == "bridge_comparison"


# ------------------------------------------------------------------------------------------------- hops

def test_hop_queries_of_sampled480_follow_the_evidence_chain(sampled):
    assert hop_queries(sampled[0]) == ["Charles Mathew", "Sir James Charles Mathew"]
    # the question's words for an entity it names; the evidence subject for the next hop
    assert hops(sampled[152]) == [("Barefoot In The Park (Film)", "Barefoot in the Park (film)"),
                                  ("Gene Saks", "Gene Saks")]
    assert hop_queries(sampled[242]) == ["Duke Adam Of Württemberg", "Duke Louis of Württemberg"]
    assert hop_queries(sampled[14]) == ["Remember The Day", "Cast Up By The Sea", "Henry King (director)",
                                        "John Gavin (director)"]
    assert hop_queries(sampled[305]) == ["Ostitto", "Hangor Nodi Grenade"]
    assert hop_queries(sampled[411]) == ["Randolph Greene Pack", "Charles Lathrop Pack"]


def test_hop_queries_of_dev500_put_the_named_titles_first(dev):
    # supporting_facts lists the performer first; the song the question names is searched first
    assert dev[0].gold_titles == ["Aretha Franklin", "I Can't See Myself Leaving You"]
    assert hop_queries(dev[0]) == ["I Can'T See Myself Leaving You", "Aretha Franklin"]
    assert hop_queries(dev[3]) == ["Henriette Of France (1727–1752)", "Marie Leszczyńska"]
    # a bridge comparison: each director after the film whose passage names them, searched without "(director)"
    assert dev[4].gold_titles == ["Rudolph Maté", "Girls in White", "Victor Janson", "Three Violent People"]
    assert hop_queries(dev[4]) == ["Three Violent People", "Girls In White", "Rudolph Maté", "Victor Janson"]
    assert hops(dev[6])[2:] == [("Clement Virgo", "Clement Virgo"), ("Henry King", "Henry King (director)")]


# ------------------------------------------------------------------------------------------------- trajectories

def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """``(value, start, end)`` of each run of equal values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def test_gold_trajectories_through_the_engine(sampled, wiki_bm25, qwen_tokenizer, tmp_path):
    from agentic_rag.data.trajectories import gold_questions, make_trajectories
    from agentic_rag.data.wiki import split_record
    from agentic_rag.search import open_searcher

    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(split_record(sampled[i])) + "\n" for i in (0, 14, 305)), encoding="utf-8")
    golds = gold_questions(path)
    searcher = open_searcher(wiki_bm25)
    records, stats = make_trajectories(golds, tokenizer=qwen_tokenizer, searcher=searcher, rollout=PROBE_ROLLOUT,
                                       prompt=PROBE_PROMPT)
    for q, r in zip(golds, records, strict=True):
        assert [s["queries"] for s in r["searches"]] == [[h] for h in q.hop_queries]
        assert r["finish_reason"] == "answer" and r["answered_as_scripted"]
        model_text, env_text = [], []
        for value, a, b in _runs(r["env_mask"]):
            text = qwen_tokenizer.decode(r["completion_ids"][a:b], skip_special_tokens=False)
            (model_text if value else env_text).append(text)
        # the model wrote exactly the scripted turns; the environment exactly one observation a search
        assert "".join(model_text).replace("<|im_end|>", "") == "".join(
            f"<search> {h} </search>" for h in q.hop_queries) + f"<answer> {q.answer} </answer>"
        assert len(env_text) == len(q.hop_queries)
        assert all(t.strip().startswith("<observation>") and t.strip().endswith("</observation>") for t in env_text)
    # what BM25 shows each hop (one passage a search, none shown twice), found here without the engine
    for q, r in zip(golds, records, strict=True):
        shown: set[str] = set()
        expected = []
        for query, title in zip(q.hop_queries, q.hop_titles, strict=True):
            top = next(h for h in searcher.search(query, k=10) if h.docid not in shown)
            shown.add(top.docid)
            expected.append(top.title == title)
        assert r["gold_hits"] == expected
    assert [r["gold_hits"] for r in records] == [[True, True], [False, True, True, True], [True, True]]
    assert stats["gold_hit_by_hop"] == {"1": round(2 / 3, 3), "2": 1.0, "3": 1.0, "4": 1.0}
    assert stats["hop_counts"] == {"1": 3, "2": 3, "3": 1, "4": 1}
    assert [r["answer_visible"] for r in records] == [True, True, None]  # Cork; the film's title; a yes/no answer
    assert stats["answer_visible_by_kind"] == {"multi_hop": 1.0, "pick_one": 1.0}
    assert stats["by_kind"] == {"multi_hop": 1, "pick_one": 1, "yes_no": 1}


def test_trajectories_command_writes_what_sft_reads(sampled, wiki_bm25, tmp_path, capsys):
    from agentic_rag.cli import main
    from agentic_rag.data.wiki import split_record
    from agentic_rag.rollout.trained_settings import read_settings
    from agentic_rag.training.sft import read_examples

    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(split_record(sampled[i])) + "\n" for i in range(4)), encoding="utf-8")
    tokenizer = str(shared("rtp-llm-qwen-tokenizer/qwen2_tokenizer"))
    out = tmp_path / "gold.jsonl"
    argv = ["trajectories", "--questions", str(questions), "--index", str(wiki_bm25), "--tokenizer", tokenizer,
            "--out", str(out), "--limit", "2", "--set", "rollout.max_searches=4",
            "--set", "rollout.passages_per_search=1",
            "--max-observation-tokens", "128", "--set", "prompt.system_prompt=Answer the question by searching."]
    assert main(argv) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["trajectories"] == 2 and stats["not_ending_as_scripted"] == 0
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in lines] == [sampled[0].id, sampled[1].id]
    assert {"prompt_ids", "completion_ids", "env_mask", "question", "id", "kind", "text"} <= set(lines[0])
    settings = read_settings(f"{out}.settings.json")
    assert settings["rollout.max_searches"] == 4 and settings["rollout.passages_per_search"] == 1
    assert settings["rollout.max_observation_tokens"] == 128
    assert settings["prompt.system_prompt"] == "Answer the question by searching."
    from agentic_rag.models import load_tokenizer

    examples, skipped = read_examples(out, load_tokenizer(tokenizer))
    assert len(examples) == 2 and skipped == 0
    assert examples[0].completion_mask.count(0) > len(lines[0]["prompt_ids"])  # the prompt and the observations
    # an output that is an input is refused before anything runs
    assert main([*argv[:-2], "--out", str(questions)]) == 2
