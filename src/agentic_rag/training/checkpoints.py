"""Crash-safe checkpoints: a checkpoint counts once its completion marker is written, rotation deletes only complete
ones, and an incomplete one (a process killed while saving) is moved out of the way before a run resumes."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def write_marker(checkpoint: Path) -> None:
    """Mark ``checkpoint`` complete, durably (the marker and the directory entry are synced to disk)."""
    marker = checkpoint / COMPLETE_MARKER
    with open(marker, "w") as f:
        f.write("complete\n")
        f.flush()
        os.fsync(f.fileno())
    dir_fd = os.open(checkpoint, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``checkpoint-N`` directories of ``root``, newest (highest step) first; quarantined ones do not match."""
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CHECKPOINT_NAME.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def rotate_checkpoints(output_dir: str | os.PathLike, limit: int | None, *, keep: str | None = None) -> list[str]:
    """Delete the oldest complete checkpoints beyond the newest ``limit`` complete ones; returns what was deleted.

    Only ``checkpoint-N`` directories with a completion marker count and are ever deleted: an incomplete one
    (being written, or left by a kill) and a quarantined ``checkpoint-N.incomplete-*`` neither count toward the
    limit nor push a complete checkpoint out. ``keep`` (the best checkpoint, when there is one) is never deleted.
    No limit (None or <= 0) keeps everything."""
    import shutil

    if not limit or limit <= 0:
        return []
    complete = [p for _step, p in _checkpoints(Path(output_dir)) if (p / COMPLETE_MARKER).is_file()]
    protected = {Path(keep).resolve()} if keep else set()
    deleted = []
    for path in complete[limit:]:
        if path.resolve() in protected:
            continue
        # drop the marker first: a kill halfway through the deletion leaves an incomplete checkpoint, not a
        # "complete" one with files missing
        (path / COMPLETE_MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(str(path))
    return deleted


def latest_complete_checkpoint(output_dir: str | os.PathLike, *, quarantine: bool = True) -> str | None:
    """The newest checkpoint with a completion marker. Incomplete ones (a process killed while saving) are
    renamed out of the way so nothing later mistakes them for checkpoints."""
    import time

    root = Path(output_dir)
    if not root.is_dir():
        return None
    for _step, path in _checkpoints(root):
        if (path / COMPLETE_MARKER).is_file():
            return str(path)
        if quarantine:
            target = path.with_name(f"{path.name}.incomplete-{int(time.time())}")
            log.warning("checkpoint %s is incomplete (interrupted while saving); moved to %s", path, target.name)
            path.rename(target)
    return None
