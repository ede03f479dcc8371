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

Mapping a fresh block costs a page fault per 4 KiB page (7,680 for a 30 MiB block): with the fixed threshold a
process spends a third of its CPU time in the kernel (an SFT step of the wiki quick start: 14 of every 40 CPU
seconds). glibc 2.35 and newer can ask for transparent huge pages on the blocks it maps (the tunable
``glibc.malloc.hugetlb=1``, read from ``GLIBC_TUNABLES`` when the process starts, so it cannot be set from
Python): then such a block costs 15 faults. The scripts in ``script/`` export it (``script/_common.sh``), and
:func:`child_env` gives it to the training processes the quick start starts; measured side by side in
``experiments/benchmarks/sft_memory.py``. It does nothing where transparent huge pages are off
(``/sys/kernel/mm/transparent_hugepage/enabled`` says ``never``) or glibc is older.

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


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process with glibc's huge-page tunable added (see the module docstring), unless
    ``GLIBC_TUNABLES`` is set already (your own tunables win) or ``AGENTIC_RAG_MALLOC=default``."""
    if "GLIBC_TUNABLES" in env or env.get("AGENTIC_RAG_MALLOC", "").lower() == "default":
        return env
    return {**env, "GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}
