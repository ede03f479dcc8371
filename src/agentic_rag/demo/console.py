"""What the quick starts show on the console while they work: a line per evaluated batch, and the progress lines of
the training processes they start (whose whole output goes to each run's train.log), so that no minute passes in
silence. Shared by the world task (:mod:`.quickstart`) and the wiki task (:mod:`.wiki`)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def eval_progress(name: str, questions: str | Path, stream: Any = None) -> Callable[[int, list], None]:
    """A console line after each evaluated batch (``eval NAME: 64/200 questions, em 0.312, 41 s``): a quick-start
    evaluation takes minutes, and a minute never passes in silence."""
    total = sum(1 for line in open(questions) if line.strip())
    started, seen, right = time.perf_counter(), [0], [0.0]

    def hook(_batch: int, records: list) -> None:
        seen[0] += len(records)
        right[0] += sum(float(r["metrics"].get("em") or 0.0) for r in records)
        print(f"   eval {name}: {seen[0]}/{total} questions, em {right[0] / max(1, seen[0]):.3f}, "
              f"{time.perf_counter() - started:.0f} s", file=stream or sys.stderr, flush=True)

    return hook


CONSOLE_PREFIXES = ("[grpo]", "[validation]")  # a training run's lines the quick start's console shows, with its
# collapse-guard alerts


def run_logged(cmd: list[str], env: dict[str, str], log_path: Path, name: str) -> int:
    """Run a training process with all its output in ``log_path``, and its progress lines (one per step, the
    validations, guard alerts) on the console too, prefixed with the run's name; returns its exit status."""
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                errors="replace", bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            logf.flush()
            shown = console_part(line)
            if shown:
                print(f"   {name} {shown}", file=sys.stderr, flush=True)
        return proc.wait()


def console_part(line: str) -> str:
    """The part of a training process's output line the console shows, or ''. tqdm's bar has no newline of its
    own, so a step line often arrives glued to it (``100%|####| 2/2 [00:10<00:00][grpo] step 2/2 ...``): the line
    is shown from its first progress prefix on."""
    starts = [i for i in (line.find(p) for p in CONSOLE_PREFIXES) if i >= 0]
    if starts:
        return line[min(starts):].strip()
    return line.strip() if "collapse guard:" in line else ""
