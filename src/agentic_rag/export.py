"""``agentic-rag export``: a trained LoRA adapter merged into its base model, saved as a plain transformers model
folder that any server loads (vLLM, SGLang, llama.cpp's converter, ``from_pretrained``) with no peft and no
agentic-rag installed.

The folder holds the merged weights (safetensors), config and generation config, and the tokenizer with its chat
template: the adapter folder's tokenizer when the adapter folder has one (a run that installed a tool-call chat
template saved it there, and the model was trained on that template), else the base model's. The adapter's
``agentic_rag.json`` (the rollout and prompt settings it was trained with) is copied beside the weights, so
evaluation and the chat service still run the exported model as it was trained.

The base model is the one the adapter names (``adapter_config.json``'s ``base_model_name_or_path``, resolved by
:func:`agentic_rag.models.resolve_model`, so the packaged ``smollm2-135m-instruct`` works), or ``--base``. The
output is claimed like every command's (:mod:`agentic_rag.outputs`): a folder of the user's is refused (or moved
aside with ``--move-aside``), the export is written into a marked ``OUT.partial`` and renamed into place whole.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from .errors import UserError, input_dir
from .outputs import add_move_aside

log = logging.getLogger(__name__)

KIND = "export"
EXPORT_DTYPES = ("float32", "bfloat16", "float16")
# files that mean a folder carries a tokenizer of its own (or at least its chat template)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.json", "tokenizer.model")
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def adapter_base(adapter: Path) -> str:
    """The base model the LoRA adapter in ``adapter`` was trained on (its ``adapter_config.json``), checked as a
    model name before anything loads. A folder with no adapter config is refused: a full model (``config.json``)
    has nothing to merge."""
    config = adapter / "adapter_config.json"
    if not config.is_file():
        if (adapter / "config.json").is_file():
            raise UserError(f"--adapter {adapter} is a full model (config.json, no adapter_config.json): there is "
                            f"nothing to merge; serve or copy the folder as it is")
        raise UserError(f"--adapter {adapter} holds no adapter_config.json: not a LoRA adapter folder (name the "
                        f"folder agentic-rag sft or train saved, e.g. RUN/final)")
    try:
        base = json.loads(config.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as exc:
        raise UserError(f"--adapter {adapter}: cannot read adapter_config.json ({exc}); copy the adapter again") \
            from None
    if not isinstance(base, str) or not base:
        raise UserError(f"--adapter {adapter}: adapter_config.json names no base_model_name_or_path; name the base "
                        f"model with --base")
    return base


def check_base(base: str, *, given: bool) -> None:
    """Refuse a base model that cannot load (missing folder, packaged model not installed), naming where the name
    came from and the fix."""
    from .models import model_problem

    if problem := model_problem(base):
        where = "--base" if given else "the adapter's base model (adapter_config.json base_model_name_or_path)"
        fix = "" if given else "; name the base model with --base"
        raise UserError(f"{where} {base}: {problem}{fix}")


def base_dtype(base: str) -> str:
    """The dtype the base model's config declares when it is one an export can save, else float32: an export keeps
    the base's precision unless ``--dtype`` says otherwise (a GGUF base is dequantized to float32)."""
    from .models import load_config

    declared = getattr(load_config(base), "dtype", None)
    name = str(declared).removeprefix("torch.") if declared is not None else ""
    return name if name in EXPORT_DTYPES else "float32"


def _padding_side(folder: Path) -> str:
    """The padding side a saved tokenizer declares (transformers' default, right, when none): kept as it was."""
    try:
        side = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("padding_side")
    except (OSError, ValueError, AttributeError):
        side = None
    return side if side in ("left", "right") else "right"


