"""A fused forward for Qwen2 / Qwen3 decoders over the slot KV cache, on the ``transformers`` model's weights.

The stock forward runs about 41 operations per layer at decode: seven matrix
products, two RMSNorms of about eight operations each, the rotary embedding as
eight, two ``index_put_`` KV writes, a 4-D mask and SDPA.  Inside a CUDA graph
each is a kernel, so a step of a 28-layer model is ~1,240 kernels and is bound
by their count, not by memory bandwidth.  This forward does a layer as

    add+RMSNorm -> QKV product -> q/k norm + rotary + KV store -> attention
    -> O product -> add+RMSNorm -> gate-up product -> SiLU*up -> down product

nine or ten kernels with :class:`~.triton_kernels.TritonOps` on a GPU (one
more when attention is split).  On a CPU the same sequence runs as plain torch
(:class:`~.kernels.TorchOps`), which is also the reference the Triton kernels
are tested against.

**Weights are shared, not copied.**  The q, k and v projections of a layer (and
their biases, Qwen2) are moved once into one tensor and the model's parameters
become views of it; gate and up likewise.  The model's ``state_dict`` and
``load_state_dict`` (how the engine takes weight updates) read and write
through those views, so the merged products always see the current policy and
the engine holds one copy of the weights: the merge costs one layer's q/k/v or
gate/up weights of transient memory, nothing after.  The embedding, the output
head and every other weight are used in place.

**Attention reads each row's own keys.**  Decode attention takes the per-row
lengths (``position + 1``); the Triton kernel reads exactly those keys, split
across programs when the batch is small (split-KV), with no mask and no padded
view, so one CUDA graph serves every KV length.  Prefill runs causal SDPA with
grouped-query heads (``enable_gqa``; bottom-right causal for the later chunks of
a chunked prefill), with no 4-D mask either.

Agreement with the stock forward: the same arithmetic in the same order on a
CPU (tested to float tolerance against ``transformers`` on random Qwen2 and
Qwen3 models); on a GPU the Triton kernels round once where ``transformers``
rounds after each product of the rotary embedding, and the merged products
may sum in another order, so logits agree to the model dtype's tolerance,
not bit for bit (``tests/test_hf_fused.py`` states the tolerances).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from april_bench.engines.hf.cache import SlotKVCache
from april_bench.engines.hf.kernels import TorchOps

__all__ = ["FusedQwen", "MixedOps", "check_triton_ops", "make_ops", "triton_usable", "unsupported"]

log = logging.getLogger(__name__)

#: Rotary types whose tables depend on the sequence length at run time (not a fixed table).
_DYNAMIC_ROPE = ("dynamic", "longrope")


def unsupported(model: Any) -> str | None:
    """Why :class:`FusedQwen` cannot run ``model``, or ``None`` when it can."""
    cfg = model.config
    kind = getattr(cfg, "model_type", None)
    if kind not in ("qwen2", "qwen3"):
        return f"the fused forward covers qwen2 and qwen3 models, not {kind!r}"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return "the model has sliding-window layers"
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") in _DYNAMIC_ROPE:
        return f"rotary type {rope.get('rope_type')!r} changes with the sequence length"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r} (the fused MLP is SiLU-gated)"
    return None


def triton_usable(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the Triton kernels cannot run here, or ``None`` when they can."""
    import os

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda" and not interpreted:
        return f"Triton kernels need a CUDA device, not {device.type} (TRITON_INTERPRET=1 runs them on a CPU)"
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"Triton kernels take bfloat16, float16 or float32, not {dtype}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "the triton package is not installed"
    return None


