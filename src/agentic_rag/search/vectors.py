"""Passage vectors on disk: resumable, chunked encoding of a corpus, and memory-mapped reading of the result.

An encoding directory holds ``part-00000.npy``, ``part-00001.npy``, ... (``chunk`` passages each, float32, the
last one shorter) and ``progress.json``::

    {"key": {...}, "passages": N, "dim": 384, "chunk": 50000, "done": 7, "complete": false, "seconds": 1234.5}

Each part is written to a temporary name and renamed, then ``progress.json`` is rewritten the same way, so
after a crash or a kill every part the progress file counts is whole. :func:`encode_corpus` started again on
the same directory with the same ``key`` (what determines the vectors: corpus checksum, how it was read, the
encoder's weights, the passage prefix), passage count, dimension and chunk size encodes only the parts not yet
done; anything else starts over. Batches inside a part are the same whether or not a run was interrupted, so
a resumed encoding equals an uninterrupted one exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

log = logging.getLogger(__name__)

PROGRESS = "progress.json"
DEFAULT_CHUNK = 50_000
ENCODE_BLOCK = 1024  # passages handed to the encoder at a time (sorted by length inside, batched by it)


def _part_name(i: int) -> str:
    return f"part-{i:05d}.npy"


def read_progress(directory: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(directory) / PROGRESS
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _save_part(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def matches(directory: str | os.PathLike, key: dict[str, Any], *, complete: bool = False) -> bool:
    """Whether ``directory`` holds (``complete``: a finished) encoding made with ``key``."""
    meta = read_progress(directory)
    return meta is not None and meta.get("key") == key and (meta.get("complete", False) or not complete)


def encode_corpus(passages: Sequence, encoder, out_dir: str | os.PathLike, *, key: dict[str, Any],
                  chunk: int = DEFAULT_CHUNK, progress: bool = True,
                  on_part: Callable[[int], None] | None = None) -> VectorParts:
    """Encode ``passages`` (``len()`` and ``[i]``; e.g. a docstore) with ``encoder.encode_passages`` into
    ``out_dir``, resuming a matching earlier run; returns the finished :class:`VectorParts`.

    ``on_part(i)`` is called after part ``i`` and the progress file are on disk (a progress hook; an exception
    from it stops the encoding as a crash would, leaving a resumable directory).
    """
    if chunk < 1:
        raise ValueError(f"the encoding chunk must be >= 1 passages, got {chunk}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n, dim = len(passages), int(encoder.dim)
    parts = max(1, -(-n // chunk))
    meta = read_progress(out)
    done, seconds = 0, 0.0
    if meta is not None and meta.get("key") == key and meta.get("passages") == n and meta.get("dim") == dim \
            and (meta.get("complete") or meta.get("chunk") == chunk):
        if meta.get("complete") and _parts_whole(out, meta):
            log.info("vectors at %s are complete (%d passages); not encoding again", out, n)
            return VectorParts(out)
        done = _whole_prefix(out, meta) if meta.get("chunk") == chunk else 0
        seconds = float(meta.get("seconds", 0.0))
        if done:
            log.info("resuming the encoding at %s: %d of %d parts done, from passage %d of %d",
                     out, done, parts, min(n, done * chunk), n)
    elif meta is not None:
        log.info("starting the encoding at %s over: it was made for other passages, encoder or chunk size", out)
    if not done:
        for p in out.glob("part-*.npy*"):
            p.unlink()
    meta = {"key": key, "passages": n, "dim": dim, "chunk": chunk, "done": done, "complete": False,
            "seconds": seconds}
    _write_json(out / PROGRESS, meta)
    with tqdm(total=n, initial=min(n, done * chunk), unit="passage", desc="encoding", disable=not progress,
              smoothing=0.05) as bar:
        for i in range(done, parts):
            t0 = time.time()
            start, stop = i * chunk, min(n, (i + 1) * chunk)
            blocks = []
            for b in range(start, stop, ENCODE_BLOCK):
                batch = [passages[r] for r in range(b, min(stop, b + ENCODE_BLOCK))]
                blocks.append(encoder.encode_passages(batch))
                bar.update(len(batch))
            vecs = np.concatenate(blocks) if blocks else np.zeros((0, dim), np.float32)
            _save_part(out / _part_name(i), np.ascontiguousarray(vecs, dtype=np.float32))
            meta.update(done=i + 1, seconds=round(meta["seconds"] + time.time() - t0, 1))
            _write_json(out / PROGRESS, meta)
            if on_part is not None:
                on_part(i)
    meta["complete"] = True
    _write_json(out / PROGRESS, meta)
    return VectorParts(out)


def _part_rows(meta: dict[str, Any], i: int) -> int:
    return min(meta["passages"], (i + 1) * meta["chunk"]) - i * meta["chunk"]


def _whole_prefix(out: Path, meta: dict[str, Any]) -> int:
    """How many of the parts the progress file counts as done are on disk with the right shape."""
    for i in range(int(meta.get("done", 0))):
        try:
            arr = np.load(out / _part_name(i), mmap_mode="r")
        except (OSError, ValueError):
            return i
        if arr.shape != (_part_rows(meta, i), meta["dim"]):
            return i
    return int(meta.get("done", 0))


def _parts_whole(out: Path, meta: dict[str, Any]) -> bool:
    return _whole_prefix(out, meta) == max(1, -(-meta["passages"] // meta["chunk"]))


class VectorParts:
    """The vectors of a finished encoding, memory-mapped: ``len()``, ``.dim``, ``rows(a, b)``, ``take(rows)``."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        meta = read_progress(self.directory)
        if meta is None or not meta.get("complete"):
            raise ValueError(f"{self.directory} holds no finished encoding (no complete {PROGRESS})")
        self.meta = meta
        count = max(1, -(-meta["passages"] // meta["chunk"]))
        self.parts = [np.load(self.directory / _part_name(i), mmap_mode="r") for i in range(count)]
        self.starts = np.cumsum([0] + [p.shape[0] for p in self.parts])
        if self.starts[-1] != meta["passages"]:
            raise ValueError(f"{self.directory}: the parts hold {self.starts[-1]} vectors, progress.json says "
                             f"{meta['passages']}; encode again")

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as one array (a view when they lie in one part)."""
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, max(start, stop - 1), side="right")) - 1
        if first == last:
            s = int(self.starts[first])
            return self.parts[first][start - s:stop - s]
        return np.concatenate([self.rows(max(start, int(self.starts[p])), min(stop, int(self.starts[p + 1])))
                               for p in range(first, last + 1)])

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The given rows (sorted for sequential reads), as one in-memory array."""
        rows = np.asarray(rows, dtype=np.int64)
        which = np.searchsorted(self.starts, rows, side="right") - 1
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        for p in np.unique(which):
            sel = which == p
            out[sel] = self.parts[p][rows[sel] - self.starts[p]]
        return out

    def all(self) -> np.ndarray:
        return self.rows(0, len(self))


def weights_digest(encoder_dir: str | os.PathLike) -> str:
    """A sha256 over an encoder directory's weight files (two fine-tunes of one architecture share their
    configuration files but not their weights; vectors are reused only for the same weights)."""
    h = hashlib.sha256()
    root = Path(encoder_dir)
    if not root.is_dir():
        return f"hub:{encoder_dir}"
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt", ".pth") \
                and not {"onnx", "openvino"} & set(p.relative_to(root).parts):
            h.update(str(p.relative_to(root)).encode())
            with open(p, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
    return h.hexdigest()[:16]


def link_tree(src: Path, dst: Path) -> None:
    """Copy the files of ``src`` into ``dst`` as hard links where the filesystem allows (no extra disk)."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file():
            try:
                os.link(p, dst / p.name)
            except OSError:
                import shutil

                shutil.copy2(p, dst / p.name)
