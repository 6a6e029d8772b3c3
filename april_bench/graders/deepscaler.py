"""DeepScaleR reward (deepscaler ``math_utils``, slime ``rm_hub/deepscaler.py``): last ``\\boxed{}``, 1 / 0.

Correct iff the Hendrycks-MATH string normalisation (:func:`grade_mathd`) or the PRM800K-style sympy
comparison (:func:`grade_sympy`) accepts the answer. sympy is imported lazily, parses through a sandbox
(restricted globals, a character whitelist) and only sees short, screened expressions; the whole grading
call runs under :func:`~april_bench.graders._bounded.call_bounded`.
"""

from __future__ import annotations

import contextlib
import re
from functools import cache
from typing import Any

from april_bench.data.boxed import last_boxed
from april_bench.graders._bounded import DEFAULT_TIMEOUT_S, after_think, call_bounded, quiet_loggers

MAX_SYMPY_CHARS = 1000
"""Answers longer than this skip the sympy comparison (MATH-500's longest answer has 159 characters)."""

MAX_EXPR_CHARS = 200
"""Longest ``(gt)-(pred)`` expression handed to sympy's parser."""


# --- mathd: Hendrycks MATH string normalisation -------------------------------------------------------


def _fix_fracs(text: str) -> str:
    """``\\frac12`` → ``\\frac{1}{2}``, ``\\frac1{2}`` → ``\\frac{1}{2}`` (bare one-character arguments)."""
    head, *rest = text.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if part and part[0] == "{":
            out += part
        elif len(part) < 2:
            return text  # upstream gives up on a dangling ``\frac`` and keeps the input
        elif part[1] == "{":
            out += "{" + part[0] + "}" + part[1:]
        else:
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
    return out


