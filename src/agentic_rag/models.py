"""Loading a model and its tokenizer for inference (evaluation, the chat service): a local path or a hub
name, plus an optional LoRA adapter. Training loads through :mod:`agentic_rag.training.model` (quantisation,
LoRA configuration); both use :func:`load_tokenizer`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")


def _hub_hint(name: str, exc: Exception) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    where = "a local directory" if Path(name).is_absolute() or name.startswith(".") else "a local directory or hub name"
    extra = " (offline mode is on: only local files can be used)" if offline else ""
    return f"cannot load {name!r} as {where}{extra}: {exc}"


def _declares_generic_tokenizer(name_or_path: str) -> bool:
    path = Path(name_or_path) / "tokenizer_config.json"
    try:
        declared = json.loads(path.read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        return False
    return declared in ("TokenizersBackend", "PreTrainedTokenizerFast") and (path.parent / "tokenizer.json").is_file()


def load_tokenizer(name_or_path: str, *, padding_side: str = "left"):
    """The tokenizer, with a pad token (the EOS token when the tokenizer has none)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        if _declares_generic_tokenizer(name_or_path):
            # transformers 5 picks the model type's tokenizer class for a model directory (Qwen2Tokenizer
            # for a qwen2 config) even when tokenizer_config.json names the generic class, and rebuilds a
            # custom tokenizer.json (the quick start's word-level one) as byte-level BPE: honour the file.
            tok = PreTrainedTokenizerFast.from_pretrained(name_or_path)
        else:
            tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(_hub_hint(name_or_path, exc)) from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = padding_side
    return tok


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, name)


def load_causal_lm(name_or_path: str, *, adapter: str | None = None, dtype: str = "auto",
                   device: str | None = None, merge_adapter: bool = False):
    """A causal LM in eval mode on ``device`` (default: CUDA when available), with the LoRA adapter applied."""
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype(dtype))
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(_hub_hint(name_or_path, exc)) from exc
    if adapter:
        from peft import PeftModel

        if not Path(adapter, "adapter_config.json").is_file():
            raise FileNotFoundError(f"no LoRA adapter at {adapter} (adapter_config.json missing)")
        model = PeftModel.from_pretrained(model, adapter)
        if merge_adapter:
            model = model.merge_and_unload()
        log.info("loaded adapter %s", adapter)
    return model.to(device).eval()
