"""DAPO rule reward (verl ``math_dapo``, Minerva-style): an ``Answer:`` line, exact normalised match, ±1.

Pure string work on bounded input (the last 300 characters of the response), so no timeout is needed.
"""

from __future__ import annotations

import re

TAIL_CHARS = 300
"""Only this many trailing characters are examined (verl: "longest answer in MATH-500 has 159 characters")."""

STRICT_TAIL_CHARS = 100
"""Strict-box mode looks only at the last 100 of those characters."""

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

_REMOVED = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\ldots",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)


def normalize_final_answer(text: str) -> str:
    """Normalise an answer string exactly as verl ``math_dapo.normalize_final_answer`` (Minerva) does.

    In order: keep the text after the last ``=``; literal substitutions (articles, spaces, ``\\$``, ``mbox``,
    ``\\text{and}``…); delete unit words and LaTeX noise; keep the first ``$…$`` span; unwrap ``\\text``,
    ``\\textbf``, ``\\overline`` and (greedily) ``\\boxed``; expand ``\\fracab`` / ``\\sqrtx`` shorthand; drop
    ``$``; drop commas from an all-digit answer; strip. No numeric normalisation: ``"025"`` stays ``"025"``.
    """
    text = text.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        text = text.replace(before, after)
    for noise in _REMOVED:
        text = text.replace(noise, "")
    text = re.sub(r"(.*?)\$(.*?)\$(.*)", r"$\2$", text)
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    text = re.sub(r"\\textbf\{(.*?)\}", r"\1", text)
    text = re.sub(r"\\overline\{(.*?)\}", r"\1", text)
    text = re.sub(r"\\boxed\{(.*)\}", r"\1", text)
    text = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", text)
    text = re.sub(r"sqrt([^{])", r"sqrt{\1}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def extract_answer_line(response: str) -> str | None:
    """The rest of the line after the last case-insensitive ``Answer:`` in the last 300 characters, or None.

    Mirrors verl ``math_dapo``'s Minerva extraction (``Answer\\s*:\\s*([^\\n]+)``, last match wins).
    """
    matches = _ANSWER_LINE.findall(response[-TAIL_CHARS:])
    return matches[-1] if matches else None


def _last_boxed_raw(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` by brace counting from the last ``\\boxed{`` (verl strict-box)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None


def compute_score(response: str, reference: str, *, strict_box: bool = False) -> float:
    """verl ``math_dapo.compute_score``: +1.0 if correct, −1.0 otherwise (never 0).

    Default (Minerva) mode: the last ``Answer:`` line of the last 300 characters, normalised with
    :func:`normalize_final_answer`, must equal the normalised reference exactly, so ``Answer: 34.`` vs 34
    and ``Answer: 25`` vs ``025`` score −1 as upstream. ``strict_box``: the last ``\\boxed{…}`` within the
    last 100 of those characters must equal the reference verbatim (verl's pause-token variant is not
    offered). One deliberate difference: a response with no ``Answer:`` line is always wrong, where verl
    compares the placeholder ``"[INVALID]"`` and would accept a reference that normalises to it.
    Never raises; any internal error scores −1.
    """
    try:
        tail = response[-TAIL_CHARS:]
        if strict_box:
            correct = _last_boxed_raw(tail[-STRICT_TAIL_CHARS:]) == reference
        else:
            line = extract_answer_line(tail)
            correct = line is not None and normalize_final_answer(line) == normalize_final_answer(reference)
    except Exception:
        correct = False
    return 1.0 if correct else -1.0
