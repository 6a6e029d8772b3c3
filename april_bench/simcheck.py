"""``simcheck``: predict every arm with the simulator, seal the prediction, then measure it on the real
engine, and pass or fail on what the machine's load cannot move.

Phases, in this order:

1. **cost curve**: time the run's engine through the engine protocol
   (:func:`april_bench.curve_measure.measure_cost_curve`), ``cost_curve.json``: prices the
   simulator's steps (the wall-clock prediction, secondary) and gives it the engine's limits;
2. **lengths**: with ``--length-oracle`` (forced lengths) the prediction replays exactly the lengths the
   measured run will generate - the same oracle over the same prompts, a function of the seed - so
   what is left to predict is the engine's schedule.  Without it, a sync-only run with a *held-out*
   seed (``seed + 1``) records a length trace (``trace.jsonl``) the prediction replays: a check of the
   length model, not of the schedule (the model's own lengths cannot be known before it samples them);
3. **prediction**: the experiment on ``--engine sim``, one replica priced by the curve, with the engine's
   limits: per arm, engine iterations per step, the decode-batch histogram, prefill and re-prefill
   tokens, aborted requests, the off-policy token share and the gains per engine iteration.  Written to
   ``prediction.json``; its sha256 and time go into ``simcheck.json`` (``prediction_sha256``,
   ``prediction_utc``) **before any measured arm starts**;
4. **measurement**: the experiment itself, arms interleaved and repeated as ``run`` does (held-out
   evaluations off: accuracy is not what simcheck checks), an ordinary run directory in ``measured/``.

**The checks** (per arm, the baseline's included; tolerance 3% for the engines whose schedule is
deterministic - hf, fake - and 5% for vLLM): iterations per step, prefill and re-prefill tokens per step,
aborted requests per step, decode tokens per iteration (relative error); the off-policy token share
(absolute); the decode-batch histogram (total-variation distance over power-of-two batch buckets);
the gain per engine iteration (relative error of ``1 + gain``).  With forced lengths the measured
samples' lengths are checked against the oracle's first: the prediction replays the measured run's own
lengths.  The verdict is ``pass`` or ``fail``; without forced lengths it is ``not checkable``.

**Time** (secondary, load-proof where the engine logs its rounds - hf): the engine's scheduler-thread
CPU seconds per round are fitted on the sync arm's rounds (decode: base + per sequence + per KV token;
prefill: base + per token) and applied to the other arms' logged rounds: predicted against measured
engine CPU seconds, and the gain in generated tokens per engine CPU second.  The wall-clock gain (paired
median over interleaved blocks) is reported last; it is ``inconclusive`` when its 95% interval is wider
than +-10 points or it rests on fewer than 3 pairs (two pairs are never called an interval).

Every simcheck run appends one line to the validation log (``--validation-log``; the CLI's default is
``results/validation/simcheck-log.jsonl`` in the checkout): time, commit, engine, configuration, the
prediction's hash, the verdict and the errors.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.engines.protocol import HISTOGRAM, ITERATIONS, METRICS, Engine
from april_bench.experiment_config import ExperimentConfig
from april_bench.redact import redact
from april_bench.results.store import write_json_atomic, write_text_atomic

__all__ = [
    "WIDE_INTERVAL",
    "MeasuredIterations",
    "SimcheckResult",
    "check_arm",
    "histogram_distance",
    "measured_iterations_per_step",
    "render_simcheck",
    "run_simcheck",
    "tolerance_for",
    "trace_rows",
    "wall_clock_verdict",
]

#: A wall-clock interval wider than this (half-width, gain units) makes the wall-clock check inconclusive.
WIDE_INTERVAL = 0.10
#: Fewer paired blocks than this give no interval at all.
MIN_PAIRS = 3
#: The counted quantities compared per arm (per training step): name -> the step row's field.
_PER_STEP = {
    "iterations_per_step": "engine_iterations",
    "decode_iterations_per_step": "decode_iterations",
    "decode_tokens_per_step": "decode_tokens",
    "prefill_tokens_per_step": "prefill_tokens",
    "reprefill_tokens_per_step": "reprefill_tokens",
    "aborted_requests_per_step": "aborted_requests",
    "generated_tokens_per_step": "generated_tokens",
}


def tolerance_for(engine: str) -> float:
    """3% for engines whose schedule is a function of the requests (hf, fake), 5% for the others
    (vLLM batches whatever has arrived when it steps)."""
    return 0.03 if engine in ("hf", "fake") else 0.05


@dataclasses.dataclass(frozen=True, slots=True)
class SimcheckResult:
    """What ``simcheck`` found, as written to ``simcheck.json``."""

    data: dict[str, Any]

    def arm(self, label: str) -> dict[str, Any]:
        return next(a for a in self.data["arms"] if a["arm"] == label)

    @property
    def verdict(self) -> str:
        return str(self.data["verdict"])


def trace_rows(samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A length trace from a run's sample rows: every trained sample's ``uid``, ``length``, ``reward``."""
    rows = [
        {
            "uid": s["group_uid"],
            "index": s["sample_index"],
            "length": s["response_len"],
            "reward": s["reward"],
        }
        for s in samples
        if s["fate"] == "trained" and s["response_len"] >= 1
    ]
    rows.sort(key=lambda r: (r["uid"], r["index"]))
    return rows


