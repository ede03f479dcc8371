"""A user's slips, as a new user makes them, with real files, a real Lucene index and the real command line: no
output destroys what the command did not make, no output is written over an input, a failed search is never scored
as a result, ``eval --overwrite`` keeps the old results until the new ones are complete, and every mistake in the
input is one clear line with exit code 2 (a traceback only for a bug).

Each class here failed on the code before issue 29 (experiments/reliability/README.md has the before/after table)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentic_rag.evaluation.config import config_from_dict
from agentic_rag.evaluation.runner import run_evaluation
from conftest import ROOT, free_port, shared
from fake_openai import FakeOpenAI, ScriptedCompletions

DEV = "tts-project/2wikimultihopqa_dev500.json"


def cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", AGENTIC_RAG_LOG_LEVEL="WARNING")
    return subprocess.run([sys.executable, "-m", "agentic_rag.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (or ``root`` itself) with its sha256: what must survive a refused command."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def one_clear_line(out: subprocess.CompletedProcess, *expected: str, rc: int = 2) -> None:
    """The command failed with ``rc``, said so in a few lines holding ``expected``, and printed no stack."""
    err = out.stderr
    assert out.returncode == rc, (out.returncode, err[-2000:])
    assert "Traceback" not in err and "\tat org." not in err and "\torg.apache" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip() and "WARNING" not in ln and "%|" not in ln]
    assert len(lines) <= 4, err
    for text in expected:
        assert text in err, (text, err)


def user_folder(path: Path, *extra: tuple[str, str]) -> Path:
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("precious, and not agentic-rag's\n")
    for name, text in extra:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


# ------------------------------------------------------------------------- outputs and the user's folders


def test_index_build_never_destroys_a_folder_it_did_not_make(tmp_path, corpus_file):
    # the case: the corpus and the user's notes inside --out
    mydata = user_folder(tmp_path / "mydata")
    shutil.copy(corpus_file, mydata / "corpus.jsonl")
    before = digest(mydata)
    out = cli("index", "build", "--corpus", "mydata/corpus.jsonl", "--out", "mydata", "--bm25", cwd=tmp_path)
    one_clear_line(out, "the --corpus input mydata/corpus.jsonl is inside --out mydata")
    assert digest(mydata) == before and not list(tmp_path.glob("mydata.*"))

    # a folder of the user's: refused, then moved aside (never deleted) with --move-aside
    theirs = user_folder(tmp_path / "theirs")
    before = digest(theirs)
    one_clear_line(cli("index", "build", "--corpus", str(corpus_file), "--out", "theirs", "--bm25", cwd=tmp_path),
                   "--out theirs holds files agentic-rag did not write (notes.txt)", "--move-aside")
    assert digest(theirs) == before
    out = cli("index", "build", "--corpus", str(corpus_file), "--out", "theirs", "--bm25", "--move-aside",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (moved,) = tmp_path.glob("theirs.moved-*")
    assert {k.replace(moved.name, "theirs"): v for k, v in digest(moved).items()} == before
    assert (tmp_path / "theirs" / "manifest.json").is_file()
    # its own index is rebuilt in place (--force), the old one replaced only once the new one is complete
    out = cli("index", "build", "--corpus", str(corpus_file), "--out", "theirs", "--bm25", "--force", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["mydata", "theirs", moved.name])

    # --out naming a file: refused, the file untouched (it used to be renamed to FILE.old)
    note = tmp_path / "index.txt"
    note.write_text("a file")
    one_clear_line(cli("index", "build", "--corpus", str(corpus_file), "--out", "index.txt", "--bm25",
                       cwd=tmp_path), "--out index.txt is a file")
    assert note.read_text() == "a file" and not (tmp_path / "index.txt.old").exists()


@pytest.mark.parametrize("case", ["world", "index-link", "sft", "sft-file", "train-check"])
def test_other_writers_refuse_a_folder_they_did_not_make(case, tmp_path, index_dir, tiny_model_dir):
    theirs = user_folder(tmp_path / "theirs", ("corpus/part.txt", "the user's own corpus folder"))
    before = digest(theirs)
    if case == "world":
        out = cli("world", "--out", "theirs", cwd=tmp_path)
    elif case == "index-link":
        out = cli("index", "link", "--out", "theirs", "--lucene", str(index_dir / "bm25"), cwd=tmp_path)
    elif case in ("sft", "sft-file"):
        data = tmp_path / "traj.jsonl"
        data.write_text(json.dumps({"question": "q?", "completion": "<answer>a</answer>"}) + "\n")
        target = "theirs"
        if case == "sft-file":
            target = "out.bin"
            (tmp_path / target).write_text("a file")
            before = digest(tmp_path / target)
        out = cli("sft", "--model", str(tiny_model_dir), "--data", str(data), "--out", target, cwd=tmp_path)
    else:
        cfg = train_config(tmp_path, tiny_model_dir, index_dir, output_dir=tmp_path / "theirs")
        out = cli("train", "--config", str(cfg), "--check", cwd=tmp_path)
    if case == "sft-file":
        one_clear_line(out, "--out out.bin is a file")
        assert digest(tmp_path / "out.bin") == before
        return
    one_clear_line(out, "theirs holds files agentic-rag did not write", "--move-aside")
    assert digest(theirs) == before


@pytest.mark.parametrize("case", ["corpus-build", "search-output", "eval-retrieval-output", "eval-report-out"])
def test_an_output_is_never_written_over_an_input(case, tmp_path, corpus_file, index_dir):
    questions = tmp_path / "questions.jsonl"
    dev = json.loads(shared(DEV).read_text())[:3]
    questions.write_text("".join(json.dumps(r) + "\n" for r in dev))
    if case == "corpus-build":
        target = tmp_path / "corpus.json"
        shutil.copy(corpus_file, target)
        before = digest(target)
        out = cli("corpus", "build", "--input", "corpus.json", "--out", "./corpus.json", cwd=tmp_path)
        expected = "--out ./corpus.json is the --input input corpus.json"
    elif case in ("search-output", "eval-retrieval-output"):
        target, before = questions, digest(questions)
        if case == "search-output":
            out = cli("search", "--index", str(index_dir), "--queries", "questions.jsonl", "--output",
                      "questions.jsonl", cwd=tmp_path)
        else:
            out = cli("eval-retrieval", "--index", str(index_dir), "--questions", "questions.jsonl", "--output",
                      "questions.jsonl", cwd=tmp_path)
        expected = "--output questions.jsonl is the --queries input" if case == "search-output" else \
            "--output questions.jsonl is the --questions input"
    else:
        run = tmp_path / "run"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"run": "r", "n": 1, "metrics": {"em": 0.5}}))
        target, before = run / "summary.json", digest(run / "summary.json")
        out = cli("eval-report", "--runs", "run", "--out", "run/summary.json", cwd=tmp_path)
        expected = "--out run/summary.json is the --runs"
    one_clear_line(out, expected)
    assert digest(target) == before


# ------------------------------------------------------------------------- a failure is never a result


def endpoint_eval(url: str, tok_dir: Path, index: str, out: Path, n: int = 4, **extra) -> dict:
    return {"name": "slip", "dataset": {"path": str(shared(DEV)), "limit": n},
            "policy": {"type": "endpoint", "model": "fake-model", "base_url": url, "tokenizer": str(tok_dir)},
            "search": {"index": index, "timeout_s": 5}, "rollout": {"passages_per_search": 2}, "batch_size": n,
            "output_dir": str(out), **extra}


def search_then_answer(n: int) -> ScriptedCompletions:
    rows = json.loads(shared(DEV).read_text())[:n]
    return ScriptedCompletions({r["question"]: [f"<search>{r['question']}</search>", f"<answer>{r['answer']}</answer>"]
                                for r in rows})


def test_eval_against_a_dead_search_server_stops_before_the_model_and_scores_nothing(tmp_path, tok_dir):
    dead = f"http://127.0.0.1:{free_port()}"
    with FakeOpenAI(completions=search_then_answer(4)) as srv:
        cfg = tmp_path / "eval.yaml"
        cfg.write_text(yaml.safe_dump(endpoint_eval(srv.url, tok_dir, dead, tmp_path / "run")))
        out = cli("eval", "--config", str(cfg), "--no-progress", cwd=tmp_path)
        assert not srv.bodies("/v1/completions")  # the policy was never asked
    one_clear_line(out, f"the search target {dead} does not answer a probe query", "serve-search")
    assert not (tmp_path / "run" / "summary.json").exists() and not (tmp_path / "run" / "predictions.jsonl").exists()


class FailingHalf:
    """A real searcher whose every other call fails, as a server that falls over mid-run does."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def search(self, query, k=10):
        return self.inner.search(query, k)

    def batch_search(self, queries, k=10):
        self.calls += 1
        if self.calls % 2 == 0:
            raise ConnectionError("search server went away")
        return self.inner.batch_search(queries, k)


