"""The simulator's one response-length model, each parameter derived from published evidence.

Every simulated run - the default ``run --hw mi300x --algo dapo``, ``--recipe``,
``benchmarks/paper_table.py`` and ``ablate`` - draws response lengths from
:func:`length_params` for its model (overrides only through an explicit
``--workload-arg``).  The parameters were chosen from the sources below
*before* any throughput gain was compared with the paper, and none of them is
fitted to the paper's gains (``docs/calibration.md``).

The level (median length of a right answer) for Qwen3-4B comes from one
published fact about truncation at APRIL's own 16,384-token cap, not from a
length statistic nobody published:

* Qwen3-4B in thinking mode scores 73.8 on AIME'24 with its recommended
  32,768-token output budget (Qwen3 Technical Report, arXiv 2505.09388);
* APRIL's own DAPO run (``imgs/eval_dapo_qwen.png``) starts at AIME'24 avg@16
  0.59 with a 16,384-token limit.

Reading the drop as right answers that would have run past 16,384 tokens, a
share ``1 - 0.59 / 0.738 = 0.20`` of right answers is longer than the cap.
Under the model's log-normal spread (total log-sd 1.0: Laminar's p99/median
~ 10) that puts the right-answer median at ``16384 * exp(-1.0 * z_0.80)``
(:func:`median_from_truncation`, about 7,060 tokens).  The derivation assumes
the training sets are about as hard for Qwen3-4B as AIME'24 (the same
assumption gives the solve rate 0.59); no published per-data-set Qwen3-4B
length or solve-rate statistic was found, so the three data sets share them
and differ only in prompt lengths (``april_bench.sim.workload.DATASET_PROFILES``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

__all__ = [
    "LENGTH_FIELDS",
    "MODEL_LENGTHS",
    "LengthEvidence",
    "TruncationAnchor",
    "length_params",
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
        "eval/aime (avg@16, 16,384-token limit) starts at ~0.59 for Qwen3-4B",
        "accuracy_uncapped": "Qwen3 Technical Report (arXiv 2505.09388), thinking mode: Qwen3-4B "
        "AIME'24 73.8, "
        "sampled with the 32,768-token output budget the Qwen3-4B model card recommends",
    },
)

_QWEN3_4B_SOURCES = {
    "response_median": "derived: 1 - 0.59/0.738 = 20% of right answers run past 16,384 tokens (anchor "
    "below); under total log-sd 1.0 the right-answer median is 16384 * exp(-z_0.80) (median_from_truncation)",
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


def length_params(model: str, dataset: str) -> dict[str, Any] | None:
    """The length model's parameters for ``model`` (the same for every data set), or None when no
    published evidence covers the model: then the data-set profile's labelled assumptions apply."""
    del dataset  # one model per policy: no published per-data-set Qwen3-4B statistics (module doc)
    evidence = MODEL_LENGTHS.get(model)
    return None if evidence is None else evidence.workload_args()
