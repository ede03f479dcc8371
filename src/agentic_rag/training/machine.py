"""What this machine has for a training run: the GPU's memory and the RAM available, in GiB, and whether its CPU
computes bfloat16 natively.

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


CPU_AUTOCAST = ("none", "bf16", "auto")  # the settings of model.cpu_autocast / sft --cpu-autocast (cpu_bf16)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of x86 CPUs with bf16 dot products


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX-BF16, read from
    ``/proc/cpuinfo``; ``cpuinfo`` gives its text instead). Elsewhere oneDNN emulates bf16, slower than fp32."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def cpu_bf16(setting: str) -> bool:
    """Resolve a ``cpu_autocast`` setting (``auto``, ``bf16``, ``none``) to whether a CPU run computes its forward
    and backward passes in bfloat16 (``torch.autocast``): ``auto`` where the CPU has it natively. Anything else is
    refused (a typo such as ``bfloat16`` would otherwise train in fp32 without a word)."""
    if setting not in CPU_AUTOCAST:
        raise ValueError(f"cpu_autocast must be one of {', '.join(CPU_AUTOCAST)}, got {setting!r}")
    if setting == "auto":
        return cpu_has_native_bf16()
    return setting == "bf16"
