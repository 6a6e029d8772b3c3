"""Writing a trainer's state file: a uniquely named temporary file next to it, fsynced, then renamed.

Two processes (or a killed run's leftover) never share a temporary name, and after a crash the file
holds the old state or the new one, never a torn one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["save_atomic"]


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)``, atomically and durably."""
    import torch

    from april_bench.fsio import record

    target = Path(path)
    record(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
