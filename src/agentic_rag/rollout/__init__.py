"""The rollout engine: a question goes in, the policy reasons, searches, reads and answers, and out comes a
trajectory (token ids, env_mask, logprobs, events) that training, evaluation and the chat service consume.

The names below are imported when first used (PEP 562), so importing a settings module of this package
(:mod:`.settings`, :mod:`.protocol`) loads no torch."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "DecodeSession": "decoding", "Generation": "decoding", "SamplingParams": "decoding",
    "FINISH_REASONS": "engine", "AgentRollout": "engine", "RolloutHooks": "engine",
    "HFPolicy": "policy", "Policy": "policy",
    "Action": "protocol", "ActionKind": "protocol", "Dialect": "protocol", "get_dialect": "protocol",
    "RolloutSettings": "settings", "PromptSettings": "settings", "SamplingSettings": "settings",
    "completion_logprobs": "scoring",
    "Segment": "trajectory", "Trajectory": "trajectory",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
