"""The fused forward's operations, each as plain torch (any device and dtype) and, on CUDA, one Triton kernel.

:class:`TorchOps` is the reference: every function computes what the
``transformers`` Qwen2/Qwen3 modules compute, in the same order and the same
precision (RMSNorm in float32 and cast back before the weight multiplies,
rotary embedding in the model's dtype), so on a CPU the fused forward agrees
with the stock forward to the last few units in the last place.  It is what
the CPU runs and what the Triton kernels are tested against.

:class:`TritonOps` (``triton_kernels.py``, imported only when asked for) does
the same work in fewer launches on a GPU:

=====================  ==========================================  ===========
operation              torch                                       Triton
=====================  ==========================================  ===========
add + RMSNorm          add, 6 ops of RMSNorm                       1 kernel
q/k norm, rotary, KV   2 RMSNorms, 8 rotary ops, 2 ``index_put_``  1 kernel
attention (decode)     SDPA over a padded view + a length mask     1 (+1 combine when split)
SiLU * up              2 ops                                       1 kernel
top-p threshold        31 rounds of 3 ops                          1 kernel
=====================  ==========================================  ===========

Shapes: tokens are rows ``N`` (the decode batch, or every prompt token of a
prefill); ``qkv`` is the merged projection ``[N, (Hq + 2 Hkv) * D]``; the KV
cache layer is ``[slots, Hkv, max_len, D]``; ``slots[n]`` and ``positions[n]``
say where token ``n``'s key and value go.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

__all__ = ["FusedOps", "TorchOps", "top_p_threshold"]

#: Bisection rounds that pin a float32 threshold in [0, 1] to one representable value (2**30 > bits(1.0)).
THRESHOLD_ROUNDS = 31


class FusedOps(Protocol):
    """What the fused forward needs, whichever implementation does it."""

    name: str

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual + x`` (``x`` alone when ``residual`` is None) and its RMSNorm times ``weight``;
        returns (normalised, new residual)."""
        ...

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
        """Per-head q/k RMSNorm (Qwen3), rotary embedding at ``positions`` (``cos``/``sin``: tables
        [max_len, D]), the keys and values stored at (``slots``, ``positions``); returns q [N, Hq, D]."""
        ...

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
        """Row ``b``'s query [Hq, D] against slot ``b``'s first ``lengths[b]`` keys; returns [B, Hq * D].
        ``view`` bounds every length (a dense kernel's padded width); ``splits`` partitions each row's
        keys for a split-KV kernel (ignored where there is none)."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of the merged projection ``[N, 2F]``; returns [N, F]."""
        ...

    def top_p_threshold(self, weights: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        """Per row, the largest float32 ``t`` with ``sum(weights[weights >= t]) >= need`` (see
        :func:`top_p_threshold`)."""
        ...


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``transformers``' Qwen RMSNorm: normalise in float32, cast back, then times the weight."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def top_p_threshold(weights: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """Per row of ``weights`` [B, V] (non-negative, at most 1), the largest float32 ``t`` such that the
    weights at least ``t`` sum to at least ``need`` [B] - without sorting.

    ``{w >= t}`` is then exactly the nucleus a descending sort would keep: a token is in it iff the
    weights strictly above it sum to less than ``need`` (ties and summation order aside).  Float32
    values >= 0 order as their int32 bit patterns, so a bisection over the bits finds ``t`` exactly in
    :data:`THRESHOLD_ROUNDS` rounds.  Invariant: the mass at ``lo`` reaches ``need``, at ``hi`` it does not.
    """
    w = weights.float()
    rows = w.shape[0]
    lo = torch.zeros(rows, dtype=torch.int32, device=w.device)
    hi = torch.full((rows,), 0x3F800001, dtype=torch.int32, device=w.device)  # just above 1.0
    for _ in range(THRESHOLD_ROUNDS):
        mid = lo + (hi - lo) // 2
        t = mid.view(torch.float32)
        mass = torch.where(w >= t[:, None], w, 0.0).sum(-1)
        ok = mass >= need
        lo = torch.where(ok, mid, lo)
        hi = torch.where(ok, hi, mid)
    return lo.view(torch.float32)


class TorchOps:
    """The reference: ``transformers``' own arithmetic, operation by operation."""

    name = "torch"

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x if residual is None else residual + x
        return rms_norm(residual, weight, eps), residual

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
        q, k, v = qkv.view(n, heads + 2 * kv_heads, head_dim).split([heads, kv_heads, kv_heads], dim=1)
        if q_norm is not None and k_norm is not None:
            q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
        c, s = cos[positions][:, None, :], sin[positions][:, None, :]
        q = (q * c) + (rotate_half(q) * s)
        k = (k * c) + (rotate_half(k) * s)
        keys[slots, :, positions] = k
        values[slots, :, positions] = v
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
        width = keys.shape[2] if view is None else view
        k, v = keys[:rows, :, :width], values[:rows, :, :width]
        # the query heads of one KV head as that head's query rows: no repeat of the keys (as transformers)
        grouped = q.view(rows, kv_heads, heads // kv_heads, dim)
        visible = (torch.arange(width, device=q.device)[None, :] < lengths[:, None])[:, None, None, :]
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=visible, scale=scale)
        return out.reshape(rows, heads * dim)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def top_p_threshold(self, weights: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        return top_p_threshold(weights, need)
