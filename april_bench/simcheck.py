"""``simcheck``: predict each arm's gain with the simulator, then measure it on the real engine.

One command, four phases, in this order (the prediction is written before
any measured arm runs):

1. **cost curve**: time the run's engine through the engine protocol
   (:func:`april_bench.curve_measure.measure_cost_curve`) and save
   ``cost_curve.json``;
2. **length trace**: a short sync-only run with a *different* seed (``seed +
   1`` unless told) on the same engine; each trained sample's response length
   and reward go to ``trace.jsonl`` (the simulator's ``length_trace``);
3. **prediction**: the same experiment on ``--engine sim`` priced by the cost
   curve (one replica, the engine's own limits) and replaying the trace:
   ``predicted_gain`` per arm and ``predicted_iterations_per_step`` (forward
   passes: decode iterations + extend batches);
4. **measurement**: the experiment itself, arms interleaved and repeated as
   ``run`` does: ``measured_gain`` (the paired median), ``measured_ci``,
   ``measured_iterations_per_step`` (the step rows' ``engine_iterations``, the engine's own
   accounting: exact for hf and fake, not deterministic for vLLM; docs/measured.md).

``simcheck.json`` (with the measured run's provenance) and ``simcheck.md`` go to the output
directory beside the three inputs; the measured run is an ordinary run directory in ``measured/``
(rows, provenance, ``trace.jsonl``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.engines.protocol import Engine
from april_bench.experiment_config import ExperimentConfig
from april_bench.results.store import write_text_atomic

__all__ = [
    "MeasuredIterations",
    "SimcheckResult",
    "measured_iterations_per_step",
    "render_simcheck",
    "run_simcheck",
    "trace_rows",
]


@dataclasses.dataclass(frozen=True, slots=True)
class SimcheckResult:
    """What ``simcheck`` found, as written to ``simcheck.json``."""

    data: dict[str, Any]

    def arm(self, label: str) -> dict[str, Any]:
        return next(a for a in self.data["arms"] if a["arm"] == label)


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


def _prediction_config(config: ExperimentConfig, curve: Path, trace: Path) -> ExperimentConfig:
    return config.replace(
        engine="sim",
        trainer="sim",
        repeats=1,  # deterministic: one repeat says all; blocks and warm-up as measured (same statistic)
        eval_every=None,
        eval_datasets=(),
        engine_args={"cost_curve": str(curve)},
        workload_args={"length_trace": str(trace)},
        trainer_args={},
        warmstart_args={},
    )


def _predict(config: ExperimentConfig, progress: bool) -> tuple[dict[str, Any], dict[str, float]]:
    """Run the prediction; return the summary and each arm's forward passes per step."""
    from april_bench.backends import build_components
    from april_bench.experiment import run

    components = build_components(config, progress=False)
    built: list[Any] = []
    factory: Callable[[], Engine] = components.engine

    def recording() -> Engine:
        engine = factory()
        built.append(engine)
        return engine

    components = dataclasses.replace(components, engine=recording)
    recorder = run(config, progress=progress, components=components).recorder
    # paired over the same blocks as the measured side (and as the run directory's summary.json)
    summary = recorder.summary(baseline=config.baseline, block_steps=config.block_steps)
    labels = [arm.label for arm in config.arms]
    if len(built) != len(labels):  # one fresh engine per arm session, in arm order (virtual time)
        raise ConfigError(f"simcheck: expected {len(labels)} simulated engines, got {len(built)}")
    passes = {
        label: engine.forward_passes() / config.steps for label, engine in zip(labels, built, strict=True)
    }
    return summary, passes


