"""Where the toolkit writes: every output path checked before anything is written, the folders it makes marked
as its own, and its own earlier output replaced only once the new one is complete.

The rules every writing subcommand keeps (as git, rsync and pip do: refuse, explain, keep):

* **apart from its inputs** (:func:`check_apart`): an output is never one of the command's inputs, never inside
  one, and never holds one (``index build --out DIR`` with the corpus in ``DIR`` would replace the corpus);
* **only its own folders** (:func:`claim_dir`): a folder is written into or replaced only when it is missing,
  empty, or made by this toolkit for the same purpose: it carries :data:`MARKER` (``.agentic-rag.json``, naming
  the kind of output), or the layout an earlier version of the command wrote (an index's ``manifest.json``, an
  evaluation's ``config.json`` beside its predictions, ...). Anything else is refused, naming a few of its
  files; with ``--move-aside`` it is renamed to ``DIR.moved-YYYYmmdd-HHMMSS`` (never deleted) and the command
  goes on;
* **files** (:func:`check_output_file`): an output file is not a folder and not an input; it is written beside
  its final name and renamed over it when complete (:func:`atomic_write_text`);
* **replacing its own output** (:func:`replace_dir`): the new folder is built beside the old one and swapped in
  whole; the old one is deleted only after the swap, and only because it was the command's own;
* **work folders** (:func:`claim_work_dir`): a folder a command works in before its output is complete
  (``OUT.partial``) is emptied or resumed only when it carries the command's marker; a folder of the same name that
  the command did not make is refused (or, with ``--move-aside``, renamed), never emptied. Guessing by layout (a
  ``corpus/`` folder "looks like" a build part) is exactly how a user's folder gets deleted, so work folders are
  recognised by their marker alone. Work *files* are created exclusively under a fresh name
  (:func:`temp_beside`), so no existing file is ever truncated or removed;
* **one run per output** (:func:`output_lock`): a command holds an exclusive lock on its output while it writes it;
  a second command aimed at the same output is refused in one line naming the first one's process. The lock is
  ``flock`` on a small file beside the output (``.NAME.agentic-rag.lock``; in the temporary folder where the folder
  beside is not the user's to write), released by the kernel when its process dies however it dies (``kill -9``
  included), so a crash never leaves a lock that blocks the next run.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from .errors import OutputError

log = logging.getLogger(__name__)

MARKER = ".agentic-rag.json"

# What each kind of output is, in words, for the messages.
KINDS = {
    "index": "an index (agentic-rag index build / link)",
    "index-partial": "an interrupted index build",
    "eval": "an evaluation run (agentic-rag eval)",
    "sft": "an SFT model or adapter (agentic-rag sft)",
    "train": "a training run (agentic-rag train)",
    "world": "a generated world (agentic-rag world)",
    "quickstart": "a quick start (python -m agentic_rag.demo.quickstart)",
    "trajectories": "gold trajectories (agentic-rag trajectories)",
    "export": "a merged model (agentic-rag export)",
}


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _legacy_eval(d: Path) -> bool:
    cfg = _json(d / "config.json")
    return cfg is not None and {"dataset", "policy"} <= cfg.keys() and (
        (d / "predictions.jsonl").exists() or (d / "summary.json").exists())


def _legacy_train(d: Path) -> bool:
    return (d / "train_summary.json").is_file() or ((d / "config.yaml").is_file() and (
        any(d.glob("checkpoint-*")) or (d / "final").is_dir() or (d / "train.log").is_file()))


def _legacy_sft(d: Path) -> bool:
    return (d / "sft_summary.json").is_file() or (
        (d / "agentic_rag.json").is_file() and ((d / "adapter_config.json").is_file() or (d / "config.json").is_file()))


# The layouts earlier versions wrote, before folders carried the marker: still recognised as the command's own.
LEGACY_LAYOUTS: dict[str, Callable[[Path], bool]] = {
    "index": lambda d: _json(d / "manifest.json") is not None,
    "eval": _legacy_eval,
    "sft": _legacy_sft,
    "train": _legacy_train,
    "world": lambda d: (d / "world.json").is_file() and (d / "corpus.json").is_file(),
    "quickstart": lambda d: _json(d / "settings.json") is not None and (d / "world").is_dir(),
}


def marked(path: str | os.PathLike) -> str | None:
    """The kind named by the folder's marker (:data:`MARKER`), or None: the marker alone, no layout guessed."""
    d = Path(path)
    marker = _json(d / MARKER) if d.is_dir() else None
    if marker is not None and marker.get("made_by") == "agentic-rag" and isinstance(marker.get("kind"), str):
        return marker["kind"]
    return None


def owner(path: str | os.PathLike) -> str | None:
    """The kind of output the folder ``path`` is (its marker's, else a recognised earlier layout's), or None."""
    d = Path(path)
    if not d.is_dir():
        return None
    if (kind := marked(d)) is not None:
        return kind
    for kind, looks_like in LEGACY_LAYOUTS.items():
        if looks_like(d):
            return kind
    return None


