"""The fused forward's Triton kernels against the torch reference (``TorchOps``), one operation at a time
and as a whole forward.  On a CPU they run in triton's interpreter (``tox -e triton`` sets
TRITON_INTERPRET=1); on a GPU (``tox -e gpu``) compiled, in bfloat16 as the engine runs them.

Tolerances: the kernels compute in float32 and round once where ``transformers`` rounds more often (the
rotary embedding) or sums in another order (attention, RMSNorm), so results agree with the reference to a
few units in the last place of the dtype: float32 to 1e-5 relative, bfloat16 to 2 ulp (2 * 2**-8) at
the values' scale.  Triton's interpreter rounds float32 to bfloat16 toward zero, not to nearest (numpy
has no bfloat16), so there each rounding may cost one more ulp: bfloat16 is held to 4 ulp interpreted.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from april_bench.engines.hf.cache import SlotKVCache
from april_bench.engines.hf.fused import FusedQwen
from april_bench.engines.hf.kernels import TorchOps, top_p_threshold

pytestmark = pytest.mark.triton


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _triton() -> Any:
    from april_bench.engines.hf.triton_kernels import TritonOps

    return TritonOps()


DTYPES = [torch.float32, torch.bfloat16]


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BF16_ULPS = 4 if INTERPRETED else 2


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    scale = float(b.double().abs().max()) or 1.0
    tol = 1e-5 * scale if dtype == torch.float32 else BF16_ULPS * 2**-8 * scale
    return bool((a.double() - b.double()).abs().max() <= tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
def test_add_rms_norm(dtype: torch.dtype, residual: bool) -> None:
    dev = _device()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=gen).to(dev, dtype)
    r = torch.randn(5, 96, generator=gen).to(dev, dtype) if residual else None
    w = (1 + 0.1 * torch.randn(96, generator=gen)).to(dev, dtype)
    ref_out, ref_res = TorchOps().add_rms_norm(x, r, w, 1e-6)
    out, res = _triton().add_rms_norm(x, r, w, 1e-6)
    if dtype == torch.float32 or not INTERPRETED:
        assert torch.equal(res, ref_res)  # the residual sum is rounded once, as the model's
    assert _close(res, ref_res, dtype)
    assert _close(out, ref_out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True], ids=["qwen2", "qwen3"])
def test_rope_store(dtype: torch.dtype, norm: bool) -> None:
    dev = _device()
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, slots, max_len, n = 4, 2, 24, 6, 32, 5
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen).to(dev, dtype)
    angle = torch.arange(max_len)[:, None] * (1.0 / 10000 ** (torch.arange(0, dim, 2) / dim))[None, :]
    emb = torch.cat([angle, angle], dim=-1)
    cos, sin = emb.cos().to(dev, dtype), emb.sin().to(dev, dtype)
    positions = torch.tensor([0, 3, 7, 31, 12], device=dev)
    rows = torch.tensor([0, 2, 1, 5, 4], device=dev)
    q_norm = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dev, dtype) if norm else None
    k_norm = (1 + 0.1 * torch.randn(dim, generator=gen)).to(dev, dtype) if norm else None
    outs = []
    for ops in (TorchOps(), _triton()):
        keys = torch.zeros(slots, kv_heads, max_len, dim, dtype=dtype, device=dev)
        values = torch.zeros_like(keys)
        q = ops.rope_store(
            qkv, heads=heads, kv_heads=kv_heads, head_dim=dim, cos=cos, sin=sin, positions=positions,
            slots=rows, q_norm=q_norm, k_norm=k_norm, eps=1e-6, keys=keys, values=values,
        )  # fmt: skip
        outs.append((q, keys, values))
    (q0, k0, v0), (q1, k1, v1) = outs
    assert _close(q1, q0, dtype)
    assert _close(k1, k0, dtype)
    assert torch.equal(v1, v0)  # values are stored as they come
    assert bool(k1.abs().sum(-1).ne(0).sum() == n * kv_heads)  # nothing written outside (slot, position)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("dim", [24, 64])
def test_decode_attention_reads_each_rows_own_keys(dtype: torch.dtype, splits: int, dim: int) -> None:
    dev = _device()
    gen = torch.Generator().manual_seed(2)
    rows, heads, kv_heads, slots, max_len = 4, 6, 2, 5, 200
    q = torch.randn(rows, heads, dim, generator=gen).to(dev, dtype)
    keys = torch.randn(slots, kv_heads, max_len, dim, generator=gen).to(dev, dtype)
    values = torch.randn(slots, kv_heads, max_len, dim, generator=gen).to(dev, dtype)
    lengths = torch.tensor([1, 65, 130, 200], device=dev)
    ref = TorchOps().decode_attention(q, keys, values, lengths, scale=dim**-0.5, view=None, splits=1)
    # garbage beyond each row's length must not matter: the kernel reads only the row's own keys
    keys2, values2 = keys.clone(), values.clone()
    for b, n in enumerate(lengths.tolist()):
        keys2[b, :, n:] = 1e4
        values2[b, :, n:] = float("nan")
    out = _triton().decode_attention(q, keys2, values2, lengths, scale=dim**-0.5, view=None, splits=splits)
    assert out.shape == ref.shape and not bool(out.isnan().any())
    assert _close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype: torch.dtype) -> None:
    dev = _device()
    gate_up = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(3)).to(dev, dtype)
    assert _close(_triton().silu_mul(gate_up), TorchOps().silu_mul(gate_up), dtype)


def test_top_p_threshold() -> None:
    dev = _device()
    gen = torch.Generator().manual_seed(4)
    weights = torch.softmax(torch.randn(5, 5000, generator=gen) * 3, dim=-1)
    weights = weights / weights.max(dim=-1, keepdim=True).values  # as the sampler's: the largest is 1
    # (top_p = 1 never reaches the threshold: the sampler keeps every token then)
    need = torch.tensor([0.1, 0.5, 0.9, 0.99, 0.999]) * weights.sum(-1)
    ref = top_p_threshold(weights, need)
    out = _triton().top_p_threshold(weights.to(dev), need.to(dev)).cpu()
    # the masses may sum in another order: the kept sets agree except at a float32 rounding of the cut
    assert ((weights >= out[:, None]) != (weights >= ref[:, None])).sum() <= 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_the_triton_forward_matches_the_torch_forward(dtype: torch.dtype, arch: str) -> None:
    from test_hf_fused import IDS, LENGTHS, _model

    dev = _device()
    model = _model(arch).to(dev, dtype)
    gen = torch.Generator().manual_seed(5)
    tokens = [torch.randint(3, 40, (3,), generator=gen).to(dev) for _ in range(6)]
    logits = []
    for kernels in ("torch", "triton"):
        cache = SlotKVCache.for_model(model.config, slots=4, max_len=80, dtype=dtype, device=dev)
        forward = FusedQwen(model, cache, kernels=kernels)
        assert forward.ops.name == kernels
        with torch.inference_mode():
            hidden = forward.prefill(IDS.to(dev), 0, 0)
            steps = [forward.head_logits(hidden[torch.arange(3), LENGTHS - 1])]
            pos = LENGTHS.to(dev)
            for token in tokens:
                steps.append(forward.decode(token, pos, view=int(pos.max()) + 1))
                pos = pos + 1
        logits.append(torch.stack(steps).double().cpu())
    scale = float(logits[0].abs().max())
    # bfloat16: a step's rounding differences pass through every later step's attention (the KV cache)
    tol = 1e-5 * scale if dtype == torch.float32 else 4 * BF16_ULPS * 2**-8 * scale
    assert float((logits[1] - logits[0]).abs().max()) <= tol


def test_the_engine_decodes_with_the_triton_kernels() -> None:
    """The whole fused path (Triton forward, sort-free sampler with the Triton top-p threshold) in the
    engine, against the eager path: greedy tokens, and sampled requests' stopping rules."""
    from test_hf_static import _engine, _generate, _mixed_requests

    dev = str(_device())
    eager = _generate(_engine(device=dev, dtype="float32", decode_path="eager"), _mixed_requests())
    engine = _engine(device=dev, dtype="float32", decode_path="fused", fused_kernels="triton")
    fused = _generate(engine, _mixed_requests())
    assert engine.static_decoder is not None and engine.static_decoder.fused is not None
    assert engine.static_decoder.fused.ops.name == "triton"
    # float32 through other kernels: compare the first tokens, where no near-tie has had a chance to flip
    for rid, c in eager.items():
        if rid.startswith("g"):
            assert c.output_ids[:8] == fused[rid].output_ids[:8], rid
            assert torch.allclose(
                torch.tensor(c.logprobs[:8]), torch.tensor(fused[rid].logprobs[:8]), atol=1e-4
            )
    assert {rid: c.num_tokens for rid, c in eager.items() if c.finish_reason.value == "length"} == {
        rid: fused[rid].num_tokens for rid, c in eager.items() if c.finish_reason.value == "length"
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_start_check_passes_the_triton_kernels(dtype: torch.dtype) -> None:
    """The check the fused forward runs at start accepts the kernels as they are (no silent fallback)."""
    from april_bench.engines.hf.fused import check_triton_ops, make_ops

    assert check_triton_ops(_triton(), _device(), dtype, heads=6, kv_heads=2, head_dim=64) == {}
    ops, note = make_ops("triton", _device(), dtype, heads=6, kv_heads=2, head_dim=64)
    assert ops.name == "triton" and note is None and ops.reads_own_keys


def test_a_kernel_that_fails_its_check_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from april_bench.engines.hf import triton_kernels
    from april_bench.engines.hf.fused import make_ops

    def broken(self: Any, gate_up: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no kernel image for this GPU")

    def wrong(self: Any, q: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)

    monkeypatch.setattr(triton_kernels.TritonOps, "silu_mul", broken)
    monkeypatch.setattr(triton_kernels.TritonOps, "decode_attention", wrong)
    ops, note = make_ops("auto", _device(), torch.float32, heads=4, kv_heads=2, head_dim=32)
    assert ops.name == "triton+torch" and note is not None
    assert "silu_mul: RuntimeError" in note and "decode_attention: disagrees" in note
    assert not ops.reads_own_keys  # torch's attention needs the padded view again
    gate_up = torch.randn(2, 64, device=_device())
    assert torch.equal(ops.silu_mul(gate_up), TorchOps().silu_mul(gate_up))
    assert type(ops.add_rms_norm.__self__).__name__ == "TritonOps"
