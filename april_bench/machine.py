"""What this machine has: accelerators, engine packages, torch.

Read by the backends (``--engine auto``), provenance and telemetry.  Nothing
here imports an engine or calls a GPU driver unless a GPU device node exists; the GPUs' own facts
(model, driver, clocks) are :func:`april_bench.telemetry.gpu_facts.gpu_info`'s.  A fact: this
module imports nothing of the package.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass

__all__ = [
    "GPU_NAME",
    "GPU_VENDOR",
    "Accelerators",
    "detect_accelerators",
    "gpu_name",
    "hf_available",
    "installed_engines",
]

#: The vendor of each hardware profile (``cpu`` is this machine's processor).
GPU_VENDOR = {"h100": "nvidia", "h200": "nvidia", "mi300x": "amd", "cpu": "cpu"}
#: The device-name fragment that identifies each hardware profile.
GPU_NAME = {"h100": "h100", "h200": "h200", "mi300x": "mi300"}


@dataclass(frozen=True, slots=True)
class Accelerators:
    nvidia: int
    amd: int

    def count(self, vendor: str) -> int:
        return {"nvidia": self.nvidia, "amd": self.amd}.get(vendor, 0)

    @property
    def any(self) -> bool:
        return bool(self.nvidia or self.amd)


def detect_accelerators() -> Accelerators:
    """Counts device nodes (``/dev/nvidiaN``, ``/dev/dri/renderD*`` with ``/dev/kfd``): no driver calls."""
    nvidia = len([p for p in glob.glob("/dev/nvidia[0-9]*") if os.path.basename(p)[6:].isdigit()])
    amd = len(glob.glob("/dev/dri/renderD*")) if os.path.exists("/dev/kfd") else 0
    return Accelerators(nvidia=nvidia, amd=amd)


def installed_engines() -> list[str]:
    """Real engine packages importable here (found by spec, not imported)."""
    return [name for name in ("sglang", "vllm") if importlib.util.find_spec(name) is not None]


def hf_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def gpu_name() -> str | None:
    """The first GPU's name as torch reports it, or ``None`` when torch cannot use a GPU."""
    if not detect_accelerators().any or importlib.util.find_spec("torch") is None:
        return None
    import torch  # only reached when a GPU device node exists

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)