@dataclasses.dataclass(frozen=True, slots=True)
class MeasuredIterations:
    """An arm's engine iterations per training step, from the step rows' engine accounting."""

    per_step: float | None
    #: True when the counts depend on the requests and seeds alone (hf, fake); False for vLLM, whose
    #: scheduler batches whatever has arrived when it steps; None when the engine does not count.
    deterministic: bool | None


def measured_iterations_per_step(steps: Sequence[Mapping[str, Any]], arm: str) -> MeasuredIterations:
    """Engine iterations (forward passes: decode steps + prefill forwards) per training step of
    ``arm``: the step rows' ``engine_iterations`` (docs/measured.md) summed over every step of every
    repeat (warm-up steps included, as the prediction counts them) and divided by the number of
    step rows.  None when the arm has no rows or the engine does not count its work."""
    rows = [s for s in steps if s["arm"] == arm]
    if not rows or any(s.get("engine_iterations") is None for s in rows):
        return MeasuredIterations(None, None)
    return MeasuredIterations(
        sum(int(s["engine_iterations"]) for s in rows) / len(rows),
        all(bool(s.get("work_deterministic")) for s in rows),
    )


# ------------------------------------------------------------------------------ phases
def _measure_curve(components: Any, config: ExperimentConfig) -> Any:
    from april_bench.curve_measure import measure_cost_curve
    from april_bench.vtime import run_real, run_virtual

    engine: Engine = components.engine()
    vocab = components.engine_settings.vocab_size or 100
    # Time the batches the arms run at, up to every request of an over-sampled launch wave, so the
    # fitted per-sequence cost is not extrapolated from small batches (measure_cost_curve caps them
    # at what the engine holds).
    wave = config.rollout.over_sampling_batch_size * config.rollout.n_samples_per_prompt
    batches = sorted({1, 4, 16, *(b for b in (64, 256) if b < wave), wave})

    async def measure() -> Any:
        await engine.start()
        try:
            return await measure_cost_curve(
                engine,
                engine_name=components.engine_name,
                model=config.model,
                hardware=config.hardware,
                vocab=vocab,
                batches=batches,
            )
        finally:
            await engine.close()

    return (run_virtual if engine.info.virtual_time else run_real)(measure())


def _prediction_config(config: ExperimentConfig, curve: Path, trace: Path | None) -> ExperimentConfig:
    return config.replace(
        engine="sim",
        trainer="sim",
        repeats=1,  # deterministic: one repeat says all; blocks and warm-up as measured (same statistic)
        eval_every=None,
        eval_datasets=(),
        engine_args={"cost_curve": str(curve)},
        workload_args={} if trace is None else {"length_trace": str(trace)},
        trainer_args={},
        warmstart_args={},
        task_args={},
        data_paths={},
    )


def _recording(components: Any, built: list[Any]) -> Any:
    """``components`` whose engine factory keeps every engine it builds (one per arm session)."""
    factory: Callable[[], Engine] = components.engine

    def recording() -> Engine:
        engine = factory()
        built.append(engine)
        return engine

    return dataclasses.replace(components, engine=recording)


def _predict(
    config: ExperimentConfig, progress: bool, workload: Any | None
) -> tuple[dict[str, Any], list[Any], Any]:
    """Run the prediction; return its summary, its engines (one per arm, in arm order) and its rows.
    ``workload``: the measured run's own (forced lengths: the same prompts and the same draws)."""
    from april_bench.backends import build_components
    from april_bench.experiment import run

    components = build_components(config, progress=False)
    if workload is not None:
        components = dataclasses.replace(components, workload=workload)
    built: list[Any] = []
    result = run(config, progress=progress, components=_recording(components, built))
    labels = [arm.label for arm in config.arms]
    if len(built) != len(labels):  # one fresh engine per arm session, in arm order (virtual time)
        raise ConfigError(f"simcheck: expected {len(labels)} simulated engines, got {len(built)}")
    summary = result.recorder.summary(baseline=config.baseline, block_steps=config.block_steps)
    return summary, built, result.recorder


