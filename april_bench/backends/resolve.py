"""What ``--engine auto`` becomes on this machine."""

from __future__ import annotations

from april_bench.machine import GPU_NAME, GPU_VENDOR, detect_accelerators, gpu_name, hf_available

__all__ = ["resolve_engine"]


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
        name = gpu_name()
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