def test_a_run_whose_searches_fail_ends_non_zero_and_says_how_many(tmp_path, tok_dir, index_dir):
    from agentic_rag.errors import SearchFailuresError
    from agentic_rag.search import open_searcher

    with FakeOpenAI(completions=search_then_answer(6)) as srv:
        data = endpoint_eval(srv.url, tok_dir, str(index_dir), tmp_path / "run", n=6)
        data["batch_size"] = 1
        with pytest.raises(SearchFailuresError, match=r"3 of 6 searches failed \(50\.0%") as info:
            run_evaluation(config_from_dict(data), searcher=FailingHalf(open_searcher(index_dir)), progress=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["search_failures"] == {"failed": 3, "searches": 6, "rate": 0.5, "max_rate": 0.05,
                                          "over_threshold": True}
    assert info.value.exit_code == 3 and info.value.summary["n"] == 6
    # a threshold the user raised lets the same run count
    with FakeOpenAI(completions=search_then_answer(6)) as srv:
        data = endpoint_eval(srv.url, tok_dir, str(index_dir), tmp_path / "run2", n=6)
        data["search"]["max_failure_rate"] = 0.6
        data["batch_size"] = 1
        summary = run_evaluation(config_from_dict(data), searcher=FailingHalf(open_searcher(index_dir)),
                                 progress=False)
    assert summary["search_failures"]["over_threshold"] is False


def test_eval_overwrite_keeps_the_old_results_until_the_new_run_is_complete(tmp_path, tok_dir, index_dir):
    run = tmp_path / "run"
    with FakeOpenAI(completions=search_then_answer(4)) as srv:
        data = endpoint_eval(srv.url, tok_dir, str(index_dir), run)
        run_evaluation(config_from_dict(data), progress=False)
        before = digest(run)
        # --overwrite with a local model that cannot load: the old results are still there, whole
        broken = tmp_path / "broken-model"
        broken.mkdir()
        (broken / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
        (broken / "model.safetensors").write_bytes(b"not weights")
        bad = dict(data, policy={"type": "local", "model": str(broken), "tokenizer": str(tok_dir)})
        cfg = tmp_path / "bad.yaml"
        cfg.write_text(yaml.safe_dump(bad))
        out = cli("eval", "--config", str(cfg), "--overwrite", "--no-progress", cwd=tmp_path)
        assert out.returncode != 0
        kept = {k: v for k, v in digest(run).items() if "/.overwrite/" not in k and not k.endswith(".agentic-rag.json")}
        assert kept == {k: v for k, v in before.items() if not k.endswith(".agentic-rag.json")}
        # a complete --overwrite run replaces them
        data2 = dict(data, dataset={"path": str(shared(DEV)), "limit": 2}, batch_size=2)
        data2["rollout"] = {"passages_per_search": 2, "max_turns": 6}
        summary = run_evaluation(config_from_dict(data2), progress=False, overwrite=True)
    assert summary["n"] == 2 and not (run / ".overwrite").exists()
    assert len((run / "predictions.jsonl").read_text().splitlines()) == 2


def test_eval_into_a_folder_with_another_programs_predictions_is_refused(tmp_path, tok_dir, index_dir):
    theirs = user_folder(tmp_path / "run", ("predictions.jsonl", '{"question": "q", "pred": "x"}\n'))
    before = digest(theirs)
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump(endpoint_eval("http://127.0.0.1:9/v1", tok_dir, str(index_dir), theirs)))
    out = cli("eval", "--config", str(cfg), "--no-progress", cwd=tmp_path)
    one_clear_line(out, "output_dir", "holds files agentic-rag did not write", "--move-aside")
    assert digest(theirs) == before


# ------------------------------------------------------------------------- one clear line, exit code 2


def damaged_index(index_dir: Path, tmp_path: Path) -> Path:
    broken = tmp_path / "broken-index"
    shutil.copytree(index_dir, broken)
    victim = next(p for p in sorted((broken / "bm25").iterdir()) if p.name.endswith(".doc"))
    victim.unlink()
    return broken


def train_config(tmp_path: Path, model: Path, index: Path | str, **over) -> Path:
    questions = tmp_path / "train.jsonl"
    questions.write_text("".join(json.dumps({"question": f"q{i}?", "answer": "a"}) + "\n" for i in range(4)))
    cfg = {"model": {"name_or_path": str(model)}, "data": {"train_file": str(questions)},
           "search": {"index": str(index)}, "logging": {"swanlab_mode": "disabled"},
           "checkpoint": {"output_dir": str(over.pop("output_dir", tmp_path / "out"))}, **over}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("case", ["search", "serve-search", "eval", "train-check"])
def test_a_damaged_lucene_index_is_one_line_with_the_rebuild_command(case, tmp_path, index_dir, tok_dir,
                                                                      tiny_model_dir):
    broken = damaged_index(index_dir, tmp_path)
    if case == "search":
        out = cli("search", "--index", str(broken), "some query", cwd=tmp_path)
    elif case == "serve-search":
        out = cli("serve-search", "--index", str(broken), "--port", str(free_port()), cwd=tmp_path)
    elif case == "eval":
        with FakeOpenAI(completions=search_then_answer(4)) as srv:
            cfg = tmp_path / "eval.yaml"
            cfg.write_text(yaml.safe_dump(endpoint_eval(srv.url, tok_dir, str(broken), tmp_path / "run")))
            out = cli("eval", "--config", str(cfg), "--no-progress", cwd=tmp_path)
    else:
        out = cli("train", "--config", str(train_config(tmp_path, tiny_model_dir, broken)), "--check", cwd=tmp_path)
    one_clear_line(out, "cannot open the Lucene index", "NoSuchFileException", "index build", "--force")


@pytest.mark.parametrize("case", [
    "score-dir", "sft-data-dir", "index-corpus-dir", "search-k0", "report-corrupt-summary", "nq-no-answers",
    "train-check-model-file", "train-check-dead-url", "train-resume-nothing", "hub-name-offline"])
def test_user_input_errors_are_one_clear_line(case, tmp_path, tiny_model_dir, index_dir, corpus_file, tok_dir):
    folder = tmp_path / "afolder"
    folder.mkdir()
    if case == "score-dir":
        out, expected = cli("score", "--predictions", "afolder", cwd=tmp_path), ["--predictions afolder is a folder"]
    elif case == "sft-data-dir":
        out = cli("sft", "--model", str(tiny_model_dir), "--data", "afolder", "--out", "o", cwd=tmp_path)
        expected = ["--data afolder is a folder"]
    elif case == "index-corpus-dir":
        out = cli("index", "build", "--corpus", "afolder", "--out", "idx", cwd=tmp_path)
        expected = ["--corpus afolder is a folder"]
    elif case == "search-k0":
        out, expected = cli("search", "--index", str(index_dir), "-k", "0", "q", cwd=tmp_path), ["must be >= 1"]
    elif case == "report-corrupt-summary":
        (folder / "summary.json").write_text('{"run": "x", "metrics": {"em": 0.')
        out = cli("eval-report", "--runs", "afolder", "--out", "r.md", cwd=tmp_path)
        expected = [f"{Path('afolder') / 'summary.json'} is not a readable evaluation summary"]
    elif case == "nq-no-answers":
        nq = tmp_path / "nq.jsonl"
        nq.write_text(json.dumps({"id": "1", "question": "who?", "golden_answers": ["x"]}) + "\n"
                      + json.dumps({"id": "2", "question": "what?"}) + "\n")
        cfg = tmp_path / "eval.yaml"
        cfg.write_text(yaml.safe_dump(endpoint_eval("http://127.0.0.1:9/v1", tok_dir, str(index_dir), tmp_path / "r")
                                      | {"dataset": {"path": str(nq)}}))
        out = cli("eval", "--config", str(cfg), cwd=tmp_path)  # the questions are read before any endpoint is asked
        expected = ["nq.jsonl:2: missing field 'golden_answers'"]
    elif case == "train-check-model-file":
        model = tmp_path / "model.txt"
        model.write_text("not a model")
        out = cli("train", "--config", str(train_config(tmp_path, model, index_dir)), "--check", cwd=tmp_path)
        expected = ["model.txt is a file, not a model"]
    elif case == "train-check-dead-url":
        url = f"http://127.0.0.1:{free_port()}"
        out = cli("train", "--config", str(train_config(tmp_path, tiny_model_dir, url)), "--check", cwd=tmp_path)
        expected = [f"the search target {url} does not answer a probe query"]
    elif case == "train-resume-nothing":
        out = cli("train", "--config", str(train_config(tmp_path, tiny_model_dir, index_dir)), "--resume",
                  cwd=tmp_path)
        expected = ["holds no complete checkpoint to resume from"]
    else:
        out = cli("train", "--config", str(train_config(tmp_path, "Org/no-such-model-anywhere", index_dir)),
                  "--check", cwd=tmp_path, timeout=60)
        expected = ["'Org/no-such-model-anywhere' is not a local path"]
    one_clear_line(out, *expected)


def test_a_bug_is_a_traceback_with_a_report_line(capsys):
    from agentic_rag.errors import UserError, guarded

    def bug() -> int:
        return {}["missing"]

    assert guarded("agentic-rag world", bug) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'missing'" in err and "this is a bug in agentic-rag" in err

    def slip() -> int:
        raise UserError("--out x is a file")

    assert guarded("agentic-rag world", slip) == 2
    assert capsys.readouterr().err == "agentic-rag world: error: --out x is a file\n"


def test_out_of_gpu_memory_is_advice_not_a_bug_report(capsys):
    """Seen on an H100 shared by 8 training runs: a CUDA out-of-memory error in the validation callback ended with
    'internal error: this is a bug in agentic-rag'. It is the settings (or the neighbours) asking for more memory
    than the card has: one line with the knobs that lower it, exit 2, no traceback."""
    import torch

    from agentic_rag.errors import guarded

    def oom() -> int:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 54.00 MiB. GPU 0 has a total capacity "
                                     "of 79.18 GiB of which 30.69 MiB is free.\nmore detail")

    assert guarded("agentic-rag train", oom) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "bug" not in err
    assert err.startswith("agentic-rag train: error: out of GPU memory (CUDA out of memory. Tried to allocate")
    assert "per_device_train_batch_size" in err and "--resume" in err


