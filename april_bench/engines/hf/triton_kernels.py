"""Triton kernels for the fused forward on a GPU: each does one of :class:`~.kernels.TorchOps`' operations
in one launch.  Imported only when asked for (``triton`` comes with CUDA builds of torch).

Every kernel computes in float32 and rounds once where ``transformers`` rounds
(the residual sum, RMSNorm's normalised value before the weight multiplies, the
SiLU output before the up projection multiplies), so it agrees with the torch
reference to about one unit in the last place of the model's dtype; the rotary
embedding is rounded once, not after each of its three products.

Decode attention is split-KV: grid (rows, KV heads, splits); each program takes
its KV head's whole query group (GQA: the keys are read once for all the heads
that share them) over a slice of the row's *own* keys (``lengths[b]``, no padded
view, no mask), keeps a running max and sum (online softmax), and writes a
partial output and its log-sum-exp; a second kernel combines the splits.  With
one split the first kernel writes the output itself.  ``TRITON_INTERPRET=1``
runs all of this on a CPU (``tests/test_hf_triton.py``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from april_bench.engines.hf.kernels import THRESHOLD_ROUNDS

__all__ = ["TritonOps"]


_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@triton.jit
def _add_rms_norm_kernel(
    X, R, W, OUT, R_OUT, stride_x, stride_r, stride_o, stride_ro, cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)  # rounded as the model's sum is
    tl.store(R_OUT + row * stride_ro + offs, x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / cols
    normed = (h * tl.rsqrt(var + eps)).to(X.dtype.element_ty)
    w = tl.load(W + offs, mask=mask, other=0.0)
    tl.store(
        OUT + row * stride_o + offs,
        (w.to(tl.float32) * normed.to(tl.float32)).to(OUT.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def _rope_store_kernel(
    QKV, COS, SIN, POS, SLOTS, QW, KW, Q_OUT, KC, VC,
    stride_t, stride_cos, stride_qo_t, stride_qo_h,
    stride_c_s, stride_c_h, stride_c_p,
    heads, kv_heads, eps,
    HEAD_DIM: tl.constexpr, HALF_PAD: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    head = tl.program_id(1)  # 0 .. heads + kv_heads: query heads, then key heads (with their value head)
    half = HEAD_DIM // 2
    offs = tl.arange(0, HALF_PAD)
    mask = offs < half
    pos = tl.load(POS + token)
    row = QKV + token * stride_t + head * HEAD_DIM
    x1 = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + half + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:  # Qwen3's per-head RMSNorm of q and k, before the rotary embedding
        var = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / HEAD_DIM
        inv = tl.rsqrt(var + eps)
        if head < heads:
            w1 = tl.load(QW + offs, mask=mask, other=0.0).to(tl.float32)
            w2 = tl.load(QW + half + offs, mask=mask, other=0.0).to(tl.float32)
        else:
            w1 = tl.load(KW + offs, mask=mask, other=0.0).to(tl.float32)
            w2 = tl.load(KW + half + offs, mask=mask, other=0.0).to(tl.float32)
        x1 = ((x1 * inv).to(QKV.dtype.element_ty).to(tl.float32) * w1).to(QKV.dtype.element_ty).to(tl.float32)
        x2 = ((x2 * inv).to(QKV.dtype.element_ty).to(tl.float32) * w2).to(QKV.dtype.element_ty).to(tl.float32)
    c1 = tl.load(COS + pos * stride_cos + offs, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(COS + pos * stride_cos + half + offs, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + pos * stride_cos + offs, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + pos * stride_cos + half + offs, mask=mask, other=0.0).to(tl.float32)
    y1 = (x1 * c1 - x2 * s1).to(Q_OUT.dtype.element_ty)
    y2 = (x2 * c2 + x1 * s2).to(Q_OUT.dtype.element_ty)
    if head < heads:
        out = Q_OUT + token * stride_qo_t + head * stride_qo_h
        tl.store(out + offs, y1, mask=mask)
        tl.store(out + half + offs, y2, mask=mask)
    else:
        kv = head - heads
        slot = tl.load(SLOTS + token)
        at = slot * stride_c_s + kv * stride_c_h + pos * stride_c_p
        tl.store(KC + at + offs, y1, mask=mask)
        tl.store(KC + at + half + offs, y2, mask=mask)
        vrow = row + kv_heads * HEAD_DIM
        tl.store(VC + at + offs, tl.load(vrow + offs, mask=mask, other=0.0), mask=mask)
        tl.store(VC + at + half + offs, tl.load(vrow + half + offs, mask=mask, other=0.0), mask=mask)


@triton.jit
def _decode_attention_kernel(
    Q, KC, VC, LENS, OUT, O_PART, LSE_PART,
    stride_q_b, stride_q_h,
    stride_c_s, stride_c_h, stride_c_p,
    stride_o_b, stride_o_h,
    stride_p_b, stride_p_h, stride_p_s, stride_l_b, stride_l_h,
    scale, group, splits,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
    DIRECT: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    kv = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(LENS + row)
    per_split = tl.cdiv(tl.cdiv(length, splits), BLOCK_T) * BLOCK_T
    start = split * per_split
    end = tl.minimum(start + per_split, length)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    g_ok = g < group
    d_ok = d < HEAD_DIM
    heads = kv * group + g
    q = tl.load(
        Q + row * stride_q_b + heads[:, None] * stride_q_h + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if DOT_F32:
        q = q.to(tl.float32)
    base = row * stride_c_s + kv * stride_c_h
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    for t0 in range(start, end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        t_ok = t < end
        at = base + t[:, None] * stride_c_p + d[None, :]
        k = tl.load(KC + at, mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(t_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(VC + at, mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    keep = g_ok[:, None] & d_ok[None, :]
    if DIRECT:
        out = acc / total[:, None]
        tl.store(
            OUT + row * stride_o_b + heads[:, None] * stride_o_h + d[None, :],
            out.to(OUT.dtype.element_ty),
            mask=keep,
        )
    else:
        # an empty split (start >= length) leaves total 0: its log-sum-exp is -inf and it weighs nothing
        has = total > 0
        out = tl.where(has[:, None], acc / tl.where(has, total, 1.0)[:, None], 0.0)
        lse = tl.where(has, m + tl.log(tl.where(has, total, 1.0)), float("-inf"))
        tl.store(
            O_PART + row * stride_p_b + heads[:, None] * stride_p_h + split * stride_p_s + d[None, :],
            out,
            mask=keep,
        )
        tl.store(LSE_PART + row * stride_l_b + heads * stride_l_h + split, lse, mask=g_ok)


@triton.jit
def _combine_kernel(
    O_PART, LSE_PART, OUT, stride_p_b, stride_p_h, stride_p_s, stride_l_b, stride_l_h, stride_o_b, stride_o_h,
    splits, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, DIM_PAD)
    s_ok = s < splits
    lse = tl.load(LSE_PART + row * stride_l_b + head * stride_l_h + s, mask=s_ok, other=float("-inf"))
    top = tl.max(lse, axis=0)
    w = tl.where(s_ok & (lse > float("-inf")), tl.exp(lse - top), 0.0)
    parts = tl.load(
        O_PART + row * stride_p_b + head * stride_p_h + s[:, None] * stride_p_s + d[None, :],
        mask=s_ok[:, None] & (d < HEAD_DIM)[None, :],
        other=0.0,
    )
    out = tl.sum(parts * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(OUT + row * stride_o_b + head * stride_o_h + d, out.to(OUT.dtype.element_ty), mask=d < HEAD_DIM)


@triton.jit
def _silu_mul_kernel(GU, OUT, stride_gu, stride_o, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < cols
    gate = tl.load(GU + row * stride_gu + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GU + row * stride_gu + cols + offs, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(OUT.dtype.element_ty).to(tl.float32)  # rounded as F.silu's output
    tl.store(OUT + row * stride_o + offs, (act * up).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _top_p_threshold_kernel(W, NEED, OUT, stride_w, cols, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    """One row per program: the bisection of ``kernels.top_p_threshold`` over the float32 bit patterns,
    each round one pass over the row (from L2 after the first)."""
    row = tl.program_id(0)
    need = tl.load(NEED + row)
    lo = tl.zeros([1], tl.int32)
    hi = tl.full([1], 0x3F800001, tl.int32)
    for _ in range(ROUNDS):
        mid = lo + (hi - lo) // 2
        t = mid.to(tl.float32, bitcast=True)
        mass = tl.zeros([1], tl.float32)
        for c0 in range(0, cols, BLOCK):
            offs = c0 + tl.arange(0, BLOCK)
            w = tl.load(W + row * stride_w + offs, mask=offs < cols, other=0.0)
            mass += tl.sum(tl.where(w >= t, w, 0.0), axis=0)
        ok = mass >= need
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    tl.store(OUT + row + tl.arange(0, 1), lo.to(tl.float32, bitcast=True))


class TritonOps:
    """:class:`~.kernels.TorchOps`' operations, one Triton launch each (two for split attention)."""

    name = "triton"
    reads_own_keys = True  # decode attention reads each row's own keys: no padded view

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = x.shape
        out = torch.empty_like(x)
        new_residual = torch.empty_like(x)
        r = x if residual is None else residual
        _add_rms_norm_kernel[(rows,)](
            x, r, weight, out, new_residual, x.stride(0), r.stride(0), out.stride(0), new_residual.stride(0),
            cols, eps, HAS_RESIDUAL=residual is not None, BLOCK=_pow2(cols),
        )  # fmt: skip
        return out, new_residual

    def rope_store(
        self,
        qkv: torch.Tensor,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        eps: float,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        n = qkv.shape[0]
        q = torch.empty(n, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
        has_norm = q_norm is not None and k_norm is not None
        norm_q = q_norm if q_norm is not None else cos
        norm_k = k_norm if k_norm is not None else cos
        _rope_store_kernel[(n, heads + kv_heads)](
            qkv, cos, sin, positions, slots, norm_q, norm_k, q, keys, values,
            qkv.stride(0), cos.stride(0), q.stride(0), q.stride(1),
            keys.stride(0), keys.stride(1), keys.stride(2),
            heads, kv_heads, eps,
            HEAD_DIM=head_dim, HALF_PAD=_pow2(head_dim // 2), HAS_NORM=has_norm,
        )  # fmt: skip
        return q

    def decode_attention(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        lengths: torch.Tensor,
        *,
        scale: float,
        view: int | None,
        splits: int,
    ) -> torch.Tensor:
        rows, heads, dim = q.shape
        kv_heads = keys.shape[1]
        group = heads // kv_heads
        out = torch.empty(rows, heads, dim, dtype=q.dtype, device=q.device)
        direct = splits == 1
        parts = torch.empty(rows, heads, 1 if direct else splits, dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(rows, heads, 1 if direct else splits, dtype=torch.float32, device=q.device)
        # triton's interpreter multiplies bfloat16 blocks wrongly (it reads their bits as another type):
        # interpreted, the products run in float32
        dot_f32 = q.dtype == torch.float32 or _INTERPRETED
        precision = "ieee" if dot_f32 else "tf32"
        _decode_attention_kernel[(rows, kv_heads, splits)](
            q, keys, values, lengths, out, parts, lse,
            q.stride(0), q.stride(1),
            keys.stride(0), keys.stride(1), keys.stride(2),
            out.stride(0), out.stride(1),
            parts.stride(0), parts.stride(1), parts.stride(2), lse.stride(0), lse.stride(1),
            scale, group, splits,
            HEAD_DIM=dim, DIM_PAD=max(16, _pow2(dim)), GROUP_PAD=max(16, _pow2(group)), BLOCK_T=64,
            DIRECT=direct, PRECISION=precision, DOT_F32=dot_f32,
        )  # fmt: skip
        if not direct:
            _combine_kernel[(rows, heads)](
                parts, lse, out,
                parts.stride(0), parts.stride(1), parts.stride(2), lse.stride(0), lse.stride(1),
                out.stride(0), out.stride(1),
                splits, HEAD_DIM=dim, DIM_PAD=_pow2(dim), SPLITS_PAD=_pow2(splits),
            )  # fmt: skip
        return out.view(rows, heads * dim)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        rows, width = gate_up.shape
        cols = width // 2
        out = torch.empty(rows, cols, dtype=gate_up.dtype, device=gate_up.device)
        block = min(1024, _pow2(cols))
        _silu_mul_kernel[(rows, triton.cdiv(cols, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), cols, BLOCK=block
        )
        return out

    def top_p_threshold(self, weights: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        w = weights.float().contiguous()
        out = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
        _top_p_threshold_kernel[(w.shape[0],)](
            w, need.float().contiguous(), out, w.stride(0), w.shape[1], ROUNDS=THRESHOLD_ROUNDS, BLOCK=4096
        )
        return out
