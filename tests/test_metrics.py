"""The one scorer: normalisation, EM, F1, cover-EM, choice extraction (golden values), and `agentic-rag score`
reproducing the published numbers of a released model's real predictions."""

from __future__ import annotations

import json

import pytest

from agentic_rag.cli import main
from agentic_rag.evaluation.metrics import (
    PredictionFileError,
    example_metrics,
    score_predictions,
    summarize,
    text_golds,
)
from agentic_rag.rewards.accuracy import (
    choice_accuracy,
    cover_exact_match,
    cover_exact_match_tokens,
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


def test_f1_is_zero_when_one_side_is_yes_no_or_noanswer_and_they_differ():
    """HotpotQA's official F1: a yes/no/noanswer answer on either side scores only by matching exactly."""
    assert f1_score("yes it is", "yes") == 0.0  # plain token F1 would give 0.5
    assert f1_score("yes", "yes it is") == 0.0  # 0.5 likewise
    assert f1_score("no way", ["no"]) == 0.0  # 0.667
    assert f1_score("noanswer here", "noanswer") == 0.0
    assert f1_score("No.", "no") == 1.0 and f1_score("the yes", "Yes!") == 1.0  # equal after normalisation
    assert f1_score("no", ["nothing", "no"]) == 1.0  # the best gold still counts
    assert f1_score("Nidal Malik Hasan", "Nidal Hasan") == pytest.approx(0.8)  # other answers: unchanged


@pytest.mark.parametrize("prediction, golds, cover, tokens", [
    ("nothing", "no", 1.0, 0.0),  # "no" is a substring of "nothing", not a token of it
    ("no", "no", 1.0, 1.0),
    ("No.", "no", 1.0, 1.0),
    ("yes it is", "yes", 1.0, 0.0),  # yes/no/noanswer: exactly, as HotpotQA's F1 has it
    ("yes", "yes it is", 0.0, 0.0),
    ("yes, no", "no", 1.0, 0.0),  # hedging between yes and no
    ("It was Nidal Malik Hasan.", "Nidal Malik Hasan", 1.0, 1.0),  # 2 extra tokens
    ("Nidal Malik Hasan", "Nidal Hasan", 0.0, 0.0),  # not contiguous
    ("Paris or Lyon", "Paris", 1.0, 0.0),  # a list of candidates
    ("Paris, Lyon, Marseille", "Paris", 1.0, 0.0),
    ("Lyon and Paris", "Paris", 1.0, 0.0),
    ("Paris, France", "Paris", 1.0, 0.0),  # a comma the gold does not have
    ("Washington, D.C.", "Washington, D.C.", 1.0, 1.0),  # ... but one the gold has is not a list
    ("Tom and Jerry", ["Tom and Jerry"], 1.0, 1.0),
    ("12,400 people", "12,400", 1.0, 1.0),  # a thousands separator is not a list separator
    ("the capital city is Paris", "Paris", 1.0, 1.0),  # 3 extra tokens: the most allowed
    ("I think the capital city is Paris", "Paris", 1.0, 0.0),  # 5 extra
    ("sparisian", "Paris", 1.0, 0.0),
    ("北京市", "北京", 1.0, 1.0),  # CJK: one token per character, 1 extra
    ("", "x", 0.0, 0.0), (None, "x", 0.0, 0.0),
    ("something", "the", 0.0, 0.0),  # a gold that normalises to nothing covers nothing
])
def test_cover_em_tokens_golden_values(prediction, golds, cover, tokens):
    assert cover_exact_match(prediction, golds) == cover
    assert cover_exact_match_tokens(prediction, golds) == tokens


def test_cover_em_tokens_extra_token_bound_is_a_parameter():
    assert cover_exact_match_tokens("I think the capital city is Paris", "Paris", max_extra_tokens=5) == 1.0
    assert cover_exact_match_tokens("Paris France", "Paris", max_extra_tokens=0) == 0.0
    with pytest.raises(ValueError, match="max_extra_tokens must be >= 0"):
        cover_exact_match_tokens("Paris", "Paris", max_extra_tokens=-1)


def test_cover_em_tokens_on_real_r1_searcher_predictions():
    """On the released model's 500 HotpotQA answers it sits between EM (0.582) and cover-EM (0.634)."""
    rows = [json.loads(line) for line in shared("r1-searcher/eval_results/hotpotqa_llama.jsonl").open()]
    golds = [r["answer"] if isinstance(r["answer"], list) else [r["answer"]] for r in rows]
    em = sum(exact_match(r["pred_ans"], g) for r, g in zip(rows, golds, strict=True)) / len(rows)
    cover = sum(cover_exact_match(r["pred_ans"], g) for r, g in zip(rows, golds, strict=True)) / len(rows)
    tokens = sum(cover_exact_match_tokens(r["pred_ans"], g) for r, g in zip(rows, golds, strict=True)) / len(rows)
    assert (round(em, 3), round(cover, 3)) == (0.582, 0.634)
    assert em <= tokens <= cover
    assert round(tokens, 3) == 0.612  # "Topeka, Kansas" for "Topeka", "Lithuanian" for "Lithuania" no longer pass


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


def test_a_summary_reads_records_written_before_well_formed_was_renamed():
    old = {"metrics": {"em": 1.0, "format": 1.0}, "num_searches": 1, "num_turns": 2, "finish_reason": "answer"}
    new = {"metrics": {"em": 0.0, "well_formed": 0.0}, "num_searches": 1, "num_turns": 2, "finish_reason": "eos"}
    s = summarize([old, new], ["em", "well_formed"])
    assert s["metrics"] == {"em": 0.5, "well_formed": 0.5} and s["metric_counts"]["well_formed"] == 2


def test_example_metrics_dispatch_on_the_registry_names(monkeypatch):
    from agentic_rag.evaluation import metrics
    from agentic_rag.rewards.registry import get_scorer, metric_names

    # an answer comparison (a registry scorer with ``compare``) comes from the registry; every other metric has
    # exactly one function here, and no function is for a name the registry lacks or already computes
    comparisons = {n for n in metric_names() if get_scorer(n).compare}
    assert comparisons == {"em", "f1", "cover_em"}
    assert set(metrics.METRIC_FUNCS) == set(metric_names()) - comparisons
    out = example_metrics("Paris", ["Paris"], metric_names(), options=None, well_formed=True, judge=True)
    assert out == {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "judge": 1.0, "choice": None, "well_formed": 1.0}
    with pytest.raises(ValueError, match=r"unknown metric 'format' \('format' was renamed 'well_formed'\)"):
        example_metrics("Paris", ["Paris"], ["format"])
    with pytest.raises(ValueError, match=r"unknown metric 'exact_match' \('exact_match' was renamed 'em'\)"):
        example_metrics("Paris", ["Paris"], ["exact_match"])
    with pytest.raises(ValueError, match="unknown metric 'retrieval'"):  # a training reward, not a metric
        example_metrics("Paris", ["Paris"], ["retrieval"])
    monkeypatch.delitem(metrics.METRIC_FUNCS, "well_formed")
    with pytest.raises(NotImplementedError, match="'well_formed' is in the scorer registry .* no function"):
        example_metrics("Paris", ["Paris"], ["em", "well_formed"])


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
