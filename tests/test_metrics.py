"""The one scorer: normalisation, EM, F1, cover-EM, choice extraction (golden values), and `agentic-rag score`
reproducing the published numbers of a released model's real predictions."""

from __future__ import annotations

import json

import pytest

from agentic_rag.cli import main
from agentic_rag.evaluation.metrics import PredictionFileError, score_predictions, summarize, text_golds
from agentic_rag.rewards.accuracy import (
    choice_accuracy,
    cover_exact_match,
    exact_match,
    extract_choice,
    f1_score,
    gold_choice,
    normalize_answer,
)
from conftest import shared


@pytest.mark.parametrize("text, expected", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  A  tale of   two cities. ", "tale of two cities"),
    ("U.S. Route 22", "us route 22"),
    ("Jean-Luc Picard!", "jeanluc picard"),
    ("an apple, the pear and a plum", "apple pear and plum"),
    ("Theatre then", "theatre then"),  # articles only as whole words
    ("12,400", "12400"),
    ("Wilhelm Conrad Röntgen", "wilhelm conrad röntgen"),  # non-ASCII letters stay
    ("", ""),
    (None, ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_takes_the_best_gold():
    assert exact_match("the Detroit", ["Motor City", "Detroit"]) == 1.0
    assert exact_match("Detroit, Michigan", "Detroit") == 0.0
    assert exact_match(None, ["x"]) == 0.0
    assert exact_match("Nidal Hasan.", "nidal hasan") == 1.0


def test_f1_golden_values():
    # pred tokens [nidal, malik, hasan], gold [nidal, hasan]: p = 2/3, r = 1, f1 = 0.8
    assert f1_score("Nidal Malik Hasan", "Nidal Hasan") == pytest.approx(0.8)
    # pred [new, york, city], gold [york]: p = 1/3, r = 1 -> 0.5; second gold exact -> max 1.0
    assert f1_score("New York City", ["York"]) == pytest.approx(0.5)
    assert f1_score("New York City", ["York", "the new york city"]) == 1.0
    assert f1_score("blue", "red") == 0.0
    assert f1_score("", "red") == 0.0 and f1_score("the", "a") == 1.0  # both normalise to nothing
    # repeated tokens count once per occurrence: pred [a1, a1, b], gold [a1, b]: common 2, p 2/3, r 1 -> 0.8
    assert f1_score("x x y", "x y") == pytest.approx(0.8)
    # CJK: one token per character; pred 北京市 vs gold 北京: p 2/3, r 1 -> 0.8
    assert f1_score("北京市", "北京") == pytest.approx(0.8)


def test_cover_exact_match_is_substring_of_normalised_text():
    assert cover_exact_match("It was Nidal Malik Hasan.", "Nidal Malik Hasan") == 1.0
    assert cover_exact_match("Nidal Malik Hasan", "Nidal Hasan") == 0.0
    assert cover_exact_match("The Home Rule League", "Home Rule League") == 1.0
    assert cover_exact_match("U.S. Route 22 in Ohio", ["US Route 22"]) == 1.0
    assert cover_exact_match("", "x") == 0.0 and cover_exact_match(None, "x") == 0.0
    assert cover_exact_match("something", "the") == 0.0  # a gold that normalises to nothing covers nothing
    with pytest.raises(ValueError, match="no gold answer"):
        exact_match("x", [])


OPTIONS = {"A": "Disclose the error to the patient", "B": "Tell the attending that he cannot fail to disclose",
           "C": "Report the physician to the ethics committee", "D": "Refuse to dictate the operative report"}


@pytest.mark.parametrize("prediction, expected", [
    ("B", "B"), ("b", "B"), ("(C)", "C"), ("D.", "D"), ("[A]", "A"),
    ("B. Tell the attending that he cannot fail to disclose", "B"),
    ("(D) refuse", "D"), ("C: report", "C"), ("A) disclose", "A"),
    ("The answer is C", "C"), ("Answer: (D)", "D"), ("I pick option B.", "B"),
    ("first I thought option A, but the answer is C", "C"),
    ("Report the physician to the ethics committee", "C"),
    ("He should report the physician to the ethics committee at once", "C"),
    ("A patient should be told", None),  # an article, not option A
    ("the answer is a fever", None),  # lower-case a inside text is not a letter
    ("E", None),  # not an option
    ("no idea", None), ("", None), (None, None),
])
def test_extract_choice(prediction, expected):
    assert extract_choice(prediction, OPTIONS) == expected


def test_choice_accuracy_with_letter_or_text_golds():
    assert choice_accuracy("B", ["B", OPTIONS["B"]], OPTIONS) == 1.0
    assert choice_accuracy("answer is b", ["B"], OPTIONS) == 0.0  # lower-case letter in text is not read
    assert choice_accuracy(OPTIONS["B"].upper(), [OPTIONS["B"]], OPTIONS) == 1.0  # gold given as text
    assert choice_accuracy("C", ["B"], OPTIONS) == 0.0
    assert gold_choice(["Tell the attending that he cannot fail to disclose"], OPTIONS) == "B"
    with pytest.raises(ValueError, match="no gold option letter"):
        gold_choice(["something else"], OPTIONS)
    # text metrics on a multiple-choice row ignore the bare letter (it would "cover" any text with a b in it)
    assert text_golds(["B", OPTIONS["B"]], OPTIONS) == [OPTIONS["B"]]


def test_summary_of_records():
    recs = [{"metrics": {"em": 1.0, "judge": 1.0}, "num_searches": 2, "num_turns": 3, "finish_reason": "answer",
             "latency_s": 1.0, "prediction": "x", "judge": {"status": "yes"}},
            {"metrics": {"em": 0.0, "judge": None}, "num_searches": 0, "num_turns": 1, "finish_reason": "eos",
             "latency_s": 3.0, "prediction": None, "judge": {"status": "garbage"}}]
    s = summarize(recs, ["em", "judge"])
    assert s["n"] == 2 and s["metrics"] == {"em": 0.5, "judge": 1.0}
    assert s["searches_per_question"] == 1.0 and s["turns_per_question"] == 2.0
    assert s["latency_s"]["p50"] == 2.0 and s["latency_s"]["p99"] == pytest.approx(2.98)
    assert s["judge"]["garbage"] == 1 and s["judge"]["judged"] == 1
    assert s["finish_reasons"] == {"answer": 1, "eos": 1}


# ------------------------------------------------------------------------------------- real predictions


def test_score_reproduces_r1_searcher_hotpotqa_numbers(capsys):
    """R1-Searcher's released Llama-3.1-8B on hotpotqa_500: SQuAD normalisation gives EM 0.582, cover-EM 0.634."""
    path = shared("r1-searcher/eval_results/hotpotqa_llama.jsonl")
    assert main(["score", "--predictions", str(path), "--pred-field", "pred_ans", "--answer-field", "answer"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["n"] == 500
    assert round(out["em"], 3) == 0.582
    assert round(out["cover_em"], 3) == 0.634
    assert round(out["f1"], 3) == 0.700
    # the fields are found without being named
    auto = score_predictions(path)
    assert (auto["pred_field"], auto["answer_field"]) == ("pred_ans", "answer") and auto["em"] == out["em"]


def test_score_missing_field_names_the_field_and_line(tmp_path, capsys):
    path = tmp_path / "preds.jsonl"
    path.write_text('{"pred_ans": "a", "answer": "a"}\n{"pred_ans": "b", "answer": ["b", "c"]}\n'
                    '{"answer": "c"}\n')
    with pytest.raises(PredictionFileError, match=r"preds\.jsonl:3: missing field 'pred_ans'"):
        score_predictions(path, pred_field="pred_ans", answer_field="answer")
    assert main(["score", "--predictions", str(path), "--pred-field", "pred_ans"]) == 2
    assert "preds.jsonl:3: missing field 'pred_ans'" in capsys.readouterr().err
    path.write_text('{"pred_ans": "a", "answer": "a"}\n{"pred_ans": null, "answer": "b"}\n')
    assert score_predictions(path) | {} == {"n": 2, "em": 0.5, "f1": 0.5, "cover_em": 0.5, "pred_field": "pred_ans",
                                           "answer_field": "answer"}
    path.write_text('{"output": "a", "answer": "a"}\n')
    with pytest.raises(PredictionFileError, match=r":1: no prediction field .*--pred-field"):
        score_predictions(path)
    path.write_text('{"pred_ans": "a", "answer": []}\n')
    with pytest.raises(PredictionFileError, match=r":1: field 'answer' holds no gold answer"):
        score_predictions(path)
