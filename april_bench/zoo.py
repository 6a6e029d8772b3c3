"""The strategy and driver zoo as a grid of arms: what ``ablate`` and ``whatif`` enumerate.

One factor at a time around each strategy's defaults (:func:`grid_arms`); the asynchronous drivers
(:func:`parse_drivers`) run on the sync-style and APRIL rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import ConfigError
from april_bench.workload import Workload

__all__ = [
    "ASYNC_STRATEGIES",
    "DEFAULT_DRIVERS",
    "ZOO",
    "AblationArm",
    "GroupDraw",
    "SegmentFit",
    "draw_groups",
    "fit_segments",
    "grid_arms",
    "parse_drivers",
    "segment_fit_rows",
]

#: The default base strategies: the paper's arms and the zoo.
ZOO = (
    "sync",
    "oversample-discard",
    "april",
    "tail-batching",
    "segment",
    "adaptive",
    "length-aware",
    "consistent",
    "sagc",
    "response-oversample",
)
#: The rollouts the async drivers run on: without partial rollout (sync) and with it (APRIL).
ASYNC_STRATEGIES = ("sync", "april")
#: The default ``--drivers``: verl's one-step-off, AReaL's bounded staleness at eta = 1 and 2, and a
#: lookahead of 2 steps that never restarts (Tinker's sampling_steps_ahead, prime-rl's max_async_level).
DEFAULT_DRIVERS = "one-step-off,stale:1,stale:2,lookahead:2"
_RATIO, _SPAN, _SEGMENT = "over_sampling_batch_size", "max_version_span", "segment_len"


@dataclass(frozen=True, slots=True)
class AblationArm:
    """One arm of the grid: its label (``name[key=value,...]``), strategy and knob values."""

    label: str
    strategy: str
    over_sampling: int | None = None
    max_version_span: int | None = None
    segment_len: int | None = None
    #: Whether the strategy takes a staleness bound (``max_version_span=None`` then means unbounded).
    bounded: bool = False
    #: The driver's arm options (empty: synchronous).
    driver: tuple[tuple[str, Any], ...] = ()

    @property
    def driver_name(self) -> str:
        options = dict(self.driver)
        name = str(options.get("driver", "sync"))
        if name == "lookahead":
            return f"lookahead (k={options.get('steps_ahead', 1)})"
        return f"stale (eta={options.get('max_staleness', 1)})" if name == "stale" else name


def _label(strategy: str, knobs: dict[str, int]) -> str:
    inner = ",".join(f"{k}={v}" for k, v in knobs.items())
    return f"{strategy}[{inner}]" if inner else strategy


def grid_arms(
    strategies: Sequence[str],
    *,
    target_groups: int,
    ratios: Sequence[float],
    spans: Sequence[int | None],
    segments: Sequence[int],
    max_response_len: int,
    drivers: Sequence[dict[str, Any]] = (),
) -> list[AblationArm]:
    """One factor at a time: each strategy at its first value of every knob it has, then each knob's
    other values alone.  A strategy without a knob (sync has none) is one arm.  Segment arms whose
    staleness bound cannot hold a full response (segment_len x (span + 1) < the limit: it would restart
    forever) are left out.  Each of ``drivers`` (arm options such as ``{"driver": "stale",
    "max_staleness": 2}``) adds one arm per strategy of :data:`ASYNC_STRATEGIES` in ``strategies``, at
    that strategy's first knob values."""
    from april_bench.strategies import STRATEGIES, strategy_options

    arms: dict[str, AblationArm] = {}
    for name in strategies:
        if name not in STRATEGIES:
            STRATEGIES.get(name)  # one line with the known names
        options = strategy_options(name)
        axes: dict[str, list[Any]] = {}
        if _RATIO in options and ratios:
            axes[_RATIO] = [max(target_groups, round(r * target_groups)) for r in ratios]
        if _SPAN in options and spans:
            axes[_SPAN] = list(spans)
        if _SEGMENT in options and segments:
            axes[_SEGMENT] = list(segments)
        base = {axis: values[0] for axis, values in axes.items()}
        variants = [base] + [{**base, axis: v} for axis, values in axes.items() for v in values[1:]]
        for knobs in variants:
            segment, span = knobs.get(_SEGMENT), knobs.get(_SPAN)
            if segment is not None and span is not None and segment * (span + 1) < max_response_len:
                continue
            shown = {k: v for k, v in knobs.items() if v is not None}
            label = _label(name, shown)
            arms.setdefault(
                label,
                AblationArm(
                    label=label,
                    strategy=name,
                    over_sampling=knobs.get(_RATIO),
                    max_version_span=knobs.get(_SPAN),
                    segment_len=knobs.get(_SEGMENT),
                    bounded=_SPAN in axes,
                ),
            )
        if name not in ASYNC_STRATEGIES:
            continue
        shown = {k: v for k, v in base.items() if v is not None}
        for driver in drivers:
            label = _label(name, {**shown, **driver})
            arms.setdefault(
                label,
                AblationArm(
                    label=label,
                    strategy=name,
                    over_sampling=base.get(_RATIO),
                    max_version_span=base.get(_SPAN),
                    segment_len=base.get(_SEGMENT),
                    bounded=_SPAN in axes,
                    driver=tuple(driver.items()),
                ),
            )
    return list(arms.values())


