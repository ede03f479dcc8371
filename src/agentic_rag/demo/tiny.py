"""A word-level tokenizer trained on the demo task's own text, and a tiny Qwen2 model initialised from scratch.

The quick start's ``--tiny`` model: the same pipeline as with the real SmolLM2-135M-Instruct it runs by
default, on a model made from scratch, in a minute or two. A word-level vocabulary (every world name is one
or two whole tokens, the dialect's tags are single added tokens) keeps sequences short and
makes copying a name from an observation into a query or an answer a one-token-at-a-time copy that a
model of a few hundred thousand parameters learns in a minute of SFT. Input and output embeddings are
tied, so copying also works for names the model never saw in training (the held-out people): attention
moves a token's embedding forward and the tied unembedding scores that same token highest.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..rollout.protocol import get_dialect

UNK, PAD, EOS = "[UNK]", "[PAD]", "<|endoftext|>"


def dialect_tags(dialect: str = "agentic") -> list[str]:
    """Every tag of the dialect, so each becomes one added token."""
    d = get_dialect(dialect)
    tags = {d.answer_open, d.answer_close, d.observation_open, d.observation_close}
    for t in d.tool_tags:
        tags |= {t.open, t.close}
    for pair in (d.backtrack, d.summary, *d.content_tags):
        if pair:
            tags |= set(pair)
    return sorted(tags)


def build_word_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, *, dialect: str = "agentic"):
    """Train a word-level tokenizer on ``texts`` (every word seen becomes a token), save it to ``out_dir``
    and return it as a ``PreTrainedTokenizerFast``. Unseen words map to ``[UNK]``. Decoding joins words with
    spaces (none before punctuation), which tag parsing and answer normalisation both take in their stride."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pre = pre_tokenizers.Whitespace()
    tags = dialect_tags(dialect)
    counts: Counter[str] = Counter()
    for text in texts:
        for tag in tags:  # tags are added tokens: keep their pieces out of the word list
            text = text.replace(tag, " ")
        counts.update(word for word, _ in pre.pre_tokenize_str(text))
    vocab = {UNK: 0, PAD: 1, EOS: 2}
    for word in sorted(counts):
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece(cleanup=True)  # words joined by spaces, none before . , ? !
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNK, pad_token=PAD, eos_token=EOS,
                                   padding_side="left")
    fast.add_tokens(tags)
    fast.save_pretrained(str(out_dir))
    return fast


@dataclass
class TinyModelSize:
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 384
    max_positions: int = 512


def init_tiny_model(tokenizer, out_dir: str | os.PathLike, *, seed: int = 0,
                    size: TinyModelSize | None = None) -> Path:
    """A randomly initialised Qwen2 decoder sized for ``tokenizer``, saved with it to ``out_dir``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    size = size or TinyModelSize()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=size.hidden_size,
                         intermediate_size=size.intermediate_size, num_hidden_layers=size.layers,
                         num_attention_heads=size.heads, num_key_value_heads=size.heads,
                         max_position_embeddings=size.max_positions, tie_word_embeddings=True,
                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return Path(out_dir)
