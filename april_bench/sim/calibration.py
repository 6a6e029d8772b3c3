"""Calibration: the response-length model against published length statistics.

Two fits, both deterministic:

* :func:`fit_lengths` fits :class:`~april_bench.sim.lengths.LognormalLengths`
  to a published :class:`LengthTarget` (mean length under a response cap,
  truncation rate, how much longer wrong answers are, spread), by drawing the
  model itself (so censoring, the right/wrong mixture and the group hierarchy
  are all in) and solving one parameter per statistic.  :func:`length_stats`
  is what the model side of the side-by-side table is computed with;
* :func:`fit_drift` fits the per-step drift of log-length to a published move
  of the mean length over training.

The paper settings themselves are fitted to the paper's gains by
``benchmarks/paper_table.py --fit`` (it runs the simulator, a layer above this one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from april_bench.sim.lengths import LognormalLengths

__all__ = [
    "PUBLISHED",
    "PUBLISHED_DRIFT",
    "DriftFit",
    "DriftTarget",
    "LengthFit",
    "LengthParams",
    "LengthTarget",
    "all_equal_share",
    "fit_drift",
    "fit_lengths",
    "length_stats",
]


@dataclass(frozen=True, slots=True)
class LengthParams:
    """The response-length model's parameters (as in ``SimWorkload.Config``)."""

    median: float
    prompt_sigma: float = 0.8
    within_sigma: float = 0.6
    incorrect_factor: float = 3.0
    solve_rate: float = 0.5
    solve_concentration: float = 2.0

    @property
    def sigma(self) -> float:
        """Total log-sd of one response's length around its right/wrong median."""
        return math.hypot(self.prompt_sigma, self.within_sigma)

    def model(self, seed: int = 0) -> LognormalLengths:
        return LognormalLengths(
            median=self.median,
            prompt_sigma=self.prompt_sigma,
            within_sigma=self.within_sigma,
            incorrect_factor=self.incorrect_factor,
            solve_a=self.solve_rate * self.solve_concentration,
            solve_b=(1 - self.solve_rate) * self.solve_concentration,
            drift_per_step=0.0,
            seed=seed,
        )

    def scaled_sigma(self, sigma: float) -> LengthParams:
        """The same between/within split with total log-sd ``sigma``."""
        k = sigma / self.sigma
        return LengthParams(
            self.median,
            self.prompt_sigma * k,
            self.within_sigma * k,
            self.incorrect_factor,
            self.solve_rate,
            self.solve_concentration,
        )


@dataclass(frozen=True, slots=True)
class LengthTarget:
    """Published length statistics of one model on one task, each with its source.

    ``None`` means the source does not give that statistic; the fit leaves the
    matching parameter at its default.
    """

    name: str
    model: str
    cap: int
    mean: float
    solve_rate: float
    wrong_over_right: float | None = None
    #: The cap the wrong/right ratio was measured under, when it differs from ``cap``.
    ratio_cap: int | None = None
    #: Wrong-answer factor to start from (1.0 for sources that do not separate right and wrong).
    incorrect_factor: float = 3.0
    truncated: float | None = None
    cv: float | None = None
    p99_over_median: float | None = None
    sources: dict[str, str] = field(default_factory=dict)


