"""What goes to an engine and what comes back: :class:`GenerateRequest` (with its
:class:`SamplingParams`) and :class:`Completion`.  Part of the engine protocol
(:mod:`april_bench.engines.protocol` re-exports them; import them from there).

Apart from the protocol's module because they are built once per request on the simulator's hot path,
and the compiled core (``april_bench/compiled.py``) compiles this module (the protocol's own module
cannot be compiled: its ``@runtime_checkable`` protocols do not compile).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from april_bench.types import FinishReason

__all__ = ["Completion", "GenerateRequest", "SamplingParams"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling settings, in engine-neutral names (adapters translate them)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return _by_fields(self)

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or self.temperature == float("inf"):  # NaN fails >= too
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be >= -1 (-1: off), got {self.top_k}")


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """Generate up to ``max_new_tokens`` after ``input_ids`` (prompt + any partial response)."""

    request_id: str
    input_len: int
    max_new_tokens: int
    sampling: SamplingParams
    #: Prompt + partial response ids; ``None`` only for token-free engines (the simulator).
    input_ids: tuple[int, ...] | None = None
    #: Replayed length: the response ends with EOS after this many new tokens (benchmarks
    #: replay recorded output lengths this way; the simulator always needs it).
    replay_len: int | None = None
    #: Requests with the same key share a prefix (a prompt's samples); routers may co-locate them.
    routing_key: str | None = None
    #: Scheduling priority (lower runs first, as in vLLM and SGLang); engines without priority
    #: scheduling ignore it.
    priority: int = 0
    #: Tokens at the end of ``input_ids`` that are a partial response resumed (0: a fresh start).
    #: Only for accounting: an engine counts the prefill of a resumed request as re-prefill.
    prefix_len: int = 0
    #: Generate with the weights of this policy version (``None``: the current ones).  Only an engine
    #: declaring :data:`VERSIONS` takes an older one; such an engine keeps that version's KV for a
    #: resumed partial (it was computed by these weights), so nothing is prefilled again.
    policy_version: int | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return _by_fields(self)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"{self.request_id}: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.input_ids is not None and len(self.input_ids) != self.input_len:
            raise ValueError(f"{self.request_id}: input_len {self.input_len} != {len(self.input_ids)} ids")
        if self.replay_len is not None and self.replay_len < 1:
            raise ValueError(f"{self.request_id}: replay_len must be >= 1, got {self.replay_len}")


@dataclass(frozen=True, slots=True)
class Completion:
    """The final answer to one request (possibly partial, when aborted)."""

    request_id: str
    num_tokens: int
    finish_reason: FinishReason
    #: Policy version of the weights that produced the last of these tokens (all of them, unless
    #: ``version_runs`` says otherwise).
    policy_version: int
    t_done: float
    t_first_token: float | None = None
    output_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    num_retractions: int = 0
    replica: int = 0
    #: ``((version, n_tokens), ...)`` in token order when a weight update landed while this request
    #: ran (the runs sum to ``num_tokens``); ``None``: every token is ``policy_version``'s.
    version_runs: tuple[tuple[int, int], ...] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return _by_fields(self)

    def __post_init__(self) -> None:
        if self.version_runs is not None and sum(n for _, n in self.version_runs) != self.num_tokens:
            raise ValueError(
                f"{self.request_id}: version_runs {self.version_runs} do not sum to {self.num_tokens} tokens"
            )

    def runs(self) -> tuple[tuple[int, int], ...]:
        """Every token's policy version, run-length encoded (one run unless an update landed)."""
        if self.version_runs is not None:
            return tuple((v, n) for v, n in self.version_runs if n)
        return ((self.policy_version, self.num_tokens),)


def _by_fields(obj: Any) -> tuple[Any, ...]:
    """How a frozen type pickles and copies: built again from its fields (the constructor checks them).
    Compiled (a native class), the default way (setting each slot) meets the frozen ``__setattr__``."""
    return type(obj), tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))
