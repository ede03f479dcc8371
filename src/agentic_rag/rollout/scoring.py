"""Re-score trajectories the training way: every completion token under exactly the context it was
generated with, in one forward pass per batch.

For a linear trajectory that is the ordinary causal pass over ``prompt + completion``. When a backtrack or
summary branched the context, the completion is still laid out in the order it was written, and a 4D
attention mask lets each token see only the prompt, the segments on its path (see
:class:`~.trajectory.Trajectory`) and the earlier tokens of its own segment; its position id is its
position in that path. Every segment's path is prefix-closed, so each token's hidden state is computed from
the same inputs as during generation: the log-probabilities agree with the rollout's (the tests check it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .trajectory import Trajectory

TREE_MASK_ATTENTION = ("sdpa", "eager")  # the attention kernels that apply a custom 4D mask as given


def layout(traj: Trajectory) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids ``[L]`` and a boolean visibility matrix ``[L, L]`` (row attends column) for
    ``prompt + completion`` of one trajectory."""
    p = len(traj.prompt_ids)
    n = p + len(traj.completion_ids)
    pos = torch.arange(n)
    vis = torch.zeros(n, n, dtype=torch.bool)
    vis[:p, :p] = torch.tril(torch.ones(p, p, dtype=torch.bool))
    for index, seg in enumerate(traj.segments):
        path = traj.path(index)[:-1]
        rows = slice(p + seg.start, p + seg.end)
        vis[rows, :p] = True
        offset = p
        for a in path:
            anc = traj.segments[a]
            vis[rows, p + anc.start:p + anc.end] = True
            offset += len(anc)
        length = len(seg)
        vis[rows, rows] = torch.tril(torch.ones(length, length, dtype=torch.bool))
        pos[rows] = torch.arange(offset, offset + length)
    return pos, vis


def predictor_index(traj: Trajectory) -> torch.Tensor:
    """For each completion token, the layout index of the position whose logits predict it.

    Inside a segment that is the previous token; for a segment's first token it is the last token of its
    parent segment (or of the prompt), which after a branch is not the token laid out just before it.
    """
    p = len(traj.prompt_ids)
    idx = torch.arange(p - 1, p - 1 + len(traj.completion_ids))
    for seg in traj.segments:
        if seg.end > seg.start:
            parent_end = p + traj.segments[seg.parent].end - 1 if seg.parent >= 0 else p - 1
            idx[seg.start] = parent_end
    return idx


def batch_inputs(trajs: Sequence[Trajectory], pad_id: int, dtype: torch.dtype = torch.float32):
    """Right-padded ``input_ids``, ``position_ids`` and a 4D additive attention mask for ``trajs``."""
    n = max(len(t.prompt_ids) + len(t.completion_ids) for t in trajs)
    b = len(trajs)
    input_ids = torch.full((b, n), pad_id, dtype=torch.long)
    position_ids = torch.zeros((b, n), dtype=torch.long)
    allowed = torch.zeros((b, 1, n, n), dtype=torch.bool)
    for i, t in enumerate(trajs):
        ids = list(t.prompt_ids) + list(t.completion_ids)
        pos, vis = layout(t)
        input_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        position_ids[i, :len(ids)] = pos
        allowed[i, 0, :len(ids), :len(ids)] = vis
        allowed[i, 0, len(ids):, :].fill_(False)
        idx = torch.arange(len(ids), n)
        allowed[i, 0, idx, idx] = True  # padding rows see themselves: no all-masked softmax rows
    mask = torch.zeros((b, 1, n, n), dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return input_ids, position_ids, mask


def model_dtype(model) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


@torch.no_grad()
def completion_logprobs(model, trajs: Sequence[Trajectory], *, pad_id: int, temperature: float = 1.0,
                        batch_size: int = 8) -> list[torch.Tensor]:
    """Per completion token, ``log_softmax(logits / temperature)`` at the token, under its own context.

    Environment tokens get a value too (they are inputs like any other) but the trainer masks them out. The
    model's attention must apply a custom 4D mask as given (sdpa or eager): flash attention reads it as a 2D
    padding mask, so any other kernel is refused rather than scored wrong.
    """
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attention is not None and attention not in TREE_MASK_ATTENTION:
        raise ValueError(f"completion_logprobs scores with a 4D tree-shaped attention mask, which the model's "
                         f"{attention!r} attention cannot apply; load the model with attn_implementation='sdpa' "
                         f"(or 'eager')")
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    for start in range(0, len(trajs), batch_size):
        chunk = trajs[start:start + batch_size]
        input_ids, position_ids, mask = batch_inputs(chunk, pad_id, model_dtype(model))
        logits = model(input_ids=input_ids.to(device), position_ids=position_ids.to(device),
                       attention_mask=mask.to(device), use_cache=False).logits
        for i, t in enumerate(chunk):
            rows = logits[i, predictor_index(t).to(device)].float() / temperature
            targets = torch.tensor(t.completion_ids, dtype=torch.long, device=device)
            out.append(torch.log_softmax(rows, dim=-1).gather(-1, targets[:, None])[:, 0].cpu())
    return out
