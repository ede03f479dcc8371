"""Paired comparisons of two evaluations (agentic_rag.evaluation.paired): flips counted per question, McNemar's exact
p computed from them."""

from __future__ import annotations

import json

import pytest

from agentic_rag.evaluation.paired import bootstrap_interval, distinguishable, mcnemar, paired, pooled, predictions


@pytest.mark.parametrize("better, worse, p", [(0, 0, 1.0), (25, 0, 2 / 2 ** 25), (5, 7, 0.7744140625),
                                              (1, 0, 1.0), (6, 0, 0.03125)])
def test_mcnemar_is_the_exact_two_sided_binomial_test_on_the_flips(better, worse, p):
    assert mcnemar(better, worse) == pytest.approx(p)
    assert mcnemar(worse, better) == pytest.approx(p)


def test_paired_counts_flips_on_the_common_questions_and_filters_by_the_first_records(tmp_path):
    def write(name, ems, kinds):
        folder = tmp_path / name
        folder.mkdir()
        folder.joinpath("predictions.jsonl").write_text("".join(
            json.dumps({"id": f"q{i}", "metrics": {"em": em}, "meta": {"kind": k}}) + "\n"
            for i, (em, k) in enumerate(zip(ems, kinds, strict=True))))
        return predictions(folder)

    kinds = ["multi_hop", "multi_hop", "yes_no", "multi_hop", "yes_no"]
    a = write("a", [1, 1, 0, 0, 1], kinds)
    b = write("b", [0, 1, 1, 0, 0], kinds)
    del b["q4"]  # only the questions both evaluated count
    assert paired(a, b) == {"questions": 4, "better": 1, "worse": 1, "p": 1.0, "difference": 0.0,
                            "ci95": [-0.75, 0.75]}
    multi = paired(a, b, where=lambda r: r["meta"]["kind"] == "multi_hop")
    assert multi == {"questions": 3, "better": 1, "worse": 0, "p": 1.0, "difference": 1 / 3, "ci95": [0.0, 1.0]}


def test_the_bootstrap_interval_covers_the_mean_and_shrinks_with_more_questions():
    """A known case: 25 of 55 questions gained, none lost (the native seed 0): the mean 0.455 lies inside, zero
    outside; 24 gained and 20 lost: zero inside. Seeded, so it reproduces exactly."""
    low, high = bootstrap_interval([1.0] * 25 + [0.0] * 30)
    assert 0.3 < low < 25 / 55 < high < 0.6
    assert bootstrap_interval([1.0] * 25 + [0.0] * 30) == (low, high)
    low2, high2 = bootstrap_interval([1.0] * 24 + [-1.0] * 20 + [0.0] * 11)
    assert low2 < 0 < high2
    wide = bootstrap_interval([1.0, 0.0] * 10)
    narrow = bootstrap_interval([1.0, 0.0] * 200)
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 3
    assert bootstrap_interval([]) == (None, None)
    assert distinguishable({"ci95": [low, high]}) and not distinguishable({"ci95": [low2, high2]})


def test_pooled_averages_each_question_over_the_seeds_before_resampling():
    def run(ems):
        return {f"q{i}": {"metrics": {"em": em}, "meta": {}} for i, em in enumerate(ems)}

    sft = run([0, 0, 1, 1])
    seeds = [(run([1, 0, 1, 1]), sft), (run([1, 1, 1, 0]), sft)]
    result = pooled(seeds)
    # per question: q0 +1, +1 -> 1; q1 0, +1 -> 0.5; q2 0, 0 -> 0; q3 0, -1 -> -0.5: mean 0.25
    assert result["questions"] == 4 and result["seeds"] == 2
    assert (result["better"], result["worse"]) == (3, 1)
    assert result["difference"] == pytest.approx(0.25)
    assert result["ci95"][0] <= 0.25 <= result["ci95"][1]
