"""Per-token log-probs of given tokens under a causal LM: shared by the trainer and the tests."""

from __future__ import annotations

import torch

__all__ = ["token_logprobs"]


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / T)`` of each next token: [B, L-1] for ids [B, L] (and the entropy).

    The temperature matches the sampler's, so these are the log-probs of the
    distribution the engine sampled from (algorithms.md §1.1).
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return chosen, entropy