def mark_dir(path: str | os.PathLike, kind: str) -> Path:
    """Create the folder ``path`` (when missing) and mark it as a ``kind`` output of this toolkit."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    marker = d / MARKER
    if _json(marker) is None or _json(marker).get("kind") != kind:
        marker.write_text(json.dumps({"made_by": "agentic-rag", "kind": kind,
                                      "created": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n", encoding="utf-8")
    return d


def _sample(d: Path, n: int = 3) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in d.iterdir())
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def aside_path(path: Path) -> Path:
    """A free sibling name for ``path`` moved aside: ``NAME.moved-YYYYmmdd-HHMMSS`` (with a counter if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.name}.moved-{stamp}")
    i = 1
    while candidate.exists():
        i += 1
        candidate = path.with_name(f"{path.name}.moved-{stamp}-{i}")
    return candidate


def claim_dir(path: str | os.PathLike, kind: str, *, flag: str = "--out", move_aside: bool = False,
              also: tuple[str, ...] = ()) -> Path:
    """Check, before anything is written, that the command may write the folder ``path`` as a ``kind`` output.

    Missing, empty, or already a ``kind`` (or ``also``) output: fine. A file: refused. Anything else (a folder of
    the user's, or another kind of output): refused with what it holds, unless ``move_aside``, which renames it
    to :func:`aside_path` (logged) so that ``path`` is free. Nothing is ever deleted here."""
    d = Path(path)
    if d.is_symlink() and not d.exists():
        raise OutputError(f"{flag} {d} is a broken symbolic link; name a folder")
    if d.exists() and not d.is_dir():
        raise OutputError(f"{flag} {d} is a file; {flag} names a folder ({KINDS.get(kind, kind)} goes there)")
    if not d.exists() or not any(d.iterdir()):
        return d
    made = owner(d)
    if made == kind or made in also:
        return d
    holds = f"holds {KINDS.get(made, made)}" if made else f"holds files agentic-rag did not write ({_sample(d)})"
    return _refuse_or_move_aside(d, f"{flag} {d} {holds}", f"this command would write {KINDS.get(kind, kind)} "
                                 f"there. Name a new or empty folder, or", move_aside)


def _refuse_or_move_aside(d: Path, what: str, why: str, move_aside: bool) -> Path:
    """Refuse the folder ``d`` (``what`` it is; ``why`` it is in the way, ending where the remedy follows), or with
    ``move_aside`` rename it to :func:`aside_path` (logged) so that ``d`` is free. Nothing is deleted."""
    aside = aside_path(d)
    if not move_aside:
        raise OutputError(f"{what}; {why} pass --move-aside to move it to {aside.name} first (nothing is deleted)")
    os.replace(d, aside)
    log.warning("%s: moved it to %s", what, aside)
    return d


def claim_work_dir(path: str | os.PathLike, kinds: tuple[str, ...], *, what: str, move_aside: bool = False) -> Path:
    """Check the work folder ``path`` that ``what`` (the command, in words) builds its output in before it is
    complete, and may empty or resume: missing, empty, or marked as one of ``kinds`` (:func:`marked`; no layout is
    guessed). Anything else is the user's: refused, or with ``move_aside`` renamed to :func:`aside_path` (logged).
    Nothing is deleted here; the caller marks the folder (:func:`mark_dir`) before it writes into it."""
    d = Path(path)
    if d.is_symlink():
        raise OutputError(f"{d} is a symbolic link; {what} uses that name for its work in progress: move it away")
    if d.exists() and not d.is_dir():
        raise OutputError(f"{d} is a file; {what} uses that name for its work in progress: move it away")
    if not d.exists() or not any(d.iterdir()) or marked(d) in kinds:
        return d
    return _refuse_or_move_aside(d, f"{d} holds files agentic-rag did not write ({_sample(d)})", f"{what} uses that "
                                 f"folder for its work in progress and would empty it. Move it away, or", move_aside)


@contextlib.contextmanager
def temp_beside(path: str | os.PathLike) -> Iterator[Path]:
    """A new, empty work file beside ``path`` (same folder, so a rename puts it in place), created exclusively under
    a fresh name: no file that exists, whoever made it, is ever opened, truncated or removed, and two runs never
    share one. Removed on the way out unless the caller renamed it over ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".partial", dir=p.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


# locks this process holds: the output's real path -> [file descriptor, depth] (a command that calls another
# in-process, as the quick start calls the index build, takes the lock it already holds again)
_HELD: dict[str, list[int]] = {}


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of the output ``path``: beside it, so it outlives the output being renamed or replaced."""
    p = Path(os.path.abspath(os.path.expanduser(str(path))))
    return p.parent / f".{p.name}.agentic-rag.lock"


