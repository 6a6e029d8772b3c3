"""vLLM behind the engine protocol: an in-process ``AsyncLLM`` driven by token ids.

:class:`VLLMEngine` (in :mod:`.engine`) is imported on first use, so ``import
april_bench.engines.vllm`` never imports vLLM or torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["VLLMEngine"]


def __getattr__(name: str) -> Any:
    if name != "VLLMEngine":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module("april_bench.engines.vllm.engine").VLLMEngine
