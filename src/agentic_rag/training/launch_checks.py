"""Checks of a training run that look beyond the config's own values: the distributed launch it runs under (the
rollout decodes each process's trajectories on its own, which some sharding cannot serve) and whether the model can
score branched trajectories (a 4D tree mask needs sdpa or eager attention and no sliding window). Run before any
model loads by the config check, and again by the trainer on what it really got (the refusals at the end)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..rollout.protocol import DIALECTS, memory_actions


def launch_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The distributed launch this process runs under, as ``accelerate launch`` describes it to the processes it
    starts: ``{"zero_stage": 2 | 3 | None, "fsdp": bool}``. The ZeRO stage is the one exported with the launch
    (``ACCELERATE_DEEPSPEED_ZERO_STAGE``; the launch scripts export it), else the ``zero_optimization.stage`` of
    the DeepSpeed config file accelerate names (``ACCELERATE_DEEPSPEED_CONFIG_FILE``); None without DeepSpeed."""
    fsdp = env.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes")
    stage = None
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes"):
        value: Any = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
        if not value and env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"):
            try:
                ds = json.loads(Path(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"]).read_text())
                value = ds.get("zero_optimization", {}).get("stage", "")
            except (OSError, ValueError, AttributeError):
                value = ""  # DeepSpeed itself reports an unreadable config file, at launch
        stage = int(value) if str(value).isdigit() else None
    return {"zero_stage": stage, "fsdp": fsdp}


def launch_problems(*, zero_stage: int | None, fsdp: bool, ds3_gather_for_generation: bool = True) -> list[str]:
    """Launches the rollout cannot run under, with the reason. The rollout engine decodes each process's own
    trajectories, as many forward passes as they need, so processes run different numbers of decode steps.
    With sharded weights every forward pass is a collective that needs every process: FSDP, and ZeRO-3 when the
    weights are not gathered for generation (``ds3_gather_for_generation: false``), would wait forever on the
    process that finished first. (ZeRO-3 as launched by script/training/train_zero3.sh gathers them.)"""
    found = []
    if fsdp:
        found.append("this launch uses FSDP (accelerate's distributed_type: FSDP), which the rollout does not "
                     "support: with sharded weights each decode step needs every process, and ranks run different "
                     "numbers of decode steps, so they would hang; launch with DeepSpeed instead "
                     "(script/training/train_zero2.sh or train_zero3.sh)")
    if zero_stage == 3 and not ds3_gather_for_generation:
        found.append("DeepSpeed ZeRO-3 with ds3_gather_for_generation false would hang: without the whole model "
                     "gathered for generation each decode step needs every process, and ranks run different "
                     "numbers of decode steps; keep ds3_gather_for_generation true (the default), or use ZeRO-2")
    return found


# the attention kernels that apply a custom 4D attention mask as given
TREE_MASK_ATTENTION = ("sdpa", "eager")
NO_MEMORY_DIALECTS = "a dialect without memory actions (rollout.dialect search-r1 or r1-searcher)"


def branching_actions(dialect: str, summary_mode: str) -> tuple[str, ...]:
    """The memory actions of ``dialect`` that branch a trajectory's context: a backtrack always (its note hangs off
    the segment before the abandoned step), a summary under ``summary_mode`` replace (the context restarts from it);
    a summary that keeps the context does not branch."""
    if dialect not in DIALECTS:
        return ()
    return tuple(a for a in memory_actions(dialect) if a == "backtrack" or summary_mode == "replace")


def model_sliding_window(model_config: Mapping[str, Any]) -> int | None:
    """The sliding attention window (in tokens) that layers of a model use, from its config.json (or a transformers
    config's ``to_dict()``); None when every layer attends to the whole context. Reads ``sliding_window``, switched
    off by ``use_sliding_window: false`` (Qwen2, Qwen3), and which layers slide from ``layer_types`` or, without it,
    Qwen2's ``max_window_layers`` (layers from that index on slide). A multimodal config's ``text_config`` counts."""
    text = model_config.get("text_config")
    if isinstance(text, Mapping) and (window := model_sliding_window(text)) is not None:
        return window
    window = model_config.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        return None
    if model_config.get("use_sliding_window") is False:
        return None
    layers = model_config.get("layer_types")
    if isinstance(layers, list):
        return window if "sliding_attention" in layers else None
    first, count = model_config.get("max_window_layers"), model_config.get("num_hidden_layers")
    if "use_sliding_window" in model_config and isinstance(first, int) and isinstance(count, int) and first >= count:
        return None
    return window


def local_model_config(name_or_path: str, *, cache_dir: str | None = None) -> dict[str, Any] | None:
    """A model's config.json, read without loading the model or using the network: from a model directory, or for a
    hub name from the local Hugging Face cache (``cache_dir``: its default) when it was downloaded before. None
    otherwise (a GGUF file, a packaged model, a hub model not downloaded yet, an unreadable file)."""
    path = Path(name_or_path).expanduser()
    file: Path | None = path / "config.json" if path.is_dir() else None
    if file is None and not path.exists() and not name_or_path.lower().endswith(".gguf"):
        from huggingface_hub import try_to_load_from_cache

        try:
            found = try_to_load_from_cache(name_or_path, "config.json", cache_dir=cache_dir)
        except ValueError:  # not a valid repository id
            found = None
        file = Path(found) if isinstance(found, str) else None
    if file is None or not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def tree_mask_problems(*, memory: str, attn_implementation: str | None, model_config: Mapping[str, Any] | None,
                       model_name: str = "") -> list[str]:
    """Why branched trajectories could not be scored correctly with this model, with the fix; empty when they can.

    ``memory`` names what branches a context (e.g. "rollout.dialect agentic's backtrack"). A micro-batch holding a
    branched trajectory is scored with a 4D tree-shaped additive mask and the tree's position ids
    (:class:`agentic_rag.training.trainer.TreeLayout`). Only sdpa and eager apply such a mask as given: the
    flash-attention path of transformers (5.23) reads an attention mask as a 2D padding mask (an index error, or
    wrong attention). And the mask replaces the model's own sliding-window mask, so a model whose layers slide over
    a window shorter than the contexts it takes (``max_position_embeddings``; the prompt's length is not bounded
    by the config) would be trained on attention it never uses."""
    found = []
    if attn_implementation is not None and attn_implementation not in TREE_MASK_ATTENTION:
        found.append(f"model.attn_implementation is {attn_implementation!r}, but {memory} can branch a trajectory's "
                     f"context, and a micro-batch holding a branched trajectory is scored with a 4D tree-shaped "
                     f"attention mask that {attn_implementation} cannot apply (transformers' flash-attention path "
                     f"reads it as a 2D padding mask: an index error or wrong attention, partway through a run). Set "
                     f"model.attn_implementation to sdpa or eager, or use {NO_MEMORY_DIALECTS}")
    window = model_sliding_window(model_config) if model_config is not None else None
    longest = model_config.get("max_position_embeddings") if model_config is not None else None
    if window is not None and not (isinstance(longest, int) and window >= longest):
        found.append(f"model.name_or_path {model_name!r} uses a sliding attention window of {window} tokens "
                     f"(its contexts may reach {longest or 'any length'}), but {memory} can branch a trajectory's "
                     f"context, and a branched trajectory is scored with a 4D tree-shaped attention mask that replaces "
                     f"the model's sliding-window mask: past {window} tokens its log-probabilities would come from "
                     f"attention the model never uses. Use a model without a sliding window (Qwen2 and Qwen3 "
                     f"checkpoints ship with use_sliding_window: false in config.json), or {NO_MEMORY_DIALECTS}")
    return found


# ----------------------------------------------------------------------------- the trainer's refusals


def refuse_unsupported_launch(args: Any, env: Any = None) -> None:
    """Raise before DeepSpeed starts when the launch is one the rollout would hang under (FSDP, or ZeRO-3 with
    ``args.ds3_gather_for_generation`` false; see :func:`launch_problems`). ``args`` is the
    GRPOConfig: its DeepSpeed plugin knows the ZeRO stage; ``env`` (default: the process environment) the launch."""
    launch = launch_from_env(os.environ if env is None else env)
    plugin = getattr(args, "deepspeed_plugin", None)
    stage = int(plugin.zero_stage) if plugin is not None else launch["zero_stage"]
    fsdp = bool(getattr(args, "fsdp", None)) or launch["fsdp"]
    problems = launch_problems(zero_stage=stage, fsdp=fsdp, ds3_gather_for_generation=args.ds3_gather_for_generation)
    if problems:
        raise ValueError("; ".join(problems))


def refuse_tree_masks_it_cannot_serve(model: Any, dialect: str, summary_mode: str) -> None:
    """Raise before training when ``dialect`` can branch a trajectory's context (backtrack; summary under
    ``summary_mode`` replace) and ``model`` cannot be scored with the tree-shaped 4D mask such a trajectory needs:
    an attention kernel other than sdpa or eager (flash attention reads the mask as a 2D padding mask), or layers
    that slide over a window the context can outgrow (the mask replaces the window). The config check refuses the
    same before the model loads, where it can read the model's config.json (:func:`tree_mask_problems`); this
    covers every other model (a hub download, a GGUF file, a model built in code)."""
    actions = branching_actions(dialect, summary_mode)
    config = getattr(model, "config", None)
    if not actions or config is None:
        return
    problems = tree_mask_problems(memory=f"dialect {dialect}'s {' and '.join(actions)}",
                                  attn_implementation=getattr(config, "_attn_implementation", None),
                                  model_config=config.to_dict(), model_name=getattr(config, "name_or_path", ""))
    if problems:
        raise ValueError("; ".join(problems))