#: Published statistics the length model is fitted to (landscape.md 5a and the pages cited there).
PUBLISHED: tuple[LengthTarget, ...] = (
    LengthTarget(
        name="deepscaler-r1-1.5b",
        model="DeepSeek-R1-Distill-Qwen-1.5B",
        cap=8192,
        mean=5500,
        solve_rate=0.29,
        wrong_over_right=3.0,
        ratio_cap=32768,
        sources={
            "mean": "DeepScaleR blog (Agentica, 2025) via long8v.github.io/PTIR/posts/225: mean response "
            "length 5,500 at the start of 8k-context RL, 3,500 after it",
            "wrong_over_right": "same: on AIME, incorrect responses are three times longer than correct ones "
            "(taken as measured at DeepScaleR's 32k evaluation context: ratio_cap)",
            "solve_rate": "DeepScaleR blog: R1-Distill-Qwen-1.5B AIME24 pass@1 28.8%",
            "cap": "DeepScaleR: first stage at 8K max context",
        },
    ),
    LengthTarget(
        name="code-rl-laion",
        model="(code RL run, laion/a2_rl_crosscodeeval_python_v2)",
        cap=11791,
        mean=3837,
        solve_rate=0.01,
        cv=0.45,
        sources={
            "mean": "HF laion/a2_rl_crosscodeeval_python_v2 training_logs: mean 3,837, std 1,728 "
            "(landscape.md 5a)",
            "cv": "same: std / mean = 1,728 / 3,837",
            "cap": "same: max logged length 11,791 used as the cap",
            "solve_rate": "same: zero-reward mean 3,857 vs 1,844 non-zero gives ~1% non-zero reward",
        },
    ),
    LengthTarget(
        name="laminar-reasoning",
        model="(reasoning / agentic RL, Laminar arXiv 2510.12633)",
        cap=1 << 20,
        mean=1000,
        solve_rate=0.5,
        incorrect_factor=1.0,
        p99_over_median=10.0,
        sources={
            "p99_over_median": "Laminar via papers.lunadong.com summary: p99 ~ 10x median "
            "[unverified in primary] (landscape.md 5a)",
            "mean": "no level given: 1,000 tokens, only the shape is fitted",
            "incorrect_factor": "not separated by correctness: wrong answers as long as right ones",
        },
    ),
)


def length_stats(
    params: LengthParams, cap: int, *, blocks: int = 64, n: int = 8, seed: int = 0
) -> dict[str, float]:
    """Statistics of the length model under a response cap, from ``blocks x 256`` groups of ``n``.

    ``mean`` and the right/wrong means are of the capped lengths (what a run logs); ``truncated`` is
    the share at the cap; ``cv`` the capped coefficient of variation; ``p99_over_median`` uncapped.
    """
    model = params.model(seed)
    logs, correct = zip(*(model._block(b, n) for b in range(blocks)), strict=True)
    raw = np.exp(np.concatenate(logs).ravel())
    right = np.concatenate(correct).ravel()
    capped = np.minimum(raw, cap)
    wrong_mean = float(capped[~right].mean()) if (~right).any() else float("nan")
    right_mean = float(capped[right].mean()) if right.any() else float("nan")
    return {
        "mean": float(capped.mean()),
        "truncated": float((raw >= cap).mean()),
        "wrong_over_right": wrong_mean / right_mean,
        "cv": float(capped.std() / capped.mean()),
        "p99_over_median": float(np.percentile(raw, 99) / np.median(raw)),
        "right_mean": right_mean,
        "wrong_mean": wrong_mean,
        "samples": float(raw.size),
    }


@dataclass(frozen=True, slots=True)
class LengthFit:
    target: LengthTarget
    params: LengthParams
    stats: dict[str, float]

    def rows(self) -> list[tuple[str, float, float]]:
        """(statistic, published, fitted model) for each statistic the source gives."""
        t = self.target
        given = {
            "mean": t.mean,
            "truncated": t.truncated,
            "wrong_over_right": t.wrong_over_right,
            "cv": t.cv,
            "p99_over_median": t.p99_over_median,
        }
        return [(k, v, self.stats[k]) for k, v in given.items() if v is not None]


def _solve(f: Callable[[float], float], target: float, lo: float, hi: float, iters: int = 40) -> float:
    """x in [lo, hi] (geometric bisection) with f(x) ~ target, f increasing."""
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def fit_lengths(target: LengthTarget, start: LengthParams | None = None, rounds: int = 4) -> LengthFit:
    """Fit the length model to ``target``: the spread to ``cv`` or ``p99_over_median``, the wrong-answer
    factor to ``wrong_over_right``, then the median to ``mean`` (a few rounds: they interact)."""
    p = start or LengthParams(median=target.mean)
    p = LengthParams(p.median, p.prompt_sigma, p.within_sigma, target.incorrect_factor, target.solve_rate)
    cap = target.cap
    ratio_cap = target.ratio_cap or cap

    def stat(params: LengthParams, key: str) -> float:
        return length_stats(params, ratio_cap if key == "wrong_over_right" else cap, blocks=16)[key]

    def spread(base: LengthParams, key: str, value: float) -> LengthParams:
        return base.scaled_sigma(_solve(lambda s: stat(base.scaled_sigma(s), key), value, 0.05, 3))

    def solve_field(
        base: LengthParams, name: str, key: str, value: float, lo: float, hi: float
    ) -> LengthParams:
        return _with(base, **{name: _solve(lambda x: stat(_with(base, **{name: x}), key), value, lo, hi)})

    for _ in range(rounds):
        if target.p99_over_median is not None:
            p = spread(p, "p99_over_median", target.p99_over_median)
        if target.cv is not None:
            p = spread(p, "cv", target.cv)
        if target.wrong_over_right is not None:
            p = solve_field(p, "incorrect_factor", "wrong_over_right", target.wrong_over_right, 0.2, 20)
        p = solve_field(p, "median", "mean", target.mean, 10, 1e6)
    stats = length_stats(p, cap)
    stats["wrong_over_right"] = length_stats(p, ratio_cap)["wrong_over_right"]
    return LengthFit(target, p, stats)


