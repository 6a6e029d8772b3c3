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
"""

from __future__ import annotations

import torch

__all__ = ["position_uniform", "sample"]

_MASK64 = (1 << 64) - 1


def position_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) from (seed, position): splitmix64 finaliser."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z >> 11) * (1.0 / (1 << 53))


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
