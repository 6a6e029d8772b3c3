"""``ablate``: a grid of strategies and knobs on one workload, as one table (and a figure).

Every arm of the grid runs in one ``run`` (per off-policy mode), so all arms see the same prompts,
seeds and length draws and differ in the strategy alone.  The grid is one factor at a time around
each strategy's defaults: N'/N ratios for every strategy that over-provisions, the staleness bound
(``max_version_span``) and the segment length where a strategy has them, and the asynchronous
drivers (``--drivers``: one-step-off, stale with max_staleness 1 and 2, lookahead 2) on the sync-style
and APRIL rollouts at their first knob values, so partial rollout is isolated inside a
bounded-staleness async system; each off-policy mode is a run of its own (it changes the loss, not
the rollout).  Each run is an ordinary run directory under ``OUT/<mode>/`` (``report`` and ``run
--resume`` work on it); ``OUT/ablation.md`` and ``OUT/ablation.json`` hold the table,
``OUT/ablation.{png,pdf}`` the figure (PNG for the docs, vector PDF for a paper).
``OUT/ablation-plan.json``, written before the first mode runs, is what ``ablate --resume OUT``
finishes after an interruption: every mode, then the outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.cli.output import echo
from april_bench.config import ConfigError
from april_bench.results.episodes import EPISODE_COLUMNS, episode_table
from april_bench.results.table import md_cell, render_markdown
from april_bench.zoo import DEFAULT_DRIVERS, ZOO, AblationArm, grid_arms, parse_drivers

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["ZOO", "AblationArm", "add_parsers", "cmd_ablate", "grid_arms"]


def _drivers(text: str) -> list[dict[str, Any]]:
    try:
        return parse_drivers(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1.5,2,3, got {text!r}") from None
    if any(not 1.0 <= v < 1e6 for v in values):  # NaN and infinity fail too
        raise argparse.ArgumentTypeError(f"N'/N ratios must be >= 1 (and finite), got {text!r}")
    return values


def _spans(text: str) -> list[int | None]:
    out: list[int | None] = []
    for v in (v.strip() for v in text.split(",") if v.strip()):
        if v.lower() in ("none", "off", "-"):
            out.append(None)
            continue
        try:
            out.append(int(v))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected whole numbers or none, like none,1,2, got {text!r}"
            ) from None
    return out


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers like 2048,4096, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"segment lengths must be >= 1, got {text!r}")
    return values


#: The grid flags' defaults (``ablate --resume`` tells them from flags the user gave).
_GRID_DEFAULTS: dict[str, Any] = {
    "ratios": [2.0, 1.5, 3.0],
    "spans": [None, 1],
    "drivers": _drivers(DEFAULT_DRIVERS),
}


def add_parsers(sub: Any) -> None:
    from april_bench.algorithms import OFF_POLICY_MODES
    from april_bench.cli.args import add_run_arguments

    p = sub.add_parser(
        "ablate",
        help="run a grid of strategies and knobs on one workload; one table of gains (and a figure)",
        description="Every strategy of --strategies (default: the whole zoo) at each N'/N ratio, "
        "staleness bound and segment length it takes, one knob at a time, all in one run on the same "
        "prompts and seeds; each --off-policy-modes value is a run of its own. Takes every flag of `run`.",
    )
    add_run_arguments(p)
    grid = p.add_argument_group("the grid (one knob at a time around the first value of each)")
    grid.add_argument(
        "--ratios", type=_floats, default=_GRID_DEFAULTS["ratios"], metavar="LIST", help="N'/N values"
    )
    grid.add_argument(
        "--spans",
        type=_spans,
        default=_GRID_DEFAULTS["spans"],
        metavar="LIST",
        help="max_version_span values (none: unbounded)",
    )
    grid.add_argument(
        "--segments",
        type=_ints,
        default=None,
        metavar="LIST",
        help="segment_len values; one the workload cannot fill a step with is a 'cannot run here' row "
        "(default: 1/4, 1/8 and 1/2 of --max-response-len, each raised to a length the workload can fill)",
    )
    grid.add_argument(
        "--drivers",
        type=_drivers,
        default=_GRID_DEFAULTS["drivers"],
        metavar="LIST",
        help="asynchronous drivers run on the sync and APRIL arms: one-step-off, stale:ETA, lookahead:K, or "
        f"none (default: {DEFAULT_DRIVERS}; on the simulator they train on a quarter of the node and roll "
        "out on the rest)",
    )
    grid.add_argument(
        "--off-policy-modes",
        metavar="LIST",
        help=f"comma-separated ({', '.join(OFF_POLICY_MODES)}); one run each (default: the recipe's)",
    )
    p.set_defaults(handler=cmd_ablate)


#: The ablation's plan, written before its first mode runs: what ``ablate --resume OUT`` finishes.
PLAN_NAME = "ablation-plan.json"
_PLAN_KIND = "april-bench ablation plan"


def cmd_ablate(args: argparse.Namespace) -> int:
    from april_bench import runner
    from april_bench.algorithms import OFF_POLICY_MODES
    from april_bench.cli.args import config_from_args
    from april_bench.results.reference import check_reference_output
    from april_bench.results.rundir import RunLock, claim_run_dir, default_run_name
    from april_bench.results.schema import SCHEMA_VERSION
    from april_bench.results.store import write_json_atomic

    if args.resume is not None:
        return _resume(args)
    base = config_from_args(args)
    strategies = ZOO if args.strategies is None else base.strategies
    max_len = base.rollout.max_response_len
    segments = args.segments or [max(1, max_len // 4), max(1, max_len // 8), max(1, max_len // 2)]
    ratio = args.ratios[0] if args.ratios else None
    cannot_run: list[tuple[AblationArm, str]] = []  # arms this workload cannot fill a step of, and why
    if "segment" in strategies:
        segments, cannot_run = _workable_segments(base, segments, ratio, derive=args.segments is None)
        if not segments:  # no length this workload can fill: the segment arms are rows that say why
            strategies = tuple(name for name in strategies if name != "segment")
    arms = grid_arms(
        strategies,
        target_groups=base.rollout.rollout_batch_size,
        ratios=args.ratios,
        spans=args.spans,
        segments=segments,
        max_response_len=max_len,
        drivers=args.drivers,
    )
    modes = [m.strip() for m in (args.off_policy_modes or base.off_policy).split(",") if m.strip()]
    for mode in modes:
        if mode not in OFF_POLICY_MODES:
            raise ConfigError(f"--off-policy-modes: {mode!r} is not one of {', '.join(OFF_POLICY_MODES)}")
    baseline = base.baseline or next((a.label for a in arms if a.strategy == "sync"), arms[0].label)
    configs = {
        mode: base.replace(strategies=tuple(a.label for a in arms), off_policy=mode, baseline=baseline)
        for mode in modes
    }
    components = {
        mode: runner.prepare(config, progress=not args.no_progress) for mode, config in configs.items()
    }
    name = "ablate-" + default_run_name(base.hardware, base.algorithm, base.dataset)
    check_reference_output(args.out, allow_dirty=args.allow_dirty)  # results/ holds committed evidence
    lock = RunLock()  # held until the ablation ends: a second ablate into this --out is refused
    out = claim_run_dir(args.out, default_name=name, overwrite=args.overwrite, lock=lock, kind="ablate")
    try:
        plan = {
            "kind": _PLAN_KIND,
            "schema_version": SCHEMA_VERSION,
            "arms": [dataclasses.asdict(arm) for arm in arms],
            "cannot_run": [[dataclasses.asdict(arm), why] for arm, why in cannot_run],
            "baseline": baseline,
            "configs": {mode: config.to_dict() for mode, config in configs.items()},
        }
        write_json_atomic(out / PLAN_NAME, plan)  # before any mode runs: an interruption can be finished
        _echo(f"ablation: {len(arms)} arms x {len(modes)} off-policy mode(s) -> {out}")
        for arm, why in cannot_run:
            _echo(f"ablation: {arm.label} cannot run here: {why}")
        return _run_modes(
            out, arms, configs, baseline, cannot_run, components=components, progress=not args.no_progress
        )
    finally:
        lock.release()  # a caller in this process may claim the directory again


def _resume(args: argparse.Namespace) -> int:
    """``ablate --resume OUT``: finish every mode of the plan (a complete mode is kept, an interrupted
    one resumed, one not started run), then write the ablation's table, JSON and figure."""
    from april_bench.cli.args import flags_set
    from april_bench.experiment_config import load_config
    from april_bench.redact import redacted_fields
    from april_bench.results.reference import check_reference_output
    from april_bench.results.rundir import RunLock
    from april_bench.results.schema import SCHEMA_VERSION, schema_version_of
    from april_bench.results.validate_files import read_json_object

    allowed = {"--resume", "--no-progress", "--allow-dirty"}
    extra = [f for f in flags_set(args) if f not in allowed and not _grid_default(args, f)]
    if extra:
        raise ConfigError(f"--resume continues an ablation with its own plan; drop {', '.join(extra)}")
    out = Path(args.resume).expanduser()
    if not out.is_dir():
        raise ConfigError(f"--resume {out}: no such ablation directory")
    if not (out / PLAN_NAME).is_file():
        raise ConfigError(
            f"--resume {out}: no {PLAN_NAME}, so not an ablation this april-bench can finish (one made "
            "before plans were written: continue each mode with `run --resume OUT/<mode>`)"
        )
    check_reference_output(out, allow_dirty=args.allow_dirty)
    with RunLock(out):
        plan = read_json_object(out / PLAN_NAME, "ablation plan")
        if plan.get("kind") != _PLAN_KIND:
            raise ConfigError(f"{out / PLAN_NAME}: not an april-bench ablation plan")
        if schema_version_of(plan) > SCHEMA_VERSION:
            newer = plan["schema_version"]
            raise ConfigError(
                f"{out / PLAN_NAME}: written by a newer april-bench (schema_version {newer}, this one "
                f"reads up to {SCHEMA_VERSION}); finish it with that version"
            )
        hidden = redacted_fields(plan.get("configs"))
        if hidden:
            raise ConfigError(
                f"{out / PLAN_NAME}: holds redacted credentials ({', '.join(hidden)}); start it again"
            )
        if (out / "ablation.json").exists():
            raise ConfigError(f"{out} is already complete; its table is {out / 'ablation.md'}")
        try:
            arms = [_arm(a) for a in plan["arms"]]
            cannot_run = [(_arm(a), str(why)) for a, why in plan.get("cannot_run", [])]
            configs = {str(mode): load_config(c) for mode, c in plan["configs"].items()}
            baseline = str(plan["baseline"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"{out / PLAN_NAME}: damaged ({type(exc).__name__}: {exc}); start it again"
            ) from None
        _echo(f"resuming ablation {out}: {len(arms)} arms x {len(configs)} off-policy mode(s)")
        return _run_modes(
            out,
            arms,
            configs,
            baseline,
            cannot_run,
            components=None,
            progress=not args.no_progress,
            resume=True,
            allow_dirty=args.allow_dirty,
        )


def _arm(data: dict[str, Any]) -> AblationArm:
    """An arm of the plan, as ``dataclasses.asdict`` wrote it."""
    return AblationArm(**{**data, "driver": tuple((str(k), v) for k, v in data.get("driver", ()))})


def _grid_default(args: argparse.Namespace, flag: str) -> bool:
    """Whether ``flag`` is one of the grid's flags left at its default (argparse fills those in)."""
    name = flag.removeprefix("--").replace("-", "_")
    return name in _GRID_DEFAULTS and getattr(args, name) == _GRID_DEFAULTS[name]


def _mode_state(run_dir: Path) -> str | None:
    """A mode's run state (``complete``, ``interrupted`` ...), ``None`` when it never started."""
    try:
        data = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return str(data.get("state")) if isinstance(data, dict) else None


def _run_modes(
    out: Path,
    arms: list[AblationArm],
    configs: dict[str, Any],
    baseline: str,
    cannot_run: list[tuple[AblationArm, str]],
    *,
    components: dict[str, Any] | None,
    progress: bool,
    resume: bool = False,
    allow_dirty: bool = False,
) -> int:
    """Run (or, with ``resume``, finish) every mode, then write the ablation's outputs.  An arm the
    workload cannot fill (``cannot_run``, known up front; or one that stalls in a mode's run, which
    then goes on without it: ``runner.execute_grid``) is a row that says why, never the end of it."""
    from april_bench import runner
    from april_bench.cli.commands import print_outcome
    from april_bench.results.store import load_run

    rows: list[dict[str, Any]] = []
    simulated = True
    first = next(iter(configs.values()))
    for mode, config in configs.items():
        run_dir = out / mode
        state = _mode_state(run_dir) if resume else None
        tick = time.monotonic()
        outcome = None
        stalled: dict[str, str] = {}
        if state is None:
            prepared = (
                components[mode] if components is not None else runner.prepare(config, progress=progress)
            )
            with runner.ClaimedRun.claim(
                config,
                prepared,
                run_dir,
                name=mode,
                overwrite=resume,
                allow_dirty=True,  # checked once, for the whole ablation directory
                lock=False,  # a mode's directory inside the ablation's
                progress=progress,
                echo=_echo,
            ) as claimed:
                outcome, _, stalled = runner.execute_grid(claimed)
        elif state != "complete":
            outcome = runner.resume(run_dir, progress=progress, echo=_echo, allow_dirty=allow_dirty)
        if outcome is not None:
            code = print_outcome(outcome)
            if code != 0:
                _echo(f"ablation: continue every mode with `{runner._prog()} ablate --resume {out}`")
                return code
            _echo(f"ablation: mode {mode} done in {time.monotonic() - tick:.0f} s")
        # a mode just run holds its summary, accumulated as the rows streamed: no table read back
        run = outcome.stored if outcome is not None and outcome.stored is not None else load_run(run_dir)
        simulated = simulated and run.simulated
        summary = run.summary()
        target = first.rollout.rollout_batch_size
        for arm in arms:
            if arm.label in summary:
                rows.append(_row(arm, mode, summary[arm.label], target))
            else:  # left out of the mode's run: it could not gather a step's groups
                why = stalled.get(
                    arm.label, "it could not gather a step's groups (left out of this mode's run)"
                )
                rows.append(_cannot_run_row(arm, mode, why, target))
        rows += [_cannot_run_row(arm, mode, why, target) for arm, why in cannot_run]
    from april_bench.results.schema import SCHEMA_VERSION

    result = {
        "schema_version": SCHEMA_VERSION,
        "result_kind": "simulated" if simulated else "measured",
        "hardware": first.hardware,
        "algorithm": first.algorithm,
        "dataset": first.dataset,
        "model": first.model,
        "steps": first.steps,
        "baseline": baseline,
        "rows": rows,
    }
    from april_bench.results.store import write_text_atomic

    write_text_atomic(out / "ablation.json", json.dumps(result, indent=1) + "\n")
    table = render_ablation(result)
    write_text_atomic(out / "ablation.md", table + "\n")
    figure = _figure(result, out / "ablation.png")
    print(table)
    print(
        f"\nablation directory: {out}" + (f"; figure: {figure}" if figure else " (no matplotlib: no figure)")
    )
    return 0


def _workable_segments(
    base: ExperimentConfig, segments: list[int], ratio: float | None, *, derive: bool
) -> tuple[list[int], list[tuple[AblationArm, str]]]:
    """The segment lengths the workload can fill (:func:`april_bench.zoo.fit_segments`): the defaults
    raised to a workable length, lengths the user chose that cannot fill a step left out (by label)."""
    from april_bench import runner
    from april_bench.zoo import draw_groups, fit_segments, segment_fit_rows

    components = runner.prepare(base.replace(strategies=("sync",), baseline=None))
    rollout = components.rollout  # as every session gets it: the filter as the algorithm sets it
    target = rollout.rollout_batch_size
    cap = rollout.max_groups_per_step or 16 * rollout.over_sampling_batch_size
    draws = draw_groups(
        components.workload,
        groups=cap,
        n_samples=rollout.n_samples_per_prompt,
        max_response_len=rollout.max_response_len,
        dynamic_sampling=rollout.dynamic_sampling,
    )
    fit = fit_segments(
        segments,
        draws,
        target_groups=target,
        wave=max(target, round((ratio or 1.0) * target)),
        cap=cap,
        max_response_len=rollout.max_response_len,
        derive=derive,
    )
    for note in fit.notes:
        _echo(f"ablation: {note}")
    return fit.segments, segment_fit_rows(fit, target_groups=target, ratio=ratio)


def _cannot_run_row(arm: AblationArm, mode: str, why: str, target_groups: int) -> dict[str, Any]:
    """The row of an arm that cannot fill a step under this workload: its knobs and the reason, no numbers."""
    row = _row(arm, mode, {}, target_groups)
    row["cannot_run"] = why
    return row


def _echo(line: str) -> None:
    echo(line)


def _row(arm: AblationArm, mode: str, m: dict[str, Any], target_groups: int) -> dict[str, Any]:
    return {
        "arm": arm.label,
        "strategy": arm.strategy,
        "driver": arm.driver_name,
        "off_policy_mode": mode,
        "n_prime_over_n": None if arm.over_sampling is None else arm.over_sampling / target_groups,
        "max_version_span_bound": arm.max_version_span if arm.bounded else "-",
        "segment_len": arm.segment_len,
        "throughput_gain": m.get("throughput_gain"),
        "useful_gain": m.get("useful_gain"),
        "end_to_end_gain": m.get("end_to_end_gain"),
        "off_policy_token_ratio": m.get("off_policy_token_ratio"),
        "max_version_span": m.get("max_version_span"),
        "max_staleness": m.get("max_staleness"),
        "step_time_per_step_s": m.get("step_time_per_step_s"),
        "wasted_tokens": m.get("wasted_tokens"),
        "rollout_time_per_step_s": m.get("rollout_time_per_step_s"),
        "accuracy": m.get("accuracy"),
        "accuracy_improvement": m.get("accuracy_improvement"),
        "failures": m.get("failures"),
        "episodes": m.get("episodes"),  # multi-turn runs (docs/agents.md)
        "cannot_run": None,  # or why this workload cannot fill a step of the arm
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def render_ablation(result: dict[str, Any]) -> str:
    """The ablation table, labelled simulated or measured, gains against the baseline arm."""
    kind = result["result_kind"]
    lines = [
        f"## Ablation: {kind.upper()} ({result['model']} on {result['hardware']}, {result['algorithm']}, "
        f"{result['dataset']}, {result['steps']} steps; gains against {result['baseline']})",
        "",
        "| Off-policy | Arm | Driver | N'/N | Span bound | Segment | Throughput gain | Useful-token gain "
        "| End-to-end gain | Off-policy share | Version span | Staleness | Rollout s/step | Step s/step "
        "| Accuracy | Source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        ratio = "-" if r["n_prime_over_n"] is None else f"{r['n_prime_over_n']:.2g}"
        span = "none" if r["max_version_span_bound"] is None else str(r["max_version_span_bound"])
        if r.get("cannot_run"):
            lines.append(
                f"| {r['off_policy_mode']} | {r['arm']} | {r.get('driver', 'sync')} | {ratio} | {span} "
                f"| {r['segment_len'] or '-'} | cannot run here: {r['cannot_run']} "
                "| - | - | - | - | - | - | - | - | - |"
            )
            continue
        accuracy = "n/a (simulated)" if kind == "simulated" else _accuracy(r)
        lines.append(
            f"| {md_cell(r['off_policy_mode'])} | {md_cell(r['arm'])} | {md_cell(r.get('driver', 'sync'))} "
            f"| {ratio} | {span} "
            f"| {r['segment_len'] or '-'} "
            f"| {_pct(r['throughput_gain'])} | {_pct(r['useful_gain'])} | {_pct(r['end_to_end_gain'])} "
            f"| {_share(r['off_policy_token_ratio'])} | {r['max_version_span']} "
            f"| {r.get('max_staleness', '-')} "
            f"| {r['rollout_time_per_step_s']:.1f} | {_seconds(r.get('step_time_per_step_s'))} "
            f"| {accuracy} | {kind} |"
        )
    episodes = episode_table({r["arm"]: r for r in result["rows"] if not r.get("cannot_run")})
    if episodes:
        lines += ["", "### Episodes (trained multi-turn episodes; docs/agents.md)", ""]
        lines.append(render_markdown(EPISODE_COLUMNS, episodes))
    from april_bench.results.faults import failure_lines

    ran = [r for r in result["rows"] if not r.get("cannot_run")]
    return "\n".join(lines + failure_lines(ran, kind=kind))


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _accuracy(row: dict[str, Any]) -> str:
    if row["accuracy"] is None:
        return "n/a (no eval)"
    gain = row["accuracy_improvement"]
    return f"{row['accuracy']:.3f}" + ("" if gain is None else f" ({gain:+.1%})")


def _figure(result: dict[str, Any], path: Path) -> Path | None:
    """Throughput, useful-token and end-to-end gain per arm: ``path`` (PNG) and a vector PDF beside it,
    titled MEASURED or SIMULATED, the legend below the bars (it covers none)."""
    import matplotlib

    from april_bench.results.figures import PAPER_RC, WIDTH_IN

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    labels = [
        (
            f"{r['arm']} ({r['off_policy_mode']})"
            if len({x["off_policy_mode"] for x in rows}) > 1
            else r["arm"]
        )
        + (" (cannot run here)" if r.get("cannot_run") else "")
        for r in rows
    ]
    with matplotlib.rc_context(dict(PAPER_RC)):  # type: ignore[arg-type]
        fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.22 * len(rows) + 1.6), layout="constrained")
        ys = range(len(rows))
        bars = (
            ("throughput_gain", "throughput gain"),
            ("useful_gain", "useful-token gain"),
            ("end_to_end_gain", "end-to-end gain (trained tokens per second of step time)"),
        )
        for i, (key, label) in enumerate(bars):
            ax.barh(
                [y + 0.27 * (i - 1) for y in ys], [100 * (r.get(key) or 0.0) for r in rows], 0.27, label=label
            )
        ax.set_yticks(list(ys), labels, fontsize=6)
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel(f"% against {result['baseline']}")
        kind = str(result["result_kind"]).upper()
        where = ", ".join(str(result.get(k, "")) for k in ("hardware", "algorithm", "dataset"))
        fig.suptitle(f"{kind}: strategy ablation ({where})")
        fig.legend(loc="outside lower center", ncols=3, frameon=False)
        from april_bench.fsio import write_atomic

        write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=150, metadata={"Software": None}))
        pdf = {"Creator": None, "Producer": None, "CreationDate": None}
        write_atomic(path.with_suffix(".pdf"), lambda f: fig.savefig(f, format="pdf", metadata=pdf))
    plt.close(fig)
    return path
