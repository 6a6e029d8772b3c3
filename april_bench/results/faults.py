"""What replica failures cost an arm, from its events table (:mod:`april_bench.engines.replicas`, the
simulator's :mod:`april_bench.engines.sim.failures`): the summary's ``failures`` field.

``replica_failures``: ``replica_failed`` rows; ``requeued_requests`` and ``requeued_tokens``: the
``requests_requeued`` rows' requests and tokens (the input tokens the survivors prefill again);
``lost_decode_tokens``: tokens the dead replicas had decoded and never delivered (the ``replica_failed``
rows' tokens: the simulator counts them; ``None`` from the measured pools, which do not know them);
``restarts``: ``replica_restarted`` rows; ``lost_all``: the run ended because no replica was left.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FAULT_KINDS", "FaultCounts"]

FAULT_KINDS = frozenset({"replica_failed", "requests_requeued", "replica_restarted", "replica_lost_all"})


@dataclass(slots=True)
class FaultCounts:
    replica_failures: int = 0
    requeued_requests: int = 0
    requeued_tokens: int = 0
    lost_decode_tokens: int | None = None  # None: the engine does not know (the measured pools)
    restarts: int = 0
    lost_all: bool = False

    def add(self, row: Mapping[str, Any]) -> None:
        kind = row.get("kind")
        if kind == "replica_failed":
            self.replica_failures += 1
            if row.get("tokens") is not None:
                self.lost_decode_tokens = (self.lost_decode_tokens or 0) + int(row["tokens"])
        elif kind == "requests_requeued":
            self.requeued_requests += int(row.get("requests") or 0)
            self.requeued_tokens += int(row.get("tokens") or 0)
        elif kind == "replica_restarted":
            self.restarts += 1
        elif kind == "replica_lost_all":
            self.lost_all = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def failure_lines(rows: list[dict[str, Any]], *, kind: str) -> list[str]:
    """The table of what replica failures cost each arm (``ablate``, ``whatif``): empty when no row
    recorded a failure.  ``rows``: with ``arm``, ``failures`` (:meth:`FaultCounts.as_dict` or None),
    ``step_time_per_step_s`` and ``rollout_time_per_step_s``."""
    from april_bench.results.table import md_cell

    if not any(r.get("failures") for r in rows):
        return []
    lines = [
        "",
        f"### Replica failures and their cost ({kind})",
        "",
        "| Arm | Failures | Requests re-queued | Tokens re-prefilled | Decoded tokens lost | Restarts "
        "| Rollout s/step | Step s/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = r.get("failures") or FaultCounts().as_dict()
        lines.append(
            f"| {md_cell(r['arm'])} | {f['replica_failures']} | {f['requeued_requests']} "
            f"| {f['requeued_tokens']:,} "
            f"| {_n(f['lost_decode_tokens'])} | {f['restarts']} | {_s(r.get('rollout_time_per_step_s'))} "
            f"| {_s(r.get('step_time_per_step_s'))} |"
        )
    lines += [
        "",
        "Tokens re-prefilled: the input (prompt + partial) of every request a dead replica held, prefilled "
        "again on a survivor; decoded tokens lost: what the dead replica had decoded for them and never "
        "delivered (decoded again). Compare the step times with a run without failures.",
    ]
    return lines


def _n(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"
