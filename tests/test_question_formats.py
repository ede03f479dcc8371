"""Dataset readers: every benchmark format on the shared public files and on hand-written fixtures in the
original formats (MuSiQue, Bamboogle, HotpotQA question-only, 2WikiMultiHopQA original)."""

from __future__ import annotations

import json

import pytest

from agentic_rag.data.questions import QuestionFormatError, detect_format, prompt_question, read_questions
from conftest import FIXTURES, shared


def first_record(path):
    text = path.read_text()
    return json.loads(text)[0] if text.lstrip().startswith("[") else json.loads(text.splitlines()[0])


@pytest.mark.parametrize("rel, fmt, n, first_id, answers, titles", [
    ("amor-hotpotqa/hotpotqa_dev.jsonl", "hotpotqa", 100, "5a85355a5542997b5ce3ffc8", ["beer and whisky"],
     ["Lucy Saunders", "Michael Jackson (writer)"]),
    ("hipporag/hotpotqa_train.json", "hotpotqa", 100, "5a77ec115542992a6e59dff7", ["a spirit"],
     ["Alû", "Lilu (mythology)"]),
    ("tts-project/2wikimultihopqa_dev500.json", "2wikimultihopqa", 500, "a1d9a65c0bd911eba7f7acde48001122",
     ["Detroit", "Detroit, Michigan", "Detroiter", "Motor City"],
     ["Aretha Franklin", "I Can't See Myself Leaving You"]),
    ("flashrag/nq_test.jsonl", "nq", 17, "test_0", ["Wilhelm Conrad Röntgen"], []),
    ("r1-searcher/hotpotqa_500.jsonl", "r1-searcher", 500, "1", ["Kauffman Stadium"], []),
    ("r1-searcher/2wiki_500.jsonl", "r1-searcher", 500, "1", ["Tetisheri"], []),
    ("r1-searcher/stage_1.jsonl", "r1-searcher", 350, "37653", ["U.S. Route 22"], []),
])
def test_shared_files(rel, fmt, n, first_id, answers, titles):
    path = shared(rel)
    assert detect_format(first_record(path)) == fmt
    rows = read_questions(path, require_answers=True)
    assert len(rows) == n and all(r.answers and r.question for r in rows)
    assert rows[0].id == first_id and rows[0].answers == answers and rows[0].gold_titles == titles
    assert read_questions(path, format=fmt, limit=3) == rows[:3]  # named explicitly: the same rows


def test_hotpotqa_distractor_keeps_its_paragraphs():
    row = read_questions(shared("amor-hotpotqa/hotpotqa_dev.jsonl"), limit=1)[0]
    paragraphs = row.meta["paragraphs"]
    assert row.meta["setting"] == "distractor" and len(paragraphs) == 10
    assert sum(p["is_supporting"] for p in paragraphs) == 2
    assert {p["title"] for p in paragraphs if p["is_supporting"]} == set(row.gold_titles)
    assert row.meta["type"] == "bridge" and row.meta["level"] == "hard"


def test_hotpotqa_question_only_fixture():
    rows = read_questions(FIXTURES / "hotpotqa_question_only_sample.json", require_answers=True)
    assert [r.id for r in rows] == ["qo0000000000000000000001", "qo0000000000000000000002"]
    assert rows[0].meta == {"type": "bridge", "level": "easy", "setting": "question-only"}
    assert rows[0].gold_titles == ["Tessaly Brandt", "Harbour of Quillmere"] and rows[1].answers == ["no"]


def test_2wiki_original_format_fixture():
    path = FIXTURES / "2wikimultihopqa_original_sample.json"
    assert detect_format(first_record(path)) == "2wikimultihopqa"
    (row,) = read_questions(path, require_answers=True)
    assert row.answers == ["Corvin College"] and row.gold_titles == ["The Lantern Keepers", "Ines Marlow"]
    assert row.meta["paragraphs"][0] == {"title": "The Lantern Keepers",
                                         "text": "The Lantern Keepers is a novel written by Ines Marlow.",
                                         "is_supporting": True}
    assert row.meta["evidences"][1] == ["Ines Marlow", "educated at", "Corvin College"]


