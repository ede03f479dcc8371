"""Continuous batched decoding over a Hugging Face causal LM, with rows that pause, resume and restart.

:class:`DecodeSession` keeps one KV cache for all live rows. Each :meth:`~DecodeSession.step` feeds every
row's pending tokens in one forward pass (new rows' prompts, observation tokens appended to a resumed row,
or the last sampled token of a generating row), samples the next token of every generating row, and
returns the rows that stopped in this step. The engine can then append an observation to a stopped row
(:meth:`~DecodeSession.resume`), give it a new context (:meth:`~DecodeSession.reset`, after a backtrack or
summary), or let it go (:meth:`~DecodeSession.release`), while the other rows keep generating: no row
waits for another row's turn to end.

How the cache stays correct: each step's block of inputs is left-padded to the longest row's pending
input; padding and invalidated entries are masked out through the 2D attention mask, and every real token
gets its own position id (its index in its row's context), so a row's tokens see exactly its own context.
Holes left by padding are removed by re-prefilling the live rows when they outgrow the real content. A batch of new
prompts feeds their common prefix (the system prompt and tool listing; in GRPO, each question's whole prompt for all
its generations share at least that) once, as a batch of one, and each row starts from a copy of its cache entries
(:meth:`DecodeSession._prefill_shared`).

Sampling is done here, not by ``model.generate``: ``log_softmax(logits / temperature)`` of the raw logits
gives the recorded log-probability of the chosen token. The token is drawn from the same logits after the
optional repetition penalty (applied to the raw logits before the temperature, as Hugging Face does it),
top-k/top-p truncation and the processors, by inverse CDF (:func:`sample_categorical`: one uniform number
per row, an exact categorical sample, much faster on CPU than ``torch.multinomial`` over a 150k vocabulary).

Which log-probability is recorded, and why. The trainer recomputes each token's log-probability as TRL's
``GRPOTrainer`` (1.16) does for its old and current policy: ``log_softmax(logits / temperature)`` of the
model's raw logits (its fused LM head, built with ``args.temperature``), with no repetition penalty and no
top-k/top-p. The recorded values are exactly that quantity, so rollout and re-scoring agree token by token
(the tests check it with a penalty on). **With ``repetition_penalty != 1`` (as with top-k/top-p < full) the
tokens are not sampled from the distribution those log-probabilities describe**: the penalty depends on the
whole context and is not re-applied when scoring, so the samples are slightly off-policy and nothing in the
loss corrects for it (TRL's own ``generate`` path behaves the same). Keep it at 1.0 for on-policy training;
:class:`~.policy.HFPolicy` warns when it is not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .kv_cache import RESERVE, ReservedLayer, reserve_room

STOP_EOS = "eos"
MIN_SHARED = 16  # tokens of common prompt prefix worth a forward pass of their own (DecodeSession._prefill_shared)
STOP_LENGTH = "length"

# a logits processor here: (scores [n, V], the rows being sampled) -> scores
Processor = Callable[[torch.Tensor, list["Row"]], torch.Tensor]


def sample_categorical(probs: torch.Tensor, block: int = 256) -> torch.Tensor:
    """One token per row of ``probs`` ([n, V], non-negative, each row with positive mass; need not sum to 1),
    by inverse CDF with one uniform number per row.

    Exact and cheap on a CPU over a 150k vocabulary: rather than a cumulative sum over the whole vocabulary (a
    sequential scan), the vocabulary is cut into blocks of ``block`` entries; the block is chosen from the
    cumulative sum of the block sums (a well-vectorised reduction, then a scan over ~600 numbers), the token
    from the cumulative sum inside that one block. A token of zero probability is never chosen.
    """
    n, vocab = probs.shape
    full = vocab // block * block
    sums = probs[:, :full].reshape(n, -1, block).sum(-1)
    if full < vocab:
        sums = torch.cat([sums, probs[:, full:].sum(-1, keepdim=True)], dim=1)
    cdf = sums.cumsum(-1)
    total = cdf[:, -1:]
    zero = torch.zeros_like(total)
    # u < total strictly, so the first block whose cumulative mass exceeds u exists and has positive mass
    u = torch.minimum(torch.rand(total.shape, dtype=total.dtype, device=total.device) * total,
                      torch.nextafter(total, zero))
    b = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
    start = b * block
    idx = start + torch.arange(block, device=probs.device)
    inside = probs.gather(-1, idx.clamp(max=vocab - 1)).masked_fill_(idx >= vocab, 0.0)
    inner = inside.cumsum(-1)
    offset = (u - (cdf.gather(-1, b) - sums.gather(-1, b))).clamp_(min=0)
    offset = torch.minimum(offset, torch.nextafter(inner[:, -1:], zero))
    t = torch.searchsorted(inner, offset, right=True).clamp_(max=block - 1)
    return (start + t)[:, 0]


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    do_sample: bool = True
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use do_sample=False for greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.repetition_penalty <= 0:
            raise ValueError("top_k must be >= 0 and repetition_penalty > 0")


@dataclass
class Generation:
    """What one row produced in a turn: new ids exactly as generated, and why it stopped."""

    ids: list[int]
    logprobs: list[float] | None = None
    stop: str = STOP_LENGTH  # the stop string that matched, STOP_EOS, or STOP_LENGTH


@dataclass
class Row:
    """A sequence in the session. ``context`` is everything fed or queued; ``generated`` this turn's output."""

    id: int
    context: list[int]
    budget: int
    pending: list[int] = field(default_factory=list)  # tokens not yet in the cache
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    generating: bool = True
    position: int = 0  # position id of the next token fed
    turn_start: int = 0  # len(context) when this turn began
    user: Any = None  # free for processors (e.g. a script key)


