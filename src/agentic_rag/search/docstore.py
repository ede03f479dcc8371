"""Random access to the passages of a normalised corpus JSONL by row number.

The FAISS index returns row numbers; this store turns them into passages without loading the corpus:
an ``int64`` array of line offsets (``np.load(mmap_mode="r")``) and ``os.pread`` on the JSONL, which is
safe from any thread and holds no state a fork could break.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .corpus import Passage, split_pyserini_contents


def write_offsets(jsonl: str | os.PathLike, out: str | os.PathLike, progress: bool = True) -> int:
    """Write the byte offset of every non-empty line of ``jsonl`` to ``out`` (.npy); returns the count."""
    offsets: list[int] = []
    size = os.path.getsize(jsonl)
    with open(jsonl, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc="offsets",
                                      disable=not progress) as bar:
        pos = 0
        for line in f:
            if line.strip():
                offsets.append(pos)
            pos += len(line)
            bar.update(len(line))
    np.save(out, np.asarray(offsets, dtype=np.int64))
    return len(offsets)


def passage_from_record(obj: dict) -> Passage:
    """A passage from a normalised record, or from a Pyserini raw document (``id`` + ``contents``)."""
    docid = str(obj.get("id", obj.get("docid", "")))
    if "text" in obj:
        return Passage(docid, str(obj.get("title", "")), str(obj["text"]))
    title, text = split_pyserini_contents(str(obj.get("contents", "")))
    return Passage(docid, title, text)


class DocStore:
    """Passages by row: ``store[i]``; ``len(store)``; ``store.get_many(rows)``."""

    def __init__(self, jsonl: str | os.PathLike, offsets: str | os.PathLike):
        self.path = Path(jsonl)
        self._offsets = np.load(offsets, mmap_mode="r")
        self._fd = os.open(self.path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size

    def __len__(self) -> int:
        return int(self._offsets.shape[0])

    def __getitem__(self, row: int) -> Passage:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range for {len(self)} passages")
        start = int(self._offsets[row])
        end = int(self._offsets[row + 1]) if row + 1 < len(self) else self._size
        raw = os.pread(self._fd, end - start, start)
        return passage_from_record(json.loads(raw))

    def get_many(self, rows: list[int]) -> list[Passage]:
        return [self[r] for r in rows]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
