"""The simulator's response-length models, one per (data set, model), each parameter from cited evidence.

Every simulated run - the default ``run --hw mi300x --algo dapo``, ``--recipe``,
``benchmarks/paper_table.py`` and ``ablate`` - draws response lengths from
:func:`length_params` for its (model, data set) (overrides only through an
explicit ``--workload-arg``).  The parameters were chosen from the sources
below *before* any throughput gain was compared with the paper, and none of
them is fitted to the paper's gains (``docs/calibration.md``).

Qwen3-4B's level (median length of a right answer) comes from one published
fact about truncation at APRIL's own 16,384-token cap, not from a length
statistic nobody published:

* Qwen3-4B in thinking mode scores 73.8 on AIME'24 (Qwen3 Technical Report,
  arXiv 2505.09388), sampled at temperature 0.6 / top-p 0.95 with the output
  budget the Qwen3-4B model card recommends for competition math, 38,912
  tokens (32,768 for most queries);
* APRIL's own DAPO run (``imgs/eval_dapo_qwen.png``) starts at AIME'24 avg@16
  0.59 with a 16,384-token limit, sampled at temperature 0.8 / top-p 0.7
  (APRIL's eval settings, not Qwen's).

Reading the drop as right answers that would have run past 16,384 tokens, a
share ``1 - 0.59 / 0.738 = 0.20`` of right answers is longer than the cap.
That reading is an upper bound on the truncation share and a confounded one:
the two figures were sampled differently (temperature 0.8 / top-p 0.7 against
0.6 / 0.95), and some of the drop may be the sampling's, not the cap's.  Under
the model's log-normal spread (total log-sd 1.0: Laminar's p99/median ~ 10)
that puts the right-answer median at ``16384 * exp(-1.0 * z_0.80)``
(:func:`median_from_truncation`, about 7,075 tokens).

The derivation is about AIME'24, not a training set.  No published Qwen3-4B
length or solve-rate statistic on DAPO-Math-17k, DeepScaleR or DeepMath-103K
was found, so each (data set, Qwen3-4B) profile in :data:`LENGTH_PROFILES`
takes the AIME-anchored model as its central value and is marked **open**,
with the range its parameters could take (:attr:`LengthProfile.open_range`,
written down before any gain was computed with it); ``benchmarks/paper_table.py``
shows each paper row's prediction over that range.  R1-Distill-Qwen-1.5B's
profiles come from the DeepScaleR blog (the only published length statistics
for that model) or are labelled assumptions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

__all__ = [
    "LENGTH_FIELDS",
    "LENGTH_PROFILES",
    "MODEL_LENGTHS",
    "LengthEvidence",
    "LengthProfile",
    "TruncationAnchor",
    "length_params",
    "length_profile",
    "median_from_truncation",
]

#: The workload arguments the length model consists of (a recipe must not set any of them per row).
LENGTH_FIELDS = (
    "response_median",
    "prompt_sigma",
    "within_sigma",
    "incorrect_factor",
    "solve_rate",
    "solve_concentration",
    "drift_per_step",
)


@dataclass(frozen=True, slots=True)
class TruncationAnchor:
    """Accuracy of one model on one benchmark with and without a response cap."""

    benchmark: str
    cap: int
    accuracy_at_cap: float
    accuracy_uncapped: float
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def right_share_over_cap(self) -> float:
        """Share of (uncapped) right answers longer than ``cap``: the accuracy the cap takes away."""
        return 1.0 - self.accuracy_at_cap / self.accuracy_uncapped


def median_from_truncation(cap: int, share_over_cap: float, sigma: float) -> float:
    """Median of a log-normal with log-sd ``sigma`` of which ``share_over_cap`` lies above ``cap``."""
    if not 0 < share_over_cap < 1:
        raise ValueError(f"share over the cap must be in (0, 1), got {share_over_cap}")
    z = NormalDist().inv_cdf(1.0 - share_over_cap)
    return cap * math.exp(-sigma * z)


@dataclass(frozen=True, slots=True)
class LengthEvidence:
    """The length model of one policy model, with the source of every parameter."""

    model: str
    response_median: float
    prompt_sigma: float
    within_sigma: float
    incorrect_factor: float
    solve_rate: float
    solve_concentration: float
    drift_per_step: float
    sources: Mapping[str, str] = field(default_factory=dict)
    anchor: TruncationAnchor | None = None

    def workload_args(self) -> dict[str, float]:
        values = asdict(self)
        return {name: float(values[name]) for name in LENGTH_FIELDS}

    @property
    def sigma(self) -> float:
        return math.hypot(self.prompt_sigma, self.within_sigma)


_PROMPT_SIGMA, _WITHIN_SIGMA = 0.8, 0.6  # total 1.0, split between / within a group

QWEN3_4B_AIME24 = TruncationAnchor(
    benchmark="AIME'24",
    cap=16384,
    accuracy_at_cap=0.59,
    accuracy_uncapped=0.738,
    sources={
        "accuracy_at_cap": "APRIL README figure imgs/eval_dapo_qwen.png (RLsys-Foundation/APRIL@b37fa61): "
        "eval/aime (avg@16, 16,384-token limit, APRIL's eval sampling: temperature 0.8, top-p 0.7) starts "
        "at ~0.59 for Qwen3-4B",
        "accuracy_uncapped": "Qwen3 Technical Report (arXiv 2505.09388), thinking mode: Qwen3-4B "
        "AIME'24 73.8 (temperature 0.6, top-p 0.95); the Qwen3-4B model card recommends a 38,912-token "
        "output budget for competition math (32,768 for most queries)",
        "caveat": "the two accuracies were sampled differently (temperature 0.8 / top-p 0.7 against 0.6 / "
        "0.95), so the 20% read as truncation also holds whatever the sampling change costs: an upper "
        "bound on the share past the cap, not a measurement of it",
    },
)

_QWEN3_4B_SOURCES = {
    "response_median": "derived: 1 - 0.59/0.738 = 20% of right answers run past 16,384 tokens (anchor "
    "below; the two accuracies were sampled at different temperatures, so 20% is an upper bound); under "
    "total log-sd 1.0 the right-answer median is 16384 * exp(-z_0.80) (median_from_truncation)",
    "prompt_sigma": "total log-sd 1.0 from Laminar's p99/median ~ 10 (arXiv 2510.12633 via a secondary "
    "summary; landscape.md 5b), split 0.8 between prompts",
    "within_sigma": "0.6 inside a group (Seer, arXiv 2511.14617: responses to one prompt are similar in "
    "length, so within < between)",
    "incorrect_factor": "DeepScaleR blog: wrong answers ~3x longer than right ones on AIME; 3.5 in the "
    "model reproduces 3x under a 32k cap (april_bench.sim.calibration.fit_lengths)",
    "solve_rate": "APRIL eval_dapo_qwen.png: AIME'24 avg@16 0.59 at step 0; training sets taken as about "
    "as hard (no per-data-set Qwen3-4B solve rate published)",
    "solve_concentration": "Polaris (hkunlp.github.io/blog/2025/Polaris): per-prompt solve counts on "
    "DeepScaleR are U/J-shaped (most prompts 0/8 or 8/8); Beta a+b = 2",
    "drift_per_step": "DAPO (arXiv 2503.14476): mean length 750 -> 2,500 over ~2,000 steps under "
    "clip-higher, which APRIL's scripts share (eps-clip-high 0.28); +0.0006 per step in log length",
}

MODEL_LENGTHS: dict[str, LengthEvidence] = {
    "qwen3-4b": LengthEvidence(
        model="qwen3-4b",
        response_median=round(
            median_from_truncation(
                QWEN3_4B_AIME24.cap,
                QWEN3_4B_AIME24.right_share_over_cap,
                math.hypot(_PROMPT_SIGMA, _WITHIN_SIGMA),
            ),
            1,
        ),
        prompt_sigma=_PROMPT_SIGMA,
        within_sigma=_WITHIN_SIGMA,
        incorrect_factor=3.5,
        solve_rate=0.59,
        solve_concentration=2.0,
        drift_per_step=0.0006,
        sources=_QWEN3_4B_SOURCES,
        anchor=QWEN3_4B_AIME24,
    ),
}


@dataclass(frozen=True, slots=True)
class LengthProfile:
    """The length model of one (data set, model) pair: its parameters, how well the evidence pins them
    (``status``), the evidence, and for an open profile the range its parameters could take."""

    dataset: str
    model: str
    #: ``derived`` (from a published statistic of this model on this kind of data), ``assumed`` (a
    #: labelled assumption) or ``open`` (no evidence: the central value below, predictions over the range).
    status: str
    params: Mapping[str, float]
    #: What is published for this pair, with its setting, in one line.
    evidence: str
    #: ``open``: name -> (low, high) of the parameters that move together over the open range, fixed before
    #: any gain was computed with them.
    open_range: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def workload_args(self) -> dict[str, float]:
        return {name: float(self.params[name]) for name in LENGTH_FIELDS}

    def range_ends(self) -> list[tuple[str, dict[str, float]]]:
        """The open range's two ends as workload arguments: ``("easier", {...})`` with every parameter at
        the end that makes the set easier (shorter right answers, more solved), and ``("harder", {...})``."""
        if not self.open_range:
            return []
        easier = {k: lo if k == "response_median" else hi for k, (lo, hi) in self.open_range.items()}
        harder = {k: hi if k == "response_median" else lo for k, (lo, hi) in self.open_range.items()}
        return [("easier", easier), ("harder", harder)]


_QWEN3_4B = MODEL_LENGTHS["qwen3-4b"]
#: The open range of a Qwen3-4B training set: right answers half to 1.5x the AIME-anchored median, mean
#: solve rate 0.4-0.8 (the set easier or harder than AIME'24 for Qwen3-4B), moving together.
_QWEN3_4B_OPEN = {
    "response_median": (round(_QWEN3_4B.response_median / 2, 1), round(_QWEN3_4B.response_median * 1.5, 1)),
    "solve_rate": (0.4, 0.8),
}
_NO_QWEN3_4B = (
    "no published Qwen3-4B length, truncation or solve-rate statistic on this set was found; the central "
    "value is the AIME'24-anchored model (module doc)"
)
#: R1-Distill-Qwen-1.5B's shape where nothing else is published: the Qwen3-4B sources' spread, wrong x3
#: (DeepScaleR), the same drift.
_R1_SHAPE = {
    "prompt_sigma": 0.8,
    "within_sigma": 0.6,
    "incorrect_factor": 3.0,
    "solve_concentration": 2.0,
    "drift_per_step": 0.0006,
}
_R1 = "r1-distill-qwen-1.5b"

LENGTH_PROFILES: dict[tuple[str, str], LengthProfile] = {
    ("dapo-math-17k", "qwen3-4b"): LengthProfile(
        "dapo-math-17k",
        "qwen3-4b",
        "open",
        _QWEN3_4B.workload_args(),
        _NO_QWEN3_4B + ".  Nearest evidence: APRIL's own DAPO run on this set starts at AIME'24 avg@16 0.59 "
        "(eval_dapo_qwen.png); DAPO-Math-17k's answers are integers from competition problems (DAPO, "
        "arXiv 2503.14476), AIME-like",
        _QWEN3_4B_OPEN,
    ),
    ("deepscaler", "qwen3-4b"): LengthProfile(
        "deepscaler",
        "qwen3-4b",
        "open",
        _QWEN3_4B.workload_args(),
        _NO_QWEN3_4B + ".  The set mixes AIME (1984-2023), AMC, Omni-Math and STILL problems (DeepScaleR "
        "blog); Polaris (hkunlp.github.io/blog/2025/Polaris) removed the DeepScaleR problems Qwen3-4B "
        "solves 8/8 before training it, without publishing the share",
        _QWEN3_4B_OPEN,
    ),
    ("deepmath-103k", "qwen3-4b"): LengthProfile(
        "deepmath-103k",
        "qwen3-4b",
        "open",
        _QWEN3_4B.workload_args(),
        _NO_QWEN3_4B + ".  The set is difficulty levels 5-9 (DeepMath-103K card, arXiv 2504.11456)",
        _QWEN3_4B_OPEN,
    ),
    ("deepscaler", _R1): LengthProfile(
        "deepscaler",
        _R1,
        "derived",
        {
            "response_median": 2566.5,
            "prompt_sigma": 0.8,
            "within_sigma": 0.6,
            "incorrect_factor": 3.49,
            "solve_rate": 0.29,
            "solve_concentration": 2.0,
            "drift_per_step": 0.0006,
        },
        "DeepScaleR blog (R1-Distill-Qwen-1.5B on its own set, 8k stage): mean response ~5,500 tokens at "
        "the start, wrong answers ~3x longer than right (AIME), AIME'24 pass@1 28.8%; the model fitted to "
        "those (april_bench.sim.calibration.fit_lengths, target deepscaler-r1-1.5b: median 2,566, wrong "
        "x3.49 at solve rate 0.29) gives mean 5,526 at 8,192 tokens and wrong/right 3.0 at the 32,768-token "
        "evaluation context",
    ),
    ("deepmath-103k", _R1): LengthProfile(
        "deepmath-103k",
        _R1,
        "assumed",
        {"response_median": 2700.0, "solve_rate": 0.5, **_R1_SHAPE},
        "DeepMath-103K card: DeepSeek-R1's (671B) solutions average ~15.9k characters (~4,500 tokens), "
        "median 2,700 under log-sd 1.0; R1-Distill-1.5B's own lengths on the set are not published "
        "(DeepMath-1.5B, trained from it on this set, reaches AIME'24 37.3 from 28.8); solve rate assumed",
    ),
    ("dapo-math-17k", _R1): LengthProfile(
        "dapo-math-17k",
        _R1,
        "assumed",
        {"response_median": 2000.0, "solve_rate": 0.65, **_R1_SHAPE},
        "nothing published for R1-Distill-1.5B on DAPO-Math-17k: median and solve rate assumed",
    ),
}


def length_profile(model: str, dataset: str) -> LengthProfile | None:
    """The (data set, model) profile, or None when none is written down for the pair."""
    return LENGTH_PROFILES.get((dataset, model))


def length_params(model: str, dataset: str) -> dict[str, Any] | None:
    """The length model's parameters for ``model`` on ``dataset``: its (data set, model) profile, else the
    model's evidence (the same on every data set), else None (the data-set profile's labelled
    assumptions apply)."""
    profile = length_profile(model, dataset)
    if profile is not None:
        return profile.workload_args()
    evidence = MODEL_LENGTHS.get(model)
    return None if evidence is None else evidence.workload_args()
