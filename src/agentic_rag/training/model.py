"""Loading the policy for training: the base model (optionally 4-bit NF4), and the LoRA configuration. What a
model name means (a directory, a hub name, a GGUF file, a packaged model) is :mod:`agentic_rag.models`' to say.

QLoRA: bitsandbytes NF4 with double quantisation and bf16 compute; ``bnb_4bit_quant_storage`` is bf16 so
DeepSpeed ZeRO-3 can shard the packed 4-bit weights like any bf16 tensor. LoRA adapts every linear layer
of the decoder by default. The reference policy for the KL term is this same model with the adapter
disabled: no second copy is ever loaded.

On CPUs with AVX512-BF16, bitsandbytes repacks a 4-bit weight into a CPU-friendly layout on the first
eval-mode forward, and the next training step then fails on the repacked weight; every ``Linear4bit`` gets
``support_avx512bf16_for_cpu = False`` so the weights stay in the layout training expects.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..models import load_pretrained_lm, torch_dtype
from .config import ModelConfig

log = logging.getLogger(__name__)


def bnb_config() -> Any:
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)


def keep_4bit_layout_on_cpu(model: torch.nn.Module) -> int:
    """Set ``support_avx512bf16_for_cpu = False`` on every bitsandbytes ``Linear4bit``; returns how many."""
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:  # pragma: no cover - bitsandbytes is pinned
        return 0
    n = 0
    for module in model.modules():
        if isinstance(module, Linear4bit):
            module.support_avx512bf16_for_cpu = False
            n += 1
    return n


def load_base_model(cfg: ModelConfig, *, device_map: Any = None) -> torch.nn.Module:
    """The base model to put a LoRA adapter on, in training dtype (or NF4): any model name
    (:func:`agentic_rag.models.resolve_model`: a directory, a hub name, a GGUF file, a packaged model's short
    name); a GGUF model is dequantized to the training dtype (it cannot be NF4)."""
    kwargs: dict[str, Any] = {"attn_implementation": cfg.attn_implementation}
    if cfg.quantization == "nf4":
        kwargs["quantization_config"] = bnb_config()
        kwargs["dtype"] = torch.bfloat16
    else:
        kwargs["dtype"] = torch_dtype(cfg.dtype)
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = load_pretrained_lm(cfg.name_or_path, **kwargs)
    if cfg.quantization == "nf4":
        patched = keep_4bit_layout_on_cpu(model)
        log.info("QLoRA: %d Linear4bit layers in NF4", patched)
    model.config.use_cache = False  # training; generation turns the cache on for itself
    return model


def lora_config(cfg: ModelConfig) -> Any:
    from peft import LoraConfig

    targets: Any = cfg.lora_target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM", bias="none")


def quiet_adapter_saves(model: Any) -> None:
    """Save ``model``'s LoRA adapter without peft asking a model hub about its base model.

    peft's ``save_pretrained`` (``save_embedding_layers="auto"``) looks the base model's ``config.json`` up, locally
    and then on the hub, to see whether the vocabulary was resized. A packaged or GGUF base model is named by a short
    name or a file (what :func:`agentic_rag.models.resolve_model` finds again), which is no hub repository: every
    checkpoint then warned that the hub could not be reached (or, online, asked it in vain). Our adapters never
    train or resize the embeddings, so there is nothing to look up: saves pass ``save_embedding_layers=False``.
    A model that is not a peft model, or whose LoRA targets an embedding layer, is left as it is."""
    import functools

    from peft import PeftModel

    if not isinstance(model, PeftModel) or getattr(model.save_pretrained, "agentic_rag_quiet", False):
        return
    targets = getattr(model.peft_config.get(model.active_adapter), "target_modules", None) or ()
    if isinstance(targets, str) or any("embed" in t or "lm_head" in t for t in targets):
        return
    save = functools.partial(model.save_pretrained, save_embedding_layers=False)
    save.agentic_rag_quiet = True  # type: ignore[attr-defined]
    model.save_pretrained = save


def compact_lm_head_scoring() -> None:
    """Make TRL's fused LM head (GRPO and SFT) project only the labelled positions on a CPU too, as on Triton devices.

    TRL 1.16 scores every position of the batch (prompt, padding and all) on devices without Triton, so that
    compilers with fixed tile shapes (Neuron) do not recompile for every batch; the unlabelled positions are
    then thrown away. On a CPU there is nothing to recompile and the waste is the whole prompt (and, with our
    labels, every observation) run through the vocabulary projection. The results are identical: the same
    per-token function (its torch tiles on a CPU) over the labelled rows only. Applied once per process, by
    patching the module-level switch the fused forward reads (trl.trainer.utils._use_triton, pinned trl 1.16);
    the kernel module keeps its own switch, so no Triton kernel is ever asked to run on a CPU.
    """
    import trl.trainer.utils as trl_utils

    current = trl_utils._use_triton
    if getattr(current, "agentic_rag_compact", False):
        return

    def use_compact(device: torch.device) -> bool:
        return device.type == "cpu" or current(device)

    use_compact.agentic_rag_compact = True  # type: ignore[attr-defined]
    trl_utils._use_triton = use_compact