def _predicted_arms(
    config: ExperimentConfig, summary: Mapping[str, Any], engines: Sequence[Any], recorder: Any
) -> dict[str, dict[str, Any]]:
    """Per arm: the simulated engine's counts (in a real engine's accounting units) per step."""
    steps = config.steps
    arms: dict[str, dict[str, Any]] = {}
    for arm, engine in zip(config.arms, engines, strict=True):
        label = arm.label
        work = engine.simulated_work()
        rows = [r for r in recorder.tables["steps"] if r.arm == label]
        m = summary[label]
        arms[label] = {
            "iterations_per_step": work.engine_iterations / steps,
            "decode_iterations_per_step": work.decode_iterations / steps,
            "decode_tokens_per_step": work.decode_tokens / steps,
            "prefill_tokens_per_step": work.prefill_tokens / steps,
            "reprefill_tokens_per_step": work.reprefill_tokens / steps,
            "aborted_requests_per_step": sum(r.aborted_requests for r in rows) / steps,
            "preemptions_per_step": engine.preemptions() / steps,
            "generated_tokens_per_step": sum(r.generated_tokens for r in rows) / steps,
            "trained_tokens_per_step": sum(r.trained_tokens for r in rows) / steps,
            "off_policy_token_ratio": m.get("off_policy_token_ratio"),
            "decode_batch_histogram": _sorted_histogram(engine.decode_histogram()),
            "throughput_gain": m.get("throughput_gain"),
            "paired_throughput_gain": m.get("paired_gains", {}).get("throughput", {}).get("median"),
        }
    _iteration_gains(arms, summary)
    return arms


def _iteration_gains(arms: dict[str, dict[str, Any]], summary: Mapping[str, Any]) -> None:
    """Tokens per engine iteration and the gains per iteration against the baseline arm."""
    for a in arms.values():
        it = a["iterations_per_step"]
        a["generated_tokens_per_iteration"] = a["generated_tokens_per_step"] / it if it else None
        a["useful_tokens_per_iteration"] = a["trained_tokens_per_step"] / it if it else None
    for label, a in arms.items():
        base = arms.get(str(summary[label].get("baseline")))
        for key, per in (
            ("iteration_throughput_gain", "generated_tokens_per_iteration"),
            ("iteration_useful_gain", "useful_tokens_per_iteration"),
        ):
            b = None if base is None else base[per]
            a[key] = None if not b or a[per] is None else a[per] / b - 1


def _measured_arms(
    config: ExperimentConfig,
    summary: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
    engines: list[Any],
) -> dict[str, dict[str, Any]]:
    """Per arm: the engine's own accounting per step (every repeat), and its histogram."""
    arms: dict[str, dict[str, Any]] = {}
    labels = [arm.label for arm in config.arms]
    per_arm = len(engines) // len(labels) if engines else 0
    for i, label in enumerate(labels):
        rows = [s for s in steps if s["arm"] == label]
        counted = rows and all(s.get("engine_iterations") is not None for s in rows)
        entry: dict[str, Any] = {}
        for name, field in _PER_STEP.items():
            if field in ("aborted_requests", "generated_tokens") or counted:
                entry[name] = sum(float(s[field] or 0) for s in rows) / len(rows) if rows else None
            else:
                entry[name] = None
        entry["trained_tokens_per_step"] = sum(float(s["trained_tokens"]) for s in rows) / max(len(rows), 1)
        entry["deterministic"] = all(bool(s.get("work_deterministic")) for s in rows) if counted else None
        m = summary[label]
        entry["off_policy_token_ratio"] = m.get("off_policy_token_ratio")
        # the engines of this arm's sessions (repeats), in session order: arm by arm, repeat by repeat
        mine = [e for j, e in enumerate(engines) if per_arm and _session_arm(j, labels) == i]
        histogram: dict[int, int] = {}
        for engine in mine:
            if (counter := HISTOGRAM.of(engine)) is None:
                continue
            for batch, n in counter.decode_histogram().items():
                histogram[int(batch)] = histogram.get(int(batch), 0) + int(n)
        entry["decode_batch_histogram"] = _sorted_histogram(histogram) if histogram else None
        preempted = [_preemptions(e) for e in mine]
        entry["preemptions_per_step"] = (
            sum(p or 0.0 for p in preempted) / len(rows) if mine and rows and None not in preempted else None
        )
        entry["iteration_log"] = [
            r for e in mine if (logged := ITERATIONS.of(e)) for r in logged.iteration_log()
        ]
        entry["throughput_gain"] = m.get("throughput_gain")
        entry["paired_throughput"] = m.get("paired_gains", {}).get("throughput", {})
        arms[label] = entry
    _iteration_gains(arms, summary)
    return arms


def _preemptions(engine: Any) -> float | None:
    """A real engine's preemption counter (vLLM's stat logger), ``None`` when it keeps none (hf's
    slots are reserved whole: it never preempts)."""
    value = reported.metrics().get("preemptions") if (reported := METRICS.of(engine)) else None
    return None if value is None else float(value)


def _session_arm(index: int, labels: Sequence[str]) -> int:
    """The arm of the ``index``-th engine built: sessions open repeat by repeat, arms in order
    (:func:`april_bench.experiment.run`)."""
    return index % len(labels)


