"""Where every torch-based trainer starts: the seeded model with the task's starting weights.

Its own module so the registry (which names the Ray trainer by a string) and the Ray trainer (which
builds rank actors from the same start) both use it without an import circle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["starting_module"]


def starting_module(settings: Any) -> Any:
    """The seeded model with the task's starting weights loaded (what every torch trainer starts from)."""
    from april_bench.models.zoo import build_model

    module = build_model(settings.model, vocab_size=settings.vocab_size, seed=settings.seed)
    start = settings.initial_weights() if settings.initial_weights is not None else None
    if start is not None:
        module.load_state_dict(start)
    return module
