"""A model's architecture read from its config, without its weights: what the memory estimator needs to know.

Why a module of its own: turning whatever the user names (a model directory, a config.json, a GGUF file, a
packaged model, a built-in config shipped with the package, a Hugging Face hub id) into a transformers config, and
counting that config's parameters per kind, is independent of the memory formulas that use the counts
(:mod:`.memory`), and ``experiments/benchmarks/memory_check.py`` uses it on its own.

What it holds: :class:`LinearGroup` and :class:`ModelArch` (the shape and the parameter counts), the built-in
configs (:func:`builtin_models`), :func:`resolve_config` (name -> transformers config), :func:`arch_from_config`
(the config instantiated on the ``meta`` device, no memory and no download, its parameters counted module by
module: the input embedding, the LM head (0 when tied), every ``nn.Linear`` (the layers bitsandbytes quantises and
LoRA targets; the LM head is never quantised) and the rest (norms, biases)) and :func:`load_arch` (both, cached).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

# bitsandbytes block sizes.
NF4_BLOCK = 64  # elements per absmax of the 4-bit weights
DOUBLE_QUANT_BLOCK = 256  # absmax values per second-level fp32 absmax (double quantisation)

# DeepSpeed's stage3_param_persistence_threshold as the HF integration's "auto" fills it.
ZERO3_PERSISTENCE_FACTOR = 10  # stage3_param_persistence_threshold = 10 * hidden_size: smaller params not sharded

CONFIG_DIR = "resources/model_configs"
HUB_ID_KEY = "_hub_id"


@dataclass(frozen=True)
class LinearGroup:
    """All ``nn.Linear`` layers (LM head excluded) whose qualified name ends with ``name``, e.g. every ``q_proj``."""

    name: str
    in_features: int
    out_features: int
    count: int
    bias: bool

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * self.count


@dataclass(frozen=True)
class ModelArch:
    """What the estimator needs from a model: its shape and its parameters counted per kind (on the meta device)."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    total_params: int
    embedding_params: int
    lm_head_params: int  # 0 when tied to the embedding
    linears: tuple[LinearGroup, ...]  # every nn.Linear but the LM head, grouped by name suffix
    small_params: int  # parameters below ZeRO-3's persistence threshold (norms, biases): never sharded
    quant_blocks: int  # 64-element nf4 blocks over all linear weights
    quant_blocks_l2: int  # second-level (double quant) blocks, summed per weight
    quant_weights: int  # number of quantised weight matrices

    @property
    def linear_weight_params(self) -> int:
        return sum(g.weight_params for g in self.linears)

    @property
    def dense_params(self) -> int:
        """Parameters that stay in the compute dtype when the linear weights are quantised."""
        return self.total_params - self.linear_weight_params

    @property
    def largest_linear(self) -> int:
        return max((g.in_features * g.out_features for g in self.linears), default=0)

    @property
    def int8_scales(self) -> int:
        return sum(g.out_features * g.count for g in self.linears)

    def group(self, name: str) -> LinearGroup | None:
        return next((g for g in self.linears if g.name == name), None)

    def lora_groups(self, targets: tuple[str, ...]) -> list[LinearGroup]:
        """The linear layers LoRA adapts: those named in ``targets``, or all of them for PEFT's "all-linear"."""
        if "all-linear" in targets:
            return list(self.linears)
        return [g for g in self.linears if g.name in targets]

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        return sum(rank * (g.in_features + g.out_features) * g.count for g in self.lora_groups(targets))


def builtin_models() -> dict[str, str]:
    """Built-in configs shipped with the package: ``{name: hub id}`` (loadable offline)."""
    out = {}
    for entry in sorted(resources.files("agentic_rag").joinpath(CONFIG_DIR).iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            out[entry.name[: -len(".json")]] = json.loads(entry.read_text())[HUB_ID_KEY]
    return out


def _config_from_dict(data: dict[str, Any], overrides: dict[str, Any]):
    from transformers import AutoConfig

    data = {k: v for k, v in data.items() if not k.startswith("_")} | overrides
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ValueError("the config has no 'model_type'; it is not a transformers config.json")
    try:
        return AutoConfig.for_model(model_type, **data)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"transformers does not know model_type {model_type!r}: {exc}") from None