def test_musique_fixture():
    path = FIXTURES / "musique_ans_dev_sample.jsonl"
    assert detect_format(first_record(path)) == "musique"
    rows = read_questions(path, require_answers=True)
    assert [r.id for r in rows] == ["2hop__90001_90002", "3hop1__90010_90011_90012", "2hop__90020_90021"]
    assert rows[0].answers == ["Odo Varga", "O. Varga"] and rows[2].answers == ["12,400", "12400"]
    assert rows[0].gold_titles == ["Tessaly Brandt", "Quillmere"]
    assert rows[1].gold_titles == ["The Lantern Keepers", "Ines Marlow", "Corvin College"]
    assert rows[1].meta["hops"] == 3 and rows[1].meta["answerable"] is True
    assert len(rows[1].meta["paragraphs"]) == 4 and rows[1].meta["question_decomposition"][2]["answer"] == "Dunmarch"


def test_bamboogle_csv_and_jsonl_fixtures():
    rows = read_questions(FIXTURES / "bamboogle_sample.csv", require_answers=True)
    assert len(rows) == 4 and [r.id for r in rows] == ["0", "1", "2", "3"]
    assert rows[0].question.startswith("Who was the mayor of Quillmere") and rows[0].answers == ["Odo Varga"]
    assert rows[3].answers == ["The Lantern Keepers"]
    rows = read_questions(FIXTURES / "bamboogle_sample.jsonl", require_answers=True)
    assert [r.answers for r in rows] == [["Tessaly Brandt"], ["Greyfield Park"]]
    assert read_questions(FIXTURES / "bamboogle_sample.jsonl", format="bamboogle") == rows


def test_medqa_gold_is_letter_and_text_and_the_prompt_shows_the_options():
    rows = read_questions(shared("medqa/medqa_us_4opt_test.jsonl"), require_answers=True)
    assert len(rows) == 1273
    row = rows[0]
    assert row.answers == ["B", "Tell the attending that he cannot fail to disclose this mistake"]
    assert row.meta["answer_idx"] == "B" and set(row.meta["options"]) == {"A", "B", "C", "D"}
    text = prompt_question(row)
    assert text.startswith(row.question) and "\n\nOptions:\nA. Disclose the error" in text
    assert "\nD. Refuse to dictate the operative report\n" in text and text.endswith("letter of the correct option.")
    plain = read_questions(shared("flashrag/nq_test.jsonl"), limit=1)[0]
    assert prompt_question(plain) == plain.question


def test_generic_reader_still_works():
    rows = read_questions(shared("r1-searcher/eval_results/hotpotqa_llama.jsonl"), limit=2, require_answers=True)
    assert rows[0].id == "0" and rows[0].answers == ["Nidal Hasan"]
    rows = read_questions(shared("r1-searcher/eval_results/hotpotqa_llama.jsonl"), limit=1, answer_field="pred_ans")
    assert rows[0].answers == ["Nidal Malik Hasan"]


