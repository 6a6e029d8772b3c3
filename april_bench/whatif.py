"""``whatif``: what would partial rollout (or tail batching, or an async driver) buy *my* run?

Replays a trace (:mod:`april_bench.trace.format`: a user's own rollouts, imported from verl or slime,
or an april-bench run's) on the simulator under every strategy and driver of the zoo - the arms of
``ablate``'s grid (:mod:`april_bench.zoo`) at one N'/N ratio - on a hardware and model profile, and
reports each arm's generated-token, useful-token and end-to-end gain against sync and the off-policy
share it would introduce.  Every number is simulated and printed with the trace's provenance.

The replay keeps the trace's groups, its length-reward coupling and its step order
(:mod:`april_bench.sim.trace_replay`); the batch shape comes from the trace (groups per step, samples
per group, the response limit), so the what-if is the source run's setting on other hardware.

The engine's cost per iteration is the simulator's roofline profile of ``--hw`` and ``--model``, or,
with ``--cost-curve FILE`` (the ``simcheck`` measurement, :mod:`april_bench.engines.sim.cost_curve`), that
engine's measured decode-step and prefill costs: the simulator then runs as one measured replica with
the engine's own slot and prefill limits (``--engine-arg cost_curve=FILE`` of ``--engine sim``, as
``simcheck`` predicts), and the training side is priced on the curve's hardware and model profile.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.trace.format import Trace, read_trace
from april_bench.zoo import DEFAULT_DRIVERS, ZOO, AblationArm, grid_arms, parse_drivers

__all__ = ["WhatIf", "render_whatif", "run_whatif", "whatif_config", "whatif_figure"]

#: The N'/N ratio every over-provisioning strategy gets (APRIL's scripts: 64 / 32).
DEFAULT_RATIO = 2.0


@dataclass(frozen=True, slots=True)
class WhatIf:
    """What to replay a trace on: the deployment and the arms."""

    hardware: str | None = None  # None: the trace's own (see _deployment), h100, or the cost curve's
    model: str | None = None  # None: the trace's own, qwen3-4b, or the cost curve's
    num_gpus: int | None = None
    algorithm: str = "grpo"
    strategies: tuple[str, ...] | None = None  # None: ablate's zoo
    drivers: tuple[dict[str, Any], ...] | None = None  # None: ablate's default drivers
    ratio: float = DEFAULT_RATIO
    steps: int | None = None  # None: the trace's steps
    arm: str | None = None  # which arm of a run directory to replay
    #: A measured engine cost curve (``simcheck``'s ``cost_curve.json``) instead of the roofline profile.
    cost_curve: Path | None = None
    seed: int = 0
    #: Replica failures to simulate (:mod:`april_bench.engines.sim.failures`): a rate per replica-hour, a
    #: trace of virtual times, and the seconds a failed replica is down.
    failure_rate_per_hour: float = 0.0
    failure_at_s: tuple[float, ...] = ()
    restart_s: float | None = None


#: The deployment a what-if simulates when neither the user nor a cost curve names one.
DEFAULT_HARDWARE, DEFAULT_MODEL = "h100", "qwen3-4b"


def source_deployment(trace: Trace) -> tuple[str, str] | None:
    """The hardware and model profile of the run that made ``trace``, when its provenance names both
    and the simulator has profiles for them (an april-bench run's trace does): a what-if then replays
    the trace on the deployment whose lengths it holds unless told otherwise."""
    from april_bench.profiles.hardware import hardware_names
    from april_bench.profiles.models import MODELS

    hardware, model = trace.header.provenance.get("hardware"), trace.header.provenance.get("model")
    if (
        isinstance(hardware, str)
        and isinstance(model, str)
        and hardware in hardware_names()
        and model in MODELS
    ):
        return hardware, model
    return None


def _deployment(setup: WhatIf, trace: Trace) -> tuple[str, str, int | None, dict[str, Any]]:
    """Hardware, model, GPUs and simulator engine arguments: the roofline profile of ``--hw`` and
    ``--model`` (neither given: the trace's own deployment, else H100 and Qwen3-4B), or one engine
    priced by the measured cost curve (on the curve's hardware and model)."""
    if setup.cost_curve is None:
        source = source_deployment(trace) if setup.hardware is None and setup.model is None else None
        hardware, model = source or (setup.hardware or DEFAULT_HARDWARE, setup.model or DEFAULT_MODEL)
        return hardware, model, setup.num_gpus, {}
    from april_bench.engines.sim import CostCurve

    curve = CostCurve.load_file(setup.cost_curve)  # a bad file is one ConfigError line
    named = (("--hw", setup.hardware, curve.hardware), ("--model", setup.model, curve.model))
    for flag, given, measured in named:
        if given is not None and given != measured:
            raise ConfigError(
                f"{flag} {given}: the cost curve {setup.cost_curve} was measured with {measured}; "
                f"drop {flag} (the curve names it) or drop --cost-curve"
            )
    if setup.num_gpus not in (None, 1):
        raise ConfigError(
            f"--gpus {setup.num_gpus}: a measured cost curve prices one engine; drop --gpus or --cost-curve"
        )
    return curve.hardware, curve.model, None, {"cost_curve": str(setup.cost_curve)}


def whatif_config(
    trace: Trace, setup: WhatIf, *, segments: Sequence[int] | None = None
) -> tuple[Any, list[AblationArm]]:
    """The simulated experiment replaying ``trace`` under every arm, and the arms (ablate's grid).
    ``segments``: the segment arm's lengths (``None``: a quarter of the trace's response limit; empty:
    no segment arm)."""
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.rollout.loop import RolloutConfig

    hardware, model, num_gpus, engine_args = _deployment(setup, trace)
    if setup.ratio < 1:
        raise ConfigError(f"--ratio must be >= 1 (N'/N), got {setup.ratio}")
    groups = trace.groups_per_step()
    limit = trace.response_limit()
    steps = setup.steps if setup.steps is not None else len(trace.steps)
    if steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {steps}")
    strategies = setup.strategies if setup.strategies is not None else ZOO
    if segments is not None and not segments:
        strategies = tuple(name for name in strategies if name != "segment")
    if setup.drivers is not None:
        drivers = setup.drivers
    elif _rollout_gpus(hardware, num_gpus, engine_args) < 2:  # an async arm rolls out and trains apart
        drivers = ()
    else:
        drivers = tuple(parse_drivers(DEFAULT_DRIVERS))
    arms = grid_arms(
        strategies,
        target_groups=groups,
        ratios=[setup.ratio],
        spans=[None],
        segments=list(segments) if segments else [max(1, limit // 4)],
        max_response_len=limit,
        drivers=list(drivers),
    )
    baseline = next((a.label for a in arms if a.strategy == "sync" and not a.driver), arms[0].label)
    workload: dict[str, Any] = {"trace": str(trace.path)}
    if trace.arm is not None:
        workload["trace_arm"] = trace.arm
    from april_bench.sim.workload import DATASET_PROFILES

    # The data-set profile is unused by a replay (the trace gives every length); name the source's
    # when the simulator knows it, so tables say what was replayed.
    source_dataset = str(trace.header.provenance.get("dataset"))
    config = ExperimentConfig(
        dataset=source_dataset if source_dataset in DATASET_PROFILES else "dapo-math-17k",
        hardware=hardware,
        algorithm=setup.algorithm,
        model=model,
        engine="sim",
        trainer="sim",
        strategies=tuple(a.label for a in arms),
        baseline=baseline,
        steps=steps,
        seed=setup.seed,
        num_gpus=num_gpus,
        rollout=RolloutConfig(
            rollout_batch_size=groups,
            n_samples_per_prompt=trace.group_size(),
            over_sampling_batch_size=max(groups, round(setup.ratio * groups)),
            max_response_len=limit,
        ),
        workload_args=workload,
        engine_args={**engine_args, **_failure_args(setup)},
        # a replay on any hardware, the CPU's too: no held-out evaluation, ABBA blocks or warm-up
        eval_every=None,
        block_steps=None,
        warmup_steps=0,
    )
    return config, arms


def _rollout_gpus(hardware: str, num_gpus: int | None, engine_args: dict[str, Any]) -> int:
    from april_bench.profiles.hardware import hardware_profile

    if engine_args.get("cost_curve"):
        return 1  # a cost curve prices one engine
    return num_gpus or hardware_profile(hardware).gpus_per_node


#: A trace whose median response is shorter than this share of what the target model generates in RL
#: (its published median, docs/calibration.md) describes another workload: the what-if says so.
FIT_SHARE = 0.05


def fit_warning(trace: Trace, model: str) -> str | None:
    """One line when the trace's lengths do not fit the model it is replayed as: the gains are then the
    trace's schedule priced at another model's cost per token, not a prediction for that model."""
    from april_bench.sim.length_evidence import MODEL_LENGTHS

    evidence = MODEL_LENGTHS.get(model)
    median = trace.summary().get("response_median")
    if evidence is None or not median or median >= FIT_SHARE * evidence.response_median:
        return None
    made = source_deployment(trace)
    hint = (
        f"replay it as the run that made it (--hw {made[0]} --model {made[1]})"
        if made
        else ("replay a trace of a model that generates like it")
    )
    return (
        f"warning: the trace's median response ({median:,.0f} tokens) is under {FIT_SHARE:.0%} of what "
        f"{model} generates in RL ({evidence.response_median:,.0f} tokens, docs/calibration.md): its gains "
        f"are this trace's schedule priced as {model}, not a prediction for {model}; {hint}"
    )


def _failure_args(setup: WhatIf) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if setup.failure_rate_per_hour:
        args["failure_rate_per_hour"] = setup.failure_rate_per_hour
        args["failure_seed"] = setup.seed
    if setup.failure_at_s:
        args["failure_at_s"] = tuple(setup.failure_at_s)
    if setup.restart_s is not None:
        args["restart_s"] = setup.restart_s
    return args


def run_whatif(
    trace_path: Path,
    setup: WhatIf,
    out: Path | None = None,
    *,
    overwrite: bool = False,
    allow_dirty: bool = False,
    progress: bool = False,
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay the trace under every arm into a run directory (``out``; ``None``: a fresh one under
    ``runs/``), through the runner like any run; returns the result (also written as ``whatif.json``,
    ``whatif.md`` and, with matplotlib, ``whatif.png``).  An interruption is saved, then re-raised as
    ``KeyboardInterrupt``."""
    from april_bench import runner
    from april_bench.rollout.loop import RolloutStalled

    trace = read_trace(trace_path, arm=setup.arm)
    config, arms = whatif_config(trace, setup)
    warning = fit_warning(trace, config.model)  # printed with the table, kept in whatif.json
    components = runner.prepare(config, progress=progress)  # validated before a directory is claimed
    cannot_run: list[tuple[AblationArm, str]] = []  # arms this trace cannot fill a step of, and why
    if any(arm.strategy == "segment" for arm in arms):
        config, arms, components, cannot_run = _workable_segment(trace, setup, config, components, echo)
    name = f"whatif-{trace.path.stem if trace.arm is None else trace.path.parent.name}-{config.hardware}"
    with runner.ClaimedRun.claim(  # one process per run directory while the replay runs
        config,
        components,
        out,
        name=name,
        kind="whatif",
        overwrite=overwrite,
        allow_dirty=allow_dirty,
        progress=progress,
        echo=echo,
    ) as claimed:
        try:
            outcome, config, stalled = runner.execute_grid(claimed)
        except RolloutStalled as exc:  # the baseline itself: say it in whatif's words and flags
            raise ConfigError(
                f"the baseline arm {exc.arm} cannot replay this trace: {exc.reason}. "
                + (
                    "Replay with --algo grpo (no dynamic sampling), or check the trace's rewards"
                    if config.dynamic_sampling_on
                    else "Replay fewer --steps, or another trace"
                )
            ) from None
    if outcome.stored is None:
        stopped = outcome.interrupted_by
        raise KeyboardInterrupt(f"stopped by {stopped}; the replay in {outcome.out} is cut short")
    out = outcome.out
    stored = outcome.stored
    summary = stored.summary()
    result = {
        "result_kind": "simulated",
        "hardware": config.hardware,
        "model": config.model,
        "num_gpus": _rollout_gpus(config.hardware, config.num_gpus, dict(config.engine_args)),
        "cost_curve": None if setup.cost_curve is None else _curve_note(setup.cost_curve),
        "algorithm": config.algorithm,
        "baseline": config.baseline,
        "steps": config.steps,
        "rollout": {
            "groups_per_step": config.rollout.rollout_batch_size,
            "samples_per_prompt": config.rollout.n_samples_per_prompt,
            "over_sampling_batch_size": config.rollout.over_sampling_batch_size,
            "max_response_len": config.rollout.max_response_len,
        },
        "trace": {**trace.header.to_json(), "summary": trace.summary(), "path": str(trace.path)},
        "out": str(out),
        "warnings": [] if warning is None else [warning],
        "rows": [
            _row(arm, summary[arm.label], config.rollout.rollout_batch_size)
            if arm.label not in stalled
            else _cannot_run_row(arm, stalled[arm.label], config.rollout.rollout_batch_size)
            for arm in arms
        ]
        + [_cannot_run_row(arm, why, config.rollout.rollout_batch_size) for arm, why in cannot_run],
    }
    from april_bench.results.store import write_text_atomic

    write_text_atomic(out / "whatif.json", json.dumps(result, indent=1) + "\n")
    write_text_atomic(out / "whatif.md", render_whatif(result) + "\n")
    figure = whatif_figure(result, out / "whatif.png")
    result["figure"] = None if figure is None else str(figure)
    return result


def _workable_segment(
    trace: Trace,
    setup: WhatIf,
    config: Any,
    components: Any,
    echo: Callable[[str], None] | None,
) -> tuple[Any, list[AblationArm], Any, list[tuple[AblationArm, str]]]:
    """The segment arm at a length the trace can fill (:func:`april_bench.zoo.fit_segments`): a quarter
    of the limit, else the shortest workable length derived from the trace's groups, else no segment
    arm (a row says why).  Returns the config, arms and components to run, and the arms left out."""
    from april_bench import runner
    from april_bench.zoo import draw_groups, fit_segments, segment_fit_rows

    rollout = components.rollout  # the loop's settings, resolved once with the components
    target, limit = rollout.rollout_batch_size, rollout.max_response_len
    cap = rollout.max_groups_per_step or 16 * rollout.over_sampling_batch_size
    draws = draw_groups(
        components.workload,
        groups=cap,
        n_samples=rollout.n_samples_per_prompt,
        max_response_len=limit,
        dynamic_sampling=rollout.dynamic_sampling,
    )
    default = max(1, limit // 4)
    fit = fit_segments(
        [default],
        draws,
        target_groups=target,
        wave=rollout.over_sampling_batch_size,
        cap=cap,
        max_response_len=limit,
        derive=True,
    )
    if fit.segments == [default]:
        return config, whatif_config(trace, setup)[1], components, []
    for note in fit.notes:
        if echo is not None:
            echo(f"whatif: {note}")
    config, arms = whatif_config(trace, setup, segments=fit.segments)
    left_out = segment_fit_rows(fit, target_groups=target, ratio=setup.ratio)
    return config, arms, runner.prepare(config), left_out


def _cannot_run_row(arm: AblationArm, why: str, target_groups: int) -> dict[str, Any]:
    """The row of an arm the trace cannot fill a step of: its knobs and the reason, no numbers."""
    return {**_row(arm, {}, target_groups), "cannot_run": why}


def _curve_note(path: Path) -> dict[str, Any]:
    from april_bench.engines.sim import CostCurve

    curve = CostCurve.load_file(path)
    return {
        "path": str(path),
        "engine": curve.engine,
        "model": curve.model,
        "hardware": curve.hardware,
        "load": None if curve.load is None else list(curve.load),
        "utc": curve.utc,
    }


def _row(arm: AblationArm, m: dict[str, Any], target_groups: int) -> dict[str, Any]:
    return {
        "arm": arm.label,
        "strategy": arm.strategy,
        "driver": arm.driver_name,
        "n_prime_over_n": None if arm.over_sampling is None else arm.over_sampling / target_groups,
        "generated_gain": m.get("throughput_gain"),
        "useful_gain": m.get("useful_gain"),
        "end_to_end_gain": m.get("end_to_end_gain"),
        "off_policy_share": m.get("off_policy_token_ratio"),
        "max_staleness": m.get("max_staleness"),
        "step_time_per_step_s": m.get("step_time_per_step_s"),
        "wasted_tokens": m.get("wasted_tokens"),
        "rollout_time_per_step_s": m.get("rollout_time_per_step_s"),
        "failures": m.get("failures"),
        "cannot_run": None,  # or why this trace cannot fill a step of the arm
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def render_whatif(result: dict[str, Any]) -> str:
    """The gains table, every number labelled simulated, under the trace's provenance."""
    from april_bench.trace.format import TraceHeader

    t = result["trace"]
    header = TraceHeader(
        source=t["source"],
        evidence=t["evidence"],
        token_counts=t["token_counts"],
        max_response_len=t.get("max_response_len"),
        origin=t.get("origin", ""),
        created=t.get("created", ""),
        notes=tuple(t.get("notes", ())),
    )
    s, r = t["summary"], result["rollout"]
    gpus = result["num_gpus"]
    curve = result.get("cost_curve")
    engine = (
        f"one {curve['engine']} engine priced by its measured cost curve {curve['path']} "
        f"(measured {curve['utc']}, "
        + ("on a virtual clock: exact)" if curve["load"] is None else f"load {curve['load']})")
        if curve
        else "the simulator's roofline profile"
    )
    lines = [
        f"## What-if: SIMULATED ({result['model']} on {gpus} x {result['hardware']}, {result['algorithm']}; "
        f"gains against {result['baseline']})",
        "",
        *header.lines(),
        f"engine cost: {engine}",
        f"replayed: {result['steps']} steps of {r['groups_per_step']} groups x "
        f"{r['samples_per_prompt']} samples "
        f"(N' = {r['over_sampling_batch_size']}), response limit {r['max_response_len']}; the trace has "
        f"{s['groups']} groups in {s['steps']} steps, median response {s['response_median']:g} tokens, "
        f"p99 {s['response_p99']}, {s['truncated_share']:.0%} truncated",
        *result.get("warnings", ()),
        "",
        "| Arm | Driver | N'/N | Generated-token gain | Useful-token gain | End-to-end gain "
        "| Off-policy share | Max staleness | Step s/step | Source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    from april_bench.results.table import md_cell

    for row in result["rows"]:
        ratio = "-" if row["n_prime_over_n"] is None else f"{row['n_prime_over_n']:.2g}"
        if row.get("cannot_run"):
            lines.append(
                f"| {row['arm']} | {row['driver']} | {ratio} | cannot run here: {row['cannot_run']} "
                "| - | - | - | - | - | simulated |"
            )
            continue
        share = "n/a" if row["off_policy_share"] is None else f"{row['off_policy_share']:.0%}"
        step = "n/a" if row["step_time_per_step_s"] is None else f"{row['step_time_per_step_s']:.1f}"
        lines.append(
            f"| {md_cell(row['arm'])} | {md_cell(row['driver'])} | {ratio} | {_pct(row['generated_gain'])} "
            f"| {_pct(row['useful_gain'])} | {_pct(row['end_to_end_gain'])} | {share} "
            f"| {row['max_staleness']} | {step} | simulated |"
        )
    lines += [
        "",
        "Generated-token gain: generated tokens per second of rollout; useful-token gain: tokens that were "
        "trained per second of rollout; end-to-end: trained tokens per second of whole step (rollout, "
        "training, weight sync). Off-policy share: trained tokens generated by an older policy.",
    ]
    from april_bench.results.faults import failure_lines

    ran = [row for row in result["rows"] if not row.get("cannot_run")]
    return "\n".join(lines + failure_lines(ran, kind="simulated"))


def whatif_figure(result: dict[str, Any], path: Path) -> Path | None:
    """The three gains per arm, and the off-policy share, if matplotlib is installed (not a dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = result["rows"]
    fig, (ax, ax2) = plt.subplots(
        1, 2, figsize=(11, 0.4 * len(rows) + 2), sharey=True, gridspec_kw={"width_ratios": [3, 1]}
    )
    ys = list(range(len(rows)))
    bars = (
        ("generated_gain", "generated-token gain"),
        ("useful_gain", "useful-token gain"),
        ("end_to_end_gain", "end-to-end gain"),
    )
    for i, (key, label) in enumerate(bars):
        ax.barh(
            [y + 0.27 * (i - 1) for y in ys], [100 * (r.get(key) or 0.0) for r in rows], 0.27, label=label
        )
    ax.set_yticks(
        ys, [r["arm"] + (" (cannot run here)" if r.get("cannot_run") else "") for r in rows], fontsize=7
    )
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel(f"% against {result['baseline']} (simulated)")
    ax.legend(loc="lower right", fontsize=7)
    ax2.barh(ys, [100 * (r.get("off_policy_share") or 0.0) for r in rows], color="grey")
    ax2.set_xlabel("off-policy share, %\n(of trained tokens)")
    fig.suptitle(
        f"What-if (simulated): {result['trace']['source']} replayed on "
        f"{result['model']} / {result['hardware']}",
        fontsize=9,
    )
    fig.tight_layout()
    from april_bench.fsio import write_atomic

    # bbox_inches="tight": the saved image grows to hold every label (long arm names were cut)
    write_atomic(
        path,
        lambda f: fig.savefig(f, format=path.suffix.lstrip(".") or "png", dpi=110, bbox_inches="tight"),
    )
    plt.close(fig)
    return path


def parse_strategies(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(s.strip() for s in text.split(",") if s.strip())


def describe(trace: Trace) -> Sequence[str]:
    """Lines about a trace: its provenance and shape (``trace show``)."""
    s = trace.summary()
    return [
        *trace.header.lines(),
        f"{s['samples']} samples in {s['groups']} groups over {s['steps']} steps "
        f"({s['groups_per_step']} groups x {s['group_size']} samples per step); median response "
        f"{s['response_median']:g} tokens, p99 {s['response_p99']}, {s['truncated_share']:.0%} truncated; "
        f"rewards: {'yes' if s['has_rewards'] else 'no'}",
    ]
