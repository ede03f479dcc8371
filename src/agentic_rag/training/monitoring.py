"""SwanLab monitoring: cloud when a key is set, a local dashboard otherwise, and a table of sample trajectories.

``logging.swanlab_mode`` (env ``SWANLAB_MODE``): ``auto`` (the default) logs to the SwanLab cloud when
``SWANLAB_API_KEY`` is set and in ``local`` mode otherwise; ``local``, ``offline``, ``cloud`` and ``disabled``
are taken as written (``cloud`` without a key is a config error). See :func:`resolve_mode`.

Transformers' SwanLab integration (``report_to="swanlab"``) crashes unless ``swanlab.init`` already ran on
the main process, so :func:`init_swanlab` starts the run first; the integration then logs TRL's metrics to
it: per-reward means (``rewards/<name>/mean``), KL (only when ``beta > 0``), clip ratios, completion
lengths, and ours (``agentic/searches_per_trajectory``, ``agentic/env_tokens_masked``,
``agentic/finish/<reason>``...). :class:`SampleTrajectories` adds, every N steps, a table of sample
trajectories (question, answer, finish reason, searches, queries, the total reward and each reward
function's score) and one full trajectory text.

Where the logs go, and how to look at them. ``local`` runs are written under the log directory (a SQLite store
plus one folder per run), and ``swanlab watch LOG_DIR -h 127.0.0.1`` serves them as a dashboard (SwanLab's
``dashboard`` extra, installed with this package). ``offline`` runs keep only a backup for ``swanlab sync RUN_DIR``
to upload later: the dashboard does not read them. SwanLab's local store takes one writer at a time, so runs
that train at the same time need log directories of their own (the default, ``OUTPUT_DIR/swanlog``, is).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..rollout.events import search_queries
from .config import LoggingConfig

log = logging.getLogger(__name__)

MODES = {"offline": "offline", "cloud": "online", "local": "local", "disabled": "disabled"}


def resolve_mode(mode: str, env: Mapping[str, str] | None = None) -> str:
    """The SwanLab mode a run uses: ``auto`` is ``cloud`` when ``SWANLAB_API_KEY`` is set, else ``local``
    (what ``swanlab watch`` shows); any other mode is returned as it is."""
    env = os.environ if env is None else env
    if mode == "auto":
        return "cloud" if env.get("SWANLAB_API_KEY") else "local"
    return mode


def init_swanlab(cfg: LoggingConfig, output_dir: str, config: dict[str, Any], *, is_main: bool) -> str | None:
    """Start the SwanLab run on the main process; returns the log directory (None when disabled)."""
    mode = resolve_mode(cfg.swanlab_mode)
    if mode == "disabled" or not is_main:
        return None
    import swanlab

    log_dir = cfg.swanlab_log_dir or str(Path(output_dir) / "swanlog")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    if mode == "cloud":
        key = os.environ.get("SWANLAB_API_KEY")
        if not key:
            raise ValueError("logging.swanlab_mode is cloud but SWANLAB_API_KEY is not set")
        swanlab.login(api_key=key)
    log.info("SwanLab: %s mode (logging.swanlab_mode %s)", mode, cfg.swanlab_mode)
    swanlab.init(project=cfg.swanlab_project, name=cfg.run_name or None, mode=MODES[mode], log_dir=log_dir,
                 config=config)
    return log_dir


def watch_hint(log_dir: str | None) -> str:
    if not log_dir:
        return "SwanLab logging is disabled"
    return f"SwanLab logs: {log_dir}\n  open the dashboard: swanlab watch {log_dir} -h 127.0.0.1"


class SampleTrajectories(TrainerCallback):
    """Every ``every`` steps, log ``rows`` of the last rollouts as a markdown table, plus one full text."""

    def __init__(self, trainer_ref: list, every: int, rows: int = 4):
        self.trainer_ref = trainer_ref  # [trainer], filled once the trainer exists
        self.every, self.rows = every, rows

    def on_step_end(self, args, state, control, **kwargs):
        if not self.every or state.global_step % self.every or not state.is_world_process_zero:
            return
        trainer = self.trainer_ref[0] if self.trainer_ref else None
        trajs = getattr(trainer, "_last_trajectories", None)
        if not trajs:
            return
        try:
            import swanlab

            if not swanlab.has_run():
                return
            swanlab.log({"samples/table": swanlab.Text(sample_table(trainer, self.rows)),
                         "samples/trajectory": swanlab.Text(trajs[0].text[:8000])}, step=state.global_step)
        except Exception as exc:  # noqa: BLE001 - monitoring must never stop training
            log.warning("could not log sample trajectories: %s", exc)


class CollapseGuard(TrainerCallback):
    """Watches two signs of a collapsing search policy at every logged step (``guards`` in the config): the mean
    entropy of the tokens the policy wrote (TRL's ``entropy``) and the searches per trajectory
    (``agentic/searches_per_trajectory``). When one stays past its bound for ``patience`` logged steps in a row,
    it warns, appends a line to ``OUTPUT_DIR/guards.jsonl`` (step, metric, value, bound) and, with ``action:
    stop``, ends training (the adapter is saved as at a normal end). One alert per spell: the count starts again
    once the metric is back within its bound. ``alerts`` and ``stopped_at`` are what the run summary records."""

    def __init__(self, cfg: Any, output_dir: str | os.PathLike):
        self.cfg = cfg
        self.path = Path(output_dir) / "guards.jsonl"
        self.bounds = [(key, kind, bound) for key, kind, bound in (
            ("entropy", "min", cfg.min_entropy),
            ("agentic/searches_per_trajectory", "min", cfg.min_searches),
            ("agentic/searches_per_trajectory", "max", cfg.max_searches)) if bound is not None]
        self.spells: dict[tuple[str, str], int] = {}
        self.alerts: list[dict[str, Any]] = []
        self.stopped_at: int | None = None

    @property
    def active(self) -> bool:
        return bool(self.bounds)

    def on_log(self, args, state, control, logs=None, **kwargs):
        import json

        for key, kind, bound in self.bounds:
            value = (logs or {}).get(key)
            if value is None or not math.isfinite(value):
                continue
            past = value < bound if kind == "min" else value > bound
            spell = self.spells.get((key, kind), 0) + 1 if past else 0
            self.spells[key, kind] = spell
            if spell != self.cfg.patience:
                continue
            alert = {"step": state.global_step, "metric": key, "value": value, kind: bound,
                     "steps_in_a_row": spell, "action": self.cfg.action}
            self.alerts.append(alert)
            log.warning("collapse guard: %s has been %s %g for %d logged steps (now %g, step %d)%s", key,
                        "below" if kind == "min" else "above", bound, spell, value, state.global_step,
                        ": stopping" if self.cfg.action == "stop" else "")
            if state.is_world_process_zero:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a") as f:
                    f.write(json.dumps(alert) + "\n")
            if self.cfg.action == "stop":
                control.should_training_stop = True
                self.stopped_at = state.global_step
        return control


def sample_table(trainer: Any, rows: int) -> str:
    """The table of the trainer's last rollouts on this (the main) process, with the rewards they were paid.

    The trainer's rewards are gathered over all processes, this process's rows first (process 0); with
    ``shuffle_rewards`` they are the permuted rewards the control run paid."""
    trajs = trainer._last_trajectories[:rows]
    per_func = getattr(trainer, "_rewards_per_func", None)
    if per_func is None:
        return render_table(trajs)
    start = trainer.accelerator.process_index * len(trainer._last_trajectories)
    values = per_func[start:start + len(trajs)].tolist()
    weights = trainer.reward_weights.tolist()
    return render_table(trajs, values, trainer.reward_func_names, weights)


def render_table(trajs: Sequence[Any], rewards: Sequence[Sequence[float | None]] | None = None,
                 names: Sequence[str] = (), weights: Sequence[float] | None = None) -> str:
    """A markdown table of trajectories. With ``rewards`` (one row of per-function scores per trajectory,
    ``None`` or NaN where a function did not apply) it adds the weighted total, computed as TRL sums it
    (functions that did not apply are left out), and one column per reward function."""
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")[:160]

    def score(x: float | None) -> str:
        return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"

    head = ["question", "answer", "finish", "searches", "queries"]
    if rewards is not None:
        weights = list(weights) if weights is not None else [1.0] * len(names)
        head += ["reward", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, t in enumerate(trajs):
        queries = search_queries(t.events)
        row = [cell(t.question), cell(t.answer), str(t.finish_reason), str(t.num_searches), cell("; ".join(queries))]
        if rewards is not None:
            scores = list(rewards[i])
            applied = [w * s for w, s in zip(weights, scores, strict=True) if s is not None and not math.isnan(s)]
            row += [score(sum(applied)) if applied else "n/a", *(score(s) for s in scores)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
