"""The error a user's input causes, and the command line's one error boundary.

A :class:`UserError` is printed as one line naming the file or flag and the fix, with exit code 2 and no
traceback: a wrong path, an unreadable or malformed file, a value out of range, an index that cannot be
opened, a search target that does not answer. An accelerator out of memory, a disk that is full or read-only (however
the library that hit it words it: an ``OSError``, torch's or safetensors' writer, Lucene's Java exception) and a
declared dependency missing from the environment are one line of advice too (exit 2). Anything else that escapes a
command is a bug in the toolkit: the traceback is printed with a line asking for a report, exit code 1.

It subclasses ``ValueError`` so that callers that already treat a bad value as the user's (a config check, the
chat server's start-up) treat these the same way.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path


class UserError(ValueError):
    """An error caused by the user's input: one clear message, no traceback, exit code 2."""

    exit_code = 2


class OutputError(UserError):
    """An output path that would destroy something the command did not make (see :mod:`agentic_rag.outputs`)."""


class SearchFailuresError(UserError):
    """A run finished, but more of its searches failed than its threshold allows: its numbers measure a broken
    search target, not the model. Raised after the summary is written (``summary``); the command exits 3."""

    exit_code = 3

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary or {}


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the user's input is at fault (a path, a file's content, a value, an index that
    cannot be opened, a search target or endpoint that does not answer): one line, exit 2. ``ValueError`` covers
    every config, question-file, corpus and prediction-file error (they subclass it) and :class:`UserError`."""
    from .endpoints import EndpointError
    from .search.jvm import JvmError
    from .search.types import SearchError

    return (ValueError, SearchError, EndpointError, JvmError, FileNotFoundError, IsADirectoryError,
            NotADirectoryError, PermissionError, FileExistsError)


OOM_ADVICE = ("Fewer tokens at once fit: lower algorithm.per_device_train_batch_size (raising "
              "gradient_accumulation_steps keeps the batch), rollout.max_completion_tokens, or the eval/validation "
              "batch; turn on model.gradient_checkpointing or model.quantization nf4; give the run a GPU of its own "
              "(other processes' memory counts). A training run goes on from its last checkpoint with --resume.")


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA (or other accelerator) out-of-memory error: the settings ask for more than the card holds, which is
    no bug of ours. Recognised by name, so this module need not import torch."""
    return type(exc).__name__ == "OutOfMemoryError" and type(exc).__module__.startswith("torch")


DISTRIBUTION = "agentic-rag-r1"  # the project's name on PyPI / in setup.cfg: its declared dependencies


