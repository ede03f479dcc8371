"""The policy: anything that continues a batch of token-id sequences until each stops.

``Policy.generate(contexts, stop_strings, max_new_tokens)`` continues every context until it writes one of
the stop strings, an end-of-sequence token, or its own new-token budget, and returns the new token ids of
each (with their log-probabilities when the backend has them). A sequence that stops early is never
stopped by another sequence's stop. Remote backends (an OpenAI-compatible server) and scripted policies
implement just this.

:class:`HFPolicy` runs a Hugging Face causal LM (plain, peft-wrapped, or unwrapped from DeepSpeed) with the
continuous batched decoder of :mod:`.decoding`. Besides ``generate`` it offers ``open_session``, which the
engine uses to let each sequence pause for its search and resume while the others keep generating.
Log-probabilities are ``log_softmax(logits / temperature)`` of the raw logits at the chosen token, before any
repetition penalty, top-k/top-p truncation or processor: the quantity the trainer (like TRL's GRPOTrainer)
computes when it re-scores a completion. A repetition penalty changes what is sampled but not what is
recorded (see :mod:`.decoding`): sampling is then off-policy, and the policy logs a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .decoding import STOP_EOS, STOP_LENGTH, DecodeSession, Generation, Processor, SamplingParams

log = logging.getLogger(__name__)
_warned_penalties: set[float] = set()  # warn once per process and value, not at every rollout step


def repetition_penalty_warned(penalty: float) -> None:
    """Record that ``penalty``'s off-policy sampling was already explained (the training config check says it
    once per run), so the policy does not say it again in every process."""
    _warned_penalties.add(penalty)

__all__ = ["STOP_EOS", "STOP_LENGTH", "Generation", "HFPolicy", "Policy", "SamplingParams", "per_sequence_budgets"]


@runtime_checkable
class Policy(Protocol):
    def generate(self, contexts: Sequence[Sequence[int]], *, stop_strings: Sequence[str],
                 max_new_tokens: int | Sequence[int]) -> list[Generation]: ...


def per_sequence_budgets(max_new_tokens: int | Sequence[int], n: int) -> list[int]:
    if isinstance(max_new_tokens, int):
        return [max_new_tokens] * n
    budgets = list(max_new_tokens)
    if len(budgets) != n:
        raise ValueError(f"{len(budgets)} budgets for {n} contexts")
    return budgets


class HFPolicy:
    """A Hugging Face causal LM behind the Policy protocol (and the engine's continuous sessions).

    ``max_batch_size`` bounds how many sequences decode together (the engine starts the next trajectory
    when one finishes). ``processors`` run after temperature/top-k/top-p with the signature
    ``(scores [n, vocab], rows) -> scores``: constrained decoding, or forcing tokens in tests and benchmarks;
    the recorded log-probabilities stay those of the raw logits.
    """

    def __init__(self, model, tokenizer, sampling: SamplingParams | None = None, *, return_logprobs: bool = True,
                 max_batch_size: int | None = None, processors: Sequence[Processor] = ()):
        self.model, self.tokenizer = model, tokenizer
        self.sampling = sampling or SamplingParams()
        self.return_logprobs = return_logprobs
        self.max_batch_size = max_batch_size
        self.processors = list(processors)
        config = getattr(model, "generation_config", None)
        eos = getattr(config, "eos_token_id", None)
        eos_list = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {e for e in eos_list + [tokenizer.eos_token_id] if e is not None}
        if not self.eos_ids:
            raise ValueError("the tokenizer and the model's generation config name no end-of-sequence token")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)

    def open_session(self, stop_strings: Sequence[str]) -> DecodeSession:
        penalty = self.sampling.repetition_penalty
        if penalty != 1.0 and self.return_logprobs and self.sampling.do_sample and penalty not in _warned_penalties:
            _warned_penalties.add(penalty)
            log.warning("repetition_penalty=%g: tokens are sampled from the penalized distribution, but the recorded "
                        "log-probabilities (like the trainer's re-scoring) are the unpenalized model's; the samples "
                        "are off-policy for training. Use 1.0 for on-policy GRPO.", penalty)
        return DecodeSession(self.model, self.tokenizer, stop_strings=stop_strings, eos_ids=self.eos_ids,
                             pad_id=self.pad_id, sampling=self.sampling, return_logprobs=self.return_logprobs,
                             processors=self.processors)

    def generate(self, contexts: Sequence[Sequence[int]], *, stop_strings: Sequence[str],
                 max_new_tokens: int | Sequence[int]) -> list[Generation]:
        budgets = per_sequence_budgets(max_new_tokens, len(contexts))
        results: list[Generation | None] = [None] * len(contexts)
        size = self.max_batch_size or max(1, len(contexts))
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(contexts), size):
                session = self.open_session(stop_strings)
                rows = {session.add(contexts[i], budgets[i]): i for i in range(start, min(start + size, len(contexts)))}
                while session.busy:
                    for row, gen in session.step():
                        results[rows[row]] = gen
                        session.release(row)
        finally:
            if was_training:
                self.model.train()
        return results  # type: ignore[return-value]
