"""Speculative decoding as a cost option of the simulator (``--engine-arg speculative=DRAFT``).

A drafter proposes ``gamma`` tokens per request, one decode step of the draft model each, and the
target verifies them in one forward over ``gamma + 1`` tokens per request; with a per-token
acceptance rate ``alpha`` a step yields on average (Leviathan, Kalman and Matias, *Fast Inference
from Transformers via Speculative Decoding*, arXiv 2211.17192, eq. 1)::

    E(alpha, gamma) = (1 - alpha**(gamma + 1)) / (1 - alpha)

tokens per request.  The simulator keeps its unit (one decode iteration = one token per running
request), so a speculative iteration costs ``(gamma x t_draft(B, S) + t_verify(B, S)) / E``:

* ``t_draft`` is the draft model's own roofline decode step at batch ``B`` (default drafter:
  Qwen3-0.6B, the smallest model of the target's family and tokenizer), without the per-iteration
  host overhead: the draft steps run inside the step's one scheduler iteration (SGLang and vLLM
  launch them back to back, captured in CUDA graphs), which pays that overhead once;
* ``t_verify`` is the target's roofline with ``B x (gamma + 1)`` query tokens: the weights and the KV
  are read once, the matmul and attention FLOPs grow ``gamma + 1``-fold.

Batch size enters through both costs.  At a small batch decode is memory-bound, the verify costs
about one plain step, and the step yields ``E`` tokens: speculation pays (the long tail, where
EfficientRollout, arXiv 2606.18967, and BubbleSpec apply it).  At a large batch the verify is
compute-bound and ``gamma + 1`` times a plain step: it loses.  The engine speculates only where it
helps (TLT and EfficientRollout turn it off in compute-bound regimes): each decode run, from its
first iteration's context, takes the cheaper per-token cost, and never speculates above
``speculative_max_batch`` running requests (vLLM's ``speculative_disable_by_batch_size``).
``alpha`` does not depend on the batch: it is a property of the drafter, the task and the sampling
temperature; its default 0.6 is an assumption to sweep, not a measured pair.  Lengths, and so every
schedule, are those of plain decoding (speculation is lossless); the drafter's weights and KV come out
of the KV pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from april_bench.engines.sim.cost import CostModel, DecodeCost, _sum_linear, _sum_max_linear

__all__ = ["SpeculativeCost", "expected_tokens"]


def expected_tokens(acceptance: float, draft_tokens: int) -> float:
    """Tokens a request gains per speculative step (Leviathan et al., eq. 1)."""
    if acceptance >= 1.0:
        return float(draft_tokens + 1)
    return (1.0 - acceptance ** (draft_tokens + 1)) / (1.0 - acceptance)


@dataclass(frozen=True)
class SpeculativeCost(DecodeCost):
    """The target's roofline, decoding speculatively with a drafter where that is cheaper."""

    target: CostModel
    draft: CostModel
    draft_tokens: int = 4
    acceptance: float = 0.6
    max_batch: int | None = None

    def _tokens(self) -> float:
        return expected_tokens(self.acceptance, self.draft_tokens)

    def _spec_time(self, batch: int, context_sum: float, iterations: int) -> float:
        g, tokens = self.draft_tokens, self._tokens()
        d_c, d_ma, d_mb, d_ca, d_cb = self.draft._linear_terms(batch)
        d_c -= self.draft._overhead(batch)  # the draft steps run inside the step's one scheduler iteration
        v_c, v_ma, v_mb, v_ca, v_cb = self.target._linear_terms(batch * (g + 1))
        total = 0.0
        for c, mem, comp, times in (
            (d_c, (d_ma + d_mb * context_sum, d_mb * batch), (d_ca + d_cb * context_sum, d_cb * batch), g),
            # the verify: weights and KV read once; the FLOPs of g + 1 query tokens per request
            (
                v_c,
                (v_ma + v_mb * context_sum, v_mb * batch),
                (v_ca + (g + 1) * v_cb * context_sum, (g + 1) * v_cb * batch),
                1,
            ),
        ):
            if self.target.hardware.overlap:
                work = _sum_max_linear(mem, comp, iterations)
            else:
                work = _sum_linear(mem[0] + comp[0], mem[1] + comp[1], 0, iterations)
            total += times * (c * iterations + work)
        return total / tokens

    def _speculates(self, batch: int, context_sum: float) -> bool:
        if self.max_batch is not None and batch > self.max_batch:
            return False
        return self._spec_time(batch, context_sum, 1) < self.target.decode_run_time(batch, context_sum, 1)

    def decode_iteration_time(self, batch: int, context_sum: float) -> float:
        return self.decode_run_time(batch, context_sum, 1)

    def decode_run_time(self, batch: int, context_sum: float, iterations: int) -> float:
        if iterations <= 0:
            return 0.0
        if self._speculates(batch, context_sum):
            return self._spec_time(batch, context_sum, iterations)
        return self.target.decode_run_time(batch, context_sum, iterations)

    def prefill_time(self, chunks: Iterable[tuple[int, int]]) -> float:
        """The target's extend batch and the drafter's over the same tokens."""
        chunks = list(chunks)
        return self.target.prefill_time(chunks) + self.draft.prefill_time(chunks)

    def kv_capacity_tokens(self, mem_fraction: float) -> int:
        """KV-pool tokens per replica with the drafter's weights resident and its KV beside the target's."""
        t, d = self.target, self.draft
        pool = (
            mem_fraction * t.hardware.memory_bytes - 2 * (t.model.total_params + d.model.total_params) / t.tp
        )
        if pool <= 0:
            return 0
        return int(t.tp * pool // (t.model.kv_bytes_per_token + d.model.kv_bytes_per_token))
