"""The settings an agent was trained with, saved next to its weights so it is served and evaluated the same way.

A trained adapter only works as trained: the tag dialect, the rollout limits (turns, searches and what a search
past the limit gets, passages per search, observation length), the exact system prompt and the chat template on or
off are part of what it learned. Every adapter the trainer and SFT save (checkpoints and ``final/``) carries them
as ``agentic_rag.json``: the same :class:`~.settings.RolloutSettings` and :class:`~.settings.PromptSettings` the
configs hold, under the same names::

    {"format": 2, "written_by": "grpo",
     "rollout": {"dialect": "agentic", "max_turns": 4, "max_searches": 2, ...},
     "prompt": {"language": "en", "system_prompt": "Answer the question by searching.", "chat_template": true}}

``prompt.system_prompt`` is the text the prompts were built with (the dialect's default written out) and
``prompt.chat_template`` what the tokenizer made of "when it has one", so a later change of a default does not
change what a trained model is shown. Evaluation and the chat server read the file from the adapter (or from a
model directory that has one) and take every setting the user did not set (:func:`beneath`); each one the user
set differently is logged (:func:`override_lines`). Files written before format 2 (flat names, SFT's with the
dialect alone) still load; a newer format or a damaged file is refused with what to do.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..settings import section
from ..tools.settings import tools_setting
from .settings import PromptSettings, RolloutSettings

SETTINGS_FILE = "agentic_rag.json"
FORMAT = 2
SECTIONS = ("rollout", "prompt")
TOP_LEVEL = ("tools",)  # settings outside the sections (the tools: list)
# format 1 (flat) names -> their settings now: the reader of files older adapters carry
_FORMAT_1 = {"dialect": "rollout.dialect", "summary_mode": "rollout.summary_mode", "max_turns": "rollout.max_turns",
             "max_searches": "rollout.max_searches", "max_tokens_per_turn": "rollout.max_tokens_per_turn",
             "max_completion_tokens": "rollout.max_completion_tokens",
             "passages_per_search": "rollout.passages_per_search",
             "max_observation_tokens": "rollout.max_observation_tokens", "on_search_limit": "rollout.on_search_limit",
             "language": "prompt.language", "system_prompt": "prompt.system_prompt",
             "chat_template": "prompt.chat_template"}


@dataclass
class SavedSettings:
    """The shape of the file: the two sections an adapter records."""

    rollout: RolloutSettings = section(RolloutSettings)
    prompt: PromptSettings = section(PromptSettings)
    tools: list[str | dict] = tools_setting()


def write_settings(directory: str | os.PathLike, rollout: RolloutSettings, prompt: PromptSettings, *,
                   written_by: str, tools: list[Any] | None = None) -> Path:
    """Write ``agentic_rag.json`` into ``directory`` (atomically). ``prompt`` should hold the system prompt and
    chat template as resolved (:func:`resolved_prompt`); ``tools``: the ``tools:`` list it was trained with (None:
    not recorded, which reads as the default ``[search]``)."""
    path = Path(directory) / SETTINGS_FILE
    data = {"format": FORMAT, "written_by": written_by, "rollout": dataclasses.asdict(rollout),
            "prompt": dataclasses.asdict(prompt)}
    if tools is not None:
        data["tools"] = list(tools)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def resolved_prompt(prompt: PromptSettings, dialect: str, tokenizer: Any) -> PromptSettings:
    """``prompt`` as it was applied: the system prompt written out, the chat template on or off as the tokenizer
    made of "when it has one"."""
    chat = prompt.chat_template if prompt.chat_template is not None else bool(getattr(tokenizer, "chat_template",
                                                                                      None))
    return PromptSettings(language=prompt.language, system_prompt=prompt.system_for(dialect), chat_template=chat)


def read_settings(path: str | os.PathLike) -> dict[str, Any]:
    """The settings of a file, by dotted name (``rollout.max_searches``): all of them for format 2, the ones it
    knew for format 1. Each value is checked as the configs check it; a malformed or newer file raises
    :class:`~agentic_rag.settings.SettingsError` naming the file."""
    from ..settings import SettingsError, load

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SettingsError([f"cannot read the trained settings ({exc}); delete the file to use the defaults, or "
                             f"fix it"], str(path)) from None
    if not isinstance(data, dict):
        raise SettingsError([f"the trained settings must be a JSON object, got {type(data).__name__}"], str(path))
    version = data.get("format", 1)
    if not isinstance(version, int) or version > FORMAT:
        raise SettingsError([f"trained settings format {version!r}, newer than this version of agentic-rag reads "
                             f"({FORMAT}): upgrade agentic-rag to use this adapter"], str(path))
    if version == 1:
        flat = {dotted: data[name] for name, dotted in _FORMAT_1.items() if data.get(name) is not None}
    else:
        unknown = sorted(k for k in data if k not in (*SECTIONS, *TOP_LEVEL, "format", "written_by"))
        if unknown:
            raise SettingsError([f"unknown section(s) {', '.join(unknown)} in the trained settings"], str(path))
        flat = {f"{sec}.{k}": v for sec in SECTIONS for k, v in (data.get(sec) or {}).items()}
        flat.update({k: data[k] for k in TOP_LEVEL if k in data})
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        if "." not in dotted:
            tree[dotted] = value
            continue
        sec, name = dotted.split(".", 1)
        tree.setdefault(sec, {})[name] = value
    load(SavedSettings, data=tree, env={}, source=str(path))  # every value checked as a config's would be
    return flat


def find_settings_file(path: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """The settings of one settings file (an adapter's ``agentic_rag.json``, or the ``*.settings.json`` beside a
    trajectory file), in :func:`find_settings`' shape."""
    return read_settings(path), Path(path)


def find_settings(*directories: str | os.PathLike | None) -> tuple[dict[str, Any], Path] | None:
    """The settings of the first directory that has a file (an adapter before its base model), or None."""
    for directory in directories:
        if directory and (Path(directory) / SETTINGS_FILE).is_file():
            path = Path(directory) / SETTINGS_FILE
            return read_settings(path), path
    return None


def beneath(found: tuple[dict[str, Any], Path] | None, prefix: str = "") -> dict[str, tuple[Any, str]]:
    """``found``'s settings for :func:`agentic_rag.settings.load`'s ``beneath`` (under ``prefix``, when a
    config nests them): taken wherever the user set nothing."""
    if found is None:
        return {}
    values, path = found
    return {prefix + dotted: (value, f"the adapter's {path}") for dotted, value in values.items()}


def override_lines(found: tuple[dict[str, Any], Path] | None, config: Any, origins: Mapping[str, str],
                   prefix: str = "") -> list[str]:
    """One line per trained setting the user set to another value (which wins), and one saying how many settings
    came from the adapter."""
    if found is None:
        return []
    values, path = found
    lines, taken = [], 0
    for dotted, trained in values.items():
        node: Any = config
        for name in (prefix + dotted).split("."):
            node = getattr(node, name)
        origin = origins.get(prefix + dotted, "")
        if origin.startswith("the adapter's"):
            taken += 1
        elif node != trained:
            lines.append(f"{prefix}{dotted} = {node!r} ({origin or 'the default'}) overrides the {trained!r} the "
                         f"model was trained with ({path})")
    return [f"trained settings from {path}: {taken} taken, {len(lines)} overridden"] + lines