def _sorted_histogram(histogram: Mapping[int, int]) -> dict[str, int]:
    return {str(b): int(n) for b, n in sorted(histogram.items())}


def histogram_distance(a: Mapping[str, int] | None, b: Mapping[str, int] | None) -> float | None:
    """Total-variation distance (0: identical, 1: disjoint) between two decode-batch histograms, over
    power-of-two batch buckets (1, 2-3, 4-7, ...): the shares of decode steps at each batch size."""
    if not a or not b:
        return None

    def shares(h: Mapping[str, int]) -> dict[int, float]:
        total = sum(h.values())
        out: dict[int, float] = {}
        for batch, n in h.items():
            bucket = max(int(batch), 1).bit_length() - 1
            out[bucket] = out.get(bucket, 0.0) + n / total
        return out

    pa, pb = shares(a), shares(b)
    return 0.5 * sum(abs(pa.get(k, 0.0) - pb.get(k, 0.0)) for k in set(pa) | set(pb))


# ------------------------------------------------------------------------------ checks
def _relative(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None:
        return None
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return predicted / measured - 1


def check_arm(
    predicted: Mapping[str, Any], measured: Mapping[str, Any], tolerance: float
) -> list[dict[str, Any]]:
    """Every load-proof check of one arm: ``quantity``, ``predicted``, ``measured``, ``error`` (relative,
    absolute for shares, a distance for the histogram), ``ok`` (``None``: not measured)."""
    checks: list[dict[str, Any]] = []

    def add(quantity: str, p: Any, m: Any, error: float | None, how: str) -> None:
        ok = None if error is None else bool(abs(error) <= tolerance + 1e-12)
        checks.append(
            {"quantity": quantity, "predicted": p, "measured": m, "error": error, "kind": how, "ok": ok}
        )

    for name in (
        "iterations_per_step",
        "prefill_tokens_per_step",
        "reprefill_tokens_per_step",
        "aborted_requests_per_step",
        "preemptions_per_step",
    ):
        add(
            name,
            predicted.get(name),
            measured.get(name),
            _relative(predicted.get(name), measured.get(name)),
            "relative",
        )
    p_batch = _ratio(predicted.get("decode_tokens_per_step"), predicted.get("decode_iterations_per_step"))
    m_batch = _ratio(measured.get("decode_tokens_per_step"), measured.get("decode_iterations_per_step"))
    add("mean_decode_batch", p_batch, m_batch, _relative(p_batch, m_batch), "relative")
    po, mo = predicted.get("off_policy_token_ratio"), measured.get("off_policy_token_ratio")
    add("off_policy_token_ratio", po, mo, None if po is None or mo is None else po - mo, "absolute")
    ph, mh = predicted.get("decode_batch_histogram"), measured.get("decode_batch_histogram")
    add("decode_batch_histogram", ph, mh, histogram_distance(ph, mh), "total-variation distance")
    for gain in ("iteration_throughput_gain", "iteration_useful_gain"):
        pg, mg = predicted.get(gain), measured.get(gain)
        error = None if pg is None or mg is None else (1 + pg) / (1 + mg) - 1
        add(gain, pg, mg, error, "relative, of 1 + gain")
    return checks


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def wall_clock_verdict(paired: Mapping[str, Any], predicted: float | None) -> dict[str, Any]:
    """The secondary, wall-clock check: the measured paired median, its interval only from 3 pairs up,
    and ``inconclusive`` when the interval is wider than +-10 points (or there is none)."""
    pairs = int(paired.get("pairs") or 0)
    median, ci = paired.get("median"), paired.get("ci")
    out: dict[str, Any] = {"pairs": pairs, "measured_median": median, "predicted": predicted}
    if pairs < MIN_PAIRS or not ci:
        out.update(ci=None, verdict="inconclusive", why=f"{pairs} pair(s): too few for an interval")
        return out
    half = (ci[1] - ci[0]) / 2
    out["ci"], out["half_width"] = list(ci), half
    if half > WIDE_INTERVAL:
        out.update(verdict="inconclusive", why=f"the interval is +-{half * 100:.1f} points, wider than +-10")
    elif predicted is None:
        out.update(verdict="inconclusive", why="nothing predicted")
    else:
        inside = ci[0] - 1e-9 <= predicted <= ci[1] + 1e-9
        out.update(verdict="inside" if inside else "outside", why="")
    return out


def _cpu_time_model(arms: Mapping[str, Mapping[str, Any]], baseline: str) -> dict[str, Any] | None:
    """Fit the engine's CPU seconds per round on the baseline arm's logged rounds, apply to every arm's."""
    import numpy as np

    logs = {label: a.get("iteration_log") or [] for label, a in arms.items()}
    fit_log = logs.get(baseline) or []
    decode = [r for r in fit_log if r[0] == "decode"]
    prefill = [r for r in fit_log if r[0] == "prefill"]
    if len(decode) < 3:
        return None

    def fit(rows: list[Any], columns: Callable[[Any], list[float]]) -> list[float]:
        """Least squares with every coefficient >= 0 (a negative cost per token is noise, not a cost)."""
        from april_bench.curve_measure import nonnegative_fit

        if len(rows) < 2:
            return [float(np.median([r[4] for r in rows]))] if rows else [0.0]
        return nonnegative_fit([columns(r) for r in rows], [r[4] for r in rows])

    d = fit(decode, lambda r: [1.0, r[1], r[3]])
    p = fit(prefill, lambda r: [1.0, r[2]] if len(prefill) >= 2 else [1.0])

    def price(r: Any) -> float:
        if r[0] == "decode":
            return d[0] + d[1] * r[1] + d[2] * r[3]
        return p[0] + (p[1] * r[2] if len(p) > 1 else 0.0)

    out: dict[str, Any] = {
        "fitted_on": baseline,
        "decode_s": {"base": d[0], "per_seq": d[1], "per_kv_token": d[2]},
        "prefill_s": {"base": p[0], "per_token": p[1] if len(p) > 1 else 0.0},
        "arms": {},
    }
    for label, log in logs.items():
        if not log:
            continue
        measured = sum(r[4] for r in log)
        predicted = sum(price(r) for r in log)
        out["arms"][label] = {"rounds": len(log), "predicted_cpu_s": predicted, "measured_cpu_s": measured}
    return out


def _cpu_gains(model: dict[str, Any] | None, arms: Mapping[str, Mapping[str, Any]], baseline: str) -> None:
    """Gains in generated tokens per engine CPU second, predicted (fitted model) and measured."""
    if model is None or baseline not in model["arms"]:
        return
    base = model["arms"][baseline]
    base_tokens = arms[baseline]["generated_tokens_per_step"]
    for label, entry in model["arms"].items():
        tokens = arms[label]["generated_tokens_per_step"]
        entry["error"] = (
            entry["predicted_cpu_s"] / entry["measured_cpu_s"] - 1 if entry["measured_cpu_s"] else None
        )
        if label == baseline or not base_tokens:
            continue
        rate = tokens / base_tokens
        entry["predicted_cpu_gain"] = rate * base["predicted_cpu_s"] / entry["predicted_cpu_s"] - 1
        entry["measured_cpu_gain"] = rate * base["measured_cpu_s"] / entry["measured_cpu_s"] - 1


def _forced_lengths_check(config: ExperimentConfig, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Did the engine generate the oracle's lengths?  Every finished sample's length against
    ``min(draw, limit)``: the prediction replays exactly the measured run's own lengths when it did."""
    from april_bench.tasks.forced import oracle_for

    oracle = oracle_for(config)
    assert oracle is not None
    limit = config.rollout.max_response_len
    finished = [s for s in samples if s["status"] in ("completed", "truncated")]
    exact = sum(
        1
        for s in finished
        if s["response_len"] == min(oracle.length(s["group_uid"], s["sample_index"]), limit)
    )
    return {
        "finished_samples": len(finished),
        "exact": exact,
        "share": exact / len(finished) if finished else None,
    }


# ------------------------------------------------------------------------------ the command
def run_simcheck(
    config: ExperimentConfig,
    out: Path,
    *,
    trace_steps: int | None = None,
    trace_seed: int | None = None,
    progress: bool = False,
    echo: Callable[[str], None] | None = None,
    allow_dirty: bool = False,
    tolerance: float | None = None,
    validation_log: Path | None = None,
) -> SimcheckResult:
    """Predict, seal, then measure every arm of ``config`` on its engine (see the module docstring).

    The reference-output rule (``results/``: a clean checkout) is checked once, for the whole of
    ``out``, before anything is written: the measured run inside it must not count simcheck's own
    first outputs (cost curve, prediction) as uncommitted changes."""
    from april_bench import runner
    from april_bench.backends import build_components
    from april_bench.experiment import run
    from april_bench.results.provenance import git_info

    say = echo or (lambda _line: None)
    runner.check_reference_run(out, allow_dirty=allow_dirty)
    started = _utc()
    git_at_start = git_info(exclude=out)
    load_at_start = _load()
    measured_config = config.replace(eval_every=None, eval_datasets=())
    components = build_components(measured_config, progress=progress)
    if components.engine_name == "sim":
        raise ConfigError(
            "simcheck compares the simulator with a real engine: choose one with --engine (hf, vllm, fake)"
        )
    tolerance = tolerance_for(components.engine_name) if tolerance is None else tolerance
    forced = config.length_oracle is not None
    out.mkdir(parents=True, exist_ok=True)
    say(f"simcheck 1/4: measuring the cost curve of the {components.engine_name} engine")
    curve = _measure_curve(components, config)
    curve_path = out / "cost_curve.json"
    curve.save(curve_path)

    trace_path: Path | None = None
    trace_info: dict[str, Any]
    if forced:
        say(f"simcheck 2/4: lengths forced by {config.length_oracle}: the prediction replays them exactly")
        trace_info = {"forced_lengths": config.length_oracle}
    else:
        seed = config.seed + 1 if trace_seed is None else trace_seed
        steps = trace_steps or config.steps
        say(f"simcheck 2/4: length trace, sync only, held-out seed {seed}, {steps} steps")
        trace_config = measured_config.replace(
            strategies=("sync",),
            baseline=None,
            seed=seed,
            steps=steps,
            repeats=1,
            block_steps=None,
            warmup_steps=0,
        )
        trace_result = run(trace_config, progress=progress)
        rows = trace_rows([dataclasses.asdict(s) for s in trace_result.recorder.tables["samples"]])
        if not rows:
            raise ConfigError("simcheck: the trace run trained no sample; lengthen it with --trace-steps")
        trace_path = out / "trace.jsonl"
        write_text_atomic(trace_path, "".join(json.dumps(r) + "\n" for r in rows))
        trace_info = {"seed": seed, "steps": steps, "samples": len(rows)}

    say("simcheck 3/4: predicting every arm with the simulator, sealed before any measured arm runs")
    prediction_config = _prediction_config(config, curve_path, trace_path)
    summary, engines, recorder = _predict(
        prediction_config, progress, components.workload if forced else None
    )
    predicted = _predicted_arms(prediction_config, summary, engines, recorder)
    prediction = {
        "kind": "april-bench simcheck prediction",
        "utc": _utc(),
        "engine": components.engine_name,
        "lengths": trace_info,
        "tolerance": tolerance,
        "config": redact(config.to_dict()),  # sealed as written: no secret in the hashed bytes
        "cost_curve": curve.to_json(),
        "arms": predicted,
    }
    text = json.dumps(prediction, indent=2, sort_keys=True) + "\n"
    write_text_atomic(out / "prediction.json", text)
    blob = text.encode()
    sealed = {
        "result_kind": "measured and simulated",
        "state": "predicted; measuring",
        "prediction_sha256": hashlib.sha256(blob).hexdigest(),
        "prediction_utc": prediction["utc"],
        "prediction_file": "prediction.json",
    }
    write_json_atomic(out / "simcheck.json", sealed)

    say("simcheck 4/4: measuring every arm (interleaved, repeated as `run` does)")
    built: list[Any] = []
    outcome = runner.run_into(
        measured_config,
        out / "measured",
        components=_recording(dataclasses.replace(components, evaluator=None), built),
        overwrite=True,
        allow_dirty=True,  # checked above, once, for the whole simcheck directory
        progress=progress,
    )
    if outcome.result is None or outcome.stored is None:
        raise KeyboardInterrupt(f"simcheck stopped by {outcome.interrupted_by}; nothing was judged")
    from april_bench.results.store import load_run

    stored = load_run(out / "measured")  # every row, from disk (a virtual-time run keeps few in memory)
    measured_summary = stored.summary()
    steps_rows = stored.rows("steps")
    measured = _measured_arms(measured_config, measured_summary, steps_rows, built)
    lengths = _forced_lengths_check(config, stored.rows("samples")) if forced else None

    baseline = str(next(iter(measured_summary.values())).get("baseline"))
    cpu_model = _cpu_time_model(measured, baseline)
    _cpu_gains(cpu_model, measured, baseline)
    arms = []
    failed: list[str] = []
    for arm in config.arms:
        label = arm.label
        p, m = predicted[label], measured[label]
        checks = check_arm(p, m, tolerance)
        failed += [f"{label}: {c['quantity']}" for c in checks if c["ok"] is False]
        entry = {
            "arm": label,
            "baseline": label == baseline,
            "checks": checks,
            "measured_iterations_deterministic": m["deterministic"],
            "wall_clock": None
            if label == baseline
            else wall_clock_verdict(m["paired_throughput"], p.get("paired_throughput_gain")),
            "cpu_time": None if cpu_model is None else cpu_model["arms"].get(label),
        }
        arms.append(entry)
    if not forced:
        verdict = "not checkable"
        why = "the lengths are the model's own: no prediction can replay them; add --length-oracle"
    elif lengths is not None and lengths["share"] is not None and lengths["share"] < 1:
        verdict, why = (
            "fail",
            f"the engine generated {lengths['exact']} of {lengths['finished_samples']} forced lengths",
        )
    elif any(c["ok"] is None for a in arms for c in a["checks"] if c["quantity"] == "iterations_per_step"):
        verdict, why = "not checkable", "the engine does not count its work"
    elif failed:
        verdict, why = "fail", "outside the tolerance: " + ", ".join(failed)
    else:
        verdict, why = "pass", f"every counted quantity within {tolerance:.0%}"
    notes = _notes(components.engine_name, curve, predicted, measured)
    provenance = stored.provenance
    data = {
        **sealed,
        "state": "complete",
        "verdict": verdict,
        "why": why,
        "tolerance": tolerance,
        "engine": components.engine_name,
        "started_utc": started,
        "finished_utc": _utc(),
        "git_at_start": git_at_start,
        "load_average": {"start": load_at_start, "end": _load()},
        "provenance": {k: provenance.get(k) for k in ("git", "utc", "utc_end", "machine", "command")},
        "config": config.to_dict(),
        "lengths": {**trace_info, **({"replayed": lengths} if lengths else {})},
        "cost_curve": curve.to_json(),
        "cpu_time_model": None if cpu_model is None else {k: v for k, v in cpu_model.items() if k != "arms"},
        "arms": arms,
        "notes": notes,
    }
    write_json_atomic(out / "simcheck.json", data)
    write_text_atomic(out / "simcheck.md", render_simcheck(data) + "\n")
    if validation_log is not None:
        _append_log(validation_log, data, out)
    return SimcheckResult(data)


def _append_log(path: Path, data: Mapping[str, Any], out: Path) -> None:
    """One line per simcheck run, appended (never rewritten): what ran, on which commit, the sealed
    prediction's hash and the verdict."""
    line = {
        "utc": data["finished_utc"],
        "out": str(out),
        "engine": data["engine"],
        "commit": data["git_at_start"].get("commit"),
        "dirty": data["git_at_start"].get("dirty"),
        "cpu": (data["provenance"].get("machine") or {}).get("cpu"),
        "load_average": data["load_average"],
        "model": data["config"]["model"],
        "steps": data["config"]["steps"],
        "repeats": data["config"]["repeats"],
        "arms": list(data["config"]["strategies"]),
        "length_oracle": data["config"].get("length_oracle"),
        "prediction_sha256": data["prediction_sha256"],
        "verdict": data["verdict"],
        "iterations_error": {
            a["arm"]: next(c["error"] for c in a["checks"] if c["quantity"] == "iterations_per_step")
            for a in data["arms"]
        },
        "wall_clock": {a["arm"]: a["wall_clock"]["verdict"] for a in data["arms"] if a["wall_clock"]},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    from april_bench.fsio import open_append

    with open_append(path) as f:
        f.write(json.dumps(line) + "\n")


def _notes(engine: str, curve: Any, predicted: Mapping[str, Any], measured: Mapping[str, Any]) -> list[str]:
    """What the simulator cannot see in this comparison, said where it shows."""
    notes = []
    for label, m in measured.items():
        p = predicted[label]
        if m.get("deterministic") is False and m.get("aborted_requests_per_step") != p.get(
            "aborted_requests_per_step"
        ):
            notes.append(
                f"{label}: {engine}'s engine core steps on in its own process while this process handles "
                "outputs and sends aborts, so under load an abort lands iterations late and requests it "
                "meant to stop run on (aborted requests per step: predicted "
                f"{p.get('aborted_requests_per_step'):.2f}, measured "
                f"{m.get('aborted_requests_per_step'):.2f}); "
                "the simulator reacts at once and cannot predict that lag: the schedule it predicts is the "
                "one an idle client would get"
            )
        if engine == "vllm" and (m.get("preemptions_per_step") or p.get("preemptions_per_step")):
            notes.append(
                f"{label}: the simulator counts the KV pool ({curve.kv_capacity_tokens:,} tokens) token by "
                "token; vLLM allocates it in blocks, so a request holds up to a block more than its tokens "
                "and preemptions come earlier and in other places than predicted; its prompt-token counter "
                "counts a preempted request's prompt once, the simulator every recomputation: the "
                "preemption and prefill counts are approximations"
            )
    return notes


def _utc() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ------------------------------------------------------------------------------ the report
def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:+.1f}%"


def _iterations(per_step: float | None, deterministic: bool | None) -> str:
    if per_step is None:
        return "n/a (engine does not count)"
    return f"{per_step:.1f}" + ("" if deterministic else " (not deterministic)")


def _value(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, dict):
        return f"{len(x)} batch sizes"
    if isinstance(x, float):
        return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def _error(check: Mapping[str, Any]) -> str:
    e = check["error"]
    if e is None:
        return "n/a"
    if check["kind"] == "absolute":
        return f"{e * 100:+.1f} pt"
    if check["kind"].startswith("total"):
        return f"{e:.3f}"
    return "inf" if math.isinf(e) else f"{e * 100:+.1f}%"


def _interval(ci: Sequence[float]) -> str:
    return f"[{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]"


def render_simcheck(data: Mapping[str, Any]) -> str:
    from april_bench.results.table import render_markdown

    curve = data["cost_curve"]
    config = data["config"]
    lengths = data["lengths"]
    if "forced_lengths" in lengths:
        replayed = lengths.get("replayed") or {}
        how = (
            f"forced lengths ({lengths['forced_lengths']}): the prediction replays the draws the engine "
            f"generated ({replayed.get('exact')} of {replayed.get('finished_samples')} finished samples "
            "exact)"
        )
    else:
        how = (
            f"a length trace of a sync-only run with the held-out seed {lengths['seed']} "
            f"({lengths['samples']} samples): a check of the length model, not of the schedule"
        )
    lines = [
        f"# simcheck: the simulator's prediction against the {data['engine']} engine",
        "",
        f"**Verdict: {data['verdict'].upper()}** - {data['why']}.",
        "",
        f"{config['steps']} steps x {config['repeats']} repeat(s), {config['rollout']['rollout_batch_size']} "
        f"groups x {config['rollout']['n_samples_per_prompt']}, over-sampling "
        f"{config['rollout']['over_sampling_batch_size']}, {config['rollout']['max_response_len']} tokens, "
        f"model {config['model']} on {config['hardware']}, algorithm {config['algorithm']}; lengths: {how}.  "
        f"Prediction (SIMULATED, one replica with the engine's limits) sealed at {data['prediction_utc']}, "
        f"sha256 {data['prediction_sha256'][:16]}..., before the measured arms (MEASURED, interleaved) "
        f"started; load average {data['load_average']['start']} at the start, "
        f"{data['load_average']['end']} at the end.",
        "",
        f"## Counted, load-proof (tolerance {data['tolerance']:.0%})",
        "",
        render_markdown(
            ("Arm", "Quantity", "Predicted (sim)", "Measured", "Error", "OK"),
            [
                [
                    a["arm"],
                    c["quantity"],
                    _value(c["predicted"]),
                    _value(c["measured"]),
                    _error(c),
                    {True: "yes", False: "**no**", None: "n/a"}[c["ok"]],
                ]
                for a in data["arms"]
                for c in a["checks"]
            ],
        ),
    ]
    if data.get("notes"):
        lines += ["", "What the simulator cannot see here:", ""] + [f"* {n}" for n in data["notes"]]
    model = data.get("cpu_time_model")
    timed = [a for a in data["arms"] if a.get("cpu_time")]
    if model is not None and timed:
        d = model["decode_s"]
        lines += [
            "",
            f"## Engine CPU time (the scheduler thread's, fitted on {model['fitted_on']}, applied to each "
            "arm's logged rounds)",
            "",
            f"Decode round {d['base'] * 1e3:.3g} ms + {d['per_seq'] * 1e3:.3g} ms/sequence + "
            f"{d['per_kv_token'] * 1e6:.3g} us/KV token; prefill {model['prefill_s']['base'] * 1e3:.3g} ms + "
            f"{model['prefill_s']['per_token'] * 1e6:.3g} us/token.",
            "",
            render_markdown(
                (
                    "Arm",
                    "Rounds",
                    "CPU s predicted",
                    "CPU s measured",
                    "Error",
                    "Gain per CPU s: predicted",
                    "Gain per CPU s: measured",
                ),
                [
                    [
                        a["arm"],
                        str(a["cpu_time"]["rounds"]),
                        f"{a['cpu_time']['predicted_cpu_s']:.2f}",
                        f"{a['cpu_time']['measured_cpu_s']:.2f}",
                        _pct(a["cpu_time"].get("error")),
                        _pct(a["cpu_time"].get("predicted_cpu_gain")) if not a["baseline"] else "baseline",
                        _pct(a["cpu_time"].get("measured_cpu_gain")) if not a["baseline"] else "baseline",
                    ]
                    for a in timed
                ],
            ),
        ]
    walls = [a for a in data["arms"] if a.get("wall_clock")]
    if walls:
        lines += [
            "",
            "## Wall clock (secondary: the machine's load moves it)",
            "",
            f"Cost curve: decode step {curve['decode']['base_s'] * 1e3:.3g} ms + "
            f"{curve['decode']['per_seq_s'] * 1e3:.3g} ms/seq + "
            f"{curve['decode']['per_context_token_s'] * 1e6:.3g} us/context token; prefill "
            f"{curve['prefill']['base_s'] * 1e3:.3g} ms + "
            f"{curve['prefill']['per_token_s'] * 1e6:.3g} us/token "
            f"(load while timing {curve['load']}).",
            "",
            render_markdown(
                ("Arm", "Predicted gain (sim)", "Measured gain (paired median)", "95% CI", "Verdict"),
                [
                    [
                        a["arm"],
                        _pct(a["wall_clock"]["predicted"]),
                        _pct(a["wall_clock"]["measured_median"]),
                        "no interval" if a["wall_clock"]["ci"] is None else _interval(a["wall_clock"]["ci"]),
                        a["wall_clock"]["verdict"]
                        + (f" ({a['wall_clock']['why']})" if a["wall_clock"]["why"] else ""),
                    ]
                    for a in walls
                ],
            ),
        ]
    return "\n".join(lines)