def _with(p: LengthParams, **values: float) -> LengthParams:
    fields = {
        "median": p.median,
        "prompt_sigma": p.prompt_sigma,
        "within_sigma": p.within_sigma,
        "incorrect_factor": p.incorrect_factor,
        "solve_rate": p.solve_rate,
        "solve_concentration": p.solve_concentration,
    }
    fields.update(values)
    return LengthParams(**fields)


@dataclass(frozen=True, slots=True)
class DriftTarget:
    """A published move of the mean response length over training."""

    name: str
    cap: int
    start_mean: float
    end_mean: float
    steps: int
    sources: dict[str, str] = field(default_factory=dict)


PUBLISHED_DRIFT: tuple[DriftTarget, ...] = (
    DriftTarget(
        name="dapo-qwen2.5-32b",
        cap=20480,
        start_mean=750,
        end_mean=2500,
        steps=2000,
        sources={
            "mean": "DAPO (arXiv 2503.14476) mean response length rising under clip-higher, as quoted in "
            "docs/simulator.md (750 -> 2,500 tokens over ~2,000 steps; read off the figure, not re-checked)",
            "cap": "DAPO: 16,384 + 4,096-token overlong buffer",
        },
    ),
    DriftTarget(
        name="deepscaler-8k-stage",
        cap=8192,
        start_mean=5500,
        end_mean=3500,
        steps=1000,
        sources={
            "mean": "DeepScaleR blog via long8v.github.io/PTIR/posts/225: 5,500 -> 3,500 during the 8k stage",
            "steps": "assumption: about 1,000 steps for the 8k stage (stage length not verified)",
        },
    ),
)


@dataclass(frozen=True, slots=True)
class DriftFit:
    target: DriftTarget
    params: LengthParams
    drift_per_step: float
    start_mean: float
    end_mean: float


def fit_drift(target: DriftTarget, shape: LengthParams | None = None) -> DriftFit:
    """The per-step log-length drift that moves the capped mean from ``start_mean`` to ``end_mean``
    (the median is fitted to ``start_mean`` first; the shape is ``shape``'s, default the paper's)."""
    p = shape or LengthParams(median=target.start_mean, solve_rate=0.5)

    def mean_at(median: float) -> float:
        return length_stats(_with(p, median=median), target.cap, blocks=16)["mean"]

    start = _solve(mean_at, target.start_mean, 10, 1e6)
    end = _solve(mean_at, target.end_mean, 10, 1e6)
    drift = math.log(end / start) / target.steps
    fitted = _with(p, median=start)
    return DriftFit(
        target,
        fitted,
        drift,
        length_stats(fitted, target.cap)["mean"],
        length_stats(_with(p, median=start * math.exp(drift * target.steps)), target.cap)["mean"],
    )


def all_equal_share(params: LengthParams, cap: int, *, blocks: int = 64, n: int = 8, seed: int = 0) -> float:
    """Share of groups of ``n`` whose rewards are all equal under the length model (a right answer past
    ``cap`` is truncated and scores 0): the chance DAPO's non-zero-std filter rejects a finished group."""
    model = params.model(seed)
    logs, correct = zip(*(model._block(b, n) for b in range(blocks)), strict=True)
    reward = np.concatenate(correct) & (np.exp(np.concatenate(logs)) < cap)
    return float((reward.all(axis=1) | ~reward.any(axis=1)).mean())