def test_a_missing_dependency_is_an_install_fix_not_a_bug_report(monkeypatch, capsys):
    """Seen on a GPU machine whose environment had every package but ragas: a training run with the ragas reward
    ended with 'internal error (ModuleNotFoundError): this is a bug in agentic-rag'. A declared dependency missing
    from the environment is a broken install: one line naming the pinned requirement, exit 2. A missing module of
    our own, or one we do not declare, is still a bug (traceback, exit 1)."""
    from agentic_rag.errors import guarded
    from agentic_rag.rewards.rag import RetrievalQuality

    for name in ["ragas", *(m for m in sys.modules if m.startswith("ragas."))]:  # loaded by an earlier test or not,
        monkeypatch.setitem(sys.modules, name, None)  # "import ragas..." now fails as if it were not installed
    assert guarded("agentic-rag train", lambda: RetrievalQuality("id_recall", None) and 0) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "bug" not in err
    assert err.startswith("agentic-rag train: error: this environment lacks ragas, a dependency of agentic-rag")
    assert "pip install 'ragas==0.4.3'" in err

    monkeypatch.setitem(sys.modules, "yaml", None)  # PyYAML: the distribution's name is not the module's
    assert guarded("agentic-rag train", lambda: __import__("yaml")) == 2
    assert "lacks PyYAML" in capsys.readouterr().err

    assert guarded("agentic-rag train", lambda: __import__("agentic_rag.no_such_module")) == 1
    assert "this is a bug in agentic-rag" in capsys.readouterr().err
    assert guarded("agentic-rag train", lambda: __import__("a_package_nobody_declares")) == 1
    assert "this is a bug in agentic-rag" in capsys.readouterr().err


