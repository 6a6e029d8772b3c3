"""Per-arm summaries accumulated row by row, in memory that does not grow with the run's steps.

:func:`april_bench.results.summary.summarize` feeds a run's tables through a
:class:`SummaryAccumulator`, and a run's :class:`~april_bench.results.recorder.RunRecorder` feeds
it each row as the row is recorded, so a run streaming its rows to disk need not keep them: its
summary is ready when its last row is.  What the accumulator keeps:

* sums and maxima per arm (and per (arm, repeat, block) for the paired gains);
* the completion times of the requests of steps whose step row has not come yet (the tail share
  of a step is computed, and its times dropped, when the step row comes: rows of a step's
  requests come before the step's row, as the rollout loop records them and as
  ``summarize`` feeds whole tables in order);
* the last output length of each sample still alive (APRIL's reference off-policy ratio), dropped
  when the sample's fate row comes;
* one byte per prompt uid: the fates its samples ended in (every prompt ends in exactly one);
* latency values: exact up to :data:`EXACT_LATENCIES` finished requests per arm, then a log
  histogram whose bins are 0.1% wide (percentiles within 0.1%);
* the small tables (evaluations, engine metrics) as rows.
"""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from april_bench.quantiles import quantile
from april_bench.results.episodes import EpisodeTotals
from april_bench.results.faults import FAULT_KINDS, FaultCounts

if TYPE_CHECKING:
    from april_bench.results.records import RequestRecord

__all__ = ["EXACT_LATENCIES", "WORK_FIELDS", "LatencyValues", "SummaryAccumulator"]

Row = Mapping[str, Any]

#: The engine-work fields of a step row (:class:`april_bench.engines.protocol.EngineWork`'s counts).
WORK_FIELDS = (
    "engine_iterations",
    "decode_iterations",
    "decode_tokens",
    "prefill_tokens",
    "reprefill_tokens",
)

#: Finished requests per arm whose latencies are kept exactly; past it, a 0.1% log histogram.
EXACT_LATENCIES = 16_384
_LOG_STEP = math.log1p(1e-3)
_FATES = {"trained": 1, "dropped": 2, "buffered": 4}
#: Prompt uids below this are tracked in a byte array (one byte each); others in a dict.
_DENSE_UIDS = 1 << 26


class LatencyValues:
    """Values whose percentiles are wanted: exact up to a cap, then binned 0.1% wide."""

    __slots__ = ("_bins", "_cap", "_count", "_exact")

    def __init__(self, cap: int = EXACT_LATENCIES) -> None:
        self._exact: array[float] | None = array("d")
        self._bins: dict[int, int] = {}
        self._count = 0
        self._cap = cap

    def add(self, value: float) -> None:
        self._count += 1
        if self._exact is not None:
            self._exact.append(value)
            if len(self._exact) > self._cap:
                for v in self._exact:
                    self._bin(v)
                self._exact = None
            return
        self._bin(value)

    def _bin(self, value: float) -> None:
        key = -(1 << 40) if value <= 0 else math.floor(math.log(value) / _LOG_STEP)
        self._bins[key] = self._bins.get(key, 0) + 1

    def __len__(self) -> int:
        return self._count

    def quantile(self, q: float) -> float | None:
        """Linear interpolation between closest ranks (numpy's default) while exact; the bin's
        geometric centre of the nearest rank once binned."""
        if not self._count:
            return None
        if self._exact is not None:
            return quantile(sorted(self._exact), q)
        rank = round(q * (self._count - 1))
        seen = 0
        for key in sorted(self._bins):
            seen += self._bins[key]
            if seen > rank:
                return 0.0 if key == -(1 << 40) else math.exp((key + 0.5) * _LOG_STEP)
        return None  # unreachable: the counts sum to _count


