"""argparse types that check a value's range while the command line is parsed, before a JVM starts or a model
loads: ``-k 0`` is refused in milliseconds with the flag's name, not by Lucene eight seconds later."""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") \
            from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return int(value)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return int(value)


def positive_float(text: str) -> float:
    """A finite number > 0 (a learning rate, an epoch count, a timeout)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value:g}")
    return float(value)


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value:g}")
    return float(value)


def unit_float(text: str) -> float:
    """A number in [0, 1] (a fraction, a weight)."""
    value = _number(text, float)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value:g}")
    return float(value)


def port(text: str) -> int:
    """A TCP port, 1-65535 (0 is refused: the user must know where the server listens)."""
    value = _number(text, int)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port between 1 and 65535, got {value}")
    return int(value)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (argparse prints the whole usage first, nine lines for
    ``agentic-rag search``, above the one that matters); ``--help`` still shows the usage. Subcommands' parsers
    are of the same class."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
