"""Measure an engine's cost curve through the ordinary engine protocol (``simcheck`` does): what
:mod:`april_bench.engines.sim.cost_curve` describes.  It lives above ``engines/`` because it
drives any engine and builds the simulator's :class:`~april_bench.engines.sim.cost_curve.CostCurve`."""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Sequence

import numpy as np

from april_bench.config import ConfigError
from april_bench.engines.protocol import Engine, GenerateRequest, SamplingParams
from april_bench.engines.sim import UNLIMITED, CostCurve

__all__ = ["measure_cost_curve", "nonnegative_fit"]


# ---------------------------------------------------------------------- measuring
def _limits(engine: Engine) -> dict[str, int]:
    """Slots, KV tokens and prefill chunk of an engine, from its config where it has one
    (hf: max_running_requests x max_context_len slots; vLLM: max_num_seqs; the fake: unlimited)."""
    config = getattr(engine, "config", None)
    slots = getattr(config, "max_running_requests", None) or getattr(config, "max_running", None)
    slots = getattr(config, "max_num_seqs", None) or slots
    context = getattr(config, "max_context_len", None) or getattr(config, "max_model_len", None)
    chunk = getattr(config, "max_prefill_tokens", None) or getattr(config, "max_num_batched_tokens", None)
    running = int(slots) if slots else UNLIMITED
    kv = int(running * context) if slots and context else UNLIMITED
    pool = getattr(engine, "kv_capacity_tokens", None)  # vLLM: its KV blocks, smaller than slots x context
    if callable(pool) and pool():
        kv = min(kv, int(pool()))
    return {
        "context_tokens": int(context) if context else UNLIMITED,
        "max_running": running,
        "kv_capacity_tokens": kv,
        "chunk_tokens": int(chunk) if chunk else UNLIMITED,
    }


async def _time_batch(
    engine: Engine, tag: str, batch: int, context: int, new_tokens: int, vocab: int
) -> float:
    loop = asyncio.get_running_loop()
    tokens = engine.info.produces_tokens
    requests = [
        GenerateRequest(
            request_id=f"costcurve-{tag}-{i}",
            input_len=context,
            max_new_tokens=new_tokens,
            sampling=SamplingParams(temperature=1.0, seed=i),
            input_ids=tuple((7 * i + 13 * j + 1) % vocab for j in range(context)) if tokens else None,
            replay_len=new_tokens,
        )
        for i in range(batch)
    ]
    start = loop.time()
    async for _ in engine.generate(requests):
        pass
    return loop.time() - start


def nonnegative_fit(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Least squares, clamped at zero (refit without a column whose coefficient came out negative)."""
    a, b = np.asarray(rows, dtype=float), np.asarray(y, dtype=float)
    keep = list(range(a.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a[:, keep], b, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            out = [0.0] * a.shape[1]
            for k, c in zip(keep, coef, strict=True):
                out[k] = max(0.0, float(c))
            return out
        keep.pop(int(np.argmin(coef)))


async def measure_cost_curve(
    engine: Engine,
    *,
    engine_name: str,
    model: str,
    hardware: str,
    vocab: int = 100,
    batches: Sequence[int] = (1, 4, 16),
    contexts: Sequence[int] = (8, 64),
    new_tokens: int = 16,
    prefill_lengths: Sequence[int] = (8, 64, 256),
    repeats: int = 3,
) -> CostCurve:
    """Time ``engine`` (already started) and fit its cost curve.  Every point is the median of
    ``repeats`` timings; the first call of each shape is a warm-up and is discarded."""
    if new_tokens < 2:
        raise ConfigError("a cost curve needs at least 2 new tokens per decode measurement")
    limits = _limits(engine)
    top = min(limits["max_running"], max(batches))
    batches = sorted({min(b, top) for b in batches})
    # every measured request must fit one sequence of the engine (prompt + new tokens)
    room = limits["context_tokens"] - new_tokens
    if room < 1:
        raise ConfigError(f"the engine holds {limits['context_tokens']} tokens per sequence: too few to time")
    contexts = sorted({min(c, room) for c in contexts})
    prefill_lengths = sorted({min(p, room) for p in prefill_lengths})
    virtual = engine.info.virtual_time

    async def median(tag: str, batch: int, context: int, k: int) -> float:
        await _time_batch(engine, f"{tag}-warm", batch, context, k, vocab)
        times = [await _time_batch(engine, f"{tag}-{r}", batch, context, k, vocab) for r in range(repeats)]
        return statistics.median(times)

    load: tuple[float, ...] | None = None if virtual else os.getloadavg()
    prefill_points = [(p, await median(f"p{p}", 1, p, 1)) for p in prefill_lengths]
    p_base, p_tok = nonnegative_fit([(1.0, p) for p, _ in prefill_points], [s for _, s in prefill_points])
    decode_points: list[dict[str, float]] = []
    for b in batches:
        for c in contexts:
            seconds = await median(f"d{b}x{c}", b, c, new_tokens)
            step = max(0.0, seconds - (p_base + p_tok * b * c)) / (new_tokens - 1)
            context_sum = b * (c + new_tokens / 2)
            decode_points.append(
                {
                    "batch": b,
                    "context": c,
                    "new_tokens": new_tokens,
                    "seconds": seconds,
                    "step_s": step,
                    "context_sum": context_sum,
                }
            )
    d_base, d_seq, d_ctx = nonnegative_fit(
        [(1.0, p["batch"], p["context_sum"]) for p in decode_points], [p["step_s"] for p in decode_points]
    )
    if d_base + d_seq <= 0:
        d_base = min(p["step_s"] for p in decode_points) or 1e-9
    if load is not None:
        load = tuple(round(x, 2) for x in (*load, *os.getloadavg()))
    return CostCurve(
        engine=engine_name,
        model=model,
        hardware=hardware,
        dtype=engine.info.dtype,
        virtual_time=virtual,
        prefill_base_s=p_base,
        prefill_per_token_s=p_tok,
        decode_base_s=d_base,
        decode_per_seq_s=d_seq,
        decode_per_context_token_s=d_ctx,
        prefill_points=tuple(prefill_points),
        decode_points=tuple(decode_points),
        load=load,
        max_running=limits["max_running"],
        kv_capacity_tokens=limits["kv_capacity_tokens"],
        chunk_tokens=limits["chunk_tokens"],
        # SGLang runs one more decode step after an abort; the embedded engine, vLLM and the fake return
        # at the end of the step in progress
        abort_extra_steps=1 if engine_name.startswith("sglang") else 0,
    )
