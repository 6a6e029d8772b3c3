"""What this machine has: accelerators and engine packages, and what ``--engine auto`` picks."""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass

__all__ = ["Accelerators", "detect_accelerators", "hf_available", "installed_engines", "resolve_engine"]

GPU_VENDOR = {"h100": "nvidia", "h200": "nvidia", "mi300x": "amd", "cpu": "cpu"}
#: The device-name fragment that identifies each hardware profile.
GPU_NAME = {"h100": "h100", "h200": "h200", "mi300x": "mi300"}


@dataclass(frozen=True, slots=True)
class Accelerators:
    nvidia: int
    amd: int

    def count(self, vendor: str) -> int:
        return {"nvidia": self.nvidia, "amd": self.amd}.get(vendor, 0)


def detect_accelerators() -> Accelerators:
    """Counts device nodes (``/dev/nvidiaN``, ``/dev/dri/renderD*`` with ``/dev/kfd``): no driver calls."""
    nvidia = len([p for p in glob.glob("/dev/nvidia[0-9]*") if os.path.basename(p)[6:].isdigit()])
    amd = len(glob.glob("/dev/dri/renderD*")) if os.path.exists("/dev/kfd") else 0
    return Accelerators(nvidia=nvidia, amd=amd)


def installed_engines() -> list[str]:
    return [name for name in ("sglang", "vllm") if importlib.util.find_spec(name) is not None]


def hf_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def _gpu_name() -> str | None:
    import torch  # only reached when a GPU device node exists

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


def resolve_engine(requested: str, hardware: str) -> tuple[str, str | None]:
    """``(engine, note)``: ``auto`` becomes a real engine when one can run the named hardware here,
    otherwise ``sim``; ``note`` is the one line that says why it simulates."""
    if requested != "auto":
        return requested, None
    if not hf_available():
        why = "torch and transformers are not installed (pip install torch==2.13.0 transformers)"
        return "sim", f"--engine auto: {why}; simulating {hardware} (results labelled simulated)"
    if hardware == "cpu":
        return "hf", None
    vendor = GPU_VENDOR[hardware]
    if not detect_accelerators().count(vendor):
        why = f"no {vendor.upper()} GPU found"
    else:
        name = _gpu_name()
        if name is None:
            why = f"a {vendor.upper()} GPU is present but torch cannot use it"
        elif GPU_NAME[hardware] not in name.lower():
            why = f"the GPU here is {name}, not {hardware}"
        else:
            return "hf", None
    return (
        "sim",
        f"--engine auto: {why}; simulating {hardware} with the calibrated simulator "
        "(results labelled simulated)",
    )
