"""Roofline cost model of one inference replica (one engine with ``tp`` GPUs).

One decode iteration with ``B`` running requests whose contexts sum to ``S``
tokens takes::

    t(B, S) = c + max( (W + S*kv) / (tp*BW*eta_bw),  (F*B + A*S) / (tp*FLOPS*eta_f) ) + AR(B)

with ``W`` the bytes of weights read per step, ``kv`` the KV bytes per token,
``F`` the matmul FLOPs per token, ``A`` the attention FLOPs per (query,
context) token pair, ``c`` the per-iteration overhead (plus the eager penalty
above the CUDA-graph ceiling), and ``AR`` two all-reduces per layer when
``tp > 1``.  During a run of ``k`` iterations with the same batch, ``S`` grows
by ``B`` per iteration, so both roofline terms are linear in the iteration
index and the run time has a closed form (:meth:`CostModel.decode_run_time`);
the simulator never loops over single tokens.

On a profile with ``overlap=False`` (a fitted CPU, where memory traffic and
arithmetic do not overlap) the two roofline terms add up instead.

A prefill (extend) batch of chunks ``(offset, n)`` costs the same roofline with
``F*sum(n) + A*sum(n*(offset + n/2))`` FLOPs and the weights plus the KV it
reads, and runs without CUDA graphs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from april_bench.profiles.hardware import HardwareProfile
from april_bench.profiles.models import ModelProfile

__all__ = ["CostModel", "DecodeCost", "iterations_within"]


def iterations_within(run_time: Callable[[int], float], limit: int, budget: float) -> int:
    """Largest k <= limit with ``run_time(k) <= budget`` (0 if none): how many decode steps of a run
    completed when it was interrupted.  The one search of the simulator (one cost model's run, or the
    sum over weight versions' forwards).

    A run's time grows with its iterations, so the answer is unique: it starts from the run's mean
    rate (a run's time is convex in its iterations, so the guess is at most the answer and most
    often it or one below it), gallops up and bisects the bracket; a few evaluations of ``run_time``
    instead of a bisection's log2(limit)."""
    if limit <= 0:
        return 0
    full = run_time(limit)
    if full <= budget:
        return limit
    # the answer is below limit: keep run_time(lo) <= budget (or lo == 0) and run_time(hi) > budget
    lo, hi = 0, limit
    guess = min(max(int(limit * (budget / full)), 0), limit - 1) if full > 0 else 0
    if guess > 0:
        if run_time(guess) <= budget:
            lo = guess
        else:
            hi = guess
    step = 1
    while lo + step < hi:
        if run_time(lo + step) <= budget:
            lo += step
            step *= 2
        else:
            hi = lo + step
            break
    hi -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if run_time(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DecodeCost:
    """What both cost models (the roofline here, the measured curve of :mod:`.cost_curve`) answer the
    same way from their decode times: how many decode steps fit a time budget, and the no-tail rate."""

    __slots__ = ()

    def decode_iteration_time(self, batch: int, context_sum: float) -> float:
        raise NotImplementedError

    def decode_run_time(self, batch: int, context_sum: float, iterations: int) -> float:
        """Time of ``iterations`` decode steps; the context sum grows by ``batch`` per step."""
        raise NotImplementedError

    def iterations_within(self, batch: int, context_sum: float, limit: int, budget: float) -> int:
        """Largest k <= limit with decode_run_time(batch, context_sum, k) <= budget."""
        return iterations_within(lambda k: self.decode_run_time(batch, context_sum, k), limit, budget)

    def saturated_tokens_per_s(self, batch: int, mean_context: float) -> float:
        """Decode tokens/s with ``batch`` requests always running at ``mean_context`` tokens each."""
        if batch <= 0:
            return 0.0
        return batch / self.decode_iteration_time(batch, batch * mean_context)


@dataclass(frozen=True)
class CostModel(DecodeCost):
    hardware: HardwareProfile
    model: ModelProfile
    tp: int = 1
    graph_max_batch: int | None = None
    # Derived in __post_init__ (not arguments): the roofline constants.
    _bw: float = field(init=False, repr=False)
    _flops: float = field(init=False, repr=False)
    _ceiling: int = field(init=False, repr=False)
    _mem_a: float = field(init=False, repr=False)
    _mem_b: float = field(init=False, repr=False)
    _comp_per_seq: float = field(init=False, repr=False)
    _comp_b: float = field(init=False, repr=False)
    #: The model's integers the prefill time reads (properties computed from its shape each time).
    _weight_bytes: int = field(init=False, repr=False)
    _kv_bytes: int = field(init=False, repr=False)
    _token_flops: int = field(init=False, repr=False)
    _pair_flops: int = field(init=False, repr=False)
    #: ``_linear_terms`` per batch size, computed once each (the terms depend on the batch alone).
    _terms: dict[int, tuple[float, float, float, float, float]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        # Constants of the roofline terms, computed once: decode_run_time is on the simulator's hot path.
        m, hw = self.model, self.hardware
        bw = self.tp * hw.memory_bw * hw.eta_bw
        flops = self.tp * hw.bf16_flops * hw.eta_flops
        ceiling = self.graph_max_batch if self.graph_max_batch is not None else hw.graph_max_batch
        put = object.__setattr__
        put(self, "_bw", bw)
        put(self, "_flops", flops)
        put(self, "_ceiling", ceiling)
        put(self, "_mem_a", m.decode_weight_bytes / bw)
        put(self, "_mem_b", m.kv_bytes_per_token / bw)
        put(self, "_comp_per_seq", m.flops_per_token / flops)
        put(self, "_comp_b", m.attention_flops_per_context_token / flops)
        put(self, "_weight_bytes", m.decode_weight_bytes)
        put(self, "_kv_bytes", m.kv_bytes_per_token)
        put(self, "_token_flops", m.flops_per_token)
        put(self, "_pair_flops", m.attention_flops_per_context_token)

    def _allreduce(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        hw = self.hardware
        message = tokens * self.model.hidden * 2
        per_call = hw.allreduce_latency_s + 2 * (self.tp - 1) / self.tp * message / hw.allreduce_bw
        return 2 * self.model.layers * per_call

    def _overhead(self, batch: int) -> float:
        extra = self.hardware.eager_overhead_s if batch > self._ceiling else 0.0
        return self.hardware.step_overhead_s + extra

    def _linear_terms(self, batch: int) -> tuple[float, float, float, float, float]:
        """(c, mem_a, mem_b, comp_a, comp_b) with t = c + max(mem_a + mem_b*S, comp_a + comp_b*S)."""
        terms = self._terms.get(batch)
        if terms is None:
            constant = self._overhead(batch) + self._allreduce(batch)
            terms = constant, self._mem_a, self._mem_b, self._comp_per_seq * batch, self._comp_b
            self._terms[batch] = terms
        return terms

    # -- decode ------------------------------------------------------------
    def decode_iteration_time(self, batch: int, context_sum: float) -> float:
        c, ma, mb, ca, cb = self._linear_terms(batch)
        mem, comp = ma + mb * context_sum, ca + cb * context_sum
        return c + (max(mem, comp) if self.hardware.overlap else mem + comp)

    def decode_run_time(self, batch: int, context_sum: float, iterations: int) -> float:
        """Time of ``iterations`` decode steps; the context sum grows by ``batch`` per step."""
        if iterations <= 0:
            return 0.0
        terms = self._terms.get(batch)
        c, ma, mb, ca, cb = terms if terms is not None else self._linear_terms(batch)
        # Term j at iteration i: a_j + b_j * i with a_j = ma + mb*S0 and b_j = mb*B.
        pa, pb = ma + mb * context_sum, mb * batch
        qa, qb = ca + cb * context_sum, cb * batch
        if not self.hardware.overlap:
            return c * iterations + _sum_linear(pa + qa, pb + qb, 0, iterations)
        # _sum_max_linear((pa, pb), (qa, qb), iterations), inlined (the simulator's hot path): the same
        # operations in the same order
        k = iterations
        da, db = pa - qa, pb - qb
        if db == 0:
            return c * iterations + (_sum_linear(pa, pb, 0, k) if da >= 0 else _sum_linear(qa, qb, 0, k))
        split = min(max(math.ceil(-da / db), 0), k)
        if db > 0:  # q leads before the crossing, p after
            return c * iterations + (_sum_linear(qa, qb, 0, split) + _sum_linear(pa, pb, split, k))
        return c * iterations + (_sum_linear(pa, pb, 0, split) + _sum_linear(qa, qb, split, k))

    # -- prefill -------------------------------------------------------------
    def prefill_time(self, chunks: Iterable[tuple[int, int]]) -> float:
        """One extend batch; each chunk is (tokens already in the KV cache, new tokens)."""
        tokens = 0
        attn_pairs = 0.0
        kv_read = 0
        for offset, n in chunks:
            tokens += n
            attn_pairs += n * (offset + n / 2)
            kv_read += offset + n
        if tokens == 0:
            return 0.0
        mem = (self._weight_bytes + kv_read * self._kv_bytes) / self._bw
        comp = (self._token_flops * tokens + self._pair_flops * attn_pairs) / self._flops
        hw = self.hardware
        work = max(mem, comp) if hw.overlap else mem + comp
        return hw.step_overhead_s + hw.eager_overhead_s + work + self._allreduce(tokens)

    # -- memory ----------------------------------------------------------------
    def kv_capacity_tokens(self, mem_fraction: float) -> int:
        """KV-pool tokens per replica: ``mem_fraction`` of device memory minus the weights (SGLang)."""
        per_gpu_pool = mem_fraction * self.hardware.memory_bytes - 2 * self.model.total_params / self.tp
        if per_gpu_pool <= 0:
            return 0
        return int(self.tp * per_gpu_pool // self.model.kv_bytes_per_token)


def _sum_linear(a: float, b: float, lo: int, hi: int) -> float:
    """sum_{i=lo}^{hi-1} (a + b*i)."""
    n = hi - lo
    if n <= 0:
        return 0.0
    return n * a + b * (lo + hi - 1) * n / 2


def _sum_max_linear(p: tuple[float, float], q: tuple[float, float], k: int) -> float:
    """sum_{i=0}^{k-1} max(p_a + p_b*i, q_a + q_b*i), exactly (two lines cross at most once)."""
    (pa, pb), (qa, qb) = p, q
    da, db = pa - qa, pb - qb  # p - q = da + db*i
    if db == 0:
        return _sum_linear(pa, pb, 0, k) if da >= 0 else _sum_linear(qa, qb, 0, k)
    cross = -da / db  # p - q changes sign here
    split = min(max(math.ceil(cross), 0), k)
    if db > 0:  # q leads before the crossing, p after
        return _sum_linear(qa, qb, 0, split) + _sum_linear(pa, pb, split, k)
    return _sum_linear(pa, pb, 0, split) + _sum_linear(qa, qb, split, k)