def parse_drivers(text: str) -> list[dict[str, Any]]:
    """``one-step-off,stale:1,stale:2,lookahead:2`` (or ``none``) as arm options, one dict per driver."""
    out: list[dict[str, Any]] = []
    for v in (v.strip() for v in text.split(",") if v.strip()):
        if v.lower() in ("none", "off", "-"):
            continue
        name, _, eta = v.partition(":")
        if name == "one-step-off" and not eta:
            out.append({"driver": name})
        elif name == "stale" and eta.isdigit():
            out.append({"driver": name, "max_staleness": int(eta)})
        elif name == "lookahead" and eta.isdigit() and int(eta) >= 1:
            out.append({"driver": name, "steps_ahead": int(eta)})
        else:
            raise ConfigError(
                "expected one-step-off, stale:ETA or lookahead:K (or none), like "
                f"one-step-off,stale:1,stale:2,lookahead:2; got {v!r}"
            )
    return out


# ---------------------------------------------------------------- segments the workload can fill


@dataclass(frozen=True, slots=True)
class GroupDraw:
    """One prompt group of the workload as drawn: its longest response and whether it passes the filter."""

    longest: int
    passes: bool


def draw_groups(
    workload: Workload, *, groups: int, n_samples: int, max_response_len: int, dynamic_sampling: bool
) -> list[GroupDraw] | None:
    """The first ``groups`` prompt groups of ``workload``'s stream (the prompts every arm's step 0 takes,
    in order): each group's longest response and whether it passes DAPO's filter (rewards not all
    equal; a response past the limit is truncated).  ``None`` when the lengths are not known before
    generation (a real engine's model decides them)."""
    from april_bench.algorithms.filters import keep_group
    from april_bench.types import Sample, SampleStatus

    out = []
    for prompt in workload.prompt_stream().take(groups):
        lengths = [workload.replay_len(prompt, i, 0) for i in range(n_samples)]
        known = [n for n in lengths if n is not None]
        if len(known) < len(lengths):
            return None
        rewards = [
            workload.reward(
                Sample(
                    prompt=prompt,
                    index=i,
                    status=SampleStatus.TRUNCATED if n >= max_response_len else SampleStatus.COMPLETED,
                )
            )
            for i, n in enumerate(known)
        ]
        passes = keep_group(rewards) if dynamic_sampling else True
        out.append(GroupDraw(longest=max(known), passes=passes))
    return out


