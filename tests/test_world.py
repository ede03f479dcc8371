"""The embedded default task: deterministic, answerable only from its passages, train/test disjoint."""

from __future__ import annotations

import json

from agentic_rag.data.world import generate_world, questions, write_world


def test_same_seed_same_world_other_seed_other_world(tmp_path):
    a = write_world(tmp_path / "a", seed=3)
    b = write_world(tmp_path / "b", seed=3)
    c = write_world(tmp_path / "c", seed=4)
    for key in ("corpus", "train", "test"):
        assert open(a[key], "rb").read() == open(b[key], "rb").read()
        assert open(a[key], "rb").read() != open(c[key], "rb").read()


def test_answers_are_in_the_gold_passages_and_splits_are_disjoint():
    world = generate_world(seed=0)
    passages = {p["title"]: p["text"] for p in world.passages()}
    assert len(passages) == len(world.passages()), "titles are unique"
    train, test = questions(world)
    assert len(test) + len(train) == len(world.people) and 50 <= len(test) <= 60
    for q in train + test:
        assert all(t in passages for t in q["supporting_facts"])
        assert q["answer"] in passages[q["supporting_facts"][-1]]
        assert q["hops"] == len(q["supporting_facts"])
    people = lambda qs: {q["supporting_facts"][0] for q in qs}  # noqa: E731
    assert not people(train) & people(test)
    assert {q["hops"] for q in test} == {1, 2}
    # held-out names are new combinations of words the training names also use
    train_words = {w for name in people(train) for w in name.split()}
    assert all(w in train_words for name in people(test) for w in name.split())
    assert len({name.split()[0] for name in world.people}) < len(world.people) / 4


def test_world_written_files_read_back(tmp_path):
    paths = write_world(tmp_path, seed=1)
    corpus = json.loads(open(paths["corpus"]).read())
    assert {"id", "title", "text"} <= set(corpus[0])
    from agentic_rag.data.questions import read_questions

    rows = read_questions(paths["test"])
    assert rows[0].answers and rows[0].gold_titles
