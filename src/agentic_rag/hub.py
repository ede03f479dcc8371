"""Hub names: whether a model or encoder named by its Hugging Face hub name can load, found in seconds and without
loading it (``from_pretrained`` retries an unreachable hub for about a minute before it fails). Used by the config
checks (:func:`agentic_rag.models.model_problem`) and the dense encoder (:mod:`agentic_rag.search.dense`)."""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=64)
def hub_problem(name: str, *, timeout_s: float = 5.0) -> str | None:
    """Whether the hub name ``name`` can load, found in seconds: in the local Hugging Face cache it can; offline
    (``HF_HUB_OFFLINE``) it cannot; otherwise one metadata request with a short timeout tells a missing model or an
    unreachable hub at once, where ``from_pretrained`` would retry for a minute before failing."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        return f"{name!r} is not a local path, and not a hub name either (hub names look like org/model)"
    if isinstance(cached, str):
        return None
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        return (f"{name!r} is not a local path, and it is not in the Hugging Face cache while offline mode "
                f"(HF_HUB_OFFLINE) is on: give a local model directory or .gguf file")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=timeout_s)
    except GatedRepoError:
        return None  # exists; the download says whether the token may read it
    except RepositoryNotFoundError:
        return f"{name!r} is not a local path, and the hub has no model of that name (or it is private)"
    except Exception as exc:  # noqa: BLE001 - no route to the hub: the load would retry for a minute, then fail
        return (f"{name!r} is not a local path, and the hub cannot be reached to download it "
                f"({type(exc).__name__}); give a local model directory or .gguf file")
    return None
