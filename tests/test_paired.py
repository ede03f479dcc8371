"""Paired comparisons of two evaluations (agentic_rag.evaluation.paired): flips counted per question, McNemar's exact
p computed from them."""

from __future__ import annotations

import json

import pytest

from agentic_rag.evaluation.paired import mcnemar, paired, predictions


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
    assert paired(a, b) == {"questions": 4, "better": 1, "worse": 1, "p": 1.0}
    multi = paired(a, b, where=lambda r: r["meta"]["kind"] == "multi_hop")
    assert multi == {"questions": 3, "better": 1, "worse": 0, "p": 1.0}
