"""REINFORCE++'s per-token advantages (Hu et al. 2025; the ``reinforce_pp`` presets of
:mod:`agentic_rag.training.algorithms`): KL-shaped returns over each completion's model tokens, whitened over the
model tokens of the global batch."""

from __future__ import annotations

from collections.abc import Callable

import torch


def kl_shaped_returns(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                      beta: float = 0.0) -> torch.Tensor:
    """REINFORCE++'s per-token returns ``[B, T]`` (Hu et al. 2025, gamma = 1).

    On every model token (``mask`` 1) the reward is ``r_t = -beta * kl_t``, plus the completion's scalar reward
    (``rewards[b]``) on its last model token; the return is ``G_t = sum_{s >= t} r_s`` over the model tokens from
    ``t`` on. Other positions (observations, padding) get no reward and a return of 0. A row without model tokens
    is all 0. ``kl`` may hold anything at positions outside ``mask``."""
    m = mask.to(torch.float32)
    r = torch.zeros_like(m)
    if kl is not None and beta != 0.0:
        r = torch.where(m.bool(), -beta * kl.to(torch.float32), r)
    last = (m * torch.arange(1, m.size(1) + 1, device=m.device)).argmax(dim=1)
    has = m.sum(dim=1) > 0
    rows = torch.arange(m.size(0), device=m.device)[has]
    r[rows, last[has]] += rewards.to(r)[has]
    return r.flip(1).cumsum(1).flip(1) * m


def whiten_over_tokens(values: torch.Tensor, mask: torch.Tensor, reduce=None) -> torch.Tensor:
    """``(values - mean) / std`` with the mean and the (population) variance taken over the tokens where ``mask`` is
    1, the variance floored at 1e-8; 0 elsewhere. ``reduce`` sums a tensor over all processes (the statistics are
    the global batch's); None for one process."""
    m = mask.to(values.dtype)
    stats = torch.stack([(values * m).sum(), m.sum()])
    if reduce is not None:
        stats = reduce(stats)
    count = stats[1].clamp(min=1.0)
    mean = stats[0] / count
    squares = ((values - mean).pow(2) * m).sum()
    if reduce is not None:
        squares = reduce(squares)
    return (values - mean) * (squares / count).clamp(min=1e-8).rsqrt() * m


def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None, group_size: int, *,
                            beta: float, group_baseline: bool, process_index: int = 0,
                            reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Per-token advantages ``[B, T]`` of one process's rows.

    ``rewards``: the outcome reward of every completion of the global batch, in TRL's gathered order (groups of
    ``group_size`` consecutive completions; NaN: unscorable); ``mask``: this process's model tokens ``[B, T]``
    (its rows start at ``process_index * B`` of the gathered order); ``kl``: ``log pi_old - log pi_ref`` there, or
    None. ``group_baseline`` (``reinforce_pp_baseline``) first subtracts each group's mean reward; then
    :func:`kl_shaped_returns` with ``beta`` and :func:`whiten_over_tokens` over the model tokens of all processes
    (``reduce`` sums over them). An unscorable completion gets 0 and does not count."""
    rewards = rewards.to(torch.float32)
    if group_baseline:
        groups = rewards.view(-1, group_size)
        rewards = (groups - torch.nanmean(groups, dim=1, keepdim=True)).view(-1)
    start = process_index * mask.size(0)
    local = rewards[start:start + mask.size(0)].to(mask.device)
    mask = mask * ~torch.isnan(local)[:, None]
    returns = kl_shaped_returns(local.nan_to_num(0.0), mask, kl, beta)
    return whiten_over_tokens(returns, mask, reduce=reduce)
