"""Answer graders for math RL and evaluation: the reward each data set's recipe used.

Three styles, each reproducing an upstream grader (see ``tests/data/math/README.md``, "Grading and reward
functions"):

- ``"dapo"``: verl ``math_dapo`` (Minerva ``Answer:`` line, exact normalised match), +1 / −1.
- ``"deepscaler"``: deepscaler ``math_utils`` / slime ``rm_hub/deepscaler`` (last ``\\boxed{}``, mathd or
  sympy), 1 / 0.
- ``"math-verify"``: verl ``math_verify`` (HF math-verify, lenient), 1 / 0, or DeepMath's ±1 with
  ``signed=True``.

Importing this package is cheap: sympy, pylatexenc and math-verify load on first use. Grading never raises
on any response/reference text and is time-bounded (a few seconds worst case) from any thread; the only
errors are a ``ValueError`` for an unknown style, option or data set argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from april_bench.data.specs import DATASETS
from april_bench.graders._bounded import as_text

__all__ = [
    "DEFAULT_STYLE",
    "STYLES",
    "correct_value",
    "is_correct",
    "score",
    "style_for",
    "wrong_value",
]

STYLES: tuple[str, ...] = ("dapo", "deepscaler", "math-verify")

_OPTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"dapo": ("strict_box",), "deepscaler": ("require_think",), "math-verify": ("require_think", "signed")}
)

DEFAULT_STYLE: Mapping[str, str] = MappingProxyType({name: spec.grader for name, spec in DATASETS.items()})
"""The grader each data set's recipe used (DAPO: verl math_dapo; DeepScaleR: its own reward; DeepMath and
the evaluation sets: math-verify), from :data:`april_bench.data.specs.DATASETS`."""


def _check_style(style: str) -> str:
    if style not in STYLES:
        raise ValueError(f"unknown grader style {style!r}; use one of {', '.join(STYLES)}")
    return style


def _check_options(style: str, options: Mapping[str, object]) -> None:
    unknown = sorted(set(options) - set(_OPTIONS[style]))
    if unknown:
        valid = ", ".join(_OPTIONS[style])
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for grader {style!r}; valid options: {valid}"
        )


def correct_value(style: str) -> float:
    """The reward for a correct answer under ``style``'s default scale (1.0 for every style)."""
    _check_style(style)
    return 1.0


def wrong_value(style: str) -> float:
    """The reward for a wrong answer: −1.0 for ``dapo`` (and math-verify with ``signed=True``), else 0.0."""
    return -1.0 if _check_style(style) == "dapo" else 0.0


def score(style: str, response: str, reference: str, **options: bool) -> float:
    """The reward ``style``'s recipe gives ``response`` against ``reference``.

    Options: dapo ``strict_box``; deepscaler ``require_think``; math-verify ``require_think``, ``signed``
    (see each module's ``compute_score``). Unknown styles or options raise ``ValueError``; nothing else
    does: non-text inputs, malformed LaTeX, huge or adversarial text and internal errors all score as
    wrong, and sympy/math-verify work is cut off after a few seconds.
    """
    _check_options(_check_style(style), options)
    flags = {name: bool(value) for name, value in options.items()}
    wrong = -1.0 if style == "dapo" or flags.get("signed", False) else 0.0
    response_text, reference_text = as_text(response), as_text(reference)
    if response_text is None or reference_text is None:
        return wrong
    try:
        if style == "dapo":
            from april_bench.graders import dapo

            return dapo.compute_score(response_text, reference_text, **flags)
        if style == "deepscaler":
            from april_bench.graders import deepscaler

            return deepscaler.compute_score(response_text, reference_text, **flags)
        from april_bench.graders import mathverify

        return mathverify.compute_score(response_text, reference_text, **flags)
    except Exception:
        return wrong


def is_correct(style: str, response: str, reference: str, **options: bool) -> bool:
    """Whether ``style`` accepts ``response`` (its :func:`score` is the correct value)."""
    return score(style, response, reference, **options) == correct_value(style)


def style_for(dataset: str, override: str | None = None) -> str:
    """The grader to use for ``dataset``: ``override`` if given (validated), else the recipe's
    :data:`DEFAULT_STYLE`, else ``"math-verify"`` (the lenient general-purpose grader: it reads boxed,
    ``Answer:`` and plain final answers alike, so an unknown data set is least likely to be under-scored).
    """
    if override is not None:
        return _check_style(override)
    return DEFAULT_STYLE.get(dataset, "math-verify")