def missing_dependency(exc: BaseException) -> str | None:
    """The requirement (``ragas==0.4.3``) of a declared dependency whose import failed with ``exc``, or None when
    ``exc`` is no such failure. A dependency missing from the environment is a broken install, not a bug in the
    code: the fix is to install it. A module of the toolkit itself, or one it does not declare, stays a bug."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0].lower().replace("_", "-")
    if top == "agentic-rag":
        return None
    from importlib import metadata

    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return None
    for req in requirements:
        if "extra ==" in req:
            continue
        name = re.split(r"[\[=<>!~; ]", req, maxsplit=1)[0].lower().replace("_", "-")
        if name in (top, f"py{top}", f"python-{top}") or name.startswith(f"{top}-"):
            return req.split(";")[0].strip()
    return None


# What a failed write means when the disk is at fault, by errno (an OSError) or by the words a library wraps it in.
DISK_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
               errno.EROFS: "the file system is read-only", errno.EFBIG: "the file is larger than the disk allows"}
DISK_WORDS = {"No space left on device": errno.ENOSPC, "StorageFull": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
              "Read-only file system": errno.EROFS, "ReadOnlyFilesystem": errno.EROFS,
              "file write failed": errno.ENOSPC}


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out and len(out) < 10:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def disk_problem(exc: BaseException) -> str | None:
    """One line for an error that is a full or read-only disk (the exception or one it was raised from), else None.
    What was written before is kept: every command writes its outputs beside their final names and renames them
    into place only when complete."""
    for e in _chain(exc):
        code = e.errno if isinstance(e, OSError) and e.errno in DISK_ERRNOS else None
        if code is None:
            text = str(e)
            code = next((c for words, c in DISK_WORDS.items() if words in text), None)
        if code is None:
            continue
        where = f"cannot write {e.filename}" if isinstance(e, OSError) and e.filename else "a write failed"
        fix = ("free some space, or write the output to another disk" if code in (errno.ENOSPC, errno.EDQUOT,
                                                                                 errno.EFBIG)
               else "write the output to a writable disk (another --out / output_dir)")
        return (f"{where}: {DISK_ERRNOS[code]} ({os.strerror(code)}). Nothing finished before was lost; {fix}, then "
                f"run the command again")
    return None


def one_line(exc: BaseException) -> str:
    """The message of a user error, as the line the command prints: an OSError names its file."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def guarded(prog: str, fn: Callable[[], int | None]) -> int:
    """Run ``fn`` inside the one error boundary and return the exit status: a user error (:func:`user_errors`) is
    one line on stderr and its ``exit_code`` (2, or 3 for a run whose searches failed); Ctrl-C is 130; anything else
    is a bug: its traceback and a line asking for a report, status 1."""
    try:
        return int(fn() or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one error boundary: a user's error is a line, a bug a traceback
        line, code = _user_line(exc)
        if line is not None:
            if logging.getLogger().isEnabledFor(logging.DEBUG):
                traceback.print_exc()
            print(f"{prog}: error: {line}", file=sys.stderr)
            return code
        traceback.print_exc()
        print(f"{prog}: internal error ({type(exc).__name__}): this is a bug in agentic-rag, not in your input. "
              f"Please report it with the command you ran and the traceback above.", file=sys.stderr)
        return 1


def _user_line(exc: BaseException) -> tuple[str | None, int]:
    """The one line and exit status of an error that is not ours (the GPU's memory, a broken install, the user's
    input), or ``(None, 1)`` for a bug."""
    if is_out_of_memory(exc):
        first = (str(exc).splitlines() or [""])[0]
        return f"out of GPU memory ({first[:200]}). {OOM_ADVICE}", 2
    disk = disk_problem(exc)
    if disk is not None:
        return disk, 2
    requirement = missing_dependency(exc)
    if requirement:
        return (f"this environment lacks {requirement.split('=')[0].split('[')[0]}, a dependency of agentic-rag "
                f"(import {getattr(exc, 'name', '')!r} failed). Install it: pip install '{requirement}' (or run "
                f"script/setup.sh again)"), 2
    if isinstance(exc, user_errors()):
        return one_line(exc), int(getattr(exc, "exit_code", 2))
    return None, 1


def input_file(path: str | os.PathLike | None, flag: str, *, what: str = "file") -> Path:
    """``path`` as a readable file, or a :class:`UserError` naming ``flag``: missing, a folder, unreadable."""
    if path is None or str(path) == "":
        raise UserError(f"{flag} is required: give the {what}")
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {p} is a folder; {flag} takes a {what}")
    if not p.exists():
        raise UserError(f"{flag} {p}: no such file")
    if not os.access(p, os.R_OK):
        raise UserError(f"{flag} {p}: not readable (permission denied)")
    return p


def input_dir(path: str | os.PathLike | None, flag: str, *, what: str = "folder") -> Path:
    """``path`` as an existing folder, or a :class:`UserError` naming ``flag``."""
    if path is None or str(path) == "":
        raise UserError(f"{flag} is required: give the {what}")
    p = Path(path)
    if p.is_file():
        raise UserError(f"{flag} {p} is a file; {flag} takes a {what}")
    if not p.exists():
        raise UserError(f"{flag} {p}: no such folder")
    return p
