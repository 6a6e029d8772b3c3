"""The decode benchmarks' own logic: the meta-device step ledger, the MBU report against the issue-33 targets,
and (on a GPU) the kernel-time profile.  Nothing here times anything."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_step_ledger_counts_the_fused_steps_kernels_and_the_stock_steps() -> None:
    """Counted on the meta device: the fused step launches far fewer kernels than the stock one, reads the
    same weights, and its per-row sampler traffic is smaller (no float32 sort)."""
    profile = _load("decode_profile")
    from transformers import AutoModelForCausalLM

    from april_bench.models.zoo import model_config

    cfg = model_config("tiny", vocab_size=1000)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    points = {
        (path, batch): profile.profile_step(model, path, batch, 64, 132, False)
        for path in ("static", "fused")
        for batch in (1, 16)
    }
    layers = cfg.num_hidden_layers
    stock, fused = points[("static", 1)], points[("fused", 1)]
    assert sum(fused["kernels"].values()) < sum(stock["kernels"].values()) / 2
    assert fused["kernels"]["matrix products"] == 4 * layers  # QKV, O, gate-up, down
    assert stock["kernels"]["matrix products"] == 7 * layers
    assert fused["kernels"].get("KV store", 0) == 0  # the rotary kernel stores the keys and values

    def per_row(path: str, category: str) -> float:
        return (points[(path, 16)]["bytes"][category] - points[(path, 1)]["bytes"][category]) / 15

    assert per_row("fused", "sampler + state") < per_row("static", "sampler + state") / 2
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    head = model.get_output_embeddings().weight
    assert fused["bytes"]["lm head"] >= head.numel() * head.element_size()
    assert sum(fused["bytes"].values()) > 0.9 * weights


def test_the_mbu_report_states_the_targets_and_each_paths_slope(tmp_path: Path) -> None:
    mbu = _load("hf_mbu")
    assert mbu.target_ms("r1-distill-qwen-1.5b", "h100", 1) == 2.0
    assert mbu.target_ms("r1-distill-qwen-1.5b", "h100", 64) == 3.5
    assert mbu.target_ms("r1-distill-qwen-1.5b", "h200", 64) is None
    assert mbu.target_ms("tiny", "h100", 64) is None
    points: list[dict[str, Any]] = [{"batch": b, "step_ms": 1.0 + 0.01 * b} for b in (1, 8, 64)]
    assert mbu.per_sequence_us(points) == pytest.approx(10.0)
    assert mbu.kernel_category("void at::native::radixSortKVInPlace<...>") == "sampler"
    assert mbu.kernel_category("_decode_attention_kernel") == "attention"
    assert mbu.kernel_category("sm90_xmma_gemm_bf16bf16_bf16f32") == "matrix products"
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    mbu.add_arguments(parser)
    args = parser.parse_args(
        [
            "--out",
            str(tmp_path),
            "--batches",
            "1,2",
            "--context",
            "8",
            "--steps",
            "4",
            "--decode-paths",
            "static,fused",
        ]
    )
    result = mbu.measure(args)
    assert {p["decode_path"] for p in result["points"]} == {"static", "fused"}
    assert all(p["target_ms"] is None for p in result["points"])  # tiny on a CPU: no target applies
    assert result["runtime"]["fused"]["decode_path"] == "fused"
    text = mbu.render(
        result, {"git": {"commit": "x", "dirty": False}, "utc": "t", "machine": {"cpu": "c", "cpu_count": 2}}
    )
    assert "Targets (issue 33): <= 2 ms per decode step at batch 1 and <= 3.5 ms at batch 64" in text


@pytest.mark.gpu
def test_the_kernel_profile_sorts_a_steps_gpu_time_into_categories() -> None:
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    from april_bench.engines.hf import HFEngine
    from april_bench.vtime import run_real

    mbu = _load("hf_mbu")
    engine = HFEngine.Config(model="tiny", device="cuda", decode_path="fused", max_context_len=64).build(
        vocab_size=40
    )

    async def main() -> Any:
        await engine.start()
        out = mbu._kernel_profile(engine, 4, 32)
        await engine.close()
        return out

    profile = run_real(main())
    assert profile is not None and profile["kernels_per_step"] > 10
    assert {"matrix products", "attention", "sampler"} <= set(profile["us_by_category"])
