"""Hardware profiles, every constant with its source (read by the simulator, engines and telemetry).

Peak figures are vendor specifications; the efficiency factors turn them into
what a tuned engine achieves and come from published measurements.  Where no
measurement was found the value is an *assumption* and says so in ``sources``.
``python -m april_bench ls hardware`` prints the table with sources.

SGLang scheduler defaults (CUDA-graph batch ceiling, chunked-prefill size) are
those of ``sglang==0.5.2`` ``server_args.py`` for each GPU's memory size.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from april_bench.registry import Registry

__all__ = [
    "CALIBRATION",
    "HARDWARE",
    "GiB",
    "HardwareProfile",
    "hardware_names",
    "hardware_profile",
    "measure_host",
]

GiB = 1024**3


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    vendor: str
    #: Device memory per GPU (bytes).
    memory_bytes: float
    #: Peak memory bandwidth per GPU (bytes/s).
    memory_bw: float
    #: Peak dense BF16 matmul throughput per GPU (FLOP/s).
    bf16_flops: float
    #: Achieved fraction of ``memory_bw`` in decode (weights + KV streaming).
    eta_bw: float
    #: Achieved fraction of ``bf16_flops`` in large matmuls (prefill, large batches).
    eta_flops: float
    #: Per engine iteration: scheduling, sampling and launch overhead with CUDA graphs (s).
    step_overhead_s: float
    #: Extra per iteration when a decode batch exceeds the captured CUDA-graph sizes (s).
    eager_overhead_s: float
    #: One small-message tensor-parallel all-reduce (s).
    allreduce_latency_s: float
    #: All-reduce bandwidth for larger messages (bytes/s).
    allreduce_bw: float
    #: SGLang default largest CUDA-graph batch for this GPU.
    graph_max_batch: int
    #: SGLang default ``chunked_prefill_size`` for this GPU.
    chunked_prefill_tokens: int
    #: Achieved model FLOP utilisation of the trainer (Megatron) on this GPU.
    train_mfu: float
    gpus_per_node: int = 8
    #: True: memory and compute overlap (roofline max, GPUs); False: they add up (a fitted CPU).
    overlap: bool = True
    sources: Mapping[str, str] = field(default_factory=dict)


# Shared sources -------------------------------------------------------------
_VIDUR = (
    "microsoft/vidur data/profiling/compute/h100 Llama-2-7B mlp.csv: 5.6 ms/iter at batch 1 vs 3.87 ms "
    "ideal (69% of peak BW) and 64% MFU at 4k tokens"
)
_SGL_GRAPH = (
    "sglang==0.5.2 cuda_graph_runner.get_batch_sizes_to_capture: "
    "max 160 (<=90 GB), 256 (>90 GB), 512 (>160 GB)"
)
_SGL_CHUNK = "sglang==0.5.2 server_args: chunked_prefill_size 8192 for 35-160 GB GPUs, 16384 above"
_SGL_PR1401 = (
    "sgl-project/sglang PR #1401: Llama-3-8B decode 7.35 ms with CUDA graph vs 8.23 ms eager (flashinfer)"
)
_MEGATRON = "NVIDIA/Megatron-LM README (d086a2e): 41% MFU for the 2B model on H100 BF16"
_NCCL_1259 = "NVIDIA/nccl#1259: 2xH100 NVLink small all-reduce ~6 us"
_AITER_801 = "ROCm/aiter PR #801: MI300X TP2 custom all-reduce 7.07 us @4 KB, 28.15 us @1 MB"
_OVERHEAD = (
    "sgl-project/sglang PR #5608: overlap scheduling took Llama-3.1-8B TP4 decode from 5.24 to 4.63 ms/step "
    "(0.6 ms exposed CPU); assumption: 1 ms of non-roofline work per iteration"
)
_STREAM = "Azure/AI-benchmarking-guide@8fd0c6e Azure_Results: STREAM triad H100 2.97, H200 4.15 TB/s"
_STREAM_AMD = (
    "Azure AI-benchmarking-guide ND_MI300X_v5_results.md (fork samuel-bohman@3de0c29): triad 4.09 TB/s"
)
_GEMM = (
    "stas00/ml-engineering@744d01e compute/accelerator/README.md: "
    "BF16 GEMM H100 794.5 (80.3%), MI300X 668.4 (51.4%)"
)


HARDWARE: Registry[HardwareProfile] = Registry("hardware")

HARDWARE.register(
    "h100",
    HardwareProfile(
        name="h100",
        vendor="nvidia",
        memory_bytes=80 * GiB,
        memory_bw=3.35e12,
        bf16_flops=989.4e12,
        eta_bw=0.69,
        eta_flops=0.64,
        step_overhead_s=1.0e-3,
        eager_overhead_s=0.9e-3,
        allreduce_latency_s=6e-6,
        allreduce_bw=100e9,
        graph_max_batch=160,
        chunked_prefill_tokens=8192,
        train_mfu=0.41,
        sources={
            "memory_bytes": "NVIDIA H100 SXM5 spec: 80 GB HBM3 (nvidia-smi reports 81,559 MiB)",
            "memory_bw": "NVIDIA H100 SXM5 spec: 3.35 TB/s HBM3 (NVIDIA H100 Tensor Core GPU datasheet)",
            "bf16_flops": (
                "NVIDIA H100 SXM5 spec: 989.4 TFLOPS dense BF16, 1,979 with sparsity (NVIDIA H100 datasheet)"
            ),
            "eta_bw": _VIDUR
            + "; vLLM perf build 9555 Llama-3.1-8B TP1 b8: 7.8 ms/step implies 0.66 with 1 ms overhead",
            "eta_flops": _VIDUR,
            "step_overhead_s": _OVERHEAD,
            "eager_overhead_s": _SGL_PR1401,
            "allreduce_latency_s": _NCCL_1259,
            "allreduce_bw": "assumption (no 100 KB-1 MB NVLink measurement found): 100 GB/s effective",
            "graph_max_batch": _SGL_GRAPH,
            "chunked_prefill_tokens": _SGL_CHUNK,
            "train_mfu": _MEGATRON,
        },
    ),
    "NVIDIA H100 SXM5 80 GB",
)

HARDWARE.register(
    "h200",
    HardwareProfile(
        name="h200",
        vendor="nvidia",
        memory_bytes=141 * GiB,
        memory_bw=4.8e12,
        bf16_flops=989.4e12,
        eta_bw=0.57,
        eta_flops=0.64,
        step_overhead_s=1.0e-3,
        eager_overhead_s=0.9e-3,
        allreduce_latency_s=6e-6,
        allreduce_bw=100e9,
        graph_max_batch=256,
        chunked_prefill_tokens=8192,
        train_mfu=0.41,
        sources={
            "memory_bytes": "NVIDIA H200 SXM spec: 141 GB HBM3e",
            "memory_bw": "NVIDIA H200 SXM spec: 4.8 TB/s HBM3e (NVIDIA H200 Tensor Core GPU datasheet)",
            "bf16_flops": "NVIDIA H200: same GH100 compute as H100, 989.4 TFLOPS dense BF16",
            "eta_bw": (
                "buildkite vllm/performance-benchmark build 9513: Llama-3.1-8B TP1 batch 8 834 ms for 128 "
                "tokens = 6.5 ms/step; (15.0 GB of weights) / (5.5 ms x 4.8 TB/s) = 0.57"
            ),
            "eta_flops": "assumption: same as H100 (same GH100 compute; " + _GEMM + ", 'H200 is the same')",
            "step_overhead_s": _OVERHEAD,
            "eager_overhead_s": _SGL_PR1401,
            "allreduce_latency_s": _NCCL_1259,
            "allreduce_bw": "assumption, as H100",
            "graph_max_batch": _SGL_GRAPH,
            "chunked_prefill_tokens": _SGL_CHUNK,
            "train_mfu": _MEGATRON + " (assumed equal on H200)",
        },
    ),
    "NVIDIA H200 SXM 141 GB",
)

HARDWARE.register(
    "mi300x",
    HardwareProfile(
        name="mi300x",
        vendor="amd",
        memory_bytes=192 * GiB,
        memory_bw=5.3e12,
        bf16_flops=1307.4e12,
        eta_bw=0.60,
        eta_flops=0.41,
        step_overhead_s=1.0e-3,
        eager_overhead_s=0.9e-3,
        allreduce_latency_s=7.07e-6,
        allreduce_bw=49.7e9,
        graph_max_batch=512,
        chunked_prefill_tokens=16384,
        train_mfu=0.26,
        sources={
            "memory_bytes": "AMD Instinct MI300X spec: 192 GB HBM3",
            "memory_bw": "AMD Instinct MI300X spec: 5.3 TB/s HBM3 (AMD Instinct MI300X data sheet)",
            "bf16_flops": "AMD Instinct MI300X spec: 1,307.4 TFLOPS dense BF16 (2,615 is with sparsity)",
            "eta_bw": (
                "derived: H100 decode efficiency 0.69 x (MI300X STREAM 77% / H100 STREAM 89% of spec) "
                "= 0.60; " + _STREAM_AMD + "; " + _STREAM
            ),
            "eta_flops": "derived: H100 0.64 x (MI300X GEMM 51.4% / H100 GEMM 80.3%) = 0.41; " + _GEMM,
            "step_overhead_s": _OVERHEAD + " (no MI300X measurement found)",
            "eager_overhead_s": "assumption: as H100 (" + _SGL_PR1401 + ")",
            "allreduce_latency_s": _AITER_801,
            "allreduce_bw": _AITER_801 + ": (28.15-7.07) us per (1 MB - 4 KB) = 49.7 GB/s",
            "graph_max_batch": _SGL_GRAPH,
            "chunked_prefill_tokens": _SGL_CHUNK,
            "train_mfu": "derived: H100 0.41 x (MI300X GEMM 51.4% / H100 GEMM 80.3%) = 0.26; " + _MEGATRON,
        },
    ),
    "AMD Instinct MI300X 192 GB",
)


def measure_host(seconds: float = 0.5) -> HardwareProfile:
    """A ``cpu`` profile measured on this machine: matmul FLOP/s and copy bandwidth (numpy).

    The measured rates are achieved rates already, so the efficiency factors are 1.
    """
    import numpy as np

    a = np.ones((512, 512), dtype=np.float32)
    flops, t = 0.0, time.perf_counter()
    while time.perf_counter() - t < seconds / 2:
        a @ a
        flops += 2 * 512**3
    flops_per_s = flops / (time.perf_counter() - t)
    src = np.ones(32 * 1024 * 1024 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    moved, t = 0.0, time.perf_counter()
    while time.perf_counter() - t < seconds / 2:
        np.copyto(dst, src)
        moved += 2 * src.nbytes  # read + write
    bw = moved / (time.perf_counter() - t)
    measured = (
        f"measured on this host by april_bench.profiles.hardware.measure_host ({time.strftime('%Y-%m-%d')})"
    )
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = 16.0 * GiB
    return HardwareProfile(
        name="cpu",
        vendor="cpu",
        memory_bytes=memory,
        memory_bw=bw,
        bf16_flops=flops_per_s,
        eta_bw=1.0,
        eta_flops=1.0,
        step_overhead_s=1e-3,
        eager_overhead_s=0.0,
        allreduce_latency_s=0.0,
        allreduce_bw=1e12,
        graph_max_batch=1 << 30,
        chunked_prefill_tokens=2048,
        train_mfu=1.0,
        gpus_per_node=1,
        sources={
            "memory_bw": measured + " (float32 copy)",
            "bf16_flops": measured + " (float32 512x512 matmul)",
            "memory_bytes": "this host's physical memory (os.sysconf)",
            "step_overhead_s": "assumption: 1 ms of Python/PyTorch overhead per iteration",
            "chunked_prefill_tokens": "sglang==0.5.2 default for small devices: 2048",
        },
    )


#: The ``cpu`` profile fit to the hf engine by ``benchmarks/hf_bench.py`` (package data).
CALIBRATION = Path(__file__).with_name("calibration") / "cpu.json"


@functools.cache
def hardware_profile(name: str) -> HardwareProfile:
    """The profile for ``name``: a registered GPU, or ``cpu`` - fit to the hf engine when a
    calibration exists, else measured on this machine (once)."""
    if name == "cpu":
        if CALIBRATION.exists():
            return HardwareProfile(**json.loads(CALIBRATION.read_text()))
        return measure_host()
    return HARDWARE.get(name)


def hardware_names() -> list[str]:
    return ["cpu", *HARDWARE.names()]