def _fix_a_slash_b(text: str) -> str:
    """``3/4`` (two plain integers) → ``\\frac{3}{4}``."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    a, b = parts
    if re.fullmatch(r"-?\d+", a) and re.fullmatch(r"-?\d+", b) and str(int(a)) == a and str(int(b)) == b:
        return f"\\frac{{{a}}}{{{b}}}"
    return text


def _fix_sqrt(text: str) -> str:
    """``\\sqrt3`` → ``\\sqrt{3}``."""
    return re.sub(r"\\sqrt([^{])", r"\\sqrt{\1}", text)


def _mathd_normalize(answer: str) -> str:
    """Hendrycks ``strip_string`` as deepscaler's ``mathd_normalize_answer`` applies it (steps in order)."""
    answer = answer.strip()
    wrapped = re.fullmatch(r"\\text\{(.+?)\}", answer)
    if wrapped:
        answer = wrapped.group(1).strip()
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:  # units on the right: keep what comes before them
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x=5" -> "5"
        s = sides[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def grade_mathd(pred: str | None, gt: str | None) -> bool:
    """deepscaler ``grade_answer_mathd``: equal strings after Hendrycks-MATH normalisation.

    Accepts ``x=5`` for 5, ``80`` for ``80\\%``, ``0.5`` and ``1/2`` for ``\\frac12``; rejects ``2/4`` for
    ``\\frac12`` and ``25`` for ``025``. Never raises.
    """
    if pred is None or gt is None:
        return False
    try:
        return _mathd_normalize(gt) == _mathd_normalize(pred)
    except Exception:
        return False


# --- sympy: PRM800K-style normalisation and symbolic comparison ------------------------------------

_UNITS = (
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
)
_UNIT_RES = tuple(re.compile(unit + r"(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS)
_COMMA_GROUP = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_FRACTION = re.compile(r"-?[0-9]+.?/0*[1-9][0-9]*.?")
_SAFE_CHARS = re.compile(r"[0-9a-zA-Z+\-*/^(). ]*")


def _to_float(text: str) -> float | None:
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None


def _is_integral(x: float) -> bool:
    try:
        return abs(x - round(x)) <= 1e-7
    except (ValueError, OverflowError):
        return False


def _strip_thousands_commas(text: str) -> str:
    """``1,234,567`` → ``1234567`` (only properly grouped commas)."""
    while True:
        updated = _COMMA_GROUP.sub(r"\1\3\4", text)
        if updated == text:
            return text
        text = updated


def _str_is_int(text: str) -> bool:
    value = _to_float(_strip_thousands_commas(text))
    return value is not None and _is_integral(value)


@cache
def _latex_to_text_converter() -> Any:
    from pylatexenc.latex2text import LatexNodes2Text

    return LatexNodes2Text()


def _latex_to_text(expr: str) -> str:
    """LaTeX to plain text with pylatexenc, then the PRM800K symbol substitutions."""
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    expr = expr.replace("\\frac", " \\frac")  # keeps mixed numbers "7\frac34" apart: "7 3/4"
    expr = _latex_to_text_converter().latex_to_text(expr)
    for symbol, name in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        expr = expr.replace(symbol, name)
    return expr.strip()


def _sympy_normalize(expr: str) -> str:
    """PRM800K ``_normalize``, as deepscaler's ``grade_answer_sympy`` applies it (steps in order)."""
    wrapped = re.fullmatch(r"\\text\{(.+?)\}", expr)
    if wrapped:
        expr = wrapped.group(1)
    for before, after in (
        ("\\%", "%"),
        ("\\$", "$"),
        ("$", ""),
        ("%", ""),
        (" or ", " , "),
        (" and ", " , "),
    ):
        expr = expr.replace(before, after)
    for word, power in (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(word, power)
    for unit in _UNIT_RES:
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    value = _to_float(expr)
    if value is not None and _is_integral(value):
        expr = str(round(value))
    if "\\" in expr:
        with contextlib.suppress(Exception):  # upstream keeps the raw text when pylatexenc fails
            expr = _latex_to_text(expr)
    expr = re.sub(r"- *", "-", expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", expr)  # mixed number "7 3/4" -> "7+3/4"
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        value = _to_float(expr.replace(",", ""))
        if value is not None:
            expr = str(int(value))
    return expr


def _split_tuple(expr: str) -> list[str]:
    """Elements of ``(a,b)`` / ``[a,b)``-style tuples and intervals, else ``[expr]``."""
    expr = _strip_thousands_commas(expr)
    if not expr:
        return []
    brackets = "()[]"
    if (
        len(expr) > 2
        and expr[0] in brackets
        and expr[-1] in brackets
        and not any(c in expr[1:-1] for c in brackets)
    ):
        return [element.strip() for element in expr[1:-1].split(",")]
    return [expr]


def _may_evaluate(expr: str) -> bool:
    """Screen an expression before sympy parses (and so evaluates) it.

    Upstream's rule: at most 2 distinct unknown letters (after removing ``sqrt`` and ``frac``), no ``^{`` or
    ``^(``, no chained or multi-digit exponent. Added here because parsing evaluates arithmetic in C while
    holding the GIL: a length cap, a character whitelist (which is also the sandbox: no ``_``, quotes,
    brackets or ``!``), the same exponent rules for Python's ``**``, and at most two powers of a
    parenthesised group (``((9^9)^9)^9`` is fine, a deeper tower is not).
    """
    if len(expr) > MAX_EXPR_CHARS or not _SAFE_CHARS.fullmatch(expr) or re.search(r"\.\s*[a-zA-Z]", expr):
        return False  # the last test blocks attribute access such as ``pi.n(99999)``
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2:
        return False
    py = expr.replace("^", "**")
    if re.search(r"\*\*\s*[({]", py) or re.search(r"\*\*\s*\d+\s*\*\*", py) or re.search(r"\*\*\s*\d\d", py):
        return False
    return len(re.findall(r"\)\s*\*\*", py)) <= 2


@cache
def _sandbox() -> dict[str, Any]:
    """The only names parsed text can reach: sympy number/symbol constructors and a few constants."""
    import sympy

    names = ("Integer", "Float", "Rational", "Symbol", "Function", "sqrt", "pi", "E", "I", "oo")
    namespace: dict[str, Any] = {name: getattr(sympy, name) for name in names}
    namespace["__builtins__"] = {}  # eval would otherwise inject the real builtins
    return namespace


def _equal_under_sympy(gt: str, pred: str) -> bool:
    """``simplify((gt) - (pred)) == 0`` for screened expressions."""
    expr = f"({gt})-({pred})"
    if not _may_evaluate(expr):
        return False
    import sympy
    from sympy.parsing import sympy_parser

    transformations = (
        *sympy_parser.standard_transformations,
        sympy_parser.implicit_multiplication_application,
    )
    try:
        diff = sympy_parser.parse_expr(
            expr.replace("^", "**"),
            local_dict={},
            global_dict=dict(_sandbox()),
            transformations=transformations,
        )
        return bool(sympy.simplify(diff) == 0)
    except Exception:
        return False


def _grade_sympy_unbounded(pred: str | None, gt: str | None) -> bool:
    if pred is None or gt is None or len(pred) > MAX_SYMPY_CHARS or len(gt) > MAX_SYMPY_CHARS:
        return False
    gt_norm, pred_norm = _sympy_normalize(gt), _sympy_normalize(pred)
    if gt_norm == pred_norm:
        return True
    if not pred_norm:
        return False
    gt_elems, pred_elems = _split_tuple(gt_norm), _split_tuple(pred_norm)
    if len(gt_elems) > 1 and (gt_norm[0] != pred_norm[0] or gt_norm[-1] != pred_norm[-1]):
        return False
    if len(gt_elems) != len(pred_elems):
        return False
    for g, p in zip(gt_elems, pred_elems, strict=True):
        if _FRACTION.fullmatch(g) and _FRACTION.fullmatch(p):
            same = g == p  # unreduced fractions are wrong: 2/4 is not 1/2 here
        elif _str_is_int(g) != _str_is_int(p):
            same = False
        else:
            same = _equal_under_sympy(g, p)
        if not same:
            return False
    return True


def grade_sympy(pred: str | None, gt: str | None) -> bool:
    """deepscaler ``grade_answer_sympy`` (PRM800K grader): normalise, split tuples/intervals, compare
    element-wise with sympy ``simplify``.

    Accepts ``25`` for ``025`` and ``80`` for ``80\\%``; rejects ``x=5`` for 5 and ``2/4`` for ``\\frac12``.
    Bounded by :data:`~april_bench.graders._bounded.DEFAULT_TIMEOUT_S`; never raises.
    """
    return call_bounded(_grade_sympy_unbounded, pred, gt, timeout_s=DEFAULT_TIMEOUT_S, default=False)


def _is_correct(response: str, reference: str, require_think: bool) -> bool:
    if require_think:
        thought = after_think(response)
        if thought is None:
            return False
        response = thought
    pred = last_boxed(response, fbox=False)
    gt = last_boxed(reference, fbox=False) if "\\boxed" in reference else reference
    if pred is None or not gt:
        return False
    with quiet_loggers():
        return grade_mathd(pred, gt) or _grade_sympy_unbounded(pred, gt)


def compute_score(response: str, reference: str, *, require_think: bool = False) -> float:
    """DeepScaleR / slime ``deepscaler`` reward: 1.0 if the last ``\\boxed{}`` is accepted by
    :func:`grade_mathd` or :func:`grade_sympy`, else 0.0.

    A reference containing ``\\boxed`` is unwrapped the same way; an empty reference or no box scores 0.
    ``require_think`` applies slime's rule: the response must contain ``</think>`` and only the text after
    the last one is graded (without it, 0; slime's ``###Response`` fallback is not reproduced). It is off
    by default because the embedded/tiny models do not emit thinking tags. Bounded by
    :data:`~april_bench.graders._bounded.DEFAULT_TIMEOUT_S`; never raises, errors score 0.
    """
    ok = call_bounded(
        _is_correct, response, reference, require_think, timeout_s=DEFAULT_TIMEOUT_S, default=False
    )
    return 1.0 if ok else 0.0