def test_project_root_scripts_are_not_touched(tmp_path):
    """The tests above ran in temporary folders: nothing of theirs leaked into the checkout."""
    assert not list(ROOT.glob("theirs*")) and not list(ROOT.glob("mydata*"))


def test_the_step_benchmark_takes_a_recipes_own_adapter_and_names_a_missing_one(tmp_path):
    """grpo_step_real.py measures a recipe's own SFT start with ``--set model.adapter=DIR``: it then checks DIR, not
    the quick start's ``sft``, and refuses a DIR without an adapter by name before anything loads (the run itself,
    minutes of GRPO on the real model, is the benchmark's, not this test's)."""
    script = ROOT / "experiments" / "benchmarks" / "grpo_step_real.py"
    qs = tmp_path / "qs"
    qs.mkdir()
    plain = subprocess.run([sys.executable, str(script), "--task", "wiki", "--quickstart", str(qs)],
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2 and f"no SFT adapter at {qs / 'sft'}" in plain.stderr
    missing = tmp_path / "no_adapter"
    bad = subprocess.run([sys.executable, str(script), "--task", "wiki", "--quickstart", str(qs),
                          "--set", f"model.adapter={missing}"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2, bad.stderr
    assert f"--set model.adapter={missing}: no adapter_config.json there" in bad.stderr
    assert "no SFT adapter at" not in bad.stderr