class DecodeSession:
    def __init__(self, model, tokenizer, *, stop_strings: Sequence[str], eos_ids: set[int], pad_id: int,
                 sampling: SamplingParams, return_logprobs: bool = True, processors: Sequence[Processor] = (),
                 compact_slack: int = 256, reserve: int = RESERVE):
        self.model, self.tokenizer = model, tokenizer
        self.stop_strings = list(stop_strings)
        self.eos_ids, self.pad_id = set(eos_ids), pad_id
        self.sampling = sampling
        self.return_logprobs = return_logprobs
        self.processors = list(processors)
        self.compact_slack = compact_slack
        self.reserve = reserve  # cache entries of room per layer (kv_cache.ReservedLayer); 0: HF's DynamicLayer
        self.device = next(model.parameters()).device
        self.rows: dict[int, Row] = {}
        self._order: list[int] = []  # row ids in cache batch order
        self._cache = None
        self._mask: torch.Tensor | None = None  # [batch, timeline] bool: which cache entries are valid
        self._next_id = 0
        self._tail = max((len(s) for s in self.stop_strings), default=1) + 1
        self.on_token: Callable[[Row, int], None] | None = None  # called for every sampled token
        self.steps = 0
        self.forward_tokens = 0  # sum over steps of batch x block width (real + padding)

    # ------------------------------------------------------------------------------------------ rows

    def add(self, context: Sequence[int], budget: int, user: Any = None) -> int:
        if not context:
            raise ValueError("a row needs a non-empty context")
        if budget < 1:
            raise ValueError(f"a row needs a budget of at least one token, got {budget}")
        row = Row(self._next_id, list(context), budget, pending=list(context), turn_start=len(context), user=user)
        self._next_id += 1
        self.rows[row.id] = row
        return row.id

    def resume(self, row_id: int, append: Sequence[int], budget: int) -> None:
        """Append ``append`` (environment tokens) to a stopped row and generate a new turn."""
        row = self._stopped(row_id)
        row.context.extend(append)
        row.pending.extend(append)
        self._new_turn(row, budget)

    def reset(self, row_id: int, context: Sequence[int], budget: int) -> None:
        """Replace a stopped row's whole context (its cached entries are dropped) and generate a new turn."""
        row = self._stopped(row_id)
        if row.id in self._order and self._mask is not None:
            self._mask[self._order.index(row.id)] = False
        row.context, row.pending, row.position = list(context), list(context), 0
        self._new_turn(row, budget)

    def release(self, row_id: int) -> None:
        self.rows.pop(row_id, None)

    def _stopped(self, row_id: int) -> Row:
        row = self.rows[row_id]
        if row.generating:
            raise RuntimeError(f"row {row_id} is still generating")
        return row

    @staticmethod
    def _new_turn(row: Row, budget: int) -> None:
        row.generated, row.logprobs, row.budget, row.generating = [], [], budget, True
        row.turn_start = len(row.context)

    @property
    def busy(self) -> bool:
        return any(r.generating for r in self.rows.values())

    # ------------------------------------------------------------------------------------------ steps

    def step(self) -> list[tuple[int, Generation]]:
        """One forward pass for every row with pending input; returns the rows that stopped."""
        self._sync_batch()
        live = [self.rows[i] for i in self._order]
        fed = [r for r in live if r.pending]
        if not fed:
            return []
        self._prefill_shared(live)
        self._prefill_apart(live)
        n = len(live)
        input_ids, positions, new_mask = self._feed(live, [len(r.pending) for r in live])
        width = input_ids.shape[1]
        mask = new_mask if self._mask is None else torch.cat([self._mask, new_mask], dim=1)
        with torch.no_grad():
            out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device).long(),
                             position_ids=positions.to(self.device), past_key_values=self._cache, use_cache=True,
                             logits_to_keep=1)
        self._cache, self._mask = out.past_key_values, mask
        if self.reserve:
            reserve_room(self._cache, self.reserve)  # appends in place from now on (kv_cache.py)
        self.steps += 1
        self.forward_tokens += n * width
        sampling = [b for b, r in enumerate(live) if r.generating and new_mask[b].any()]
        stopped: list[tuple[int, Generation]] = []
        if sampling:
            logits = out.logits[sampling, -1].float()
            tokens, logps = self._sample(logits, [live[b] for b in sampling])
            tokens, logps = tokens.tolist(), logps.tolist()  # one conversion, not one per row
            for j, b in enumerate(sampling):
                row = live[b]
                token = tokens[j]
                row.generated.append(token)
                row.context.append(token)
                row.pending = [token]
                if self.return_logprobs:
                    row.logprobs.append(logps[j])
                if self.on_token is not None:
                    self.on_token(row, token)
                reason = self._stop_reason(row, token)
                if reason is not None:
                    row.generating = False
                    stopped.append((row.id, Generation(list(row.generated),
                                                       list(row.logprobs) if self.return_logprobs else None, reason)))
        self._maybe_compact()
        return stopped

    def _feed(self, rows: list[Row], counts: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Take the first ``counts[j]`` pending tokens of each row as one left-padded block: input ids, position
        ids and the block's validity mask, ``[rows, widest count]``; the rows' positions move on. Built as Python
        lists and converted once: a decode step feeds one token per row, and per-row tensor writes would cost
        more than the lists."""
        width = max(counts)
        ids, pos, valid = [], [], []
        for row, k in zip(rows, counts, strict=True):
            pad = width - k
            ids.append([self.pad_id] * pad + row.pending[:k])
            pos.append([0] * pad + list(range(row.position, row.position + k)))
            valid.append([False] * pad + [True] * k)
            row.position += k
            row.pending = row.pending[k:]
        return (torch.tensor(ids, dtype=torch.long), torch.tensor(pos, dtype=torch.long),
                torch.tensor(valid, dtype=torch.bool))

    def _prefill_shared(self, live: list[Row]) -> None:
        """Feed the prompts' common prefix once. When the cache is empty and every row starts at its first token (a
        batch of new prompts: a GRPO step's questions times their generations, whose system prompt, tool listing and
        question repeat), the longest prefix all rows share (at least ``MIN_SHARED`` tokens, and short of each row's
        last token, which the step feeds to sample from) runs through the model once, as a batch of one; each row
        gets a copy of its cache entries and feeds only the rest. The entries are the ones a batched prefill computes
        (the same tokens at the same positions, over the same context); only the order of floating-point sums may
        differ. Plain ``DynamicLayer`` caches only (the others: the usual prefill)."""
        if self._cache is not None or len(live) < 2 or any(r.position or not r.pending for r in live):
            return
        first = live[0].pending
        limit = min(len(r.pending) for r in live) - 1
        common = 0
        while common < limit and all(r.pending[common] == first[common] for r in live):
            common += 1
        if common < MIN_SHARED:
            return
        from transformers.cache_utils import DynamicLayer

        ids = torch.tensor([first[:common]], dtype=torch.long, device=self.device)
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                             position_ids=torch.arange(common, device=self.device)[None], use_cache=True,
                             logits_to_keep=1)
        cache = out.past_key_values
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) is not DynamicLayer for layer in layers):
            return  # another cache type: the rows prefill as usual
        for layer in layers:
            for name in ("keys", "values"):
                shared = getattr(layer, name)
                setattr(layer, name, shared.expand(len(live), *shared.shape[1:]).contiguous())
        self._cache, self._mask = cache, torch.ones((len(live), common), dtype=torch.bool)
        for row in live:
            row.pending, row.position = row.pending[common:], common
        self.forward_tokens += common

    def _prefill_apart(self, live: list[Row]) -> None:
        """Feed the long inputs (an observation appended to a resumed row, a new row's prompt) of a few rows
        in a forward pass of their own, all but each one's last token, so the step that follows feeds one token
        per row. Fed with everyone else, a 100-token observation would be a 100-wide block for every row: the
        others would run 99 positions of padding through the model. The cache of those rows is sliced out,
        extended, and merged back; the other rows get masked (invalid) entries over the same span, as they
        would have got padding. Only when some row has a single token to feed and the cache is plain
        ``DynamicLayer``s (otherwise the usual, padded step does the work)."""
        wide = [b for b, r in enumerate(live) if len(r.pending) > 1]
        if not wide or len(wide) == len(live) or self._cache is None or self._mask is None or not self._can_grow():
            return
        from transformers.cache_utils import DynamicCache

        idx = torch.tensor(wide, device=self.device)
        input_ids, positions, new_mask = self._feed([live[b] for b in wide], [len(live[b].pending) - 1 for b in wide])
        width = input_ids.shape[1]
        layers = self._cache.layers
        sub = DynamicCache(ddp_cache_data=[(layer.keys[idx], layer.values[idx]) for layer in layers])
        sub_mask = torch.cat([self._mask[wide], new_mask], dim=1)
        with torch.no_grad():
            self.model(input_ids=input_ids.to(self.device), attention_mask=sub_mask.to(self.device).long(),
                       position_ids=positions.to(self.device), past_key_values=sub, use_cache=True, logits_to_keep=1)
        start = self._mask.shape[1]
        for layer, part in zip(layers, sub.layers, strict=True):
            for name in ("keys", "values"):
                full, new = getattr(layer, name), getattr(part, name)[:, :, start:]
                grown = torch.cat([full, full.new_zeros((full.shape[0], full.shape[1], width, full.shape[3]))], dim=2)
                grown[idx, :, start:] = new
                setattr(layer, name, grown)
        mask = torch.cat([self._mask, torch.zeros((self._mask.shape[0], width), dtype=torch.bool)], dim=1)
        mask[wide, start:] = new_mask
        self._mask = mask
        self.forward_tokens += len(wide) * width

    def _stop_reason(self, row: Row, token: int) -> str | None:
        if token in self.eos_ids:
            return STOP_EOS
        if self.stop_strings:
            tail = self.tokenizer.decode(row.generated[-self._tail:], skip_special_tokens=False)
            for s in self.stop_strings:
                if s in tail:
                    return s
        if len(row.generated) >= row.budget:
            return STOP_LENGTH
        return None

    def _sample(self, logits: torch.Tensor, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.sampling
        x = logits if s.temperature == 1.0 else logits / s.temperature
        # the recorded log-probability: the raw logits at the sampling temperature, what the trainer recomputes;
        # taken before anything below (processors may write into ``scores`` in place)
        raw = torch.softmax(x, dim=-1)
        scores = x
        if s.repetition_penalty != 1.0:  # shapes the sampling only (see the module docstring)
            penalized = logits.clone()
            for j, row in enumerate(rows):
                seen = torch.tensor(sorted(set(row.context)), dtype=torch.long, device=logits.device)
                vals = penalized[j, seen]
                penalized[j, seen] = torch.where(vals > 0, vals / s.repetition_penalty, vals * s.repetition_penalty)
            scores = penalized / s.temperature
        if s.do_sample and s.top_k and s.top_k < scores.shape[-1]:
            kth = torch.topk(scores, s.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if s.do_sample and s.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
            probs = sorted_scores.softmax(-1)
            drop = probs.cumsum(-1) - probs >= s.top_p  # keep the smallest prefix reaching top_p
            scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, float("-inf")))
        for proc in self.processors:
            scores = proc(scores, rows)
        if not s.do_sample:
            tokens = torch.argmax(scores, dim=-1)
        else:
            shaped = scores is not x or bool(self.processors)
            tokens = sample_categorical(torch.softmax(scores, dim=-1) if shaped else raw)
        return tokens, raw.gather(-1, tokens[:, None])[:, 0].log()

    # ---------------------------------------------------------------------------------- cache layout

    def _sync_batch(self) -> None:
        """Drop released rows from the cache and add new ones (with no valid entries yet)."""
        keep = [b for b, i in enumerate(self._order) if i in self.rows]
        if len(keep) < len(self._order) and self._cache is not None:
            if keep:
                self._cache.batch_select_indices(torch.tensor(keep, device=self.device))
                self._mask = self._mask[keep]
            else:
                self._cache, self._mask = None, None
        self._order = [self._order[b] for b in keep]
        new = [i for i in self.rows if i not in self._order]
        if not new:
            return
        if self._cache is not None:
            if not self._can_grow():
                self._reprefill(extra=new)
                return
            for layer in self._cache.layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    setattr(layer, name, torch.cat([t, t.new_zeros((len(new), *t.shape[1:]))], dim=0))
            self._mask = torch.cat([self._mask, torch.zeros((len(new), self._mask.shape[1]), dtype=torch.bool)])
        self._order.extend(new)

    def _can_grow(self) -> bool:
        from transformers.cache_utils import DynamicLayer

        layers = getattr(self._cache, "layers", None)
        return bool(layers) and all(type(layer) in (DynamicLayer, ReservedLayer) and layer.keys is not None
                                    for layer in layers)

    def _maybe_compact(self) -> None:
        """Keep the cache's timeline close to the longest row's valid content. Padding blocks, released
        turns and reset rows leave invalid entries that every later step would still attend over and copy."""
        if self._mask is None:
            return
        valid = self._mask.sum(dim=1)
        longest = int(valid.max()) if valid.numel() else 0
        if self._can_grow():  # plain dynamic layers: moving entries is a gather, far cheaper than re-feeding
            if self._mask.shape[1] > longest + max(self.compact_slack // 4, longest // 2):
                self._compact(longest)
        elif self._mask.shape[1] > 2 * longest + self.compact_slack:
            self._reprefill()

    def _compact(self, longest: int) -> None:
        """Move every row's valid cache entries, in order, to the right end of a timeline ``longest`` wide.
        Keys and values keep their rotary positions (each token was fed with its own position id), so
        attention over the moved entries is what it was."""
        if longest == 0:
            self._cache, self._mask = None, None
            return
        width = self._mask.shape[1]
        # a stable sort puts each row's invalid entries first and its valid ones after, both in order
        keep = torch.argsort(self._mask.to(torch.int8), dim=1, stable=True)[:, width - longest:]
        self._mask = self._mask.gather(1, keep)
        index = keep.to(self.device)
        for layer in self._cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                setattr(layer, name, t.gather(2, index[:, None, :, None].expand(t.shape[0], t.shape[1], longest,
                                                                              t.shape[3])))

    def _reprefill(self, extra: Sequence[int] = ()) -> None:
        """Forget the cache; every live row feeds its whole context again at the next step."""
        self._cache, self._mask = None, None
        for i in list(self._order) + list(extra):
            row = self.rows[i]
            row.pending = list(row.context)
            row.position = 0
        self._order = [i for i in self._order if i in self.rows] + [i for i in extra if i not in self._order]
