"""The wiki recipe search's split (experiments/wiki/recipes.py): the SFT half and the GRPO half of the training
questions are disjoint, cover the file, and keep each kind's share."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "wiki"))

import recipes  # noqa: E402

from agentic_rag.demo import wiki  # noqa: E402


def test_split_halves_are_disjoint_and_stratified(tmp_path: Path) -> None:
    kinds = ["multi_hop"] * 7 + ["pick_one"] * 4 + ["yes_no"] * 3
    rows = [{"id": f"q{i}", "kind": k, "question": f"question {i}?"} for i, k in enumerate(kinds)]
    (tmp_path / "data").mkdir()
    s = wiki.WikiSettings(out=tmp_path, seeds=[0])
    s.train_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft_half, grpo_half = recipes.split_halves(s)
    ids = [[json.loads(line)["id"] for line in half] for half in (sft_half, grpo_half)]
    assert not set(ids[0]) & set(ids[1]) and sorted(ids[0] + ids[1]) == sorted(r["id"] for r in rows)
    count = [Counter(json.loads(line)["kind"] for line in half) for half in (sft_half, grpo_half)]
    assert count[0] == Counter(multi_hop=4, pick_one=2, yes_no=2)
    assert count[1] == Counter(multi_hop=3, pick_one=2, yes_no=1)
    assert ids[0][:3] == ["q0", "q2", "q4"]  # every other question of a kind, in file order


def test_split_recipe_trains_on_the_grpo_half_of_its_kinds(tmp_path: Path) -> None:
    kinds = ["multi_hop", "pick_one", "multi_hop", "yes_no", "multi_hop", "multi_hop"]
    (tmp_path / "data").mkdir()
    s = wiki.WikiSettings(out=tmp_path, seeds=[0])
    s.train_file.write_text("".join(json.dumps({"id": f"q{i}", "kind": k}) + "\n" for i, k in enumerate(kinds)))
    recipes.grpo_half_file(s).write_text("".join(recipes.split_halves(s)[1]))
    sets = recipes.recipe_sets(s, "split_answer_branch_multi_lr3e4")
    assert [json.loads(line)["id"] for line in open(sets["data.train_file"])] == ["q2", "q5"]
    assert Path(recipes.recipe_sets(s, "split_shipped")["data.train_file"]).name == "train_grpo_half.jsonl"
    assert "data.train_file" not in recipes.recipe_sets(s, "shipped")
