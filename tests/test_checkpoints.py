"""Checkpoints survive a kill at any moment: rotation counts and deletes only complete checkpoints, and only
after the new one is marked complete; resuming continues from the newest complete one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rag.training import trainer as trainer_module
from agentic_rag.training.checkpoints import COMPLETE_MARKER, latest_complete_checkpoint, rotate_checkpoints
from test_launch import config


def make_checkpoint(root: Path, name: str, complete: bool = True) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"x")
    if complete:
        (path / COMPLETE_MARKER).write_text("complete\n")
    return path


def test_rotation_counts_and_deletes_only_complete_checkpoints(tmp_path):
    for step in (1, 2, 3):
        make_checkpoint(tmp_path, f"checkpoint-{step}")
    make_checkpoint(tmp_path, "checkpoint-4", complete=False)  # being written, or left by a kill
    make_checkpoint(tmp_path, "checkpoint-5.incomplete-1700000000", complete=False)  # quarantined earlier
    make_checkpoint(tmp_path, "checkpoint-10.incomplete-1700000001")  # quarantined, even if it had a marker
    deleted = rotate_checkpoints(tmp_path, 1)
    assert sorted(Path(p).name for p in deleted) == ["checkpoint-1", "checkpoint-2"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["checkpoint-10.incomplete-1700000001", "checkpoint-3", "checkpoint-4",
                    "checkpoint-5.incomplete-1700000000"]
    # the newest complete one is kept whatever the limit; no limit keeps everything
    assert rotate_checkpoints(tmp_path, 1) == [] and rotate_checkpoints(tmp_path, None) == []
    # the best checkpoint is protected
    make_checkpoint(tmp_path, "checkpoint-6")
    make_checkpoint(tmp_path, "checkpoint-7")
    deleted = rotate_checkpoints(tmp_path, 1, keep=str(tmp_path / "checkpoint-3"))
    assert [Path(p).name for p in deleted] == ["checkpoint-6"]
    assert latest_complete_checkpoint(tmp_path, quarantine=False) == str(tmp_path / "checkpoint-7")


class Killed(Exception):
    """Stands in for SIGKILL: the process stops right there."""


def test_a_kill_between_save_and_marker_keeps_the_last_complete_checkpoint(tmp_path, tiny_model_dir, world_dir,
                                                                            monkeypatch):
    """save_total_limit 1: the kill comes after checkpoint-2 is written, before its marker. Transformers' own
    rotation would already have deleted checkpoint-1 then, leaving nothing to resume from."""
    from agentic_rag.training.config import load_config
    from agentic_rag.training.train import run

    cfg_path = config(tmp_path, tiny_model_dir, world_dir, algorithm__max_steps=3,
                      checkpoint__save_total_limit=1)
    out = tmp_path / "out"
    real_marker = trainer_module.write_marker

    def marker_then_kill(path):
        if Path(path).name == "checkpoint-2":
            assert (Path(path) / "adapter_model.safetensors").is_file()  # written, not yet marked
            raise Killed
        real_marker(path)

    monkeypatch.setattr(trainer_module, "write_marker", marker_then_kill)
    with pytest.raises(Killed):
        run(load_config(cfg_path))
    assert (out / "checkpoint-1" / COMPLETE_MARKER).is_file(), "the last complete checkpoint was deleted"
    assert (out / "checkpoint-2").is_dir() and not (out / "checkpoint-2" / COMPLETE_MARKER).exists()

    monkeypatch.setattr(trainer_module, "write_marker", real_marker)
    run(load_config(cfg_path), resume=True)
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["resumed_from"] == str(out / "checkpoint-1") and summary["global_step"] == 3
    assert [h["step"] for h in summary["log_history"] if "loss" in h] == [1, 2, 3]
    names = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    # limit 1: only the newest complete checkpoint; the quarantined half-written one is kept for inspection,
    # neither counted nor deleted
    assert names[0] == "checkpoint-2.incomplete-" + names[0].rsplit("-", 1)[1] and names[1:] == ["checkpoint-3"]
    assert (out / "checkpoint-3" / COMPLETE_MARKER).is_file()
