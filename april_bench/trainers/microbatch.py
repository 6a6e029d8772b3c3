"""Token-budget micro-batches: samples packed by length so that each padded forward stays in budget."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["pack_by_length", "padded_tokens"]


def pack_by_length(lengths: Sequence[int], budget: int | None) -> list[list[int]]:
    """Indices of ``lengths`` in micro-batches of at most ``budget`` padded tokens each.

    Samples are taken longest first, and a micro-batch grows while ``count x longest <= budget``,
    so similar lengths share a batch and little of it is padding.  A sample longer than the budget
    gets a micro-batch of its own (a sample is never split).  ``budget=None``: one micro-batch of
    everything, in the given order.  Deterministic: ties keep their input order.
    """
    if budget is None:
        return [list(range(len(lengths)))] if lengths else []
    if budget < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        current = batches[-1] if batches else None
        if current is not None and (len(current) + 1) * lengths[current[0]] <= budget:
            current.append(index)
        else:
            batches.append([index])
    return batches


def padded_tokens(lengths: Sequence[int], batch: Sequence[int]) -> int:
    """Tokens of ``batch`` once padded to its longest sample (what the forward pass computes)."""
    return len(batch) * max((lengths[i] for i in batch), default=0)
