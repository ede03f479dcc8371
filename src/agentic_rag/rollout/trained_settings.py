"""The settings an agent was trained with, saved next to its weights so it is served and evaluated the same way.

A trained adapter only works as trained: the tag dialect, the exact system prompt, the chat template on or off,
and the rollout limits (how many turns and searches, what a search past the limit gets, how many passages per
search, how long an observation) are part of what it learned. The GRPO trainer writes them into every adapter
directory it saves (checkpoints and ``final/``) as ``agentic_rag.json``; SFT writes the ones it knows. The chat
server and the evaluation runner read the file from the adapter (or from a model directory that has one) and take
each value the user did not set.

The file is flat JSON; a setting that is absent or null was not known to whatever wrote it::

    {"format": 1, "written_by": "grpo", "dialect": "agentic", "language": "en",
     "system_prompt": "Answer the question by searching.", "chat_template": true, "summary_mode": "replace",
     "max_turns": 4, "max_searches": 2, "max_tokens_per_turn": 64, "max_completion_tokens": 320,
     "passages_per_search": 1, "max_observation_tokens": 64, "on_search_limit": "observe"}

``system_prompt`` is the text the prompts were built with (the dialect's default written out, when no other was
configured), so a later change of the default does not change what a trained model is shown.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SETTINGS_FILE = "agentic_rag.json"
FORMAT = 1
LIMIT_NAMES = ("max_turns", "max_searches", "max_tokens_per_turn", "max_completion_tokens", "passages_per_search",
               "max_observation_tokens")


@dataclass
class TrainedSettings:
    """How the agent's prompts were built and its rollouts limited during training; None = not known."""

    dialect: str | None = None
    language: str | None = None
    system_prompt: str | None = None
    chat_template: bool | None = None
    summary_mode: str | None = None
    max_turns: int | None = None
    max_searches: int | None = None
    max_tokens_per_turn: int | None = None
    max_completion_tokens: int | None = None
    passages_per_search: int | None = None
    max_observation_tokens: int | None = None
    on_search_limit: str | None = None
    written_by: str = ""  # grpo or sft: for people reading the file

    @classmethod
    def from_limits(cls, limits: Any, **prompt: Any) -> TrainedSettings:
        """From a :class:`~agentic_rag.rollout.RolloutLimits` and the prompt settings (``dialect=``, ...)."""
        return cls(**{name: getattr(limits, name) for name in LIMIT_NAMES}, on_search_limit=limits.on_search_limit,
                   **prompt)

    def known(self) -> dict[str, Any]:
        """The settings that are known (not None), by name; ``written_by`` is not a setting."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "written_by" and getattr(self, f.name) is not None}

    def write(self, directory: str | os.PathLike) -> Path:
        path = Path(directory) / SETTINGS_FILE
        data = {"format": FORMAT, "written_by": self.written_by, **self.known()}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> TrainedSettings:
        """Parse ``path``; a malformed file raises ValueError naming the file and the setting."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read the trained settings ({exc}); delete the file to use the "
                             f"defaults, or fix it") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the trained settings must be a JSON object, got {type(data).__name__}")
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"{path}: trained settings format {data.get('format')!r}; this version reads "
                             f"format {FORMAT}")
        kinds = {"dialect": str, "language": str, "system_prompt": str, "summary_mode": str, "chat_template": bool,
                 "written_by": str, "on_search_limit": str, **dict.fromkeys(LIMIT_NAMES, int)}
        values: dict[str, Any] = {}
        for name, kind in kinds.items():
            value = data.get(name)
            if value is None:
                continue
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"{path}: {name} must be {kind.__name__}, got {value!r}")
            values[name] = value
        return cls(**values)


def find_trained_settings(*directories: str | os.PathLike | None) -> tuple[TrainedSettings, Path] | None:
    """The settings file of the first directory that has one (an adapter before its base model), or None."""
    for directory in directories:
        if directory and (Path(directory) / SETTINGS_FILE).is_file():
            path = Path(directory) / SETTINGS_FILE
            return TrainedSettings.read(path), path
    return None


def describe_taken(taken: dict[str, Any], path: Path, kept: list[str]) -> str:
    """The one log line saying which settings came from ``path`` (and which the user's own values overrode)."""
    shown = ", ".join(f"{k}={v!r}" if k != "system_prompt" else f"system_prompt={_short(v)!r}"
                      for k, v in taken.items()) or "none"
    line = f"trained settings from {path}: {shown}"
    if kept:
        line += f" (set by you, kept: {', '.join(kept)})"
    return line


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."
