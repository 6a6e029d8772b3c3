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
    the gains per engine iteration (time only where an iteration's cost is
    flat): ``iteration_throughput`` (generated tokens per engine iteration) and
    ``iteration_useful`` (trained tokens per engine iteration), against the
    baseline.  For april-bench's own engines they are
    schedule-deterministic: the same code and seed give the same values on a
    busy machine or an idle one, so they can be gated exactly.

A rule ``VIEW:TOLERANCE`` (``--fail median:5%``, ``--fail total:0``,
``--fail iterations:0``) fails the comparison when NEW's gain is more than
TOLERANCE below BASE's; ``total`` and ``median`` rules apply to the wall-clock
gains, ``iterations`` rules to the iteration-unit ones.  ``iterations:exact`` is
two-sided and stricter: every arm's engine work (forward passes, decode and
prefill tokens, re-prefill, generated and trained tokens) and every iteration
gain must come back identical, up or down - the gate for a forced-length run
(``--length-oracle``), whose schedule is a function of the seed alone and so
the same on every machine; any change, a better schedule included, means the
reference is regenerated with the change that explains it.  ``median:ci`` fails
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

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import ConfigError

__all__ = [
    "EXACT_COUNTS",
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
_RULE = re.compile(r"^(total|median|iterations):(ci|exact|[0-9.]+%?)$")
#: What ``iterations:exact`` holds equal in every arm (the summary's totals of the step rows).
EXACT_COUNTS = (
    "engine_iterations",
    "decode_iterations",
    "decode_tokens",
    "prefill_tokens",
    "reprefill_tokens",
    "generated_tokens",
    "trained_tokens",
)


@dataclass(frozen=True, slots=True)
class Rule:
    view: str  # "total" or "median" (wall-clock gains), "iterations" (iteration-unit gains)
    #: Allowed drop in gain units (0.05 = 5 points); ``None`` means "the intervals must overlap".
    tolerance: float | None
    #: ``iterations:exact``: every count and gain equal, in both directions.
    exact: bool = False

    def __str__(self) -> str:
        if self.exact:
            return f"{self.view}:exact"
        amount = "ci" if self.tolerance is None else f"{self.tolerance * 100:g}%" if self.tolerance else "0"
        return f"{self.view}:{amount}"


def parse_rule(text: str) -> Rule:
    match = _RULE.match(text.strip())
    if match is None:
        raise ConfigError(
            f"--fail {text!r}: write VIEW:TOLERANCE, e.g. median:5%, total:0, median:ci or iterations:0"
        )
    view, amount = match.groups()
    if amount == "exact":
        if view != "iterations":
            raise ConfigError(
                f"--fail {view}:exact: only engine work is counted exactly; use iterations:exact"
            )
        return Rule(view, 0.0, exact=True)
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
    for rule in rules:
        if rule.exact:  # every arm's counts, the baseline's included, then every arm's gains
            out += [_compare_work(a, rule, base[a], new[a]) for a in base if a in new]
    for arm in arms:
        for rule in rules:
            for gain in ITERATION_GAINS if rule.view == "iterations" else gains:
                out.append(_compare(arm, gain, rule, base[arm], new[arm]))
    return out


def _compare_work(arm: str, rule: Rule, base: Mapping[str, Any], new: Mapping[str, Any]) -> Comparison:
    """``iterations:exact`` on one arm's engine work: every count of :data:`EXACT_COUNTS` equal."""

    def row(regressed: bool, why: str) -> Comparison:
        return Comparison(arm, "engine work", rule, None, None, None, None, regressed, why)

    if base.get("engine_iterations") is None or new.get("engine_iterations") is None:
        return row(True, "the engine's work was not counted in both runs: nothing to hold exact")
    if not (base.get("work_deterministic") and new.get("work_deterministic")):
        return row(
            True, "the engine's schedule depends on timing (vLLM): it cannot be exact; use iterations:5%"
        )
    changed = [f"{k} {base.get(k)} -> {new.get(k)}" for k in EXACT_COUNTS if base.get(k) != new.get(k)]
    if changed:
        return row(True, "changed: " + "; ".join(changed))
    return row(
        False,
        f"identical ({base['engine_iterations']:,} iterations, {base.get('generated_tokens'):,} tokens)",
    )


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
    if not all(_finite(v) for v in (b, n, *(b_ci or ()), *(n_ci or ()))):
        why = "not a finite number (NaN or infinity) in BASE or NEW: a gate never passes on it"
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, True, why)
    if (
        rule.view == "iterations"
        and not rule.tolerance
        and not rule.exact
        and not (base.get("work_deterministic") and new.get("work_deterministic"))
    ):
        why = "the engine's schedule depends on timing (vLLM): not gated exactly; use e.g. iterations:5%"
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, False, why)
    if rule.exact:
        if abs(n - b) <= 1e-9 * max(1.0, abs(b)):
            return Comparison(arm, gain, rule, b, n, b_ci, n_ci, False, "identical")
        way = "rose" if n > b else "dropped"
        why = f"{way} {points(abs(n - b))} pts (exact: any change, up or down, fails)"
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, True, why)
    if rule.tolerance is not None:
        regressed = n < b - rule.tolerance - 1e-12
        why = f"dropped {points(b - n)} pts > {rule.tolerance * 100:g}" if regressed else "within tolerance"
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, regressed, why)
    if not b_ci or not n_ci:
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, False, "no interval to compare (one pair)")
    if n < b_ci[0]:
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, True, "NEW's median lies below BASE's interval")
    if n_ci[1] < b:
        return Comparison(arm, gain, rule, b, n, b_ci, n_ci, True, "NEW's interval lies below BASE's median")
    return Comparison(arm, gain, rule, b, n, b_ci, n_ci, False, "each median within the other's reach")


def points(change: float, *, sign: bool = False) -> str:
    """A gain's change in percentage points: two decimals, or as many as show a change that two
    decimals would round to zero (a verdict of 0.003 pts must not print beside "0.00")."""
    value = change * 100
    text = f"{value:+.2f}" if sign else f"{value:.2f}"
    if value != 0 and abs(value) < 0.005:
        text = f"{value:+.1e}" if sign else f"{value:.1e}"
    return text


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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
            "n/a" if r.delta is None else f"{points(r.delta, sign=True)} pts",
            (("CHANGED: " if r.rule.exact else "REGRESSED: ") if r.regressed else "ok: ") + r.why,
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