def resolve_config(model: str, **overrides: Any):
    """The transformers config for ``model``: a local model directory or config.json, a GGUF file or a packaged
    model's short name (the architecture from the GGUF's metadata, :func:`agentic_rag.models.load_config`), a
    built-in name (or the hub id of a built-in), else a Hugging Face hub id (needs network or the local HF cache).
    ``overrides`` replace config fields before the config is built (e.g. ``num_hidden_layers=2`` for a shrunk copy
    of a real architecture)."""
    from ..models import PACKAGED_MODELS, load_config, resolve_model

    if resolve_model(model).is_gguf:
        config = load_config(model)
        return _config_from_dict(config.to_dict(), overrides) if overrides else config
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is a directory without a config.json")
        path = path / "config.json"
    if path.is_file():
        try:
            return _config_from_dict(json.loads(path.read_text()), overrides)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
    builtins = builtin_models()
    by_hub_id = {hub.lower(): name for name, hub in builtins.items()}
    name = model.lower()
    name = by_hub_id.get(name, name)
    if name in builtins:
        text = resources.files("agentic_rag").joinpath(f"{CONFIG_DIR}/{name}.json").read_text()
        return _config_from_dict(json.loads(text), overrides)
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        raise ValueError(f"--model {model!r} is neither an existing path (a model directory, config.json or .gguf "
                         f"file), a packaged model ({', '.join(PACKAGED_MODELS)}), a built-in config "
                         f"({', '.join(builtins)}) nor a Hugging Face hub id (org/name)")
    try:
        return load_config(model, **overrides)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"could not load the config of {model!r} from the Hugging Face hub (offline, unreachable or "
                         f"no such model: {first}). Pass a local model directory or config.json, or a built-in "
                         f"config: {', '.join(builtins)}") from None


def arch_from_config(config, name: str = "") -> ModelArch:
    """Count ``config``'s parameters per kind by instantiating it on the meta device (no memory, no weights)."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if getattr(text, k, None) is None]
    if missing:
        raise ValueError(f"config of {name or config.model_type!r} lacks {missing}: only dense decoder-only models "
                         "are supported")
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"cannot build a causal LM from the config of {name!r}: {exc}") from None
    h = text.hidden_size
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or h // heads
    out_emb = model.get_output_embeddings()
    in_emb = model.get_input_embeddings()
    head_weight = out_emb.weight if out_emb is not None else None
    tied = head_weight is not None and head_weight is in_emb.weight
    groups: dict[str, list] = {}
    blocks = blocks_l2 = n_weights = 0
    for qual, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module is out_emb:
            continue
        suffix = qual.rsplit(".", 1)[-1]
        key = (suffix, module.in_features, module.out_features, module.bias is not None)
        g = groups.setdefault(suffix, [key, 0])
        if g[0] != key:  # same name, another shape: keep apart
            g = groups.setdefault(qual, [(qual, *key[1:]), 0])
        g[1] += 1
        n_blocks = math.ceil(module.weight.numel() / NF4_BLOCK)
        blocks += n_blocks
        blocks_l2 += math.ceil(n_blocks / DOUBLE_QUANT_BLOCK)
        n_weights += 1
    threshold = ZERO3_PERSISTENCE_FACTOR * h
    params = {id(p): p for p in model.parameters()}.values()
    return ModelArch(
        name=name or getattr(config, "_name_or_path", "") or config.model_type,
        model_type=config.model_type,
        hidden_size=h,
        intermediate_size=text.intermediate_size,
        num_layers=text.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=text.vocab_size,
        tie_word_embeddings=tied,
        total_params=sum(p.numel() for p in params),
        embedding_params=in_emb.weight.numel(),
        lm_head_params=0 if tied or head_weight is None else head_weight.numel(),
        linears=tuple(LinearGroup(k[0], k[1], k[2], n, k[3]) for k, n in groups.values()),
        small_params=sum(p.numel() for p in params if p.numel() < threshold),
        quant_blocks=blocks,
        quant_blocks_l2=blocks_l2,
        quant_weights=n_weights,
    )


@lru_cache(maxsize=32)
def load_arch(model: str) -> ModelArch:
    """The :class:`ModelArch` of a model directory, config.json, built-in name or hub id (:func:`resolve_config`)."""
    return arch_from_config(resolve_config(model), name=model)
