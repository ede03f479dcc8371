"""A question must fit the model it is asked of: checked before any model loads and before anything is generated.

A prompt longer than the model's context (its ``max_position_embeddings``) cannot be answered: a model with learned
positions fails on it, a rotary one reads positions it was never trained on, and either way a long prompt costs
minutes of attention before anything shows (a 1 MB question stalled an evaluation for ten minutes without a line of
output). Such a question is refused up front, naming it, its length and the model's context; the user shortens or
removes it. A prompt that fits but leaves less than the completion budget is only warned about: its rollouts end at
the context's edge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from ..errors import UserError

log = logging.getLogger(__name__)


def context_length(model: str | None) -> int | None:
    """The model's context in tokens (``max_position_embeddings`` of its config, read without the weights); None
    when it is not a model on this machine or does not say."""
    if not model:
        return None
    from ..models import load_config

    try:
        config = load_config(model)
    except (OSError, ValueError):
        return None
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def check_prompt_lengths(questions: Iterable[tuple[str, str]], prompt_ids: Callable[[str], list[int]],
                         context: int | None, *, source: str, budget: int = 0) -> None:
    """Refuse (:class:`UserError`) when any question's prompt (``prompt_ids(question)``) does not fit ``context``
    tokens; warn when some leave fewer than ``budget`` tokens for the completion. ``questions``: (id, question)
    pairs of the file ``source``. No context known: nothing to check."""
    if not context:
        return
    over: list[tuple[str, int]] = []
    tight = 0
    for qid, question in questions:
        n = len(prompt_ids(question))
        if n >= context:
            over.append((qid, n))
        elif budget and n + budget > context:
            tight += 1
    if over:
        named = ", ".join(f"{qid} ({n:,} tokens)" for qid, n in over[:3])
        more = f" and {len(over) - 3} more" if len(over) > 3 else ""
        raise UserError(f"{source}: {len(over)} question(s) do not fit the model's context of {context:,} tokens as "
                        f"prompts: {named}{more}. Shorten or remove them; nothing was generated")
    if tight:
        log.warning("%s: %d question(s) leave fewer than the %d completion tokens in the model's context of %d: "
                    "their rollouts end at the context's edge", source, tight, budget, context)
