"""How an optimizer step's rows reach the model: dealt into micro-batches by length (:func:`group_by_length`), each
micro-batch scored over the columns its rows use (:func:`used_columns`), so a short row does not pay for the
padding of a long one."""

from __future__ import annotations

from typing import Any

import torch


def used_columns(attention_mask: torch.Tensor, prompt_width: int) -> tuple[int, int]:
    """``(first, last)``: the columns of a left-padded prompt + right-padded completion batch that hold a token of at
    least one row, always keeping one completion column. Columns outside are padding in every row: cutting them
    changes no real token's context or position (positions are counted from each row's first real token)."""
    used = attention_mask.bool().any(0).nonzero().flatten().tolist()
    first = min(used[0], prompt_width) if used else prompt_width
    last = max(used[-1] + 1, prompt_width + 1) if used else prompt_width + 1
    return first, last


def group_by_length(batches: list[dict[str, Any]], per_step: int) -> list[dict[str, Any]]:
    """The micro-batches of a generation batch, with each optimizer step's rows (``per_step`` consecutive
    micro-batches) re-dealt shortest first, so that each micro-batch holds rows of similar length and
    :meth:`AgenticGRPOTrainer._get_per_token_logps_and_entropies` cuts its padding. Which rows an optimizer step
    trains on is unchanged, and so is its gradient for every loss whose normalisation does not depend on which
    rows share a micro-batch (:data:`agentic_rag.training.algorithms.ORDER_NEUTRAL_LOSSES`); only per-micro-batch
    logged means shift."""
    from trl.trainer.utils import split_tensor_dict

    out: list[dict[str, Any]] = []
    for i in range(0, len(batches), per_step):
        group = batches[i:i + per_step]
        merged: dict[str, Any] = {}
        for key, first in group[0].items():
            values = [b[key] for b in group]
            if first is None or (isinstance(first, torch.Tensor) and first.ndim == 0):
                merged[key] = first
            elif isinstance(first, torch.Tensor):
                merged[key] = torch.cat(values, dim=0)
            else:
                merged[key] = [x for v in values for x in v]
        lengths = merged["prompt_mask"].sum(1) + merged["completion_mask"].sum(1)
        order = torch.argsort(lengths.cpu(), stable=True)
        for key, value in merged.items():
            if isinstance(value, torch.Tensor) and value.ndim > 0:
                merged[key] = value[order.to(value.device)]
            elif isinstance(value, list):
                merged[key] = [value[j] for j in order.tolist()]
        out.extend(split_tensor_dict(merged, len(group)))
    return out