def make_ops(
    kind: str,
    device: torch.device,
    dtype: torch.dtype,
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
) -> tuple[Any, str | None]:
    """The ops ``kind`` asks for (``torch``, ``triton`` or ``auto``: Triton where it can run) and a note:
    why ``auto`` fell back to torch, or which Triton kernels failed their check at start.

    Each Triton kernel is checked once against the torch reference on inputs of the model's head shape
    (:func:`check_triton_ops`); one that fails to build, raises or disagrees is replaced by its torch
    version, so a kernel that is wrong on some GPU costs speed, not a run."""
    if kind == "torch":
        return TorchOps(), None
    reason = triton_usable(device, dtype)
    if reason is not None:
        if kind == "triton":
            raise ValueError(f"fused_kernels=triton: {reason}")
        return TorchOps(), reason
    from april_bench.engines.hf.triton_kernels import TritonOps

    failed = check_triton_ops(TritonOps(), device, dtype, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    if not failed:
        return TritonOps(), None
    note = "; ".join(f"{name}: {why}" for name, why in failed.items())
    log.warning("hf fused forward: torch instead of Triton for %s", note)
    return MixedOps(TritonOps(), TorchOps(), set(failed)), f"torch for {note}"


class MixedOps:
    """Triton's ops except ``fallback`` (operation names), which torch does."""

    def __init__(self, fast: Any, slow: Any, fallback: set[str]) -> None:
        self.fast, self.slow, self.fallback = fast, slow, fallback
        self.name = "triton" if not fallback else "triton+torch"
        self.reads_own_keys = "decode_attention" not in fallback

    def __getattr__(self, name: str) -> Any:
        return getattr(self.slow if name in self.fallback else self.fast, name)


def check_triton_ops(
    ops: Any, device: torch.device, dtype: torch.dtype, *, heads: int, kv_heads: int, head_dim: int
) -> dict[str, str]:
    """Each of ``ops``' operations against :class:`TorchOps` on small random inputs of this head shape;
    the ones that raised or disagreed beyond a few units in the last place, and why."""
    reference = TorchOps()
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device, dtype)

    hidden, rows, slots, max_len = heads * head_dim, 3, 3, 80
    x, residual, weight = rand(rows, hidden), rand(rows, hidden), 1 + 0.1 * rand(hidden)
    qkv = rand(rows, (heads + 2 * kv_heads) * head_dim)
    angle = torch.arange(max_len)[:, None] * 0.01 * torch.arange(1, head_dim // 2 + 1)[None, :]
    cos = torch.cat([angle, angle], -1).cos().to(device, dtype)
    sin = torch.cat([angle, angle], -1).sin().to(device, dtype)
    positions = torch.tensor([0, 40, max_len - 1], device=device)
    q = rand(rows, heads, head_dim)
    keys, values = rand(slots, kv_heads, max_len, head_dim), rand(slots, kv_heads, max_len, head_dim)
    probs = torch.softmax(3 * torch.randn(rows, 1000, generator=gen), -1)
    probs = (probs / probs.max(-1, keepdim=True).values).to(device)
    need = torch.tensor([0.5, 0.9, 0.99], device=device) * probs.sum(-1)

    def rope(o: Any) -> torch.Tensor:
        k, v = torch.zeros_like(keys), torch.zeros_like(values)
        out = o.rope_store(
            qkv, heads=heads, kv_heads=kv_heads, head_dim=head_dim, cos=cos, sin=sin, positions=positions,
            slots=torch.arange(rows, device=device), q_norm=weight[:head_dim], k_norm=weight[:head_dim],
            eps=1e-6, keys=k, values=v,
        )  # fmt: skip
        return torch.cat([out.flatten(), k.flatten(), v.flatten()])

    def attention(o: Any) -> torch.Tensor:
        lengths = positions + 1
        scale = head_dim**-0.5
        return torch.cat(
            [o.decode_attention(q, keys, values, lengths, scale=scale, view=None, splits=s) for s in (1, 4)]
        )

    probes: dict[str, Any] = {
        "add_rms_norm": lambda o: torch.cat([t.flatten() for t in o.add_rms_norm(x, residual, weight, 1e-6)]),
        "rope_store": rope,
        "decode_attention": attention,
        "silu_mul": lambda o: o.silu_mul(torch.cat([x, residual], -1)),
        # the kept sets, as 0/1: the masses may sum in another order, so one token per row may differ
        "top_p_threshold": lambda o: (probs >= o.top_p_threshold(probs, need)[:, None]).float(),
    }
    ulps = 8 * (torch.finfo(dtype).eps if dtype != torch.float32 else 1e-6)
    failed: dict[str, str] = {}
    for name, probe in probes.items():
        try:
            got, want = probe(ops).double().cpu(), probe(reference).double().cpu()
        except Exception as exc:  # a kernel that does not build or launch here
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            continue
        if name == "top_p_threshold":
            bad = float((got != want).sum()) > rows
        else:
            bad = bool(not torch.isfinite(got).all()) or float((got - want).abs().max()) > ulps * max(
                1.0, float(want.abs().max())
            )
        if bad:
            failed[name] = "disagrees with the torch reference"
    return failed


@dataclass(slots=True)
class _Layer:
    ln1: torch.Tensor
    qkv: torch.Tensor  # [ (Hq + 2 Hkv) D, hidden ]: q_proj, k_proj, v_proj weights are views of it
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    ln2: torch.Tensor
    gate_up: torch.Tensor  # [2 F, hidden]: gate_proj and up_proj weights are views of it
    down: torch.Tensor


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _share(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """One tensor holding ``params`` stacked along dim 0, with each parameter made a view of it.

    If they already are consecutive rows of one storage (the engine started again), that is returned."""
    first = params[0]
    rows = sum(p.shape[0] for p in params)
    row_bytes = first[0].numel() * first.element_size()
    if first.is_contiguous() and all(
        _same_storage(p, first)
        and p.is_contiguous()
        and p.data_ptr() == first.data_ptr() + offset * row_bytes
        for p, offset in zip(
            params, [sum(q.shape[0] for q in params[:i]) for i in range(len(params))], strict=True
        )
    ):
        return torch.empty(0, dtype=first.dtype, device=first.device).set_(
            first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]), first.stride()
        )
    merged = torch.cat([p.detach() for p in params])
    offset = 0
    for p in params:
        p.data = merged[offset : offset + p.shape[0]]
        offset += p.shape[0]
    return merged