class RoundCounts:
    """An arm's engine rounds (the ``iterations`` table, sampled rows weighted by ``sampled_every``):
    decode steps and their wall milliseconds by batch size."""

    def __init__(self) -> None:
        self.decode_ms: dict[int, float] = defaultdict(float)
        self.decode_steps: dict[int, int] = defaultdict(int)
        self.prefill_ms = 0.0

    def add(self, row: Row) -> None:
        weight = int(row.get("sampled_every", 1))
        steps = int(row.get("steps", 1))
        ms = float(row["step_ms"]) * steps * weight
        if row["kind"] == "decode":
            self.decode_ms[int(row["batch"])] += ms
            self.decode_steps[int(row["batch"])] += steps * weight
        else:
            self.prefill_ms += ms

    def as_dict(self) -> dict[str, Any]:
        """``decode_steps``, ``decode_step_ms`` (mean), ``max_decode_batch``, ``low_batch_decode_share``
        (decode time at batches of at most a quarter of the largest: the tail's share) and
        ``prefill_s``."""
        total_ms = sum(self.decode_ms.values())
        steps = sum(self.decode_steps.values())
        largest = max(self.decode_ms, default=0)
        low = sum(ms for batch, ms in self.decode_ms.items() if 4 * batch <= largest)
        return {
            "decode_steps": steps,
            "decode_step_ms": total_ms / steps if steps else None,
            "max_decode_batch": largest,
            "low_batch_decode_share": low / total_ms if total_ms else None,
            "prefill_s": self.prefill_ms / 1000.0,
        }


@dataclass(slots=True)
class _Arm:
    """What one arm's summary needs, accumulated."""

    steps: int = 0
    rollout: float = 0.0
    step_time: float = 0.0
    train_time: float = 0.0
    sync_time: float = 0.0
    bookkeeping: float = 0.0
    partial: int = 0
    restarted: int = 0
    rejected: int = 0
    dropped_groups: int = 0
    abort_rounds: int = 0
    efficiency_bound: float = 0.0
    efficiency_known: bool = True
    tail: float = 0.0
    #: Sum over steps of the step's generated tokens / its rollout time, and how many steps had a rollout.
    step_rate_sum: float = 0.0
    step_rate_steps: int = 0
    work: dict[str, int] = field(default_factory=dict)
    work_counted: bool = True
    work_deterministic: bool = True
    gap_tokens: float = 0.0
    gap_weighted: float = 0.0
    gap_max: float | None = None
    # requests
    generated: int = 0
    reference_off: int = 0
    last_output: dict[tuple[Any, Any, Any], int] = field(default_factory=dict)
    open_steps: dict[tuple[int, int], array[float]] = field(default_factory=dict)
    resumed: int = 0
    reprefilled: int = 0
    reprefilled_partial: int = 0
    prefilled: int = 0
    # samples
    trained: int = 0
    trained_tokens: int = 0
    truncated: int = 0
    off_policy: int = 0
    wasted: int = 0
    buffered_tokens: int = 0
    max_span: int = 0
    max_staleness: int = 0
    fates_dense: bytearray = field(default_factory=bytearray)
    fates_sparse: dict[int, int] = field(default_factory=dict)
    #: Multi-turn runs: the trained episodes (``None`` until one is seen).
    episodes: EpisodeTotals | None = None
    # events: replica failures (None: none recorded)
    faults: FaultCounts | None = None
    rounds: RoundCounts | None = None


