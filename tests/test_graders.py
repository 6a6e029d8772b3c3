"""Graders: upstream behaviour tables (tests/data/math/README.md), real data vendored, robustness, threads."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers import read_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from april_bench.data.stats import is_choice_letter
from april_bench.graders import (
    DEFAULT_STYLE,
    STYLES,
    correct_value,
    dapo,
    deepscaler,
    is_correct,
    mathverify,
    score,
    style_for,
    wrong_value,
)

# --- upstream behaviour tables ---------------------------------------------------------------------

DAPO_TABLE = [
    ("…\nAnswer: 34", "34", 1.0),
    ("Answer: \\boxed{34}", "34", 1.0),
    ("Answer: $34$", "34", 1.0),
    ("Answer: 34.", "34", -1.0),  # a trailing period is not stripped
    ("The answer is \\boxed{34}", "34", -1.0),  # no Answer: line
    ("Answer: 25", "025", -1.0),  # no numeric normalisation (documented verl behaviour)
    ("Answer: 1/2", "\\frac{1}{2}", -1.0),
    ("Answer: 1,234", "1234", 1.0),
    ("answer : x = 5", "5", 1.0),
    ("Answer: 34\nAnswer: 35", "35", 1.0),  # the last match wins
]


@pytest.mark.parametrize(("response", "gt", "expected"), DAPO_TABLE)
def test_dapo_table(response: str, gt: str, expected: float) -> None:
    assert dapo.compute_score(response, gt) == expected
    assert score("dapo", response, gt) == expected


def test_dapo_building_blocks() -> None:
    assert dapo.extract_answer_line("x\nAnswer: 7\nAnswer:  8 apples") == "8 apples"
    assert dapo.extract_answer_line("no answer here") is None
    assert dapo.extract_answer_line("Answer: 3" + " " * 400) is None  # outside the last 300 characters
    assert dapo.normalize_final_answer("$\\frac12$") == "\\frac{1}{2}"
    assert dapo.normalize_final_answer("10 degrees") == "10"
    assert dapo.normalize_final_answer("\\text{(B)}") == "(B)"


def test_dapo_strict_box() -> None:
    assert score("dapo", "so \\boxed{34}", "34", strict_box=True) == 1.0
    assert score("dapo", "Answer: 34", "34", strict_box=True) == -1.0
    assert score("dapo", "\\boxed{34}" + "." * 100, "34", strict_box=True) == -1.0  # outside the last 100
    assert score("dapo", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", strict_box=True) == 1.0
    assert score("dapo", "\\boxed{25}", "025", strict_box=True) == -1.0  # compared verbatim


DEEPSCALER_TABLE = [  # pred, gt, mathd, sympy
    ("25", "025", False, True),
    ("0.5", "\\frac12", True, True),
    ("1/2", "\\frac12", True, True),
    ("2/4", "\\frac12", False, False),
    ("x=5", "5", True, False),
    ("80", "80\\%", True, True),
    ("(3,\\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True, True),
]


@pytest.mark.parametrize(("pred", "gt", "mathd", "sym"), DEEPSCALER_TABLE)
def test_deepscaler_table(pred: str, gt: str, mathd: bool, sym: bool) -> None:
    assert deepscaler.grade_mathd(pred, gt) is mathd
    if pred != "0.5" and pred != "1/2":  # the README leaves sympy unobserved ("—") where mathd accepts
        assert deepscaler.grade_sympy(pred, gt) is sym
    expected = 1.0 if (mathd or sym) else 0.0
    assert score("deepscaler", f"so \\boxed{{{pred}}}", gt) == expected


def test_deepscaler_extraction_and_options() -> None:
    assert deepscaler.last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert deepscaler.last_boxed("\\fbox{7}") == "7"
    assert deepscaler.last_boxed("\\fbox{7}", fbox=False) is None
    assert deepscaler.last_boxed("\\boxed 5") is None
    assert deepscaler.last_boxed("\\boxed{5") is None
    assert score("deepscaler", "the answer is 5", "5") == 0.0  # no box
    assert score("deepscaler", "\\boxed{5}", "\\boxed{5}") == 1.0  # a boxed reference is unwrapped
    assert score("deepscaler", "\\boxed{5}", "") == 0.0
    thinking = "<think>maybe \\boxed{4}</think> so \\boxed{5}"
    assert score("deepscaler", thinking, "5", require_think=True) == 1.0
    assert score("deepscaler", "<think>\\boxed{5}</think> so \\boxed{4}", "5", require_think=True) == 0.0
    assert score("deepscaler", "\\boxed{5}", "5", require_think=True) == 0.0  # no </think>
    assert score("deepscaler", "\\boxed{5}", "5") == 1.0  # the default: no thinking required


MATH_VERIFY_ACCEPTS = [
    ("Answer: 34", "34"),
    ("The answer is 34.", "34"),
    ("\\boxed{25}", "025"),
    ("\\boxed{0.5}", "\\frac12"),
    ("\\boxed{2/4}", "\\frac12"),
    ("\\boxed{x=5}", "5"),
    ("\\boxed{80\\%}", "80"),
    ("<think>maybe \\boxed{3}</think> so \\boxed{4}", "4"),  # the last box, after </think>
]


@pytest.mark.parametrize(("response", "gt"), MATH_VERIFY_ACCEPTS)
def test_math_verify_accepts(response: str, gt: str) -> None:
    assert mathverify.compute_score(response, gt) == 1.0
    assert score("math-verify", response, gt) == 1.0


def test_math_verify_options() -> None:
    assert score("math-verify", "\\boxed{26}", "025") == 0.0
    assert score("math-verify", "\\boxed{26}", "025", signed=True) == -1.0
    assert score("math-verify", "\\boxed{25}", "025", signed=True) == 1.0
    assert score("math-verify", "\\boxed{4}", "4", require_think=True) == 0.0  # format error
    assert score("math-verify", "<think>\\boxed{4}</think> so \\boxed{3}", "4", require_think=True) == 0.0
    assert score("math-verify", "<think>x</think> so \\boxed{4}", "4", require_think=True, signed=True) == 1.0


# --- public API ------------------------------------------------------------------------------------


def test_values_and_styles() -> None:
    assert STYLES == ("dapo", "deepscaler", "math-verify")
    assert [(correct_value(s), wrong_value(s)) for s in STYLES] == [(1.0, -1.0), (1.0, 0.0), (1.0, 0.0)]
    assert is_correct("dapo", "Answer: 3", "3") and not is_correct("dapo", "Answer: 4", "3")
    assert is_correct("math-verify", "\\boxed{3}", "3", signed=True)


def test_unknown_style_and_options_name_the_fix() -> None:
    with pytest.raises(ValueError, match="dapo, deepscaler, math-verify"):
        score("minerva", "Answer: 1", "1")
    with pytest.raises(ValueError, match="valid options: strict_box"):
        score("dapo", "Answer: 1", "1", require_think=True)
    with pytest.raises(ValueError, match="valid options: require_think, signed"):
        score("math-verify", "1", "1", strict_box=True)
    with pytest.raises(ValueError, match="dapo, deepscaler, math-verify"):
        correct_value("nope")
    with pytest.raises(ValueError, match="dapo, deepscaler, math-verify"):
        style_for("deepscaler", override="nope")


def test_style_for() -> None:
    assert dict(DEFAULT_STYLE) == {
        "dapo-math-17k": "dapo",
        "deepscaler": "deepscaler",
        "deepmath-103k": "math-verify",
        "aime-2024": "math-verify",
        "aime-2025": "math-verify",
        "math-500": "math-verify",
    }
    assert style_for("dapo-math-17k") == "dapo"
    assert style_for("dapo-math-17k", override="deepscaler") == "deepscaler"
    assert style_for("some-new-set") == "math-verify"


def test_import_is_light() -> None:
    heavy = "('sympy', 'math_verify', 'pylatexenc')"
    code = f"import sys, april_bench.graders; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- real data, read in place ----------------------------------------------------------------------


def _gt(row: dict[str, Any]) -> str:
    return str(row["reward_model"]["ground_truth"])


BOXED_SETS = [
    ("deepscaler/sample.jsonl", "deepscaler"),
    ("aime-2024/sample.jsonl", "math-verify"),
    ("aime-2025/sample.jsonl", "math-verify"),
    ("math-500/sample.jsonl", "math-verify"),
]


def test_dapo_labels_grade_against_themselves(shared_data: Path) -> None:
    for name in ("dapo-math-17k/sample.jsonl", "aime-2024/dapo-format.jsonl"):
        rows = read_jsonl(shared_data / name)
        assert rows and all(score("dapo", f"Steps...\nAnswer: {_gt(r)}", _gt(r)) == 1.0 for r in rows), name


@pytest.mark.parametrize(("name", "native"), BOXED_SETS)
def test_boxed_labels_grade_against_themselves(shared_data: Path, name: str, native: str) -> None:
    rows = read_jsonl(shared_data / name)
    for style in dict.fromkeys((native, "deepscaler", "math-verify")):
        bad = [
            i
            for i, r in enumerate(rows)
            if score(style, f"so \\boxed{{{r['answer']}}}", str(r["answer"])) != 1.0
        ]
        assert not bad, (style, bad)


def test_math500_solutions_grade_correct(shared_data: Path) -> None:
    rows = read_jsonl(shared_data / "math-500/sample.jsonl")
    for style in ("math-verify", "deepscaler"):  # measured on the full sample: 500/500 for both
        bad = [i for i, r in enumerate(rows) if score(style, r["solution"], r["answer"]) != 1.0]
        assert not bad, (style, bad)


# The DeepScaleR sample is AMC: 367 of its 500 human solutions box the multiple-choice letter
# (``\boxed{A}``, ``\boxed{\textbf{(B) }26}``) while ``answer`` holds the value, so only value-boxed
# solutions are graded. Value-boxed rows that disagree with their label, the styles that grade them
# wrong, and why (measured on the full 500-row sample: deepscaler 123/133, math-verify 125/133). Keyed by
# the opening of the problem, so the table holds on the vendored rows (which keep every one of these,
# see tests/data/vendor.py) and on the full copy; "row N" is the row in the full sample.
BOTH = ("deepscaler", "math-verify")
DEEPSCALER_SOLUTION_EXCEPTIONS = {
    "Let $P(x)$ be a polynomial of degree $3n": (
        BOTH,
        "row 2, known label noise: answer '1', the solution derives n = 4 (HF discussion #3)",
    ),
    "In the adjoining figure, points $B$ and ": (BOTH, "row 13: solution boxes 6\\sqrt{21}, label 20"),
    "Consider all 1000-element subsets of the": (BOTH, "row 24: solution boxes 431, label 2016"),
    "Two long cylindrical tubes of the same l": (BOTH, "row 56: solution boxes 195, label 312"),
    "In $\\triangle PQR$, $PR=15$, $QR=20$, an": (BOTH, "row 98: solution boxes 117.5, label 150"),
    "Four congruent rectangles are placed as ": (BOTH, "row 162: solution boxes 2, label 3"),
    "The real numbers $c, b, a$ form an arith": (
        BOTH,
        "row 266: solution boxes -2 + \\sqrt{3}, label -2-\\sqrt{3}",
    ),
    "Let $f(n)$ be the number of ways to writ": (BOTH, "row 310: solution boxes 2047, label 2016"),
    "Patty has $20$ coins consisting of nicke": (
        ("deepscaler",),
        "row 205: \\textdollar 1.15 vs '$1.15' (pylatexenc emits '$' after the '$' removal step)",
    ),
    "The keystone arch is an ancient architec": (
        ("deepscaler",),
        "row 390: '100^\\circ \\Longrightarrow A' keeps the arrow text",
    ),
}


def test_deepscaler_solutions_grade_correct(shared_data: Path) -> None:
    rows = read_jsonl(shared_data / "deepscaler/sample.jsonl")
    value_rows = [
        i for i, r in enumerate(rows) if not is_choice_letter(deepscaler.last_boxed(r["solution"]) or "A")
    ]
    opening_of = {
        i: opening
        for i, r in enumerate(rows)
        for opening in DEEPSCALER_SOLUTION_EXCEPTIONS
        if r["problem"].startswith(opening)
    }
    assert sorted(opening_of.values()) == sorted(DEEPSCALER_SOLUTION_EXCEPTIONS)  # each in the data, once
    assert set(opening_of) <= set(value_rows) and len(value_rows) - len(opening_of) >= 10
    for style in BOTH:
        bad = [i for i in value_rows if score(style, rows[i]["solution"], rows[i]["answer"]) != 1.0]
        expected = {
            i for i, opening in opening_of.items() if style in DEEPSCALER_SOLUTION_EXCEPTIONS[opening][0]
        }
        assert set(bad) == expected, (style, bad)
    # The known mislabelled row: its (correct) human solution grades WRONG against the noisy label.
    assert rows[2]["answer"] == "1" and "n = 4" in rows[2]["solution"]
    assert score("deepscaler", rows[2]["solution"], rows[2]["answer"]) == 0.0
    assert score("deepscaler", rows[2]["solution"], "4") == 1.0  # mathd drops the "n =" prefix


def _perturb(answer: str) -> str | None:
    if re.fullmatch(r"-?\d+", answer):
        return str(int(answer) + 1)
    frac = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", answer)
    if frac:
        return f"{frac.group(1)}\\frac{{{int(frac.group(2)) + 1}}}{{{frac.group(3)}}}"
    return None


@pytest.mark.parametrize(("name", "native"), BOXED_SETS)
def test_perturbed_answers_grade_wrong(shared_data: Path, name: str, native: str) -> None:
    rows = read_jsonl(shared_data / name)
    pairs = [(str(r["answer"]), p) for r in rows if (p := _perturb(str(r["answer"]))) is not None]
    assert len(pairs) >= 20
    for style in ("deepscaler", "math-verify"):
        bad = [(gt, p) for gt, p in pairs if score(style, f"so \\boxed{{{p}}}", gt) != wrong_value(style)]
        assert not bad, (style, bad[:5])
    ints = [(gt, p) for gt, p in pairs if "frac" not in gt]
    assert all(score("dapo", f"Answer: {p}", gt) == -1.0 for gt, p in ints)


def test_dapo_perturbed(shared_data: Path) -> None:
    for r in read_jsonl(shared_data / "dapo-math-17k/sample.jsonl"):
        wrong = _perturb(_gt(r))
        assert wrong is not None  # every DAPO answer is an integer string
        assert score("dapo", f"Answer: {wrong}", _gt(r)) == -1.0
        assert score("math-verify", f"\\boxed{{{wrong}}}", _gt(r)) == 0.0


def test_aime2024_zero_padding_quirk(shared_data: Path) -> None:
    padded = read_jsonl(shared_data / "aime-2024/sample.jsonl")
    dapo_format = read_jsonl(shared_data / "aime-2024/dapo-format.jsonl")
    assert any(r["answer"] == "025" for r in padded)
    assert score("dapo", "Answer: 25", "025") == -1.0  # documented verl behaviour: use DAPO-format labels
    assert score("deepscaler", "\\boxed{25}", "025") == 1.0
    assert score("math-verify", "\\boxed{25}", "025") == 1.0
    for r in padded:
        unpadded = str(int(r["answer"]))
        assert score("deepscaler", f"\\boxed{{{unpadded}}}", r["answer"]) == 1.0
        assert score("math-verify", f"\\boxed{{{unpadded}}}", r["answer"]) == 1.0
    # The DAPO-format labels are the unpadded values of the same problems and work with dapo.
    by_index = sorted(dapo_format, key=lambda r: r["extra_info"]["index"])
    assert sorted(_gt(r) for r in by_index) == sorted(str(int(r["answer"])) for r in padded)
    assert all(score("dapo", f"Answer: {_gt(r)}", _gt(r)) == 1.0 for r in by_index)


def test_mangled_latex_rows(shared_data: Path) -> None:
    aime25 = [
        r for r in read_jsonl(shared_data / "aime-2025/sample.jsonl") if str(r["id"]) in {"18", "19", "27"}
    ]
    dapo_rows = [
        r for r in read_jsonl(shared_data / "dapo-math-17k/sample.jsonl") if "\x0crac" in r["prompt"]
    ]
    assert len(aime25) == 3 and len(dapo_rows) >= 1
    assert all(re.search(r"[\x0c\t]", r["problem"]) for r in aime25)
    cases = [(r["problem"], str(r["answer"])) for r in aime25] + [(r["prompt"], _gt(r)) for r in dapo_rows]
    for text, answer in cases:
        for style in STYLES:
            assert score(style, text, text) in (correct_value(style), wrong_value(style))
            assert score(style, text, answer) in (correct_value(style), wrong_value(style))
        assert score("dapo", f"{text}\nAnswer: {answer}", answer) == 1.0
        assert score("deepscaler", f"{text}\nso \\boxed{{{answer}}}", answer) == 1.0
        assert score("math-verify", f"{text}\nso \\boxed{{{answer}}}", answer) == 1.0


# --- robustness -----------------------------------------------------------------------------------

_TOKENS = [
    "{",
    "}",
    "\\boxed{",
    "\\fbox{",
    "\\frac",
    "^",
    "^{",
    "1",
    "25",
    "x",
    "=",
    "Answer:",
    "</think>",
    "$",
]
_TOKENS += ["\\left(", "\\right)", ",", "/", "\\sqrt", "\n", " ", "\\text{", "9", "**", "!", "%", "\\%", "."]
latexish = st.lists(st.sampled_from(_TOKENS), max_size=40).map("".join)
_FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _assert_valid(style: str, response: object, reference: object) -> None:
    value = score(style, response, reference)  # type: ignore[arg-type]
    assert value in (correct_value(style), wrong_value(style))


@pytest.mark.parametrize("style", STYLES)
@_FAST
@given(response=st.text(max_size=300), reference=st.text(max_size=30))
def test_arbitrary_text_never_raises(style: str, response: str, reference: str) -> None:
    _assert_valid(style, response, reference)


@pytest.mark.parametrize("style", STYLES)
@_FAST
@given(response=latexish, reference=latexish)
def test_latexish_never_raises(style: str, response: str, reference: str) -> None:
    _assert_valid(style, response, reference)
    _assert_valid(style, "so \\boxed{" + response + "}", reference)


ODD_REFERENCES = ["025", "1,234", "\\frac12", "", "\\boxed{", "}{", None, 25, 1.5, b"7", ["1"]]


@pytest.mark.parametrize("style", STYLES)
def test_odd_inputs(style: str) -> None:
    for reference in ODD_REFERENCES:
        for response in ("", "\\boxed{", "Answer:", "</think>", None, 3, "\\boxed{25}\nAnswer: 25"):
            _assert_valid(style, response, reference)


ADVERSARIAL = [
    "\\boxed{9^9^9^9}",
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{" + "{" * 10_000,
    "x" * 1_000_000,
    "\\boxed{1}" + "1 " * 500_000,
    "1 " * 500_000 + "\\boxed{1}",
    "\\boxed{(1+x)^{1000000}}",
    "10**10**10",
    "\\boxed{10**10**10}",
    "\\boxed{2^{10^{7}}}",
    "\\boxed{100000!}",
    "\\boxed{" + "\\frac{1}{" * 2000 + "}" * 2000 + "}",
    "\\boxed{((((((9^9)^9)^9)^9)^9)^9)}",
    "Answer: " + "(" * 5000,
]
WORST_SECONDS = 10.0  # generous so the test is not flaky; measured worst is well under 1 s


@pytest.mark.parametrize("style", STYLES)
def test_adversarial_inputs_are_time_bounded(style: str) -> None:
    for text in ADVERSARIAL:
        for response, reference in ((text, "1"), ("\\boxed{1}", text[:5000])):
            start = time.perf_counter()
            _assert_valid(style, response, reference)
            elapsed = time.perf_counter() - start
            assert elapsed < WORST_SECONDS, (style, text[:40], elapsed)


def test_scoring_from_worker_threads() -> None:
    cases = [
        (s, r, g) for s in STYLES for r, g in (("so \\boxed{25}\nAnswer: 25", "25"), ("\\boxed{3}", "4"))
    ]
    expected = [score(*case) for case in cases]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda case: score(*case), cases * 3))
    assert got == expected * 3
    assert expected[0] == expected[2] == expected[4] == 1.0
