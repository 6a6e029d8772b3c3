"""Writing a trainer's state file: a uniquely named temporary file next to it, fsynced, then renamed.

Two processes (or a killed run's leftover) never share a temporary name, and after a crash the file
holds the old state or the new one, never a torn one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["save_atomic"]


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)``, atomically and durably (:func:`april_bench.fsio.write_atomic`: the
    old state stays until the new one is in place)."""
    import torch

    from april_bench.fsio import write_atomic

    write_atomic(Path(path), lambda f: torch.save(obj, f))
