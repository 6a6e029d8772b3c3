"""``compare BASE NEW``: did a change move the gains?  The regression gate for CI.

Each arm present in both runs (the baseline arm excepted) is compared on each
gain: ``throughput`` (generated tokens per rollout second), ``useful`` (trained
tokens per rollout second) and ``end_to_end`` (trained tokens per step second).
Two views of a gain are compared:

``total``
    the ratio-of-totals gain of the summary (``throughput_gain`` ...);
``median``
    the median of the paired block gains (:mod:`april_bench.results.stats`).

``iterations``
    the hardware-neutral gains: ``iteration_throughput`` (generated tokens per
    engine iteration) and ``iteration_useful`` (trained tokens per engine
    iteration), against the baseline.  For april-bench's own engines they are
    schedule-deterministic: the same code and seed give the same values on a
    busy machine or an idle one, so they can be gated exactly.

A rule ``VIEW:TOLERANCE`` (``--fail median:5%``, ``--fail total:0``,
``--fail iterations:0``) fails the comparison when NEW's gain is more than
TOLERANCE below BASE's; ``total`` and ``median`` rules apply to the wall-clock
gains, ``iterations`` rules to the iteration-unit ones.  ``median:ci`` fails
when NEW's paired median lies below BASE's 95% interval, or NEW's whole interval
lies below BASE's median: a drop as large as the reference's own spread.

The default rules depend on what was compared: for simulated runs, ``total:0``
(the simulator is deterministic: any change is a change); for measured runs,
``iterations:0`` (exact, where both runs counted their engine's work) and
``median:ci``.  On a loaded machine ``median:ci`` flags load as well as
regressions (the same commit's paired medians have differed by 100 points at
load 4-7); the iteration-unit rule is the one a CI should gate on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import ConfigError

__all__ = [
    "GAINS",
    "ITERATION_GAINS",
    "Comparison",
    "Rule",
    "compare_runs",
    "config_differences",
    "default_rules",
    "parse_rule",
    "render_comparison",
]

GAINS = ("throughput", "useful", "end_to_end")
ITERATION_GAINS = ("iteration_throughput", "iteration_useful")
_TOTAL_KEY = {
    "throughput": "throughput_gain",
    "useful": "useful_gain",
    "end_to_end": "end_to_end_gain",
    "iteration_throughput": "iteration_throughput_gain",
    "iteration_useful": "iteration_useful_gain",
}
_RULE = re.compile(r"^(total|median|iterations):(ci|[0-9.]+%?)$")


@dataclass(frozen=True, slots=True)
class Rule:
    view: str  # "total" or "median" (wall-clock gains), "iterations" (iteration-unit gains)
    #: Allowed drop in gain units (0.05 = 5 points); ``None`` means "the intervals must overlap".
    tolerance: float | None

    def __str__(self) -> str:
        amount = "ci" if self.tolerance is None else f"{self.tolerance * 100:g}%" if self.tolerance else "0"
        return f"{self.view}:{amount}"


def parse_rule(text: str) -> Rule:
    match = _RULE.match(text.strip())
    if match is None:
        raise ConfigError(
            f"--fail {text!r}: write VIEW:TOLERANCE, e.g. median:5%, total:0, median:ci or iterations:0"
        )
    view, amount = match.groups()
    if amount == "ci":
        if view != "median":
            raise ConfigError(f"--fail {view}:ci: only the paired median has an interval; use median:ci")
        return Rule(view, None)
    value = float(amount.rstrip("%"))
    return Rule(view, value / 100 if amount.endswith("%") else value)


def default_rules(simulated: bool) -> list[Rule]:
    return [Rule("total", 0.0)] if simulated else [Rule("iterations", 0.0), Rule("median", None)]


@dataclass(frozen=True, slots=True)
class Comparison:
    arm: str
    gain: str
    rule: Rule
    base: float | None
    new: float | None
    base_ci: Sequence[float] | None
    new_ci: Sequence[float] | None
    regressed: bool
    why: str

    @property
    def delta(self) -> float | None:
        return None if self.base is None or self.new is None else self.new - self.base


def compare_runs(
    base: Mapping[str, Mapping[str, Any]],
    new: Mapping[str, Mapping[str, Any]],
    rules: Sequence[Rule],
    gains: Sequence[str] = GAINS,
) -> list[Comparison]:
    """Every (arm, gain, rule) of two run summaries, with its verdict."""
    arms = [a for a in base if a in new and a != base[a].get("baseline")]
    if not arms:
        raise ConfigError("the two runs have no non-baseline arm in common: nothing to compare")
    out = []
    for arm in arms:
        for rule in rules:
            for gain in ITERATION_GAINS if rule.view == "iterations" else gains:
                out.append(_compare(arm, gain, rule, base[arm], new[arm]))
    return out


def _compare(arm: str, gain: str, rule: Rule, base: Mapping[str, Any], new: Mapping[str, Any]) -> Comparison:
    if rule.view in ("total", "iterations"):
        b, n = base.get(_TOTAL_KEY[gain]), new.get(_TOTAL_KEY[gain])
        b_ci = n_ci = None
    else:
        b_stats, n_stats = (
            base.get("paired_gains", {}).get(gain, {}),
            new.get("paired_gains", {}).get(gain, {}),
        )
        b, n = b_stats.get("median"), n_stats.get("median")
        b_ci, n_ci = b_stats.get("ci"), n_stats.get("ci")
    if b is None or n is None:
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, False, "not measured in both runs")
    if (
        rule.view == "iterations"
        and not rule.tolerance
        and not (base.get("work_deterministic") and new.get("work_deterministic"))
    ):
        why = "the engine's schedule depends on timing (vLLM): not gated exactly; use e.g. iterations:5%"
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, False, why)
    if rule.tolerance is not None:
        regressed = n < b - rule.tolerance - 1e-12
        why = (
            f"dropped {(b - n) * 100:.2f} pts > {rule.tolerance * 100:g}" if regressed else "within tolerance"
        )
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, regressed, why)
    if not b_ci or not n_ci:
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, False, "no interval to compare (one pair)")
    if n < b_ci[0]:
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, True, "NEW's median lies below BASE's interval")
    if n_ci[1] < b:
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, True, "NEW's interval lies below BASE's median")
    return Comparison(arm, gain, rule, b, n, b_ci, n_ci, False, "each median within the other's reach")


def render_comparison(rows: Sequence[Comparison]) -> str:
    from april_bench.results.table import render_markdown

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 100:+.1f}%"

    def ci(values: Sequence[float] | None) -> str:
        return "" if not values else f" [{values[0] * 100:+.1f}, {values[1] * 100:+.1f}]"

    table = [
        [
            r.arm,
            r.gain,
            str(r.rule),
            pct(r.base) + ci(r.base_ci),
            pct(r.new) + ci(r.new_ci),
            "n/a" if r.delta is None else f"{r.delta * 100:+.2f} pts",
            ("REGRESSED: " if r.regressed else "ok: ") + r.why,
        ]
        for r in rows
    ]
    return render_markdown(("Arm", "Gain", "Rule", "Base", "New", "Change", "Verdict"), table)


def config_differences(base: Mapping[str, Any], new: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """``field: BASE vs NEW`` for every differing (nested) field under ``keys`` of two configs.

    A field one run lacks and the other holds as ``None`` is the same setting (a field added to the
    config since, at its default), not a difference."""
    out: list[str] = []

    def walk(path: str, a: Any, b: Any) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for key in dict.fromkeys([*a, *b]):
                walk(f"{path}.{key}", a.get(key), b.get(key))
        elif a != b and not (
            isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b)
        ):
            out.append(f"{path}: {a!r} vs {b!r}")

    for key in keys:
        walk(key, base.get(key), new.get(key))
    return out
