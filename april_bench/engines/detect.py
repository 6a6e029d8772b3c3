"""What this machine has: accelerators and installed engine packages (never imports them)."""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass

__all__ = ["Accelerators", "detect_accelerators", "installed_engines", "resolve_engine"]

GPU_VENDOR = {"h100": "nvidia", "h200": "nvidia", "mi300x": "amd", "cpu": "cpu"}
REAL_ENGINES: tuple[str, ...] = ()  # real adapters register here as they land (hf, sglang, vllm)


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


def resolve_engine(requested: str, hardware: str) -> tuple[str, str | None]:
    """``(engine, note)``: ``auto`` becomes a real engine when one can run here, else ``sim``.

    ``note`` is the one line telling the user why it simulates.
    """
    if requested != "auto":
        return requested, None
    vendor = GPU_VENDOR.get(hardware, "")
    usable = [e for e in REAL_ENGINES if e in installed_engines()] if vendor != "cpu" else []
    if usable and detect_accelerators().count(vendor):
        return usable[0], None
    if vendor == "cpu":
        why = "no real engine runs on the CPU in this release"
    elif not detect_accelerators().count(vendor):
        why = f"no {vendor.upper()} GPU found"
    elif not installed_engines():
        why = "neither sglang nor vllm is installed"
    else:
        why = "no adapter for the installed engine in this release"
    return (
        "sim",
        f"--engine auto: {why}; simulating {hardware} with the calibrated simulator "
        "(results labelled simulated)",
    )
