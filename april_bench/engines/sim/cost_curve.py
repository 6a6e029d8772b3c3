"""A measured cost curve of one inference engine, and the simulator's cost model built from it.

:func:`april_bench.curve_measure.measure_cost_curve` times an engine through the ordinary engine protocol
(no engine internals): batches of ``B`` requests with ``C``-token prompts that
replay ``k`` new tokens each, and single requests that replay one token.  From
those it fits

* the **prefill** cost (time to the first token of an extend batch, which
  samples that token, as SGLang and the embedded engine do) as
  ``prefill_s = prefill_base_s + prefill_per_token_s * tokens``;
* the **decode** step time as
  ``step_s = decode_base_s + decode_per_seq_s * B + decode_per_context_token_s * S``
  with ``S`` the sum of the running requests' contexts (prompt + tokens so far),
  from ``(T(B, C, k) - prefill_s(B * C)) / (k - 1)`` at the mean context of the run.

:class:`MeasuredCost` answers the questions the simulated replica asks of
:class:`~april_bench.engines.sim.cost.CostModel` from those coefficients, so
``--engine sim --engine-arg cost_curve=FILE`` simulates *that* engine (one
replica, its own slot and prefill limits).  ``simcheck`` measures one in the
same command; ``whatif`` (``--cost-curve FILE``) reuses a saved one.

JSON schema (``CostCurve.to_json``; ``schema_version`` 1)::

    {
      "schema_version": 1,
      "kind": "april-bench cost curve",
      "engine": "hf",                    # engine name (ENGINES)
      "model": "tiny",                   # model it served
      "hardware": "cpu",                 # hardware profile name
      "dtype": "float32" | null,
      "virtual_time": false,             # measured on a virtual clock (the fake engine): exact
      "max_running": 128,                # requests one engine runs at once
      "kv_capacity_tokens": 131072,      # tokens of KV the engine holds in all
      "chunk_tokens": 4096,              # prompt tokens per extend (prefill) batch
      "abort_extra_steps": 1,            # decode steps a running request makes after an abort
      "prefill": {"base_s": float, "per_token_s": float},
      "decode": {"base_s": float, "per_seq_s": float, "per_context_token_s": float},
      "points": {                        # the raw measurements (medians over repeats), seconds
        "prefill": [{"tokens": int, "seconds": float}, ...],
        "decode": [{"batch": int, "context": int, "new_tokens": int, "seconds": float,
                    "step_s": float, "context_sum": float}, ...]
      },
      "load": [1.2, 0.9, 0.7] | null,     # os.getloadavg() while measuring (null on a virtual clock)
      "utc": "2026-11-26T13:50:00+00:00"
    }

Coefficients are least-squares fits clamped at zero (a negative cost is
noise); the points are kept so a reader can judge the fit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.engines.sim.cost import DecodeCost

__all__ = ["SCHEMA_VERSION", "UNLIMITED", "CostCurve", "MeasuredCost"]

SCHEMA_VERSION = 1
_KIND = "april-bench cost curve"
#: Limits of an engine that does not say (the fake engine: unlimited).
#: A limit the engine does not have (slots, KV tokens, prefill chunk).
UNLIMITED = 1 << 30


@dataclass(frozen=True, slots=True)
class CostCurve:
    """A measured cost curve (see the module docstring for the JSON form)."""

    engine: str
    model: str
    hardware: str
    prefill_base_s: float
    prefill_per_token_s: float
    decode_base_s: float
    decode_per_seq_s: float
    decode_per_context_token_s: float
    max_running: int = UNLIMITED
    kv_capacity_tokens: int = UNLIMITED
    chunk_tokens: int = UNLIMITED
    abort_extra_steps: int = 1
    dtype: str | None = None
    virtual_time: bool = False
    prefill_points: tuple[tuple[int, float], ...] = ()
    decode_points: tuple[dict[str, float], ...] = ()
    load: tuple[float, ...] | None = None
    utc: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def __post_init__(self) -> None:
        costs = (
            self.prefill_base_s,
            self.prefill_per_token_s,
            self.decode_base_s,
            self.decode_per_seq_s,
            self.decode_per_context_token_s,
        )
        if any(not math.isfinite(c) or c < 0 for c in costs):
            raise ConfigError(f"cost curve of {self.engine}: costs must be finite and >= 0, got {costs}")
        if self.decode_base_s + self.decode_per_seq_s <= 0:
            raise ConfigError(f"cost curve of {self.engine}: a decode step must take time")
        limits = (self.max_running, self.kv_capacity_tokens, self.chunk_tokens)
        if min(limits) < 1 or self.abort_extra_steps < 0:
            raise ConfigError(f"cost curve of {self.engine}: limits must be >= 1, abort_extra_steps >= 0")

    def step_s(self, batch: int, context_sum: float) -> float:
        per_seq, per_ctx = self.decode_per_seq_s, self.decode_per_context_token_s
        return self.decode_base_s + per_seq * batch + per_ctx * context_sum

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * tokens

    # ----------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": _KIND,
            "engine": self.engine,
            "model": self.model,
            "hardware": self.hardware,
            "dtype": self.dtype,
            "virtual_time": self.virtual_time,
            "max_running": self.max_running,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "chunk_tokens": self.chunk_tokens,
            "abort_extra_steps": self.abort_extra_steps,
            "prefill": {"base_s": self.prefill_base_s, "per_token_s": self.prefill_per_token_s},
            "decode": {
                "base_s": self.decode_base_s,
                "per_seq_s": self.decode_per_seq_s,
                "per_context_token_s": self.decode_per_context_token_s,
            },
            "points": {
                "prefill": [{"tokens": t, "seconds": s} for t, s in self.prefill_points],
                "decode": [dict(p) for p in self.decode_points],
            },
            "load": list(self.load) if self.load is not None else None,
            "utc": self.utc,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, where: str = "cost curve") -> CostCurve:
        if data.get("kind") != _KIND or data.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError(
                f"{where} is not an april-bench cost curve of schema_version {SCHEMA_VERSION} "
                "(write one with `python -m april_bench simcheck`)"
            )
        try:
            return cls(
                engine=str(data["engine"]),
                model=str(data["model"]),
                hardware=str(data["hardware"]),
                dtype=data.get("dtype"),
                virtual_time=bool(data.get("virtual_time", False)),
                max_running=int(data["max_running"]),
                kv_capacity_tokens=int(data["kv_capacity_tokens"]),
                chunk_tokens=int(data["chunk_tokens"]),
                abort_extra_steps=int(data.get("abort_extra_steps", 1)),
                prefill_base_s=float(data["prefill"]["base_s"]),
                prefill_per_token_s=float(data["prefill"]["per_token_s"]),
                decode_base_s=float(data["decode"]["base_s"]),
                decode_per_seq_s=float(data["decode"]["per_seq_s"]),
                decode_per_context_token_s=float(data["decode"]["per_context_token_s"]),
                prefill_points=tuple(
                    (int(p["tokens"]), float(p["seconds"])) for p in data["points"]["prefill"]
                ),
                decode_points=tuple(dict(p) for p in data["points"]["decode"]),
                load=tuple(data["load"]) if data.get("load") is not None else None,
                utc=str(data.get("utc", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: malformed cost curve ({type(exc).__name__}: {exc})") from None

    def save(self, path: Path) -> None:
        from april_bench.fsio import write_atomic

        write_atomic(path, json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load_file(cls, path: Path | str) -> CostCurve:
        from april_bench.bounded import MAX_CONFIG_BYTES, read_bytes

        path = Path(path)
        try:
            data = json.loads(read_bytes(path, 16 * MAX_CONFIG_BYTES, "cost curve").decode("utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"cost curve {path} does not exist") from None
        except (OSError, ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deeply
            raise ConfigError(f"cost curve {path} cannot be read ({type(exc).__name__}: {exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"cost curve {path}: expected a JSON object")
        return cls.from_json(data, where=str(path))


class MeasuredCost(DecodeCost):
    """The simulated replica's cost model, answered from a :class:`CostCurve` (one engine, tp 1)."""

    def __init__(self, curve: CostCurve) -> None:
        self.curve = curve

    def decode_iteration_time(self, batch: int, context_sum: float) -> float:
        return self.curve.step_s(batch, context_sum)

    def decode_run_time(self, batch: int, context_sum: float, iterations: int) -> float:
        """``iterations`` decode steps; the context sum grows by ``batch`` per step."""
        if iterations <= 0:
            return 0.0
        c = self.curve
        first = c.step_s(batch, context_sum)
        return iterations * first + c.decode_per_context_token_s * batch * iterations * (iterations - 1) / 2

    def prefill_time(self, chunks: Any) -> float:
        tokens = sum(n for _, n in chunks)
        return self.curve.prefill_s(tokens) if tokens else 0.0

    def kv_capacity_tokens(self, mem_fraction: float) -> int:
        del mem_fraction  # measured: the engine's own pool
        return self.curve.kv_capacity_tokens