def step_zero_launches(
    draws: Sequence[GroupDraw], segment: int, *, target_groups: int, wave: int
) -> int | None:
    """Groups the segment strategy launches in its first step before ``target_groups`` pass: it launches
    waves of ``wave`` groups, each back whole before the next, and a group passes when every response
    ends within one segment and the filter takes it.  ``None``: ``draws`` run out first."""
    passed = 0
    for i, draw in enumerate(draws):
        passed += draw.longest <= segment and draw.passes
        if passed >= target_groups:
            return -(-(i + 1) // wave) * wave
    return None


@dataclass(frozen=True, slots=True)
class SegmentFit:
    """The segment lengths a grid runs, and the lengths it leaves out with the reason for each."""

    segments: list[int]
    left_out: dict[int, str]
    #: One line per default that was raised to a length the workload fills (for the user).
    notes: list[str]


#: A derived segment must fill step 0 within this share of the step's launch cap: room for the filter's
#: draws and for the groups that later steps resume before fresh ones.
DERIVED_CAP_SHARE = 0.5


def fit_segments(
    segments: Sequence[int],
    draws: Sequence[GroupDraw] | None,
    *,
    target_groups: int,
    wave: int,
    cap: int,
    max_response_len: int,
    derive: bool,
) -> SegmentFit:
    """Which segment lengths can fill a step under the workload (``draws``; ``None``: unknown, all kept).

    A segment whose first step cannot gather ``target_groups`` within ``cap`` launches (the loop's
    ``max_groups_per_step``) would stop the run.  With ``derive`` (the grid's defaults, fractions of
    the limit) such a length is raised to the shortest one whose first step fills within half of
    the cap, rounded up to a multiple of 128; otherwise (lengths the user chose) it is left out with
    the reason.  A length no segment up to the limit makes workable is left out either way."""
    if draws is None:
        return SegmentFit(list(segments), {}, [])

    def launches(segment: int) -> int | None:
        return step_zero_launches(draws, segment, target_groups=target_groups, wave=wave)

    def why(segment: int) -> str:
        fits = sum(d.longest <= segment and d.passes for d in draws)
        found = launches(segment)
        share = (
            f"step 0 cannot gather {target_groups} groups in {cap:,} launches"
            if found is None or found > cap
            else f"step 0 needs {found:,} of its {cap:,} launches to gather {target_groups} groups "
            f"(more than {DERIVED_CAP_SHARE:.0%}: little room for the later steps)"
        )
        return (
            f"only {fits:,} of the workload's first {len(draws):,} groups finish every response within one "
            f"segment of {segment:,} tokens and pass the filter, so {share}"
        )

    workable = None
    if derive:
        budget = max(wave, int(cap * DERIVED_CAP_SHARE))
        candidates = sorted({d.longest for d in draws if d.passes and d.longest <= max_response_len})
        for length in candidates:
            found = launches(length)
            if found is not None and found <= budget:
                workable = min(max_response_len, -(-length // 128) * 128)
                break
    kept: list[int] = []
    left_out: dict[int, str] = {}
    notes: list[str] = []
    for segment in segments:
        found = launches(segment)
        if derive and (found is None or found > max(wave, int(cap * DERIVED_CAP_SHARE))):
            if workable is None:
                left_out[segment] = why(segment)
                continue
            notes.append(f"segment_len {segment:,}: {why(segment)}; the grid uses {workable:,} instead")
            segment = max(segment, workable)
        elif found is None or found > cap:
            left_out[segment] = why(segment)
            continue
        if segment not in kept:
            kept.append(segment)
    return SegmentFit(kept, left_out, notes)


def segment_fit_rows(
    fit: SegmentFit, *, target_groups: int, ratio: float | None
) -> list[tuple[AblationArm, str]]:
    """The segment arms the fit left out, as :func:`grid_arms` would have built them (at the first
    N'/N ratio, ``None``: no ratio axis), each with the reason."""
    over = None if ratio is None else max(target_groups, round(ratio * target_groups))
    out = []
    for segment, why in fit.left_out.items():
        knobs = {_SEGMENT: segment} if over is None else {_RATIO: over, _SEGMENT: segment}
        label = _label("segment", knobs)
        out.append(
            (AblationArm(label=label, strategy="segment", over_sampling=over, segment_len=segment), why)
        )
    return out
