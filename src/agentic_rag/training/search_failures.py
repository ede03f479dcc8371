"""A training run's failed searches, counted as evaluation counts them, so a broken search target cannot train the
model in silence.

Every rollout batch adds its searches and failures (gathered over the processes, so every process decides alike).
The run stops mid-way (:class:`~agentic_rag.errors.SearchFailuresError`, exit 3) once more than
``search.max_failure_rate`` of its searches have failed and at least :data:`MIN_FAILURES_TO_STOP` have: rewards earned
with error observations instead of passages train the model on the target's failures. A run that ends over the rate
with fewer failures than that is caught at its end (:meth:`SearchFailures.summary`'s ``over_threshold``: the
evaluation's rule, whatever the batch size). The counts travel in every checkpoint (:data:`FILE`), so a resumed run
counts on from where it stopped, and they are written into ``train_summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIN_FAILURES_TO_STOP = 5
FILE = "search_totals.json"


@dataclass
class SearchFailures:
    max_rate: float
    failed: int = 0
    searches: int = 0

    def add(self, failed: int, searches: int, step: int) -> None:
        """Count one rollout batch; raise :class:`~agentic_rag.errors.SearchFailuresError` when the run must stop."""
        from ..errors import SearchFailuresError

        self.failed += failed
        self.searches += searches
        if self.failed >= MIN_FAILURES_TO_STOP and self.failed / self.searches > self.max_rate:
            raise SearchFailuresError(
                f"training stopped at step {step}: {failed} of {searches} searches of the last rollout batch failed, "
                f"{self.failed} of {self.searches} over the run ({self.failed / self.searches:.1%}; "
                f"search.max_failure_rate is {self.max_rate:.1%}). Check the search target (search.index), then "
                f"continue with --resume", summary=self.summary())

    def summary(self) -> dict[str, Any]:
        """The counts in the evaluation's shape: ``failed``, ``searches``, ``rate``, ``max_rate``,
        ``over_threshold``."""
        rate = self.failed / self.searches if self.searches else 0.0
        return {"failed": self.failed, "searches": self.searches, "rate": round(rate, 4), "max_rate": self.max_rate,
                "over_threshold": self.failed > 0 and rate > self.max_rate}

    def save(self, checkpoint: str | os.PathLike) -> None:
        (Path(checkpoint) / FILE).write_text(json.dumps({"failed": self.failed, "searches": self.searches}) + "\n")

    def load(self, checkpoint: str | os.PathLike) -> None:
        """Take up the counts a checkpoint recorded (one written before they were recorded: count from here)."""
        path = Path(checkpoint) / FILE
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            self.failed, self.searches = int(saved["failed"]), int(saved["searches"])
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("%s: no search counts recorded; the run's search failures count from here", path)
