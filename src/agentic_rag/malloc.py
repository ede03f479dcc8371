"""Keep a process's resident memory close to what it uses: freed large buffers go back to the system (glibc).

glibc serves an allocation above ``M_MMAP_THRESHOLD`` with a mapping of its own, returned to the system on free;
smaller ones come from the heap, which keeps what is freed for reuse. By default the threshold is dynamic: every
freed mapped block raises it to that block's size (up to 32 MiB on 64-bit). After the first training steps a step's
activations (1-30 MiB tensors for a 135M model) therefore come from the heap, and the heap keeps the most a step ever
held at once plus its fragmentation. Measured on the 2-core machine (SmolLM2-135M, LoRA SFT, one step of the 8
longest 2Wiki trajectories, batch 8, ~600 tokens each, gradient checkpointing on, side by side in
experiments/benchmarks/sft_memory.py): peak RSS 5.97 GiB with glibc's defaults, 1.93 GiB with the threshold fixed
at 1 MiB, for 24% more CPU time (mostly system time: mapping and unmapping) and 3% more wall time. Without gradient
checkpointing (`/usr/bin/time -v`, one run each): 13.7 GB and 8.2 GB.

:func:`release_freed_memory` fixes the threshold (``mallopt(M_MMAP_THRESHOLD)``, which also turns the dynamic
adjustment off) for the calling process. The entry points call it first thing (``agentic-rag``, the chat server,
the training launcher's processes, the quick start). It does nothing where glibc is not the allocator, when
``MALLOC_MMAP_THRESHOLD_`` is set (your own setting wins), or with ``AGENTIC_RAG_MALLOC=default``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
DEFAULT_THRESHOLD = 1 << 20


def release_freed_memory(threshold: int = DEFAULT_THRESHOLD) -> bool:
    """Serve allocations of ``threshold`` bytes and more from their own mappings, returned to the system when freed;
    True when the setting was applied."""
    if os.environ.get("AGENTIC_RAG_MALLOC", "").lower() == "default" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # glibc only: other C libraries have other allocators  # noqa: B018
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False
