"""Per-token log-probs of given tokens under a causal LM, without full-vocabulary logits for the batch.

A batch of B x L tokens with a 152k vocabulary has B x L x 152k fp32 logits: 77 GiB at 64 x 2,048
tokens.  Here the decoder's hidden states go through ``lm_head`` a chunk of tokens at a time; each
chunk's logits live only long enough to take the log-sum-exp and the chosen token's logit, and the
backward pass recomputes them chunk by chunk (:class:`ChunkedTokenLogprobs`).  What autograd keeps is
the hidden states (already kept by the decoder), the targets and one log-sum-exp per token, so the
peak grows with ``chunk_tokens x vocab``, not with ``tokens x vocab``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ChunkedTokenLogprobs",
    "chunked_token_logprobs",
    "logits_token_logprobs",
    "packed_token_logprobs",
    "token_logprobs",
]

#: Tokens per ``lm_head`` chunk when the caller names none.
DEFAULT_CHUNK_TOKENS = 1024


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, scale: float) -> Tensor:
    """``(hidden @ weight.T + bias) * scale`` in at least float32 (softmax precision)."""
    logits = hidden @ weight.T
    logits = logits.to(_softmax_dtype(logits.dtype))
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    return logits * scale if scale != 1.0 else logits


class ChunkedTokenLogprobs(torch.autograd.Function):
    """``log softmax(scale * (h W^T + b))[target]`` for N tokens, ``chunk`` tokens of logits at a time.

    Inputs: hidden ``[N, H]``, weight ``[V, H]``, bias ``[V]`` or None, targets ``[N]`` (long).
    Outputs: log-probs ``[N]`` (differentiable in hidden, weight and bias) and entropies ``[N]``
    (not differentiable; the trainer logs them), in float32 (float64 for float64 inputs).
    ``matmul_dtype`` is the dtype of the ``lm_head`` matmuls (bf16 under autocast); the softmax is
    always float32.  Autocast is off inside: the casts are explicit.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        scale: float,
        chunk: int,
        matmul_dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(matmul_dtype)
            out_dtype = _softmax_dtype(matmul_dtype)
            logprobs = torch.empty(hidden.shape[0], dtype=out_dtype, device=hidden.device)
            entropy = torch.empty_like(logprobs)
            lse = torch.empty_like(logprobs)
            for start in range(0, hidden.shape[0], chunk):
                part = slice(start, start + chunk)
                z = _chunk_logits(hidden[part].to(matmul_dtype), w, bias, scale)
                lse[part] = torch.logsumexp(z, dim=-1)
                logprobs[part] = z.gather(-1, targets[part, None]).squeeze(-1) - lse[part]
                probs = torch.softmax(z, dim=-1)
                entropy[part] = lse[part] - (probs * z).sum(-1)
                del z, probs  # free the chunk's logits before the next one
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.scale, ctx.chunk, ctx.matmul_dtype = scale, chunk, matmul_dtype
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, grad_logprobs: Tensor, _grad_entropy: Tensor | None) -> tuple[Any, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        scale, chunk, dtype = ctx.scale, ctx.chunk, ctx.matmul_dtype
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            grad_hidden = torch.empty_like(hidden) if need_hidden else None
            acc = lse.dtype  # accumulate the weight gradient over chunks in the softmax precision
            grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_weight else None
            grad_bias = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_bias else None
            for start in range(0, hidden.shape[0], chunk):
                part = slice(start, start + chunk)
                h = hidden[part].to(dtype)
                g = grad_logprobs[part, None].to(lse.dtype)
                # d logp[target] / d z = onehot(target) - softmax(z); the logits are z / scale
                grad_z = torch.exp(_chunk_logits(h, w, bias, scale) - lse[part, None]).mul_(-g)
                grad_z.scatter_add_(-1, targets[part, None], g)
                if scale != 1.0:
                    grad_z.mul_(scale)
                if grad_hidden is not None:
                    grad_hidden[part] = (grad_z.to(dtype) @ w).to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight += (grad_z.T.to(dtype) @ h).to(acc)
                if grad_bias is not None:
                    grad_bias += grad_z.sum(0)
                del grad_z
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def _scale(temperature: float) -> float:
    """The factor on the logits: 1/T, matching the sampler (algorithms.md §1.1); T <= 0 is greedy: 1."""
    return 1.0 / temperature if temperature > 0 else 1.0


def chunked_token_logprobs(
    hidden: Tensor,
    lm_head: torch.nn.Linear,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    matmul_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-probs ``[N]`` (with grad) and entropies ``[N]`` (without) of ``targets`` after ``hidden``."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    dtype = matmul_dtype or torch.promote_types(hidden.dtype, lm_head.weight.dtype)
    result: tuple[Tensor, Tensor] = ChunkedTokenLogprobs.apply(
        hidden, lm_head.weight, lm_head.bias, targets, _scale(temperature), chunk_tokens, dtype
    )
    return result


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    positions: Tensor | None = None,
    matmul_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``log softmax(logits / T)`` of each next token: [B, L-1] for ids [B, L] (and the entropy).

    The temperature matches the sampler's, so these are the log-probs of the distribution the engine
    sampled from (algorithms.md §1.1).  ``positions`` (bool ``[B, L-1]``, default: every target whose
    token is attended) selects the targets to compute; the others are 0.  ``model`` is a Hugging Face
    causal LM whose logits are ``lm_head(base_model(...))`` (Llama/Qwen families: no logit soft-capping
    or scaling).
    """
    head = model.get_output_embeddings()  # type: ignore[operator]
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"chunked log-probs need a Linear lm_head, got {type(head).__name__}")
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]  # type: ignore[operator]
    targets = input_ids[:, 1:]
    select = attention_mask[:, 1:] != 0 if positions is None else positions.to(torch.bool)
    logp, entropy = chunked_token_logprobs(
        hidden[select],
        head,
        targets[select],
        temperature=temperature,
        chunk_tokens=chunk_tokens,
        matmul_dtype=matmul_dtype,
    )
    chosen = torch.zeros(targets.shape, dtype=logp.dtype, device=targets.device)
    chosen = chosen.masked_scatter(select, logp)
    if not with_entropy:
        return chosen, None
    return chosen, torch.zeros_like(chosen).masked_scatter(select, entropy)


def packed_token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    lengths: list[int],
    positions: Tensor,
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    matmul_dtype: torch.dtype | None = None,
    prefixes: Sequence[int] | None = None,
    groups: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`token_logprobs` of rows packed end to end (:mod:`april_bench.models.packing`): the same
    ``[B, L-1]`` log-probs, without computing the rows' padding.

    Row ``r`` is its first ``lengths[r]`` tokens (padding only after them); ``positions`` (bool
    ``[B, L-1]``) selects the targets, which must lie within each row.  ``model`` is a Hugging Face
    causal LM whose attention masks come from ``transformers.masking_utils`` (every architecture of
    transformers 5), which reads restarted position ids as row boundaries.

    ``prefixes`` and ``groups`` (per row): rows of one group share their first ``prefixes[r]`` tokens
    (a GRPO group's prompt), which are then computed once per lane segment and attended to by each
    row's own suffix (:func:`~april_bench.models.packing.pack_shared`): the same log-probs and, since
    the shared prefix's gradient is the sum of what each row's copy would get, the same gradients, for
    fewer tokens.  The mask is passed as a 4D boolean mask, which ``sdpa`` attention reads as is; with
    another attention implementation the rows are packed whole instead.
    """
    from april_bench.models.packing import pack_rows, pack_shared

    head = model.get_output_embeddings()  # type: ignore[operator]
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"chunked log-probs need a Linear lm_head, got {type(head).__name__}")
    width = input_ids.shape[1] - 1
    select = positions.to(torch.bool)
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if prefixes is not None and groups is not None and attention == "sdpa":
        shared = pack_shared(input_ids, lengths, prefixes, groups, pad_id=pad_token_id)
        hidden = model.base_model(  # type: ignore[operator]
            input_ids=shared.ids, position_ids=shared.positions, attention_mask=shared.mask, use_cache=False
        ).last_hidden_state
        flat_index = shared.index[:, :width]
    else:
        packed = pack_rows(input_ids, lengths, pad_id=pad_token_id)
        hidden = model.base_model(  # type: ignore[operator]
            input_ids=packed.ids, position_ids=packed.positions, use_cache=False
        ).last_hidden_state
        flat_index = packed.flat_index(width)
    # target j of row r is predicted by the hidden state of its token j
    where = flat_index[select]
    logp, entropy = chunked_token_logprobs(
        hidden.reshape(-1, hidden.shape[-1])[where],
        head,
        input_ids[:, 1:][select],
        temperature=temperature,
        chunk_tokens=chunk_tokens,
        matmul_dtype=matmul_dtype,
    )
    chosen = torch.zeros(select.shape, dtype=logp.dtype, device=logp.device).masked_scatter(select, logp)
    if not with_entropy:
        return chosen, None
    return chosen, torch.zeros_like(chosen).masked_scatter(select, entropy)


def logits_token_logprobs(
    logits: Tensor, targets: Tensor, keep: Tensor, *, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Log-probs and entropies ``[B, T]`` of ``targets`` ``[B, T]`` from full logits ``[B, T, V]``.

    For a model whose logits come out whole (a sharded or megatron-core model, where ``lm_head``
    cannot be called on its own); positions where ``keep`` is 0 are 0.
    """
    logp_all = torch.log_softmax(logits.float() * _scale(temperature), dim=-1)
    chosen = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    weight = (keep != 0).to(chosen.dtype)
    return chosen * weight, entropy * weight