def test_the_world_questions_keep_their_hops(tmp_path):
    """The report's one-hop / two-hop claims read ``meta["hops"]``: the world's files must carry it through."""
    from agentic_rag.data.world import write_world

    paths = write_world(tmp_path / "world", seed=0)
    rows = read_questions(paths["test"], require_answers=True)
    assert {row.meta["hops"] for row in rows} == {1, 2}


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("content, fmt, message", [
    ('{"question": "q1", "answer": "a"}\n{"answer": "b"}\n', "auto",
     r"bad\.jsonl:2: missing or empty field 'question'"),
    ('{"idx": 1, "question": "q1", "answer": "a"}\n\n{"idx": 2, "question": "q2"}\n', "auto",
     r"bad\.jsonl:3: missing field 'answer' \(no gold answer\)"),
    ('{"id": "1", "question": "q", "golden_answers": []}\n', "auto", r"bad\.jsonl:1: missing field 'golden_answers'"),
    ('{"question": "q", "options": {"A": "x", "B": "y"}, "answer_idx": "E"}\n', "auto",
     r"bad\.jsonl:1: field 'answer_idx' is 'E', not one of the options A, B"),
    ('{"question": "q", "options": ["x"], "answer_idx": "A"}\n', "medqa", r":1: field 'options' must be a dict"),
    ('{"question": "q", "answer": "a"}\n{"question": "q2", "answer": "b"\n', "auto", r"bad\.jsonl:2: invalid JSON"),
    ('{"id": "m", "question": "q", "answer": "a", "paragraphs": [{"title": "t"}]}\n', "auto",
     r":1: paragraphs\[0\] needs a 'paragraph_text' string"),
])
def test_malformed_records_name_the_field_and_the_line(tmp_path, content, fmt, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(QuestionFormatError, match=message):
        read_questions(path, format=fmt, require_answers=True)


def test_bad_csv_and_unknown_format(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Question,Answer\nWho?,Me\n,Nobody\n")
    with pytest.raises(QuestionFormatError, match=r"b\.csv:3: missing or empty field 'Question'"):
        read_questions(path)
    with pytest.raises(ValueError, match="unknown question format 'squad'"):
        read_questions(path, format="squad")


# ----------------------------------------------------------------------------------- the one JSONL reader


def test_the_jsonl_reader_skips_blank_lines_and_names_the_bad_line(tmp_path):
    from agentic_rag.errors import UserError
    from agentic_rag.jsonl import FileFormatError, iter_jsonl

    path = tmp_path / "x.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n  \r\n[2]\r\n"three"\n')  # a byte-order mark, CRLF, blank lines
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, [2]), (5, "three")]
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(FileFormatError, match=r"x\.jsonl:2: invalid JSON: Expecting value") as info:
        list(iter_jsonl(path))
    assert (info.value.path, info.value.line) == (str(path), 2) and isinstance(info.value, UserError)
    path.write_text('{"question": "q",\n "answer": "a"}\n')
    with pytest.raises(FileFormatError, match=r":1: invalid JSON: .*one JSON document spread over several lines"):
        list(iter_jsonl(path))
    assert str(FileFormatError(path, 0, "a folder")) == f"{path}: a folder"


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    from agentic_rag.evaluation.metrics import PredictionFileError, score_predictions
    from agentic_rag.jsonl import FileFormatError
    from agentic_rag.search.corpus import CorpusFormatError, iter_passages

    assert QuestionFormatError is CorpusFormatError is PredictionFileError is FileFormatError
    latin1 = '{"question": "Where is Zürich?", "answer": "Schweiz"}\n'.encode("latin-1")
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"question": "q", "answer": "a"}\n' + latin1)
    with pytest.raises(QuestionFormatError, match=r"q\.jsonl:2: not UTF-8 text \(byte b'\\xfc' at column 25\): "
                                                  r"save the file as UTF-8"):
        read_questions(path)
    path.write_bytes(b'[{"question": "q", "answer": "a"},\n' + latin1.rstrip(b"\n") + b"]\n")  # a JSON list
    with pytest.raises(QuestionFormatError, match=r"q\.jsonl:2: not UTF-8 text \(byte b'\\xfc' at column 25\)"):
        read_questions(path)
    preds = tmp_path / "p.jsonl"
    preds.write_bytes(b'{"pred_ans": "a", "answer": "a"}\n{"pred_ans": "Z\xfcrich", "answer": "a"}\n')
    with pytest.raises(PredictionFileError, match=r"p\.jsonl:2: not UTF-8"):
        score_predictions(preds)
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b'{"id": "1", "contents": "ok"}\n{"id": "2", "contents": "Z\xfcrich"}\n')
    for skip_bad in (False, True):  # the file's encoding is wrong, not one record: not skipped
        with pytest.raises(CorpusFormatError, match=r"c\.jsonl:2: not UTF-8"):
            list(iter_passages(corpus, "pyserini-jsonl", skip_bad=skip_bad))
