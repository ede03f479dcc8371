"""Reliability round 4 (issue 56), each case a real process in a fresh folder: no command deletes a work folder or
file it did not make; one run per output folder (a second is refused in one line naming the first's process); a
training run whose searches fail ends non-zero whatever its batch size, with the count in its summary; a question
past the model's context is refused before anything is generated; a read-only or full disk, a damaged adapter and a
``--resume`` of a finished run are one line, never a traceback.

Each class here failed on the code before issue 56 (experiments/reliability/README.md has the before/after table).
The untrusted-text cases are in tests/test_untrusted_text.py, the slow and oversized HTTP clients in
tests/test_http_guard.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, free_port, shared
from fake_openai import FakeOpenAI
from test_user_slips import (
    DEV,
    cli,
    digest,
    endpoint_eval,
    one_clear_line,
    search_then_answer,
    train_config,
    user_folder,
)


def sft_data(tmp_path: Path) -> Path:
    data = tmp_path / "traj.jsonl"
    data.write_text(json.dumps({"question": "Where was Dovan Kell born?",
                                "completion": "<search>Dovan Kell</search>\n\n<observation>\nDovan Kell was born in "
                                              "Arrow.\n</observation>\n\n<answer>Arrow</answer>"}) + "\n")
    return data


# ------------------------------------------------------------------------- nothing deletes what it did not make


def test_sft_never_empties_a_partial_folder_it_did_not_make(tmp_path, tiny_model_dir):
    # the case: the user's own folder out.partial (the old code deleted it and went on, exit 0)
    theirs = user_folder(tmp_path / "out.partial", ("drafts/plan.md", "the user's plan"))
    before = digest(theirs)
    data = sft_data(tmp_path)
    out = cli("sft", "--model", str(tiny_model_dir), "--data", str(data), "--out", "out", "--epochs", "1",
              cwd=tmp_path)
    one_clear_line(out, "out.partial holds files agentic-rag did not write", "--move-aside")
    assert digest(theirs) == before and not (tmp_path / "out").exists()
    # --move-aside renames it (never deletes it) and the run goes on
    out = cli("sft", "--model", str(tiny_model_dir), "--data", str(data), "--out", "out", "--epochs", "1",
              "--move-aside", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (moved,) = tmp_path.glob("out.partial.moved-*")
    assert {k.replace(moved.name, "out.partial"): v for k, v in digest(moved).items()} == before
    assert (tmp_path / "out" / "adapter_config.json").is_file() and not (tmp_path / "out.partial").exists()


def test_index_build_never_empties_a_partial_folder_that_only_looks_like_its_own(tmp_path, corpus_file):
    # the case: only names a build writes at the top (corpus/, bm25/), the user's files inside: the old
    # code took the folder for an interrupted build and emptied it. Only the build's marker makes it the build's.
    theirs = tmp_path / "data.partial"
    for rel, text in (("corpus/passages.txt", "mine"), ("bm25/notes.md", "mine too")):
        (theirs / rel).parent.mkdir(parents=True, exist_ok=True)
        (theirs / rel).write_text(text)
    before = digest(theirs)
    out = cli("index", "build", "--corpus", str(corpus_file), "--out", "data", "--bm25", cwd=tmp_path)
    one_clear_line(out, "data.partial holds files agentic-rag did not write", "--move-aside")
    assert digest(theirs) == before and not (tmp_path / "data").exists()


def test_work_files_are_fresh_names_never_the_users(tmp_path, corpus_file, index_dir):
    # a file of the user's with the name a command's work file once had: neither truncated nor removed
    shutil.copy(corpus_file, tmp_path / "c.json")
    for name in ("out.jsonl.partial", ".hits.jsonl.partial"):
        (tmp_path / name).write_text(f"the user's {name}\n")
    before = {n: digest(tmp_path / n) for n in ("out.jsonl.partial", ".hits.jsonl.partial")}
    out = cli("corpus", "build", "--input", "c.json", "--out", "out.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in json.loads(shared(DEV).read_text())[:3]))
    out = cli("search", "--index", str(index_dir), "--queries", "q.jsonl", "--output", "hits.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert {n: digest(tmp_path / n) for n in before} == before
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 60
    assert len((tmp_path / "hits.jsonl").read_text().splitlines()) == 3
    # and nothing of the commands' own is left beside the outputs
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".hits.jsonl.partial", "c.json", "hits.jsonl", "out.jsonl", "out.jsonl.partial", "q.jsonl"])


# ------------------------------------------------------------------------- one run per output folder


@contextlib.contextmanager
def held_by_another_process(path: Path, command: str = "agentic-rag eval"):
    """A real second process holding ``path``'s output lock (as a run writing it does) until the block ends."""
    code = ("import sys, time; from agentic_rag.outputs import output_lock\n"
            f"with output_lock({str(path)!r}, {command!r}):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_two_index_builds_into_one_folder_the_second_is_refused_naming_the_first(tmp_path, corpus_file):
    env = dict(os.environ, HF_HUB_OFFLINE="1", AGENTIC_RAG_LOG_LEVEL="WARNING")
    first = subprocess.Popen([sys.executable, "-m", "agentic_rag.cli", "index", "build", "--corpus", str(corpus_file),
                              "--out", "data", "--bm25"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    lock = tmp_path / ".data.agentic-rag.lock"
    deadline = time.time() + 60
    while not (lock.is_file() and f'"pid": {first.pid}' in lock.read_text()):
        assert first.poll() is None and time.time() < deadline, "the first build never took its lock"
        time.sleep(0.05)
    second = cli("index", "build", "--corpus", str(corpus_file), "--out", "data", "--bm25", cwd=tmp_path)
    one_clear_line(second, "--out data is being written by another agentic-rag run",
                   f"pid {first.pid}, agentic-rag index build")
    assert "LockObtainFailed" not in second.stderr
    _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err[-3000:]
    assert json.loads((tmp_path / "data" / "manifest.json").read_text())["corpus"]["passages"] == 60
    assert not lock.exists()  # released and removed when the build ended


def test_a_second_eval_into_a_folder_in_use_is_refused_and_adds_nothing(tmp_path, tok_dir, index_dir):
    with FakeOpenAI(completions=search_then_answer(4)) as srv:
        cfg = tmp_path / "eval.yaml"
        cfg.write_text(yaml.safe_dump(endpoint_eval(srv.url, tok_dir, str(index_dir), tmp_path / "run")))
        first = cli("eval", "--config", str(cfg), "--no-progress", cwd=tmp_path)
        assert first.returncode == 0, first.stderr[-3000:]
        before = digest(tmp_path / "run")
        with held_by_another_process(tmp_path / "run") as pid:
            out = cli("eval", "--config", str(cfg), "--no-progress", "--overwrite", cwd=tmp_path)
            one_clear_line(out, "output_dir", "is being written by another agentic-rag run",
                           f"pid {pid}, agentic-rag eval")
        assert digest(tmp_path / "run") == before


@pytest.mark.parametrize("case", ["sft", "train", "world", "quickstart"])
def test_every_writer_refuses_a_folder_another_run_is_writing(case, tmp_path, tiny_model_dir, index_dir):
    target = tmp_path / "out"
    with held_by_another_process(target, "agentic-rag " + case) as pid:
        if case == "sft":
            out = cli("sft", "--model", str(tiny_model_dir), "--data", str(sft_data(tmp_path)), "--out", "out",
                      cwd=tmp_path)
        elif case == "train":
            out = cli("train", "--config", str(train_config(tmp_path, tiny_model_dir, index_dir)), cwd=tmp_path)
        elif case == "world":
            out = cli("world", "--out", "out", cwd=tmp_path)
        else:
            out = subprocess.run([sys.executable, "-m", "agentic_rag.demo.quickstart", "--tiny", "--out", "out"],
                                 capture_output=True, text=True, cwd=tmp_path, timeout=240,
                                 env=dict(os.environ, HF_HUB_OFFLINE="1"))
        one_clear_line(out, "out is being written by another agentic-rag run", f"pid {pid}")
    assert not target.exists() and not (tmp_path / "out.partial").exists()


def test_an_output_in_a_folder_the_user_cannot_write_beside_is_locked_in_the_temp_folder(tmp_path, monkeypatch):
    """An output folder made for the user inside someone else's folder: the lock cannot go beside it (permission
    denied there), so it goes to the temporary folder, named by the output's real path, and the run goes on."""
    import hashlib
    import tempfile

    from agentic_rag.outputs import output_lock

    (tmp_path / "mine").mkdir()
    real_open = os.open

    def no_writing_beside(path, flags, mode=0o777):
        if Path(path).parent == tmp_path and str(path).endswith(".agentic-rag.lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", no_writing_beside)
    digest_ = hashlib.sha256(os.path.realpath(tmp_path / "mine").encode()).hexdigest()[:24]
    fallback = Path(tempfile.gettempdir()) / f"agentic-rag-{digest_}.lock"
    with output_lock(tmp_path / "mine", "agentic-rag eval"):
        assert json.loads(fallback.read_text())["command"] == "agentic-rag eval"
        assert not list(tmp_path.glob(".*.lock"))
    assert not fallback.exists()


# ------------------------------------------------------------------------- a failed search is never trained on


def test_training_with_a_few_searches_a_batch_all_failing_ends_non_zero_with_the_count(tmp_path, tiny_model_dir,
                                                                                        world_dir, monkeypatch):
    """Two searches a rollout batch, every one failing, 2 steps: under the old rule (a batch of 10, or 50 in all)
    the run ended 0 with a saved adapter. Now it ends with SearchFailuresError (exit 3) after the adapter and a
    summary that counts the failures: the run's own entry point, its own searcher replaced by a dead one."""
    import torch

    import agentic_rag.tools.build as tools  # where build_tools makes the search tool
    import agentic_rag.training.trainer as trainer_mod
    from agentic_rag.errors import SearchFailuresError
    from agentic_rag.models import load_tokenizer
    from agentic_rag.training.config import load_config
    from agentic_rag.training.train import run
    from test_training import WentAway

    search = load_tokenizer(str(tiny_model_dir))("<search>who</search>", add_special_tokens=False)["input_ids"]

    def always_search(scores, rows):  # the policy writes one search tag; the search fails
        out = torch.full_like(scores, float("-inf"))
        for j, row in enumerate(rows):
            step = len(row.generated)
            out[j, search[step] if step < len(search) else 0] = 0
        return out

    class Scripted(trainer_mod.AgenticGRPOTrainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, processors=[always_search], **kw)

    monkeypatch.setattr(trainer_mod, "AgenticGRPOTrainer", Scripted)
    real_tool = tools.SearchTool
    monkeypatch.setattr(tools, "SearchTool", lambda searcher: real_tool(WentAway()))
    cfg_path = train_config(tmp_path, tiny_model_dir, world_dir / "index",
                            rollout={"max_turns": 2, "max_tokens_per_turn": 12, "max_completion_tokens": 64,
                                     "passages_per_search": 1, "max_observation_tokens": 32},
                            algorithm={"num_generations": 2, "per_device_train_batch_size": 2, "max_steps": 2,
                                       "learning_rate": 0.001},
                            checkpoint={"output_dir": str(tmp_path / "out"), "save_steps": 1})
    with pytest.raises(SearchFailuresError, match=r"4 of the run's 4 searches failed \(100\.0%") as info:
        run(load_config(str(cfg_path)))
    assert info.value.exit_code == 3
    summary = json.loads((tmp_path / "out" / "train_summary.json").read_text())
    assert summary["search_failures"] == {"failed": 4, "searches": 4, "rate": 1.0, "max_rate": 0.05,
                                          "over_threshold": True}
    # the counts travel with each checkpoint, so a resumed run counts on from them
    assert json.loads((tmp_path / "out" / "checkpoint-2" / "search_totals.json").read_text()) == {
        "failed": 4, "searches": 4}


def test_search_failures_stop_a_run_once_five_have_failed_over_the_rate():
    from agentic_rag.errors import SearchFailuresError
    from agentic_rag.training.search_failures import SearchFailures

    counts = SearchFailures(max_rate=0.05)
    counts.add(2, 2, step=0)
    counts.add(2, 2, step=1)  # 4 failures: not yet (a flaky target's first misses)
    with pytest.raises(SearchFailuresError, match=r"training stopped at step 2: 2 of 2 searches .* 6 of 6"):
        counts.add(2, 2, step=2)
    healthy = SearchFailures(max_rate=0.05)
    for step in range(20):
        healthy.add(1 if step % 10 == 0 else 0, 40, step=step)  # 2 of 800: under the rate, never stops
    assert healthy.summary()["over_threshold"] is False


# ------------------------------------------------------------------------- oversized input


def huge_question_file(tmp_path: Path) -> Path:
    rows = [{"id": "ok-1", "question": "Where was Dovan Kell born?", "answer": "Arrow"},
            {"id": "huge-1", "question": "word " * 200_000 + "?", "answer": "a"}]  # 1 MB
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_refuses_a_question_past_the_models_context_before_generating(tmp_path, tiny_model_dir, index_dir):
    questions = huge_question_file(tmp_path)
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(yaml.safe_dump({"name": "huge", "dataset": {"path": str(questions)},
                                   "policy": {"type": "local", "model": str(tiny_model_dir)},
                                   "search": {"index": str(index_dir)}, "output_dir": str(tmp_path / "run")}))
    started = time.time()
    out = cli("eval", "--config", str(cfg), "--no-progress", cwd=tmp_path, timeout=120)
    one_clear_line(out, "huge-1 (", "do not fit the model's context of 4,096 tokens", "nothing was generated")
    assert time.time() - started < 90
    assert not (tmp_path / "run" / "predictions.jsonl").exists()


def test_train_check_refuses_a_question_past_the_models_context(tmp_path, tiny_model_dir, index_dir):
    cfg = train_config(tmp_path, tiny_model_dir, index_dir)
    data = yaml.safe_load(cfg.read_text())
    data["data"]["train_file"] = str(huge_question_file(tmp_path))
    cfg.write_text(yaml.safe_dump(data))
    out = cli("train", "--config", str(cfg), "--check", cwd=tmp_path)
    one_clear_line(out, "data.train_file", "huge-1 (", "do not fit the model's context of 4,096 tokens")


# ------------------------------------------------------------------------- one line, never a traceback


@pytest.fixture(scope="module")
def damaged_adapter(tmp_path_factory, tiny_model_dir) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    d = tmp_path_factory.mktemp("adapter") / "adapter"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(str(d))
    weights = d / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # an interrupted copy
    return d


@pytest.mark.parametrize("case", ["eval", "serve"])
def test_a_damaged_adapter_is_one_line_naming_it(case, tmp_path, tiny_model_dir, index_dir, damaged_adapter):
    if case == "eval":
        cfg = tmp_path / "eval.yaml"
        cfg.write_text(yaml.safe_dump({"name": "d", "dataset": {"path": str(shared(DEV)), "limit": 2},
                                       "policy": {"type": "local", "model": str(tiny_model_dir),
                                                  "adapter": str(damaged_adapter)},
                                       "search": {"index": str(index_dir)}, "output_dir": str(tmp_path / "run")}))
        out = cli("eval", "--config", str(cfg), "--no-progress", cwd=tmp_path)
    else:
        out = subprocess.run([sys.executable, str(ROOT / "service" / "chat_server.py"), "--model", str(tiny_model_dir),
                              "--adapter", str(damaged_adapter), "--index", str(index_dir), "--port", str(free_port()),
                              "--log-level", "WARNING"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=240,
                             env=dict(os.environ, HF_HUB_OFFLINE="1"))
    one_clear_line(out, f"the LoRA adapter at {damaged_adapter} cannot be read", "damaged or cut short")


@pytest.mark.slow
def test_resume_of_a_finished_run_is_refused_and_changes_nothing(tmp_path, tiny_model_dir, world_dir):
    cfg = train_config(tmp_path, tiny_model_dir, world_dir / "index",
                       rollout={"max_turns": 1, "max_tokens_per_turn": 8, "max_completion_tokens": 16},
                       algorithm={"num_generations": 2, "per_device_train_batch_size": 2, "max_steps": 1},
                       checkpoint={"output_dir": str(tmp_path / "out"), "save_steps": 1})
    first = cli("train", "--config", str(cfg), cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    before = digest(tmp_path / "out")
    out = cli("train", "--config", str(cfg), "--resume", cwd=tmp_path)
    one_clear_line(out, "holds a finished run (step 1 of 1", "nothing to resume", "algorithm.max_steps")
    assert digest(tmp_path / "out") == before


# ------------------------------------------------------------------------- read-only and full disks


@contextlib.contextmanager
def small_disk(path: Path, *, read_only: bool = False, free_kb: int = 0):
    """A tmpfs mounted at ``path`` (root only): read-only, or full but for ``free_kb``."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (path / "keep.txt").write_text("the user's file on that disk\n")
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        else:
            fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError:
                pass  # full
            finally:
                os.close(fd)
            if free_kb:
                with open(path / "filler", "r+b") as f:
                    f.truncate(max(0, f.seek(0, 2) - free_kb * 1024))
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


DISK_CASES = ["corpus-build", "index-build", "world", "search-output", "eval", "sft"]


def disk_command(case: str, disk: Path, tmp_path: Path, corpus_file, index_dir, tok_dir, tiny_model_dir, url: str):
    if case == "corpus-build":
        return cli("corpus", "build", "--input", str(corpus_file), "--out", str(disk / "c.jsonl"), cwd=tmp_path)
    if case == "index-build":
        return cli("index", "build", "--corpus", str(corpus_file), "--out", str(disk / "idx"), "--bm25", cwd=tmp_path)
    if case == "world":
        return cli("world", "--out", str(disk / "world"), cwd=tmp_path)
    if case == "search-output":
        questions = tmp_path / "q.jsonl"
        questions.write_text("".join(json.dumps(r) + "\n" for r in json.loads(shared(DEV).read_text())[:40]))
        return cli("search", "--index", str(index_dir), "--queries", str(questions), "-k", "10", "--output",
                   str(disk / "hits.jsonl"), cwd=tmp_path)
    if case == "eval":
        cfg = tmp_path / "eval.yaml"
        cfg.write_text(yaml.safe_dump(endpoint_eval(url, tok_dir, str(index_dir), disk / "run")))
        return cli("eval", "--config", str(cfg), "--no-progress", cwd=tmp_path)
    return cli("sft", "--model", str(tiny_model_dir), "--data", str(sft_data(tmp_path)), "--out", str(disk / "sft"),
               cwd=tmp_path)


@pytest.mark.parametrize("case", DISK_CASES)
@pytest.mark.parametrize("disk_kind", ["read-only", "full"])
def test_a_read_only_or_full_disk_is_one_line(disk_kind, case, tmp_path, corpus_file, index_dir, tok_dir,
                                              tiny_model_dir):
    with FakeOpenAI(completions=search_then_answer(4)) as srv, \
            small_disk(tmp_path / "disk", read_only=disk_kind == "read-only", free_kb=8) as disk:
        out = disk_command(case, disk, tmp_path, corpus_file, index_dir, tok_dir, tiny_model_dir, srv.url)
        expected = "the file system is read-only" if disk_kind == "read-only" else "the disk is full"
        one_clear_line(out, expected)
        assert (disk / "keep.txt").read_text() == "the user's file on that disk\n"
