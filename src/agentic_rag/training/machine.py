"""What this machine has for a training run: the GPU's memory and the RAM available, in GiB.

Why a module of its own: these are probes of the machine (torch, psutil, an environment variable), not part of
the estimate (:mod:`.memory`) or its advice (:mod:`.memory_advice`), which stay pure functions of a model and a
setup; the trainer's pre-load checks feed these numbers to :func:`~.memory_advice.check_fits` and
:func:`~.memory_advice.check_fits_ram`.
"""

from __future__ import annotations

import os

from .memory import GiB


def available_ram_gb() -> float:
    """RAM the run can have now, in GiB: ``AGENTIC_RAG_RAM_GB`` when set (a budget of your own, e.g. to leave
    room for a second run), else what the kernel reports as available (free plus reclaimable caches)."""
    import psutil

    given = os.environ.get("AGENTIC_RAG_RAM_GB")
    if given:
        return float(given)
    return psutil.virtual_memory().available / GiB


def gpu_memory_gb(device: int = 0) -> float | None:
    """Total memory of a CUDA device in GiB, or None without one (for the trainer's pre-load check)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(device).total_memory / GiB