class SummaryAccumulator:
    """Rows in, per-arm metrics out (:meth:`summary`, the same dict ``summarize`` returns)."""

    def __init__(self) -> None:
        self._arms: dict[str, _Arm] = {}
        self._step_arms: list[str] = []  # arms in the order of their first step row
        self._blocks: list[tuple[str, int, int, bool, float, float, float, float]] = []
        self._max_step = -1
        self._repeats: dict[str, set[int]] = defaultdict(set)
        self._latency: dict[str, dict[str, LatencyValues]] = {}
        self.evals: list[Row] = []
        self.engine_metrics: list[Row] = []

    def _arm(self, name: str) -> _Arm:
        arm = self._arms.get(name)
        if arm is None:
            arm = self._arms[name] = _Arm()
        return arm

    def add(self, table: str, row: Row) -> None:
        """One row of ``table``; tables the summary does not read are ignored."""
        if table == "requests":
            self._request(row)
        elif table == "samples":
            self._sample(row)
        elif table == "steps":
            self._step(row)
        elif table == "evals":
            self.evals.append(row)
        elif table == "engine_metrics":
            self.engine_metrics.append(row)
        elif table == "iterations":
            arm = self._arm(row["arm"])
            arm.rounds = arm.rounds or RoundCounts()
            arm.rounds.add(row)
        elif table == "events" and row.get("kind") in FAULT_KINDS:
            arm = self._arm(row["arm"])
            arm.faults = arm.faults or FaultCounts()
            arm.faults.add(row)

    # ----------------------------------------------------------------- rows
    def _request(self, r: Row) -> None:
        self._request_values(
            r["arm"],
            int(r.get("output_len", 0)),  # hand-written rows may carry only what a test needs
            int(r.get("prefix_len", 0)),
            r.get("repeat", 0),
            r.get("group_uid"),
            r.get("sample_index"),
            int(r.get("prompt_len", 0)),
            r["finish_reason"],
            r["step"],
            r.get("t_submit"),
            r.get("t_first_token"),
            r["t_done"],
        )

    def add_request(self, r: RequestRecord) -> None:
        """A request row given as its record: what :meth:`add` does with ``as_row(r)``, without
        building the row (one per simulated request, where nothing writes it out)."""
        self._request_values(
            r.arm,
            r.output_len,
            r.prefix_len,
            r.repeat,
            r.group_uid,
            r.sample_index,
            r.prompt_len,
            r.finish_reason,
            r.step,
            r.t_submit,
            r.t_first_token,
            r.t_done,
        )

    def _request_values(
        self,
        arm_name: str,
        out: int,
        prefix: int,
        repeat: int,
        group_uid: int | None,
        sample_index: int | None,
        prompt_len: int,
        finish_reason: str,
        step: int,
        t_submit: float | None,
        t_first_token: float | None,
        t_done: float,
    ) -> None:
        arm = self._arm(arm_name)
        arm.generated += out
        key = (repeat, group_uid, sample_index)
        if prefix and key in arm.last_output:  # slime/APRIL's definition (see summary.py)
            arm.reference_off += arm.last_output[key]
        arm.last_output[key] = out
        input_len = prompt_len + prefix
        arm.prefilled += input_len
        if prefix > 0:
            arm.resumed += 1
            arm.reprefilled += input_len
            arm.reprefilled_partial += prefix
        if finish_reason == "abort":
            return
        step_key = (repeat, step)
        times = arm.open_steps.get(step_key)
        if times is None:
            times = arm.open_steps[step_key] = array("d")
        times.append(t_done)
        if t_submit is None:
            return
        lat = self._latency.get(arm_name)
        if lat is None:
            lat = self._latency[arm_name] = {name: LatencyValues() for name in ("ttft_s", "tpot_s", "e2e_s")}
        lat["e2e_s"].add(t_done - t_submit)
        if t_first_token is not None:
            lat["ttft_s"].add(t_first_token - t_submit)
            if out > 1:
                lat["tpot_s"].add((t_done - t_first_token) / (out - 1))

    def _sample(self, s: Row) -> None:
        arm = self._arm(s["arm"])
        fate = s["fate"]
        response = int(s["response_len"]) - int(s.get("observation_tokens", 0))  # generated tokens
        arm.wasted += int(s.get("discarded_tokens", 0))
        if fate == "trained" and s.get("episode"):
            arm.episodes = arm.episodes or EpisodeTotals()
            arm.episodes.add(s)
        if fate == "trained":
            arm.trained += 1
            arm.trained_tokens += response
            arm.off_policy += int(s.get("off_policy_tokens", 0))
            arm.truncated += s.get("status") == "truncated"
            versions = [v for v, _ in s.get("version_runs", ())]
            if versions:
                arm.max_span = max(arm.max_span, max(versions) - min(versions))
                arm.max_staleness = max(arm.max_staleness, s["train_version"] - min(versions))
        elif fate == "dropped":
            arm.wasted += response
        elif fate == "buffered":
            arm.buffered_tokens += response
        if fate in ("trained", "dropped"):  # the sample is gone: no later request resumes it
            arm.last_output.pop((s.get("repeat", 0), s.get("group_uid"), s.get("sample_index")), None)
        uid, bit = int(s.get("group_uid", -1)), _FATES.get(fate, 0)
        if s.get("reason") == "response_surplus":
            bit = 0  # a response past its group's first n: the prompt's fate is its group's
        if 0 <= uid < _DENSE_UIDS:
            if uid >= len(arm.fates_dense):
                arm.fates_dense.extend(bytes(max(uid + 1 - len(arm.fates_dense), len(arm.fates_dense))))
            arm.fates_dense[uid] |= bit | 8  # 8: launched
        else:
            arm.fates_sparse[uid] = arm.fates_sparse.get(uid, 0) | bit | 8

    def _step(self, s: Row) -> None:
        name = s["arm"]
        if name not in self._step_arms:
            self._step_arms.append(name)
        arm = self._arm(name)
        arm.steps += 1
        arm.rollout += s["rollout_time_s"]
        arm.step_time += s.get("step_time_s", 0.0)  # hand-written rows may carry only what a test needs
        arm.train_time += s.get("train_time_s", 0.0)
        arm.sync_time += s.get("weight_sync_time_s", 0.0)
        arm.bookkeeping += s.get("bookkeeping_s", 0.0)
        arm.partial += s.get("partial_samples", 0)
        arm.restarted += s.get("restarted_samples", 0)
        arm.rejected += s.get("rejected_groups", 0)
        arm.dropped_groups += s.get("dropped_groups", 0)
        arm.abort_rounds += s.get("abort_rounds", 0)
        if s["rollout_time_s"] > 0 and s.get("generated_tokens") is not None:  # APRIL's per-step metric
            arm.step_rate_sum += s["generated_tokens"] / s["rollout_time_s"]
            arm.step_rate_steps += 1
        rate = s.get("saturated_tokens_per_s")
        if rate is None:
            arm.efficiency_known = False
        else:
            arm.efficiency_bound += s["rollout_time_s"] * rate
        repeat = s.get("repeat", 0)
        times = arm.open_steps.pop((repeat, s["step"]), None)
        if times:
            ordered = sorted(times)
            arm.tail += s["t_start"] + s["rollout_time_s"] - ordered[math.ceil(0.9 * len(ordered)) - 1]
        if s.get("engine_iterations") is None:
            arm.work_counted = False
        else:
            for key in WORK_FIELDS:
                arm.work[key] = arm.work.get(key, 0) + int(s[key])
            arm.work_deterministic = arm.work_deterministic and bool(s.get("work_deterministic"))
        metrics = s.get("train_metrics") or {}
        if "engine_logprob_tokens" in metrics:
            tokens = metrics["engine_logprob_tokens"]
            arm.gap_tokens += tokens
            arm.gap_weighted += metrics["engine_logprob_gap_mean"] * tokens
            top = metrics["engine_logprob_gap_max"]
            arm.gap_max = top if arm.gap_max is None else max(arm.gap_max, top)
        self._repeats[name].add(repeat)
        self._max_step = max(self._max_step, s["step"])
        self._blocks.append(
            (
                name,
                repeat,
                s["step"],
                bool(s.get("warmup")),
                s.get("generated_tokens", 0.0),
                s.get("trained_tokens", 0.0),
                s.get("rollout_time_s", 0.0),
                s.get("step_time_s", 0.0),
            )
        )

    # -------------------------------------------------------------- results
    def arms(self) -> list[str]:
        """Arms with step rows, in the order of their first one."""
        return list(self._step_arms)

    def arm_metrics(self, name: str) -> dict[str, Any]:
        """An arm's metrics (the ``summarize`` fields that come from its own rows)."""
        a = self._arms[name]
        n = a.steps
        generated = a.generated
        counted = bool(n) and a.work_counted
        work: dict[str, Any] = {}
        for key in WORK_FIELDS:
            work[key] = a.work.get(key, 0) if counted else None
        iterations, decode = work["engine_iterations"], work["decode_iterations"]
        total = a.rollout
        return {
            "steps": n,
            "rollout_time_s": a.rollout,
            "rollout_time_per_step_s": a.rollout / n if n else None,
            "step_time_s": a.step_time,
            "step_time_per_step_s": a.step_time / n if n else None,
            "train_time_per_step_s": a.train_time / n if n else None,
            "weight_sync_time_per_step_s": a.sync_time / n if n else None,
            "generated_tokens": generated,
            "trained_tokens": a.trained_tokens,
            "wasted_tokens": a.wasted,
            "buffered_tokens_at_end": a.buffered_tokens,
            "generated_tokens_per_s": generated / a.rollout if a.rollout else None,
            "useful_tokens_per_s": a.trained_tokens / a.rollout if a.rollout else None,
            "tokens_throughput_step_mean": a.step_rate_sum / a.step_rate_steps if a.step_rate_steps else None,
            "trained_tokens_per_step_s": a.trained_tokens / a.step_time if a.step_time else None,
            **work,
            "work_deterministic": a.work_deterministic if counted else None,
            "mean_decode_batch": work["decode_tokens"] / decode if decode else None,
            "generated_tokens_per_iteration": generated / iterations if iterations else None,
            "useful_tokens_per_iteration": a.trained_tokens / iterations if iterations else None,
            "rollout_efficiency": generated / a.efficiency_bound
            if a.efficiency_known and a.efficiency_bound
            else None,
            "tail_time_share": a.tail / total if total else None,
            "off_policy_token_ratio": a.off_policy / a.trained_tokens if a.trained_tokens else None,
            "off_policy_ratio_reference_def": a.reference_off / (generated + a.reference_off)
            if generated + a.reference_off
            else None,
            "max_version_span": a.max_span,
            "max_staleness": a.max_staleness,
            "partial_samples": a.partial,
            "restarted_samples": a.restarted,
            "rejected_groups": a.rejected,
            "dropped_groups": a.dropped_groups,
            "truncated_share": a.truncated / a.trained if a.trained else None,
            "mean_response_len": a.trained_tokens / a.trained if a.trained else None,
            "prompts": _prompt_counts(a),
            "abort_rounds": a.abort_rounds,
            "bookkeeping_s_per_step": a.bookkeeping / n if n else None,
            "bookkeeping_share_of_engine_time": a.bookkeeping / a.rollout if a.rollout else None,
            "failures": None if a.faults is None else a.faults.as_dict(),
            # only with rows of the iterations table: runs without them keep their summary's fields
            **({"iterations": a.rounds.as_dict()} if a.rounds is not None else {}),
        }

    def engine(self, name: str) -> dict[str, Any]:
        """What ``engine_report`` computes for an arm (re-prefill, prefix cache, log-prob gap)."""
        from april_bench.results.engine_report import prefix_cache

        a = self._arms[name]
        n = a.steps
        return {
            "resumed_requests": a.resumed,
            "reprefilled_tokens": a.reprefilled,
            "reprefilled_partial_tokens": a.reprefilled_partial,
            "reprefilled_tokens_per_step": a.reprefilled / n if n else None,
            "reprefill_share_of_prefill": a.reprefilled / a.prefilled if a.prefilled else None,
            **prefix_cache([m for m in self.engine_metrics if m["arm"] == name]),
            **(
                {
                    "logprob_gap_mean": a.gap_weighted / a.gap_tokens,
                    "logprob_gap_max": a.gap_max,
                    "logprob_gap_tokens": int(a.gap_tokens),
                }
                if a.gap_tokens
                else {"logprob_gap_mean": None, "logprob_gap_max": None, "logprob_gap_tokens": 0}
            ),
        }

    def episodes(self, name: str) -> dict[str, Any] | None:
        """Per-episode figures of an arm's trained episodes (``None``: no episodes)."""
        a = self._arms[name]
        return None if a.episodes is None else a.episodes.metrics(a.steps)

    def latency(self, name: str) -> dict[str, Any]:
        lat = self._latency.get(name)
        if lat is None:
            return {}
        out: dict[str, Any] = {"requests": len(lat["e2e_s"])}
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            out[metric] = {f"p{round(q * 100)}": lat[metric].quantile(q) for q in (0.5, 0.9, 0.99)}
        return out

    def step_rows(self) -> list[dict[str, Any]]:
        """The step fields the paired gains read, one small dict per step row."""
        keys = ("arm", "repeat", "step", "warmup", "generated_tokens", "trained_tokens")
        return [
            dict(zip((*keys, "rollout_time_s", "step_time_s"), block, strict=True)) for block in self._blocks
        ]

    def repeats(self, name: str) -> int:
        return len(self._repeats[name])

    @property
    def max_step(self) -> int:
        return self._max_step


def _prompt_counts(a: _Arm) -> dict[str, int]:
    counts = {"launched": 0, "trained": 0, "dropped": 0, "buffered": 0, "inconsistent": 0}
    names = {bit: fate for fate, bit in _FATES.items()}
    for value in [*a.fates_dense, *a.fates_sparse.values()]:
        if not value & 8:
            continue
        counts["launched"] += 1
        fates = value & 7
        if fates in names:
            counts[names[fates]] += 1
        elif fates:
            counts["inconsistent"] += 1
        else:
            counts["inconsistent"] += 1  # a fate this accounting does not know
    return counts
