"""Token sampling for the ``hf`` engine: temperature, top-p, seeded per request.

Randomness is *position-keyed*: the uniform that picks token ``t`` of a
sequence is ``splitmix64(seed, t)``.  A request's draws therefore do not depend
on which other requests share its batch, and a request resumed after an abort
(same seed) continues with exactly the draws an uninterrupted one would have
used.

Log-probs follow SGLang: ``log_softmax(logits / temperature)`` of the sampled
token, before top-p renormalisation and before banning EOS for a replayed
length - the model's own distribution, which is what a trainer recomputes;
greedy requests (temperature 0) report ``log_softmax(logits)``.

:func:`position_uniforms` and :func:`sample_banning` are the same draws as
tensor operations (no host values), for the static decode step that runs
inside a CUDA graph; they give bit-identical tokens and log-probs.

:func:`sample_sort_free` is the fused decode path's sampler: the same
distribution (same temperature, top-p, banning and log-prob convention) and the
same position-keyed uniform, without sorting the vocabulary.  At top_p = 1 it
inverts the CDF in vocabulary order (one cumulative sum and a binary search);
with top-p it first finds the nucleus' probability threshold by bisection
(:func:`~april_bench.engines.hf.kernels.top_p_threshold`), which keeps exactly
the tokens a descending sort keeps.  The sorted sampler walks the CDF in
descending order, this one in vocabulary order, so one uniform picks a
different token: the two agree in distribution, not draw by draw
(``tests/test_hf_fused.py`` tests that).  Its cost at top_p = 1 is about six
passes over the ``[B, V]`` float32 logits instead of a 151,936-wide sort per row.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "position_uniform",
    "position_uniforms",
    "sample",
    "sample_banning",
    "sample_sort_free",
    "seed_bits",
]

_MASK64 = (1 << 64) - 1


def position_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) from (seed, position): splitmix64 finaliser."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z >> 11) * (1.0 / (1 << 53))


def _signed(value: int) -> int:
    """``value`` mod 2**64 as the int64 with the same bits."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` (torch's ``>>`` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


_GOLDEN, _MIX1, _MIX2 = (_signed(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def position_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """:func:`position_uniform` element-wise on int64 tensors (seeds as :func:`seed_bits` gives them);
    float64.  int64 multiplication wraps modulo 2**64 on CPU and CUDA, which is splitmix64's arithmetic."""
    z = seeds * _GOLDEN + positions * _MIX1 + _MIX2
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    z = z ^ _shift_right(z, 31)
    return _shift_right(z, 11).double() * (1.0 / (1 << 53))


def seed_bits(seed: int) -> int:
    """A request seed as the int64 :func:`position_uniforms` takes (same draws as ``position_uniform``)."""
    return _signed(seed)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
    banned: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits`` [B, V]; returns (token ids [B], their log-probs [B]).

    ``temperature``, ``top_p`` and ``uniforms`` are [B]; rows with temperature 0
    are greedy.  ``banned`` [B, V] (bool) removes tokens (EOS while replaying a length).
    """
    logits = logits.float()
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    if banned is not None:
        logits = logits.masked_fill(banned, float("-inf"))
        probs = torch.softmax(logits / scale[:, None], dim=-1)
    else:
        probs = logp.exp()
    return _draw(logits, logp, probs, greedy, top_p, uniforms)


def sample_banning(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
    ban_rows: torch.Tensor,
    ban_tokens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample` with ``banned = ban_rows[:, None] & ban_tokens[None, :]``, decided on the device.

    ``sample`` takes the banned branch when its caller passes a mask, which the
    engine does when any row bans; here that choice is ``ban_rows.any()`` as a
    tensor, so the result is bit-identical and nothing is read back to the host.
    """
    logits = logits.float()
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    masked = logits.masked_fill(ban_rows[:, None] & ban_tokens[None, :], float("-inf"))
    probs = torch.where(ban_rows.any(), torch.softmax(masked / scale[:, None], dim=-1), logp.exp())
    return _draw(masked, logp, probs, greedy, top_p, uniforms)


def _draw(
    logits: torch.Tensor,
    logp: torch.Tensor,
    probs: torch.Tensor,
    greedy: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    sorted_p, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_p.cumsum(dim=-1)
    keep = (cumulative - sorted_p) < top_p[:, None]  # the smallest prefix whose mass reaches top_p
    sorted_p = sorted_p * keep
    cdf = sorted_p.cumsum(dim=-1)
    target = uniforms[:, None] * cdf[:, -1:]
    index = torch.searchsorted(cdf, target).clamp(max=logits.shape[-1] - 1)
    sampled = order.gather(-1, index).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def sample_sort_free(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
    ban_rows: torch.Tensor,
    ban_tokens: torch.Tensor,
    *,
    nucleus: bool,
    threshold: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_banning`'s distribution without a sort (see the module notes).

    ``nucleus=False`` ignores ``top_p`` (the caller knows every row has top_p = 1); ``nucleus=True``
    applies it through ``threshold`` (default :func:`~april_bench.engines.hf.kernels.top_p_threshold`).
    Log-probs are ``log_softmax(logits / T)`` of the token, before banning and top-p, as elsewhere.
    """
    x = logits.float()
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    x = x / scale[:, None]
    masked = x.masked_fill(ban_rows[:, None] & ban_tokens[None, :], float("-inf"))
    top = masked.max(dim=-1, keepdim=True).values
    weights = (masked - top).exp()  # the sampling distribution, unnormalised: banned tokens weigh 0
    if nucleus:
        if threshold is None:
            from april_bench.engines.hf.kernels import top_p_threshold

            threshold = top_p_threshold
        need = top_p * weights.sum(dim=-1)
        cut = torch.where(top_p >= 1, torch.zeros_like(need), threshold(weights, need))
        weights = torch.where(weights >= cut[:, None], weights, 0.0)
    cdf = weights.cumsum(dim=-1)
    total = cdf[:, -1:]
    # the first token whose cumulative weight exceeds u * total: never one of weight 0 (right=True), and
    # u * total rounded up to total still lands on the last token that has weight
    target = torch.minimum(uniforms[:, None].float() * total, torch.nextafter(total, torch.zeros_like(total)))
    sampled = torch.searchsorted(cdf, target, right=True).clamp(max=x.shape[-1] - 1).squeeze(-1)
    tokens = torch.where(greedy, masked.argmax(dim=-1), sampled)
    logprobs = x.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(x, dim=-1)
    return tokens, logprobs