def export_tokenizer(adapter: Path, base: str) -> tuple[Any, str]:
    """The tokenizer an export saves, and where it came from: the adapter folder's when it has tokenizer files (the
    one the model was trained with, its chat template included), else the base model's; a ``chat_template.jinja``
    the adapter folder holds without a tokenizer replaces the base tokenizer's template."""
    from .models import load_tokenizer

    if any((adapter / name).is_file() for name in TOKENIZER_FILES):
        return load_tokenizer(str(adapter), padding_side=_padding_side(adapter)), f"the adapter's ({adapter})"
    base_dir = Path(base)
    tok = load_tokenizer(base, padding_side=_padding_side(base_dir) if base_dir.is_dir() else "right")
    if (adapter / CHAT_TEMPLATE_FILE).is_file():
        tok.chat_template = (adapter / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
        return tok, f"the base model's ({base}) with the adapter's {CHAT_TEMPLATE_FILE}"
    return tok, f"the base model's ({base})"


def merge_into(adapter: Path, base: str, dtype: str, folder: Path) -> str:
    """Load ``base`` in ``dtype`` on the CPU (no accelerator memory needed: a merge is one matrix product per
    adapted layer), apply and merge the adapter, and save the plain model, its generation config and the tokenizer
    into ``folder``. Returns where the tokenizer came from."""
    from .models import load_adapter, load_causal_lm, save_model

    model = load_causal_lm(base, dtype=dtype, device="cpu")
    merged = load_adapter(model, adapter).merge_and_unload()
    tok, source = export_tokenizer(adapter, base)
    save_model(merged, folder, tokenizer=tok)  # safetensors: the only format transformers 5 writes
    merged.generation_config.save_pretrained(str(folder))
    if not getattr(tok, "chat_template", None):
        log.warning("the exported tokenizer (%s) has no chat template: a server's chat endpoint needs one "
                    "(give it with the server's own chat-template option)", source)
    return source


def folder_size(folder: Path) -> int:
    """The bytes of every file under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def human_size(n: int) -> str:
    """``n`` bytes in words: 270.1 MB, 14.2 GB."""
    size, unit = float(n), "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            break
        size /= 1000
    return f"{size:.1f} {unit}" if unit != "B" else f"{n} B"


def export(adapter: str, out: str, *, base: str | None = None, dtype: str | None = None,
           move_aside: bool = False) -> dict[str, Any]:
    """Merge the LoRA adapter in ``adapter`` into its base model (``base`` overrides the one it names) and save a
    plain model folder at ``out`` in ``dtype`` (default: the base's own, :func:`base_dtype`), with the tokenizer
    (:func:`export_tokenizer`) and the adapter's ``agentic_rag.json``. Everything is checked before the model
    loads; returns a summary."""
    from .outputs import check_apart, claim_dir, claim_work_dir, mark_dir, output_lock, replace_dir
    from .rollout.trained_settings import SETTINGS_FILE

    adapter_dir = input_dir(adapter, "--adapter", what="LoRA adapter folder")
    named = adapter_base(adapter_dir)
    base_name = base or named
    check_base(base_name, given=base is not None)
    if dtype is not None and dtype not in EXPORT_DTYPES:
        raise UserError(f"--dtype {dtype}: choose one of {', '.join(EXPORT_DTYPES)}")
    final = Path(out)
    partial = final.with_name(final.name + ".partial")
    inputs = {"--adapter": str(adapter_dir), "base model": base_name}
    check_apart(final, inputs)
    check_apart(partial, inputs)
    with output_lock(final, "agentic-rag export"):  # before --move-aside can rename anything
        claim_dir(final, KIND, move_aside=move_aside)
        claim_work_dir(partial, (KIND,), what="agentic-rag export", move_aside=move_aside)
        if partial.exists():
            shutil.rmtree(partial)  # an interrupted export of this command's own (claimed above): nothing to keep
        mark_dir(partial, KIND)
        dtype = dtype or base_dtype(base_name)
        source = merge_into(adapter_dir, base_name, dtype, partial)
        settings = adapter_dir / SETTINGS_FILE
        if settings.is_file():
            shutil.copy2(settings, partial / SETTINGS_FILE)
        else:
            log.warning("%s has no %s: the export records no trained rollout/prompt settings (evaluation and the "
                        "chat service will use their defaults)", adapter_dir, SETTINGS_FILE)
        replace_dir(partial, final)
    return {"out": str(final), "adapter": str(adapter_dir), "base": base_name, "dtype": dtype,
            "bytes": folder_size(final), "tokenizer": source, "settings": settings.is_file()}


def cmd_export(args: argparse.Namespace) -> int:
    summary = export(args.adapter, args.out, base=args.base, dtype=args.dtype, move_aside=args.move_aside)
    print(f"exported {summary['adapter']} merged into {summary['base']} to {summary['out']} "
          f"({human_size(summary['bytes'])}, {summary['dtype']}; tokenizer: {summary['tokenizer']})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="merge a LoRA adapter into its base model and save a plain model folder "
                                      "(vLLM, SGLang, llama.cpp)")
    p.add_argument("--adapter", required=True, help="the LoRA adapter folder (agentic-rag sft / train output, "
                                                     "e.g. RUN/final or a checkpoint)")
    p.add_argument("--out", required=True, help="the model folder to write (weights, config, tokenizer with its "
                                                 "chat template, agentic_rag.json)")
    p.add_argument("--dtype", choices=EXPORT_DTYPES, default=None,
                   help="the saved weights' dtype (default: the base model's own; float32 for a GGUF base)")
    p.add_argument("--base", default=None,
                   help="the base model, when the one adapter_config.json names is not found here (moved, or "
                        "trained on another machine): a directory, a .gguf file, a hub name or a packaged model")
    add_move_aside(p)
    p.set_defaults(func=cmd_export)