class FusedQwen:
    """Decode and prefill forwards of a ``transformers`` Qwen2/Qwen3 causal LM over ``cache``'s slots."""

    def __init__(self, model: Any, cache: SlotKVCache, *, kernels: str = "auto") -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(reason)
        cfg = model.config
        self.model = model
        self.cache = cache
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        weight = model.get_output_embeddings().weight
        self.device, self.dtype = weight.device, weight.dtype
        self.ops, self.kernels_note = make_ops(
            kernels, self.device, self.dtype, heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim
        )
        self._bind_weights()
        # the rotary tables of transformers' own module, for every position a slot can hold
        positions = torch.arange(cache.max_len, device=self.device)[None, :]
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        with torch.inference_mode():
            cos, sin = model.base_model.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0].clone(), sin[0].clone()
        self._repeat_chunk_heads = False
        self.sm_count = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else 1
        )

    def _bind_weights(self) -> None:
        base = self.model.base_model
        self.embed = base.embed_tokens.weight
        self.norm = base.norm.weight
        head = self.model.get_output_embeddings()
        self.head, self.head_bias = head.weight, head.bias
        self.layers = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = (attn.q_proj, attn.k_proj, attn.v_proj)
            biases = [p.bias for p in projections]
            qkv_bias = _share(biases) if all(b is not None for b in biases) else None
            if qkv_bias is None and any(b is not None for b in biases):
                raise ValueError("q, k and v projections must all have a bias or none")
            if (
                mlp.gate_proj.bias is not None
                or mlp.up_proj.bias is not None
                or mlp.down_proj.bias is not None
            ):
                raise ValueError("the fused MLP takes no biases")
            self.layers.append(
                _Layer(
                    ln1=layer.input_layernorm.weight,
                    qkv=_share([p.weight for p in projections]),
                    qkv_bias=qkv_bias,
                    o=attn.o_proj.weight,
                    o_bias=attn.o_proj.bias,
                    q_norm=attn.q_norm.weight if hasattr(attn, "q_norm") else None,
                    k_norm=attn.k_norm.weight if hasattr(attn, "k_norm") else None,
                    ln2=layer.post_attention_layernorm.weight,
                    gate_up=_share([mlp.gate_proj.weight, mlp.up_proj.weight]),
                    down=mlp.down_proj.weight,
                )
            )

    def weights_shared(self) -> bool:
        """Whether every q/k/v and gate/up parameter of the model is still a view of its merged tensor
        (``load_state_dict`` copies in place and keeps it; ``assign=True`` or ``.to()`` would not)."""
        for layer, module in zip(self.layers, self.model.base_model.layers, strict=True):
            attn, mlp = module.self_attn, module.mlp
            pairs = [(layer.qkv, p.weight) for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
            pairs += [(layer.gate_up, p.weight) for p in (mlp.gate_proj, mlp.up_proj)]
            if not all(_same_storage(merged, w) for merged, w in pairs):
                return False
        return True

    def splits_for(self, rows: int) -> int:
        """Split-KV factor for a batch of ``rows``: enough programs to fill the GPU about twice."""
        if self.device.type != "cuda":
            return 1
        programs = rows * self.kv_heads
        want = math.ceil(2 * self.sm_count / programs)
        return max(1, min(want, 64, math.ceil(self.cache.max_len / 64)))

    # ------------------------------------------------------------ forwards
    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, *, view: int | None = None
    ) -> torch.Tensor:
        """Logits [B, V] for one new token per row ``b`` of slots ``0 .. B``, at ``positions[b]``; its key
        and value are stored there.  ``view`` bounds the keys the torch attention reads (at least the
        longest row's ``position + 1``); the Triton kernel reads each row's own and ignores it."""
        rows = tokens.shape[0]
        ops = self.ops
        slots = self.cache.row_index[:rows]
        lengths = positions + 1
        splits = self.splits_for(rows)
        hidden = F.embedding(tokens, self.embed)
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            x, residual = ops.add_rms_norm(hidden, residual, layer.ln1, self.eps)
            q = self._qkv_rope_store(i, layer, x, positions, slots)
            a = ops.decode_attention(
                q,
                self.cache.keys[i],
                self.cache.values[i],
                lengths,
                scale=self.scale,
                view=view,
                splits=splits,
            )
            hidden, residual = self._mlp(layer, F.linear(a, layer.o, layer.o_bias), residual)
        x, _ = ops.add_rms_norm(hidden, residual, self.norm, self.eps)
        return F.linear(x, self.head, self.head_bias)

    def prefill(self, ids: torch.Tensor, start: int, offset: int) -> torch.Tensor:
        """Final hidden states [n, w, hidden] of right-padded ``ids`` [n, w] at positions ``offset ..
        offset + w`` of slots ``start .. start + n``, whose earlier positions are already cached."""
        n, width = ids.shape
        ops = self.ops
        slots = torch.arange(start, start + n, device=self.device).repeat_interleave(width)
        positions = torch.arange(offset, offset + width, device=self.device).repeat(n)
        hidden = F.embedding(ids.reshape(-1), self.embed)
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            x, residual = ops.add_rms_norm(hidden, residual, layer.ln1, self.eps)
            q = self._qkv_rope_store(i, layer, x, positions, slots)
            q = q.view(n, width, self.heads, self.head_dim).transpose(1, 2)
            k = self.cache.keys[i][start : start + n, :, : offset + width]
            v = self.cache.values[i][start : start + n, :, : offset + width]
            a = self._prefill_attention(q, k, v, offset)
            a = a.transpose(1, 2).reshape(n * width, self.heads * self.head_dim)
            hidden, residual = self._mlp(layer, F.linear(a, layer.o, layer.o_bias), residual)
        x, _ = ops.add_rms_norm(hidden, residual, self.norm, self.eps)
        return x.view(n, width, -1)

    def _prefill_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int
    ) -> torch.Tensor:
        """Causal attention of ``q`` [n, Hq, w, D] over ``k``/``v`` [n, Hkv, offset + w, D], GQA heads
        unrepeated.  A later chunk (``offset`` > 0) is bottom-right causal: query i sees keys up to
        ``offset + i``; where no fused kernel takes that with grouped heads, the key heads are repeated."""
        if offset == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=True)
        from torch.nn.attention.bias import causal_lower_right

        causal = causal_lower_right(q.shape[2], k.shape[2])
        if not self._repeat_chunk_heads:
            try:
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=causal, scale=self.scale, enable_gqa=True
                )
            except RuntimeError as exc:  # no kernel for bottom-right causal with grouped heads here
                self._repeat_chunk_heads = True
                log.info("hf fused prefill: repeating KV heads for later chunks (%s)", exc)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=self.scale)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.head, self.head_bias)

    def _qkv_rope_store(
        self, i: int, layer: _Layer, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        return self.ops.rope_store(
            F.linear(x, layer.qkv, layer.qkv_bias),
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            cos=self.cos,
            sin=self.sin,
            positions=positions,
            slots=slots,
            q_norm=layer.q_norm,
            k_norm=layer.k_norm,
            eps=self.eps,
            keys=self.cache.keys[i],
            values=self.cache.values[i],
        )

    def _mlp(
        self, layer: _Layer, attn_out: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.ops.add_rms_norm(attn_out, residual, layer.ln2, self.eps)
        return F.linear(self.ops.silu_mul(F.linear(x, layer.gate_up)), layer.down), residual
