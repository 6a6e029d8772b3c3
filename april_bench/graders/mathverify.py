"""math-verify reward (verl ``math_verify.compute_score``; DeepMath's second grader): lenient, 1 / 0 or ±1.

The gold is ``\\boxed{reference}`` parsed with ``LatexExtractionConfig``; the prediction is parsed with
``ExprExtractionConfig`` and ``LatexExtractionConfig`` and checked with ``verify`` (``float_rounding=6``,
``strict=True``). math-verify's own SIGALRM timeouts are disabled (they fail outside the main thread);
instead the call runs under :func:`~april_bench.graders._bounded.call_bounded`, only the response's tail is
parsed (its extraction regexes are super-linear), and parsed expressions whose evaluation would explode
(``10**10**10``, ``(1+x)^{1000000}``) are screened out before ``verify`` evaluates them.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

from april_bench.graders._bounded import DEFAULT_TIMEOUT_S, after_think, call_bounded, quiet_loggers

MAX_RESPONSE_CHARS = 4000
"""Only the last 4,000 characters of a response are parsed (the boxed answer sits at the end)."""

MAX_REFERENCE_CHARS = 1000
"""Longer references are graded wrong rather than parsed (MATH-500's longest answer has 159 characters)."""

MAX_DIGITS = 100_000
"""Reject an expression whose numeric value could need more decimal digits than this."""

MAX_EXPANDED_POWER = 100
"""Reject a compound symbolic base raised to a larger numeric power (simplify would expand it)."""

_GROWTH_FUNCTIONS = frozenset(
    {
        "factorial",
        "factorial2",
        "subfactorial",
        "binomial",
        "RisingFactorial",
        "FallingFactorial",
        "gamma",
        "fibonacci",
        "lucas",
        "bell",
        "catalan",
        "harmonic",
        "primorial",
        "prime",
        "tribonacci",
    }
)


@cache
def _configs() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(),), (ExprExtractionConfig(), LatexExtractionConfig())


def _digits(node: Any, memo: dict[int, float]) -> float:
    """Upper bound on the decimal digits of ``node``'s value if sympy evaluates it (``inf``: refuse).

    Symbols count as one digit; only numbers, powers and fast-growing functions can explode.
    """
    key = id(node)
    if key in memo:
        return memo[key]
    import sympy

    if isinstance(node, sympy.Rational):  # Integer included
        digits = 0.30103 * max(abs(int(node.p)).bit_length(), int(node.q).bit_length()) + 1
    elif isinstance(node, sympy.Float):
        value = abs(float(node))
        digits = (
            math.log10(value) + 1 if math.isfinite(value) and value > 1 else (1.0 if value <= 1 else math.inf)
        )
    elif isinstance(node, sympy.Pow):
        digits = _power_digits(node, memo)
    elif isinstance(node, sympy.MatrixBase):
        digits = sum(_digits(element, memo) for element in node) + 1
    elif not isinstance(node, sympy.Basic):
        digits = 1.0
    else:
        digits = sum(_digits(arg, memo) for arg in node.args) + 1
        name = type(node).__name__
        if name in _GROWTH_FUNCTIONS and any(not arg.free_symbols for arg in node.args):
            digits = math.inf if digits > 5 else digits * 10**digits  # n! has about n·log10(n) digits
    memo[key] = digits
    return digits


def _power_digits(node: Any, memo: dict[int, float]) -> float:
    base, exponent = node.args
    base_digits = _digits(base, memo)
    if exponent.free_symbols:
        return base_digits + _digits(exponent, memo)
    exponent_digits = _digits(exponent, memo)
    if exponent_digits > 7:
        return math.inf
    try:
        magnitude = abs(complex(exponent.evalf(15)))
    except (TypeError, ValueError, OverflowError):
        return math.inf
    if not math.isfinite(magnitude):
        return math.inf
    if base.free_symbols and not base.is_Symbol and magnitude > MAX_EXPANDED_POWER:
        return math.inf
    return base_digits * max(magnitude, 1.0)


def _tame(expr: Any) -> bool:
    """True if evaluating/simplifying ``expr`` cannot explode (see :data:`MAX_DIGITS`)."""
    if isinstance(expr, str):
        return True
    try:
        return _digits(expr, {}) <= MAX_DIGITS
    except RecursionError:
        return False


def _is_correct(response: str, reference: str, require_think: bool) -> bool:
    if require_think:
        thought = after_think(response)
        if thought is None:
            return False
        response = thought
    if len(reference) > MAX_REFERENCE_CHARS:
        return False
    from math_verify import parse, verify

    gold_config, pred_config = _configs()
    with quiet_loggers():
        gold = parse("\\boxed{" + reference + "}", gold_config, parsing_timeout=None)
        if not gold or not all(_tame(g) for g in gold):
            return False
        pred = parse(response[-MAX_RESPONSE_CHARS:], pred_config, parsing_timeout=None)
        pred = [p for p in pred if _tame(p)]
        return bool(pred) and verify(gold, pred, float_rounding=6, timeout_seconds=None)


def compute_score(
    response: str, reference: str, *, require_think: bool = False, signed: bool = False
) -> float:
    """verl ``math_verify.compute_score``: 1.0 if math-verify accepts the response, else 0.0.

    Accepts ``Answer: 34``, ``The answer is 34.``, ``\\boxed{25}`` vs ``025``, ``\\boxed{0.5}`` /
    ``\\boxed{2/4}`` vs ``\\frac12``, ``\\boxed{x=5}`` vs 5 and ``\\boxed{80\\%}`` vs 80. DeepMath's options:
    ``require_think`` (the format is correct iff ``</think>`` is present; only the text after the last one
    is graded, which keeps boxes inside the thinking out) and ``signed`` (±1 instead of 1/0). DeepMath's
    first grader (OpenMathInstruct ``math_equal``) is not reproduced, so this is slightly stricter than
    DeepMath's reward. Bounded by :data:`~april_bench.graders._bounded.DEFAULT_TIMEOUT_S`; never raises,
    errors and timeouts score as wrong (verl's ``timeout_score`` 0).
    """
    ok = call_bounded(
        _is_correct, response, reference, require_think, timeout_s=DEFAULT_TIMEOUT_S, default=False
    )
    if ok:
        return 1.0
    return -1.0 if signed else 0.0
