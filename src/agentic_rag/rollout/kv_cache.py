"""A KV-cache layer that appends in place: the decoder's cache without a full copy at every step.

Hugging Face's :class:`~transformers.cache_utils.DynamicLayer` appends a step's keys and values with ``torch.cat``,
so every decode step copies the layer's whole cache into a new tensor: for the rollout engine's batch of 64 rows
over a 600-entry timeline, SmolLM2-135M's 30 layers copy 1.8 GB a step (and, with :mod:`agentic_rag.malloc`'s fixed
mmap threshold, map and fault in that much fresh memory), as much time as the step's matrix products.
:class:`ReservedLayer` keeps each of keys and values in a buffer with room for ``reserve`` more entries on the
timeline and writes a step's entries into that room; only when it is full does the buffer move to a larger one
(``reserve`` entries more), once every ``reserve`` decode steps.

What the model sees is unchanged: ``keys`` / ``values`` are views of the first entries of the buffer, the same
values a ``DynamicLayer`` would hold (the tests compare the two step by step). Code that replaces them
(``batch_select_indices``, the decode session's compaction and row changes) assigns a tensor as before; the buffer
then is that tensor, and grows at the next append. Used only by :class:`~agentic_rag.rollout.decoding.DecodeSession`,
which runs under ``torch.no_grad``: the in-place writes are never part of an autograd graph.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

RESERVE = 64  # entries of room on the timeline: a 64-row batch of SmolLM2-135M holds 188 MB of it at most


def _append(buf: torch.Tensor | None, n: int, new: torch.Tensor, reserve: int) -> tuple[torch.Tensor, int]:
    """Write ``new`` ([batch, heads, k, dim]) after the first ``n`` timeline entries of ``buf``; the buffer (a
    larger one when there is no room) and the new count."""
    add = new.shape[-2]
    if buf is None or buf.dim() != 4 or n == 0:
        out = new.new_empty((*new.shape[:-2], add + reserve, new.shape[-1]))
        out[:, :, :add] = new
        return out, add
    if n + add > buf.shape[-2]:
        grown = buf.new_empty((*buf.shape[:-2], n + add + reserve, buf.shape[-1]))
        grown[:, :, :n] = buf[:, :, :n]
        buf = grown
    buf[:, :, n:n + add] = new
    return buf, n + add


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose appends write into reserved room (see the module docstring)."""

    def __init__(self, reserve: int = RESERVE):
        self.reserve = reserve
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._kn = self._vn = 0
        super().__init__()

    @classmethod
    def adopt(cls, layer: DynamicLayer, reserve: int = RESERVE) -> ReservedLayer:
        """A reserved layer holding what ``layer`` holds."""
        new = cls(reserve)
        if layer.is_initialized:
            new.dtype, new.device = layer.dtype, layer.device
            new.keys, new.values = layer.keys, layer.values
            new.is_initialized = True
        return new

    @property
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._k if self._k is None or self._k.dim() != 4 else self._k[:, :, :self._kn]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._k, self._kn = value, (value.shape[-2] if value is not None and value.dim() == 4 else 0)

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._v if self._v is None or self._v.dim() != 4 else self._v[:, :, :self._vn]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v, self._vn = value, (value.shape[-2] if value is not None and value.dim() == 4 else 0)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._k, self._kn = _append(self._k, self._kn, key_states, self.reserve)
        self._v, self._vn = _append(self._v, self._vn, value_states, self.reserve)
        return self.keys, self.values


def reserve_room(cache, reserve: int = RESERVE) -> None:
    """Turn ``cache``'s plain ``DynamicLayer``s into :class:`ReservedLayer`s holding the same entries (sliding-window
    and other layer types are left as they are)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[i] = ReservedLayer.adopt(layer, reserve)
