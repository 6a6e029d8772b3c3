"""Test tiers: markers for hardware- and package-bound tests skip themselves where unavailable."""

from __future__ import annotations

import importlib.util

import pytest

from april_bench.engines.detect import detect_accelerators


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    accel = detect_accelerators()
    has_gpu = bool(accel.nvidia or accel.amd)
    reasons = {
        "gpu": None if has_gpu else "needs a CUDA or ROCm GPU",
        "sglang": None if importlib.util.find_spec("sglang") else "needs the sglang package",
        "vllm": None if importlib.util.find_spec("vllm") else "needs the vllm package",
    }
    for item in items:
        for marker, reason in reasons.items():
            if reason and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
