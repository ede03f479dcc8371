"""Scoring a branched trajectory (after a backtrack or summary) under exactly the contexts it was generated with: its
position ids and a tree-shaped attention mask in TRL's padded layout, and the same tensors for ordinary rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..rollout.scoring import layout
from ..rollout.trajectory import Trajectory


@dataclass
class TreeLayout:
    """What the loss needs to score a branched trajectory: its real prompt length and segments."""

    trajectory: Trajectory

    def tensors(self, prompt_width: int, completion_width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids ``[P + C]`` and visibility ``[P + C, P + C]`` in TRL's padded layout (prompt
        left-padded to ``P``, completion right-padded to ``C``); padding sees only itself."""
        t = self.trajectory
        pos, vis = layout(t)
        p, c = len(t.prompt_ids), len(t.completion_ids)
        n = prompt_width + completion_width
        positions = torch.zeros(n, dtype=torch.long)
        allowed = torch.eye(n, dtype=torch.bool)
        off = prompt_width - p
        idx = torch.cat([torch.arange(off, prompt_width), torch.arange(prompt_width, prompt_width + c)])
        positions[idx] = pos
        allowed[idx[:, None], idx[None, :]] = vis
        return positions, allowed


def real_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of ordinary rows (``[..., L]``, any device): each real token's index among its row's real
    tokens, as the rollout fed it (0 at the first prompt token, whatever the left padding); padding gets 0, or
    the last real position when it follows real tokens."""
    return (torch.cumsum(attention_mask.long(), -1) - 1).clamp(min=0)


def linear_tensors(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same tensors for an ordinary row: causal over its real tokens."""
    n = attention_mask.shape[0]
    real = attention_mask.bool().cpu()
    positions = real_positions(real)
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool)) & real[None, :] & real[:, None]
    allowed |= torch.eye(n, dtype=torch.bool)
    return positions, allowed


def tree_inputs(model: Any, layouts: list[TreeLayout | None], attention_mask: torch.Tensor, prompt_width: int,
                completion_width: int) -> dict[str, Any]:
    """Position ids and an additive 4D mask for a micro-batch that holds a branched trajectory (``layouts``: one
    per row, None for an ordinary row), in the dtype of ``model``'s floating-point parameters."""
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        dtype = torch.bfloat16
    positions, allowed = [], []
    for row_mask, lay in zip(attention_mask, layouts, strict=True):
        pos, vis = (lay.tensors(prompt_width, completion_width) if lay is not None
                    else linear_tensors(row_mask))
        positions.append(pos)
        allowed.append(vis)
    device = attention_mask.device
    n = prompt_width + completion_width
    additive = torch.zeros((len(layouts), 1, n, n), dtype=dtype, device=device)
    additive.masked_fill_(~torch.stack(allowed)[:, None].to(device), torch.finfo(dtype).min)
    # Model segments always follow their parent directly (only environment notes start a branch), so the
    # ordinary shift (position i predicts token i + 1) is right for every token that is trained on.
    return {"attention_mask": additive, "position_ids": torch.stack(positions).to(device)}
