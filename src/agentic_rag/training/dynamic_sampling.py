"""DAPO's dynamic sampling (on by default for ``dapo``; ``algorithm.dynamic_sampling`` for the others, not for the
REINFORCE++ pair, whose advantages are normalised over the whole batch).

A group whose rewards are all equal has advantage 0 and no gradient. After each generation batch is scored, such
groups are dropped and groups of further training questions (drawn at random, seeded) are rolled out and scored
until every process has as many informative groups as its batch had, or until ``max_extra_rollouts`` more rollouts
a process were drawn; a batch still short is filled with the dropped groups (advantage 0), so every process trains
on exactly its batch size. Each round draws ``ceil(missing / p)`` groups, ``p`` the share of groups so far
informative (at least 1/4), on every process alike. The trainer logs ``dynamic_sampling/extra_rollouts``,
``/zero_variance_groups`` (found, over all rounds), ``/filled`` (zero-variance groups kept to fill) and ``/rounds``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def informative_groups(rewards: torch.Tensor, group_size: int, tol: float = 1e-6) -> torch.Tensor:
    """``[N / group_size]`` booleans: whether each group of ``group_size`` consecutive rewards (NaN: unscorable,
    ignored) holds two scorable rewards that differ by more than ``tol``, i.e. carries a learning signal."""
    groups = rewards.detach().float().view(-1, group_size)
    finite = ~torch.isnan(groups)
    high = torch.where(finite, groups, -math.inf).max(dim=1).values
    low = torch.where(finite, groups, math.inf).min(dim=1).values
    return (finite.sum(dim=1) >= 2) & (high - low > tol)


def select_rows(pieces: list[tuple[dict[str, Any], list[int]]], pad_token_id: int) -> dict[str, Any]:
    """One scored generation batch made of chosen rows of several (TRL's output dicts): ``pieces`` are ``(output,
    row indices)``. Prompt tensors are left-padded (with ``pad_token_id`` for ids, 0 for masks) and completion
    tensors right-padded to the widest chosen row; per-row lists are concatenated. ``num_items_in_batch`` is left
    for the caller to recount. A key this does not know how to join raises."""
    first = pieces[0][0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if key == "num_items_in_batch":
            continue
        parts = [(o[key], rows) for o, rows in pieces]
        if isinstance(value, list):
            out[key] = [v[i] for v, rows in parts for i in rows]
        elif isinstance(value, torch.Tensor) and value.dim() == 1:
            out[key] = torch.cat([v[rows] for v, rows in parts])
        elif isinstance(value, torch.Tensor) and value.dim() == 2:
            width = max(v.size(1) for v, _ in parts)
            fill = pad_token_id if key.endswith("_ids") else 0
            left = key.startswith("prompt")
            chunks = []
            for v, rows in parts:
                v = v[rows]
                pad = v.new_full((v.size(0), width - v.size(1)), fill)
                chunks.append(torch.cat([pad, v] if left else [v, pad], dim=1))
            out[key] = torch.cat(chunks)
        else:
            raise ValueError(f"dynamic sampling cannot join the generation batch's {key!r}")
    return out


@dataclass
class Refill:
    """What :func:`refill_groups` chose for one process: ``pieces`` for :func:`select_rows`, and its counts."""

    pieces: list[tuple[dict[str, Any], list[int]]]
    drawn: int  # extra rollouts drawn
    zero_variance: int  # zero-variance groups found, over all rounds
    filled: int  # zero-variance groups kept to fill the batch
    rounds: int


def refill_groups(output: dict[str, Any], flags: list[bool], group: int, *,
                  score_more: Callable[[int, int], tuple[dict[str, Any], list[bool]]],
                  gather: Callable[[list[float]], torch.Tensor], max_extra_rollouts: int) -> Refill:
    """The groups one process trains on: its batch's informative groups (``flags``: one per group of ``group`` rows
    of ``output``), then those of further rounds, as many as ``flags`` has groups. ``score_more(groups, round)``
    rolls out and scores ``groups`` further questions and returns that output and its flags; ``gather(values)``
    stacks one list of numbers from every process into a ``[processes, len(values)]`` tensor (every process calls
    it as often: each round is decided from all processes' counts)."""
    wanted = len(flags)
    found = [(output, g) for g, ok in enumerate(flags) if ok]
    zero = [(output, g) for g, ok in enumerate(flags) if not ok]
    seen, informative, drawn, rounds = len(flags), len(found), 0, 0
    while True:
        stats = gather([max(0, wanted - len(found)), seen, informative])
        most_missing = int(stats[:, 0].max())
        share = max(float(stats[:, 2].sum() / stats[:, 1].sum().clamp(min=1)), 0.25)
        groups = min(math.ceil(most_missing / share), (max_extra_rollouts - drawn) // group)
        if most_missing == 0 or groups <= 0:
            break
        rounds += 1
        extra, flags = score_more(groups, rounds)
        drawn += groups * group
        seen, informative = seen + len(flags), informative + sum(flags)
        found += [(extra, g) for g, ok in enumerate(flags) if ok]
        zero += [(extra, g) for g, ok in enumerate(flags) if not ok]
    chosen = found[:wanted]
    filled = wanted - len(chosen)
    chosen += zero[:filled]
    pieces: list[tuple[dict[str, Any], list[int]]] = []
    for out, g in chosen:
        if pieces and pieces[-1][0] is out:
            pieces[-1][1].extend(range(g * group, (g + 1) * group))
        else:
            pieces.append((out, list(range(g * group, (g + 1) * group))))
    return Refill(pieces, drawn, seen - informative, filled, rounds)
