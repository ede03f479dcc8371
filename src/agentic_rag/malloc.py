"""Keep a process's resident memory close to what it uses: freed large buffers go back to the system (glibc).

glibc serves an allocation above ``M_MMAP_THRESHOLD`` with a mapping of its own, returned to the system on free,
unless a free chunk of the heap fits it (glibc looks there first); smaller ones come from the heap, which keeps what
is freed for reuse. By default the threshold is dynamic: every freed mapped block raises it to that block's size (up
to 32 MiB on 64-bit). After the first training steps a step's activations (1-30 MiB tensors for a 135M model)
therefore come from the heap, and the heap keeps the most a step ever held at once plus its fragmentation. Measured
on the 2-core machine (SmolLM2-135M, LoRA SFT, one step of the 8 longest 2Wiki trajectories, batch 8, ~600 tokens
each, gradient checkpointing on, side by side in experiments/benchmarks/sft_memory.py): peak RSS 5.97 GiB with
glibc's defaults, 1.93 GiB with the threshold fixed at 1 MiB, for 24% more CPU time (mostly system time: mapping and
unmapping) and 3% more wall time. Without gradient checkpointing (`/usr/bin/time -v`, one run each): 13.7 GB and 8.2
GB.

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

Under bf16 autocast on a CPU the fixed threshold costs far more: every forward casts each weight matrix into a fresh
bf16 copy, and those copies and the bf16 activations (1-16 MiB) are mapped and faulted in anew each time. Measured
on the 2-core machine (three LoRA SFT steps of the 24 longest wiki trajectories, batch 8, huge pages on, one run
each): 95 s train time (46 s system CPU), 2.1 GB peak RSS with the threshold at 1 MiB; 104 s at 4 MiB; 78 s at
16 MiB; 75 s (11 s system), 3.3 GB at 32 MiB; 70 s (9 s system), 3.8 GB with glibc's defaults. The whole wiki quick
start's SFT ran at ~22 s a step under the 1 MiB threshold against 11.6 s a step with glibc's defaults.
:func:`heap_for_blocks_below` raises the threshold for such a stretch (SFT and GRPO training under CPU bf16
autocast; measured for the SFT) and puts it back after, handing what the heap then holds free back to the system
(``malloc_trim``); what was allocated inside and is freed later stays in the heap until :func:`trim_heap` (run_sft
calls it once its trainer is gone), unless it lay at the heap's top (then free() trims it). Trimmed, the heap still
spans what the stretch grew, and a process that goes on dirties it again: in the wiki quick start's process an
evaluation after the SFT left the heap 2.19 GB resident against 0.24 GB for the same evaluation before it (and 2.19
GB again after a trim), which took the quick start to a 9.2 GB peak (and ran its evaluations faster: their large
blocks fit in the heap's free chunks instead of being mapped anew, the cost measured below). So the quick start runs
the real model's SFT in a process of its own (:func:`agentic_rag.training.sft.run_sft_apart`), as its GRPO runs are.

Decoding on a CPU pays the fixed threshold too: each step's logits (a 128-row batch of a 49k vocabulary: 25 MB),
the prefill of each observation and the KV cache's growing buffers (:mod:`agentic_rag.rollout.kv_cache`) are mapped
and faulted in anew. Measured on the 2-core machine (``experiments/benchmarks/decoding_heap.py``: the wiki quick
start's SFT adapter greedily answering 64 validation questions in one batch, twice, a fresh process each): 92.6 s
for the second evaluation under the 1 MiB threshold (93 s system CPU over both); 63.1 s (17 s system) with every
``AgentRollout.run`` inside a 256 MiB stretch, at a peak RSS of 4.17 GB against 3.16 GB. Not shipped: in the wiki
quick start the same stretch took the quick start's own process to 7.84 GB (its sampled evaluation, 128 rows) and
a GRPO process to 8.14 GB (its greedy validation, 128 rows), against 5.3 and 5.5 GB without it: over the 8 GB the
quick start must stay under. Why the heap grows that much is not measured (a likely part: the KV cache's buffers,
each replaced by a larger one, leave holes the next cannot fit).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
GLIBC_TRIM_THRESHOLD = 128 << 10  # glibc's default: free memory above this at the heap's top is given back
DEFAULT_THRESHOLD = 1 << 20
BF16_AUTOCAST_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold on 64-bit
_applied: int | None = None  # the threshold release_freed_memory set in this process, if it did


@cache  # find_library runs ldconfig in a subprocess: once a process is enough
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # glibc only: other C libraries have other allocators  # noqa: B018
        return libc
    except (OSError, AttributeError):
        return None


def release_freed_memory(threshold: int = DEFAULT_THRESHOLD) -> bool:
    """Serve allocations of ``threshold`` bytes and more from their own mappings, returned to the system when freed;
    True when the setting was applied."""
    global _applied
    if os.environ.get("AGENTIC_RAG_MALLOC", "").lower() == "default" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    libc = _glibc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, int(threshold)):
        return False
    _applied = int(threshold)
    return True


def trim_heap() -> bool:
    """Hand the heap's free memory back to the system (``malloc_trim``: the top and the free pages inside); True
    where glibc did."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


@contextmanager
def heap_for_blocks_below(threshold: int = BF16_AUTOCAST_THRESHOLD) -> Iterator[bool]:
    """Inside: blocks under ``threshold`` bytes come from the heap again (reused, not mapped anew); after: the
    threshold :func:`release_freed_memory` set is back and the heap's free memory is returned (``malloc_trim``).
    Yields whether anything changed: nothing does where :func:`release_freed_memory` was not applied."""
    libc = _glibc() if _applied is not None else None
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, int(threshold)):
        yield False
        return
    # and, as glibc's dynamic threshold does, keep up to twice that free at the heap's top rather than trimming a
    # freed block away only to fault it in again on the next allocation
    libc.mallopt(M_TRIM_THRESHOLD, 2 * int(threshold))
    try:
        yield True
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, _applied)
        libc.mallopt(M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD)
        trim_heap()


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process with glibc's huge-page tunable added (see the module docstring), unless
    ``GLIBC_TUNABLES`` is set already (your own tunables win) or ``AGENTIC_RAG_MALLOC=default``."""
    if "GLIBC_TUNABLES" in env or env.get("AGENTIC_RAG_MALLOC", "").lower() == "default":
        return env
    return {**env, "GLIBC_TUNABLES": HUGE_PAGES_TUNABLE}