def run_simcheck(
    config: ExperimentConfig,
    out: Path,
    *,
    trace_steps: int | None = None,
    trace_seed: int | None = None,
    progress: bool = False,
    echo: Callable[[str], None] | None = None,
    allow_dirty: bool = False,
) -> SimcheckResult:
    """Predict, then measure, every arm of ``config`` on its engine (see the module docstring).

    The reference-output rule (``results/``: a clean checkout) is checked once, for the whole of
    ``out``, before anything is written: the measured run inside it must not count simcheck's own
    first outputs (cost curve, trace) as uncommitted changes."""
    from april_bench import runner
    from april_bench.backends import build_components
    from april_bench.experiment import run

    say = echo or (lambda _line: None)
    runner.check_reference_run(out, allow_dirty=allow_dirty)
    components = build_components(config, progress=progress)
    if components.engine_name == "sim":
        raise ConfigError(
            "simcheck compares the simulator with a real engine: choose one with --engine (hf, vllm, fake)"
        )
    out.mkdir(parents=True, exist_ok=True)
    say(f"simcheck 1/4: measuring the cost curve of the {components.engine_name} engine")
    curve = _measure_curve(components, config)
    curve_path = out / "cost_curve.json"
    curve.save(curve_path)

    seed = config.seed + 1 if trace_seed is None else trace_seed
    steps = trace_steps or config.steps
    say(f"simcheck 2/4: length trace, sync only, seed {seed}, {steps} steps")
    trace_config = config.replace(
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

    say("simcheck 3/4: predicting every arm with the simulator (before any measured arm runs)")
    prediction_config = _prediction_config(config, curve_path, trace_path)
    predicted, predicted_passes = _predict(prediction_config, progress)
    write_text_atomic(
        out / "prediction.json", json.dumps({"summary": predicted, "passes": predicted_passes}, indent=2)
    )

    say("simcheck 4/4: measuring every arm (interleaved, repeated as `run` does)")

    # an ordinary run directory (config, provenance, rows, trace.jsonl): `whatif OUT/measured --cost-curve
    # OUT/cost_curve.json` replays the measured run's own trace with the engine's own curve
    measured_run = runner.run(
        config, out=out / "measured", overwrite=True, allow_dirty=True, progress=progress
    )
    # the run directory's own statistic: paired over interleaved blocks (measured/summary.json)
    measured = measured_run.recorder.summary(baseline=config.baseline, block_steps=config.block_steps)
    step_rows = [dataclasses.asdict(r) for r in measured_run.recorder.tables["steps"]]
    arms = []
    for arm in config.arms:
        label = arm.label
        m, p = measured[label], predicted[label]
        if label == m.get("baseline"):
            continue
        paired = m.get("paired_gains", {}).get("throughput", {})
        measured_passes = measured_iterations_per_step(step_rows, label)
        baseline_passes = measured_iterations_per_step(step_rows, m["baseline"])
        arms.append(
            {
                "arm": label,
                "baseline": m.get("baseline"),
                # the same statistic on both sides: the paired median over the same blocks and warm-up
                "predicted_gain": p.get("paired_gains", {}).get("throughput", {}).get("median"),
                "predicted_ratio_gain": p["throughput_gain"],
                "measured_gain": paired.get("median"),
                "measured_ci": paired.get("ci"),
                "measured_pairs": paired.get("pairs"),
                "measured_ratio_gain": m["throughput_gain"],
                "predicted_iterations_per_step": predicted_passes[label],
                "measured_iterations_per_step": measured_passes.per_step,
                "measured_iterations_deterministic": measured_passes.deterministic,
                "baseline_predicted_iterations_per_step": predicted_passes[m["baseline"]],
                "baseline_measured_iterations_per_step": baseline_passes.per_step,
            }
        )
    provenance = json.loads((out / "measured" / "provenance.json").read_text())
    result = SimcheckResult(
        {
            "result_kind": "measured and simulated",
            "engine": components.engine_name,
            "provenance": {k: provenance.get(k) for k in ("git", "utc", "utc_end", "machine", "command")},
            "config": config.to_dict(),
            "trace": {"seed": seed, "steps": steps, "samples": len(rows)},
            "cost_curve": curve.to_json(),
            "arms": [_with_errors(a) for a in arms],
        }
    )
    write_text_atomic(out / "simcheck.json", json.dumps(result.data, indent=2) + "\n")
    write_text_atomic(out / "simcheck.md", render_simcheck(result.data) + "\n")
    return result


def _with_errors(arm: dict[str, Any]) -> dict[str, Any]:
    pred, meas, ci = arm["predicted_gain"], arm["measured_gain"], arm["measured_ci"]
    arm["gain_error_pt"] = None if meas is None else (pred - meas) * 100
    slack = 1e-9  # summation order: an exact prediction may differ from a one-pair interval in the last bit
    arm["predicted_inside_ci"] = None if ci is None else bool(ci[0] - slack <= pred <= ci[1] + slack)
    it_p, it_m = arm["predicted_iterations_per_step"], arm["measured_iterations_per_step"]
    arm["iterations_error"] = None if not it_m else it_p / it_m - 1
    return arm


def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:+.1f}%"


def _iterations(per_step: float | None, deterministic: bool | None) -> str:
    if per_step is None:
        return "n/a (engine does not count)"
    return f"{per_step:.1f}" + ("" if deterministic else " (not deterministic)")


def render_simcheck(data: Mapping[str, Any]) -> str:
    from april_bench.results.table import render_markdown

    curve = data["cost_curve"]
    config = data["config"]
    lines = [
        f"# simcheck: the simulator's prediction against the {data['engine']} engine",
        "",
        f"{config['steps']} steps x {config['repeats']} repeat(s), {config['rollout']['rollout_batch_size']} "
        f"groups x {config['rollout']['n_samples_per_prompt']}, model {config['model']} on "
        f"{config['hardware']}, algorithm {config['algorithm']}.  Predicted (SIMULATED) from a cost curve "
        f"measured in the same command (decode step {curve['decode']['base_s'] * 1e3:.3g} ms + "
        f"{curve['decode']['per_seq_s'] * 1e3:.3g} ms/seq + "
        f"{curve['decode']['per_context_token_s'] * 1e6:.3g} us/context token; "
        f"prefill {curve['prefill']['base_s'] * 1e3:.3g} ms + "
        f"{curve['prefill']['per_token_s'] * 1e6:.3g} us/token; load while measuring "
        f"{curve['load']}) and a length trace of a sync-only run with seed {data['trace']['seed']} "
        f"({data['trace']['samples']} samples); then MEASURED, arms interleaved.",
        "",
        render_markdown(
            (
                "Arm",
                "Predicted gain (sim)",
                "Measured gain (paired median)",
                "Measured 95% CI",
                "Error",
                "Inside CI",
                "Iterations/step predicted",
                "Iterations/step measured",
                "Iterations error",
            ),
            [
                [
                    a["arm"],
                    _pct(a["predicted_gain"]),
                    _pct(a["measured_gain"]),
                    "n/a"
                    if a["measured_ci"] is None
                    else f"[{a['measured_ci'][0] * 100:+.1f}, {a['measured_ci'][1] * 100:+.1f}]",
                    "n/a" if a["gain_error_pt"] is None else f"{a['gain_error_pt']:+.1f} pt",
                    {True: "yes", False: "no", None: "n/a"}[a["predicted_inside_ci"]],
                    f"{a['predicted_iterations_per_step']:.1f}",
                    _iterations(a["measured_iterations_per_step"], a["measured_iterations_deterministic"]),
                    "n/a" if a["iterations_error"] is None else f"{a['iterations_error'] * 100:+.1f}%",
                ]
                for a in data["arms"]
            ],
        ),
    ]
    return "\n".join(lines)
