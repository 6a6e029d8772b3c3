"""Hub model ids (``--model Qwen/Qwen3-4B``) resolved the way ``transformers`` and vLLM resolve them.

A model spec is a local checkpoint directory when one exists at that path, a
named architecture (``ls models``) when it has no slash, and otherwise a
Hugging Face hub id: its snapshot in the local cache (``HF_HUB_CACHE`` /
``HF_HOME``) is used, downloaded first when the hub is reachable.  Offline
(``HF_HUB_OFFLINE=1`` or no connection) a model missing from the cache is one
line saying so and how to fix it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from april_bench.config import ConfigError

__all__ = ["is_hub_id", "resolve_model"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: What a checkpoint needs to load: config, tokenizer, chat template and weights (no other formats).
_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")


def is_hub_id(model: str) -> bool:
    """``owner/name`` that is not an existing local path (``./owner/name`` is always a path)."""
    return bool(_HUB_ID.match(model)) and not Path(model).expanduser().exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_model(model: str) -> str:
    """``model`` itself, or the local snapshot directory of the hub id ``model`` (revision ``main``)."""
    if not is_hub_id(model):
        return model
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return str(snapshot_download(model, local_files_only=True, allow_patterns=list(_PATTERNS)))
    except LocalEntryNotFoundError:
        pass
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface"
    if _offline():
        raise ConfigError(
            f"--model {model}: not in the local Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set: "
            f"download it where the hub is reachable (`hf download {model}`) or pass a checkpoint directory"
        )
    try:
        return str(snapshot_download(model, allow_patterns=list(_PATTERNS)))
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ConfigError(
            f"--model {model}: the hub has no model by that id you can read ({type(exc).__name__}); "
            "check the spelling (a named architecture has no slash: `python -m april_bench ls models`)"
        ) from None
    except Exception as exc:  # no connection: httpx, requests or OSError, by version
        raise ConfigError(
            f"--model {model}: not in the local Hugging Face cache ({cache}) and the hub cannot be reached "
            f"(offline: {type(exc).__name__}); download it with `hf download {model}` or pass a checkpoint "
            "directory"
        ) from None
