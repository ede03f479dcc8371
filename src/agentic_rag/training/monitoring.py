"""SwanLab monitoring: offline by default, cloud when a key is set, and a table of sample trajectories.

Transformers' SwanLab integration (``report_to="swanlab"``) crashes unless ``swanlab.init`` already ran on
the main process, so :func:`init_swanlab` starts the run first; the integration then logs TRL's metrics to
it: per-reward means (``rewards/<name>/mean``), KL, clip ratios, completion lengths, and ours
(``agentic/searches_per_trajectory``, ``agentic/env_tokens_masked``, ``agentic/finish/<reason>``...).
:class:`SampleTrajectories` adds, every N steps, a table of sample trajectories (question, answer, rewards,
searches, finish reason) and one full trajectory text.

Offline runs are written under the log directory; ``swanlab watch LOG_DIR -h 127.0.0.1`` serves the
dashboard, ``swanlab sync RUN_DIR`` uploads one later.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..config import LoggingConfig

log = logging.getLogger(__name__)

MODES = {"offline": "offline", "cloud": "online", "local": "local", "disabled": "disabled"}


def init_swanlab(cfg: LoggingConfig, output_dir: str, config: dict[str, Any], *, is_main: bool) -> str | None:
    """Start the SwanLab run on the main process; returns the log directory (None when disabled)."""
    if cfg.swanlab_mode == "disabled" or not is_main:
        return None
    import swanlab

    log_dir = cfg.swanlab_log_dir or str(Path(output_dir) / "swanlog")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    if cfg.swanlab_mode == "cloud":
        key = os.environ.get("SWANLAB_API_KEY")
        if not key:
            raise ValueError("logging.swanlab_mode is cloud but SWANLAB_API_KEY is not set")
        swanlab.login(api_key=key)
    swanlab.init(project=cfg.swanlab_project, name=cfg.run_name or None, mode=MODES[cfg.swanlab_mode],
                 log_dir=log_dir, config=config)
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
            swanlab.log({"samples/table": swanlab.Text(render_table(trajs[: self.rows])),
                         "samples/trajectory": swanlab.Text(trajs[0].text[:8000])}, step=state.global_step)
        except Exception as exc:  # noqa: BLE001 - monitoring must never stop training
            log.warning("could not log sample trajectories: %s", exc)


def render_table(trajs) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")[:160]

    lines = ["| question | answer | finish | searches | queries |", "|---|---|---|---|---|"]
    for t in trajs:
        queries = [q for e in t.events if e["type"] == "search" for q in e.get("queries", [])]
        lines.append(f"| {cell(t.question)} | {cell(t.answer)} | {t.finish_reason} | {t.num_searches} | "
                     f"{cell('; '.join(queries))} |")
    return "\n".join(lines)
