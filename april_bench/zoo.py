"""The strategy and driver zoo as a grid of arms: what ``ablate`` and ``whatif`` enumerate.

One factor at a time around each strategy's defaults (:func:`grid_arms`); the asynchronous drivers
(:func:`parse_drivers`) run on the sync-style and APRIL rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import ConfigError

__all__ = ["ASYNC_STRATEGIES", "DEFAULT_DRIVERS", "ZOO", "AblationArm", "grid_arms", "parse_drivers"]

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
