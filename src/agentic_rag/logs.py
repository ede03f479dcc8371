"""Logging for the command-line entry points: one format, and the libraries' import-time notes kept quiet.

bitsandbytes and DeepSpeed log at import, on every CPU run, that optional kernels or accelerators are missing
("Failed to load CPU gemm_4bit_forward...", "Setting accelerator to CPU"); nothing is wrong and nothing can be
done about it, so below DEBUG those loggers show errors only.
"""

from __future__ import annotations

import logging

NOISY_AT_IMPORT = ("bitsandbytes", "DeepSpeed", "deepspeed")


def configure_logging(level: str | int = "INFO", fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s") -> None:
    level = level.upper() if isinstance(level, str) else level
    logging.basicConfig(level=level, format=fmt)
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in NOISY_AT_IMPORT:
            logging.getLogger(name).setLevel(logging.ERROR)