def _open_lock(path: str | os.PathLike) -> tuple[Path, int]:
    """Open (creating) the lock file of ``path``: beside it, or, where its folder is not the user's to write (an
    output folder made for them inside someone else's), in the machine's temporary folder under a name made of the
    output's real path."""
    lock = lock_path(path)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        return lock, os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:
        import hashlib

        real = os.path.realpath(os.path.expanduser(str(path)))
        lock = Path(tempfile.gettempdir()) / f"agentic-rag-{hashlib.sha256(real.encode()).hexdigest()[:24]}.lock"
        return lock, os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode("utf-8"))
        return f"pid {info['pid']}, {info['command']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its process id not recorded yet"


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, command: str, *, flag: str = "--out") -> Iterator[None]:
    """Hold the exclusive lock of the output ``path`` while the block runs; refuse at once (no waiting) with an
    :class:`OutputError` naming the process that holds it (its pid, ``command`` as it recorded it, e.g.
    ``agentic-rag train``, and when it started; never its command line, which may hold a secret). Re-entrant within
    a process. The lock file stays out of the output itself and is removed when the lock is released."""
    key = os.path.realpath(os.path.expanduser(str(path)))
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    while True:
        lock, fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputError(f"{flag} {path} is being written by another agentic-rag run ({holder}); one run per "
                              f"output: wait for that one to finish (or stop it), or name another {flag}") from None
        try:
            current = os.stat(lock).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)  # the holder released and removed the file between our open and our lock: take the new one
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "command": command,
                             "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode("utf-8"))
    _HELD[key] = [fd, 1]
    try:
        yield
    finally:
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            del _HELD[key]
            with contextlib.suppress(OSError):
                os.unlink(lock)  # while still locked: a process that opened it meanwhile sees it gone and retries
            os.close(fd)


def _real(path: str | os.PathLike) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def check_apart(out: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None], *,
                flag: str = "--out") -> None:
    """Refuse an output ``out`` that is one of ``inputs`` (``{flag or setting: path}``), lies inside one, or holds
    one. Inputs that are not on this machine (URLs, hub names, unset) are skipped; symbolic links are followed."""
    o = _real(out)
    for name, value in inputs.items():
        if value is None or str(value) == "" or _is_url(str(value)) or not os.path.exists(str(value)):
            continue
        i = _real(value)
        if o == i:
            raise OutputError(f"{flag} {out} is the {name} input {value}: the output would overwrite it; "
                              f"name another path")
        if i in o.parents:
            raise OutputError(f"{flag} {out} is inside the {name} input {value}; write the output outside it")
        if o in i.parents:
            raise OutputError(f"the {name} input {value} is inside {flag} {out}, which this command writes; "
                              f"name an output outside the inputs")


def check_output_file(out: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None] | None = None, *,
                      flag: str = "--out") -> Path:
    """An output file path: not a folder, not one of ``inputs``, its folder creatable. Returns it as a Path."""
    p = Path(out)
    if p.is_dir():
        raise OutputError(f"{flag} {p} is a folder; {flag} names a file")
    if str(out).endswith(os.sep):
        raise OutputError(f"{flag} {out} ends with a path separator; {flag} names a file")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"{flag} {p}: {parent} is a file, so {p} cannot be created")
            break
    if inputs:
        for name, value in inputs.items():
            if value is None or str(value) == "" or _is_url(str(value)) or not os.path.exists(str(value)):
                continue
            if _real(value) == _real(p):
                raise OutputError(f"{flag} {out} is the {name} input {value}: the output would overwrite it; "
                                  f"name another file")
            if Path(value).is_dir() and _real(value) in _real(p).parents:
                raise OutputError(f"{flag} {out} is inside the {name} input {value}; write the output outside it")
    return p


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a sibling temporary file renamed over it: a reader sees the old file or
    the new one, never half of one."""
    p = Path(path)
    with temp_beside(p) as tmp:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    return p


def replace_dir(new: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Put the complete folder ``new`` at ``out``; an ``out`` already there (the command's own earlier output,
    claimed by :func:`claim_dir`) is renamed aside first and deleted only after ``new`` is in place."""
    new, out = Path(new), Path(out)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(new, out)
        return out
    old = out.with_name(f".{out.name}.replaced-{os.getpid()}-{time.time_ns()}")
    os.replace(out, old)
    try:
        os.replace(new, out)
    except OSError:
        os.replace(old, out)  # put the old one back: nothing lost
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out


def add_move_aside(p: argparse.ArgumentParser, flag: str = "--out") -> None:
    """``--move-aside``: the one way past :func:`claim_dir`'s refusal of a folder the command did not make (the
    folder is renamed, never deleted)."""
    p.add_argument("--move-aside", action="store_true",
                   help=f"when {flag} is a folder agentic-rag did not make, rename it to NAME.moved-TIMESTAMP and "
                        f"write a new one (without it such a folder is refused; nothing is ever deleted)")
