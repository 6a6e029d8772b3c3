"""Math data sets: loaders on the real samples (read in place), templates, LaTeX repair and statistics.

The samples are the rows vendored in ``tests/data/math`` (``VENDORED.md`` there); expectations are derived
from the rows read, so the tests also hold on the full copy (``APRIL_BENCH_SHARED_DATA``)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from helpers import read_jsonl

from april_bench.data import (
    DATASETS,
    TEMPLATES,
    DataError,
    DatasetStats,
    LoadedDataset,
    MathProblem,
    format_stats,
    load,
    messages,
    prompt_lengths,
    render,
    repair_latex,
    stats,
)
from april_bench.data.stats import answer_type, percentile

CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f]")  # every control character but newline


def accounted(ds: LoadedDataset) -> bool:
    r = ds.report
    return r.rows_read == r.kept + sum(r.skipped.values()) and r.kept == len(ds.problems)


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --------------------------------------------------------------------------------------------------
# Import weight and registry
# --------------------------------------------------------------------------------------------------


def test_import_is_light() -> None:
    code = (
        "import sys, april_bench.data; "
        "print(sorted(m for m in ('pyarrow', 'datasets', 'transformers', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_registry() -> None:
    assert set(DATASETS) == {
        "dapo-math-17k",
        "deepscaler",
        "deepmath-103k",
        "aime-2024",
        "aime-2025",
        "math-500",
    }
    for name, spec in DATASETS.items():
        assert spec.name == name and spec.template in TEMPLATES and spec.role in ("train", "eval")
        assert spec.template == "boxed" if spec.role == "eval" else spec.template != "boxed"
    assert DATASETS["math-500"].split == "test"
    assert DATASETS["dapo-math-17k"].hub_id == "BytedTsinghua-SIA/DAPO-Math-17k"


# --------------------------------------------------------------------------------------------------
# The real samples
# --------------------------------------------------------------------------------------------------


def test_dapo_both_schemas_agree(shared_data: Path) -> None:
    processed = load("dapo-math-17k", shared_data / "dapo-math-17k" / "sample.jsonl", repair=False)
    original = load("dapo-math-17k", shared_data / "dapo-math-17k" / "original-schema.jsonl", repair=False)
    raw = read_jsonl(shared_data / "dapo-math-17k" / "sample.jsonl")
    assert len(processed) == len(original) == len(raw) >= 20
    assert accounted(processed) and accounted(original)
    assert original.report.notes == {}  # every templated prompt was recognised
    for a, b, row in zip(processed, original, raw, strict=True):
        assert a.problem == b.problem == row["prompt"]  # template stripped back to open-r1's problem text
        assert a.answer == b.answer == row["reward_model"]["ground_truth"]
        assert a.source_id == b.source_id == row["extra_info"]["index"]
    assert original.problems[0].source_id.startswith("9a9b6eb4-") and original.problems[0].answer == "34"


def test_dapo_original_repeats_are_deduplicated(tmp_path: Path, shared_data: Path) -> None:
    rows = read_jsonl(shared_data / "dapo-math-17k" / "original-schema.jsonl")[:5]
    repeated = write_parquet(tmp_path / "dapo.parquet", rows * 3)
    ds = load("dapo-math-17k", repeated)
    assert len(ds) == 5 and ds.report.rows_read == 15
    assert ds.report.skipped == {"duplicate problem": 10} and accounted(ds)
    assert len(load("dapo-math-17k", repeated, dedupe=False)) == 15


def test_dapo_slime_variant(tmp_path: Path, shared_data: Path) -> None:
    raw = read_jsonl(shared_data / "dapo-math-17k" / "sample.jsonl")[:3]
    boxed = TEMPLATES["dapo-boxed"]
    rows = [
        {"prompt": [{"content": boxed.user(r["prompt"]), "role": "user"}], "label": r["solution"]}
        for r in raw
    ]
    rows.append({"prompt": [{"content": "Just a question?", "role": "user"}], "label": "7"})
    path = tmp_path / "slime.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = load("dapo-math-17k", path, repair=False)
    assert [p.problem for p in ds.problems[:3]] == [r["prompt"] for r in raw]
    assert [p.answer for p in ds] == [r["solution"] for r in raw] + ["7"]
    assert ds.problems[3].problem == "Just a question?"
    assert ds.report.notes == {"instruction template not recognised: whole prompt kept": 1}
    assert [p.source_id for p in ds] == ["0", "1", "2", "3"]


def test_deepscaler_sample_and_components(shared_data: Path) -> None:
    ds = load("deepscaler", shared_data / "deepscaler" / "sample.jsonl")
    rows = {
        name: len(read_jsonl(shared_data / "deepscaler" / f"{name}.jsonl"))
        for name in ("sample", "component-aime", "component-math")
    }
    assert len(ds) + ds.report.skipped.get("no answer", 0) == rows["sample"] and accounted(ds)
    first = ds.problems[0]
    assert first.problem.startswith("The operation $\\otimes$") and first.answer == "-\\frac{2}{3}"
    assert first.source_id == "0" and set(first.metadata) == {"solution", "difficulty"}
    aime = load("deepscaler", shared_data / "deepscaler" / "component-aime.jsonl")
    math = load("deepscaler", shared_data / "deepscaler" / "component-math.jsonl")
    assert (len(aime), len(math)) == (rows["component-aime"], rows["component-math"])
    assert {"year", "aime_number", "problem_number", "difficulty"} <= set(aime.problems[0].metadata)
    assert set(math.problems[0].metadata) == {"difficulty", "type"}
    whole = load("deepscaler", shared_data / "deepscaler")  # a directory: files sorted, ids = row index
    total = len(ds) + len(aime) + len(math)
    assert len(whole) == total and [p.source_id for p in whole] == [str(i) for i in range(total)]


def test_aime_2024_both_copies(shared_data: Path) -> None:
    padded = load("aime-2024", shared_data / "aime-2024" / "sample.jsonl")
    dapo = load("aime-2024", shared_data / "aime-2024" / "dapo-format.jsonl")
    assert len(padded) == len(dapo) == 30 and accounted(padded) and accounted(dapo)
    assert "025" in {p.answer for p in padded}  # zero padding kept as the source gives it
    assert padded.problems[0].source_id == "2024-I-1"
    assert all(not p.answer.startswith("0") for p in dapo)
    assert [p.source_id for p in dapo] == [str(i) for i in range(30)]
    assert sorted(int(p.answer) for p in padded) == sorted(int(p.answer) for p in dapo)

    def key(text: str) -> str:  # the DAPO copy drops [asy] figures and trailing links
        return re.sub(r"[^a-z0-9]", "", text.lower())[:50]

    by_key = {key(p.problem): p for p in padded}
    matched = [(p, by_key[key(p.problem)]) for p in dapo if key(p.problem) in by_key]
    assert len(matched) >= 29
    assert all(int(a.answer) == int(b.answer) for a, b in matched)


def test_aime_2024_dapo_eval_repeats(tmp_path: Path, shared_data: Path) -> None:
    rows = read_jsonl(shared_data / "aime-2024" / "dapo-format.jsonl")
    shuffled = write_parquet(tmp_path / "aime-2024.parquet", (rows * 32)[::-1])
    ds = load("aime-2024", shuffled)
    assert len(ds) == 30 and ds.report.skipped == {"duplicate problem": 930} and accounted(ds)
    assert ds.problems[0].problem == rows[-1]["extra_info"]["raw_problem"]


def test_aime_other_forms(tmp_path: Path) -> None:
    areal = tmp_path / "areal.jsonl"
    areal.write_text(
        json.dumps(
            {
                "id": 60,
                "problem": "Find x.",
                "solution": "x is 204",
                "answer": "204",
                "url": "u",
                "question": "Q",
            }
        )
        + "\n"
    )
    ds = load("aime-2024", areal)
    assert ds.problems[0] == MathProblem(
        "aime-2024", "60", "Find x.", "204", {"solution": "x is 204", "url": "u", "question": "Q"}
    )
    hub_like = tmp_path / "math-ai.json"  # math-ai/aime24: the answer only as \boxed{} in solution
    hub_like.write_text(json.dumps([{"id": 0, "problem": "Find y.", "solution": "\\boxed{033}", "url": "u"}]))
    ds = load("aime-2024", hub_like)
    assert ds.problems[0].answer == "033"
    assert ds.report.notes == {"answer taken from \\boxed{} in solution": 1}


def test_aime_2025_and_math_500(shared_data: Path) -> None:
    aime = load("aime-2025", shared_data / "aime-2025" / "sample.jsonl")
    assert len(aime) == 30 and [p.source_id for p in aime] == [str(i) for i in range(30)]
    assert aime.problems[0].answer == "70"  # the source stores an int; answers are text
    math = load("math-500", shared_data / "math-500" / "sample.jsonl")
    raw = read_jsonl(shared_data / "math-500" / "sample.jsonl")
    assert len(math) == len(raw) >= 20 and accounted(math)
    assert [p.source_id for p in math] == [r["unique_id"] for r in raw]
    assert [p.answer for p in math] == [r["answer"] for r in raw]
    assert set(math.problems[0].metadata) == {"solution", "subject", "level"}


def test_limit(shared_data: Path) -> None:
    ds = load("math-500", shared_data / "math-500", limit=7)
    assert len(ds) == 7 and ds.report.rows_read == 7
    with pytest.raises(ValueError, match="limit"):
        load("math-500", shared_data / "math-500", limit=0)


# --------------------------------------------------------------------------------------------------
# LaTeX repair
# --------------------------------------------------------------------------------------------------


def test_repair_aime_2025(shared_data: Path) -> None:
    path = shared_data / "aime-2025" / "sample.jsonl"
    fixed = {p.source_id: p for p in load("aime-2025", path)}
    raw = {p.source_id: p for p in load("aime-2025", path, repair=False)}
    mangled = {i for i, p in raw.items() if CONTROL.search(p.problem)}
    assert mangled == {"18", "19", "27"}
    assert fixed["18"].problem.count("\\frac") >= 5 and fixed["27"].problem.count("\\frac") >= 2
    assert "\\triangle DEF" in fixed["19"].problem and "\triangle DEF" in raw["19"].problem
    assert not any(CONTROL.search(p.problem) for p in fixed.values())
    assert load("aime-2025", path).report.repaired == 3


def test_repair_dapo_form_feeds(shared_data: Path) -> None:
    path = shared_data / "dapo-math-17k" / "original-schema.jsonl"
    fixed, raw = load("dapo-math-17k", path), load("dapo-math-17k", path, repair=False)
    # The source's 10 form-feed rows, all of them vendored (tests/data/vendor.py keeps every one).
    assert fixed.report.repaired == 10 and raw.report.repaired == 0
    assert sum("\x0crac{m}{n}" in p.problem for p in raw) == 10
    assert not any(CONTROL.search(p.problem) for p in fixed)
    changed = [(a, b) for a, b in zip(raw, fixed, strict=True) if a.problem != b.problem]
    assert len(changed) == 10 and all("\\frac{m}{n}" in b.problem for _, b in changed)


@pytest.mark.parametrize(
    ("mangled", "repaired"),
    [
        ("\x0crac{1}{2}", "\\frac{1}{2}"),
        ("\triangle ABC", "\\triangle ABC"),
        ("2\times 3", "2\\times 3"),
        ("\text{cm} and \textbf{x}", "\\text{cm} and \\textbf{x}"),
        ("\theta + \tau", "\\theta + \\tau"),
        ("\beta, \binom{4}{2}, \boxed{5}", "\\beta, \\binom{4}{2}, \\boxed{5}"),
        ("\\left(x\right) + \rho", "\\left(x\\right) + \\rho"),
        ("\x07lpha \x0bec{v}", "\\alpha \\vec{v}"),
    ],
)
def test_repair_latex_rules(mangled: str, repaired: str) -> None:
    assert repair_latex(mangled) == repaired


@pytest.mark.parametrize(
    "text",
    [
        "a\nu b",  # could be \nu, could be a line break: newlines are never touched
        "x\tequal\tperimeters",  # a tab separator, not a command
        "\tan apple",  # "\tan" is also the word "an" after a tab: ambiguous, left alone
        "line one\r\nline two",
        "plain $\\frac{1}{2}$",
    ],
)
def test_repair_latex_leaves_ambiguous_text(text: str) -> None:
    assert repair_latex(text) == text


# --------------------------------------------------------------------------------------------------
# DeepMath (no rows in the samples: the documented columns, written here)
# --------------------------------------------------------------------------------------------------

DEEPMATH_ROWS = [
    {
        "question": "Evaluate $\\int_0^1 x\\,dx$.",
        "final_answer": "\\frac{1}{2}",
        "difficulty": 2.0,
        "topic": "Mathematics -> Calculus -> Integral Calculus",
        "r1_solution_1": "a" * 1000,
        "r1_solution_2": "b" * 2000,
        "r1_solution_3": "c" * 3000,
    },
    {
        "question": "What is $2+2$?",
        "final_answer": "",
        "difficulty": 1.0,
        "topic": "Mathematics -> Algebra",
        "r1_solution_1": "x",
        "r1_solution_2": "y",
        "r1_solution_3": "z",
    },
    {
        "question": "  ",
        "final_answer": "3",
        "difficulty": 1.0,
        "topic": "Mathematics -> Algebra",
        "r1_solution_1": "",
        "r1_solution_2": "",
        "r1_solution_3": "",
    },
]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_deepmath(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"deepmath{suffix}"
    if suffix == ".parquet":
        write_parquet(path, DEEPMATH_ROWS)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in DEEPMATH_ROWS))
    ds = load("deepmath-103k", path)
    assert len(ds) == 1 and ds.report.skipped == {"no answer": 1, "empty problem": 1} and accounted(ds)
    p = ds.problems[0]
    assert (p.problem, p.answer, p.source_id) == (DEEPMATH_ROWS[0]["question"], "\\frac{1}{2}", "0")
    assert dict(p.metadata) == {
        "difficulty": 2.0,
        "topic": "Mathematics -> Calculus -> Integral Calculus",
        "r1_solution_chars": [1000, 2000, 3000],
    }
    assert messages(p)[0] == {"role": "system", "content": TEMPLATES["deepmath"].system}


# --------------------------------------------------------------------------------------------------
# File formats
# --------------------------------------------------------------------------------------------------


def test_formats_round_trip(tmp_path: Path, shared_data: Path) -> None:
    rows = read_jsonl(shared_data / "math-500" / "sample.jsonl")[:20]
    expected = load("math-500", shared_data / "math-500", limit=20).problems
    (tmp_path / "array.json").write_text(json.dumps(rows))
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    (tmp_path / "columns.json").write_text(json.dumps(columns))
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in rows))
    write_parquet(tmp_path / "table.parquet", rows)
    for name in ("array.json", "columns.json", "lines.json", "table.parquet"):
        assert load("math-500", tmp_path / name).problems == expected, name
    deepscaler = read_jsonl(shared_data / "deepscaler" / "sample.jsonl")[:10]
    parquet = write_parquet(tmp_path / "deepscaler.parquet", deepscaler)
    original = load("deepscaler", shared_data / "deepscaler" / "sample.jsonl", limit=10)
    assert load("deepscaler", parquet).problems == original.problems


def test_directory_of_files(tmp_path: Path, shared_data: Path) -> None:
    rows = read_jsonl(shared_data / "aime-2025" / "sample.jsonl")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[15:]))
    (tmp_path / "data" / "a.json").write_text(json.dumps(rows[:15]))
    (tmp_path / "README.md").write_text("not data")
    ds = load("aime-2025", tmp_path)
    assert [p.source_id for p in ds] == [str(i) for i in range(30)] and ds.path == str(tmp_path)


def test_bad_rows_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"problem": "p", "answer": "1"}\n[1, 2]\n{not json\n\n{"problem": "q", "answer": null}\n'
    )
    ds = load("aime-2025", path)
    assert len(ds) == 1
    assert ds.report.skipped == {"not an object": 1, "invalid JSON": 1, "no answer": 1} and accounted(ds)


# --------------------------------------------------------------------------------------------------
# Errors that name the fix
# --------------------------------------------------------------------------------------------------


def test_unknown_data_set() -> None:
    with pytest.raises(
        ValueError, match=r"unknown data set 'gsm8k'; known data sets: dapo-math-17k, deepscaler"
    ):
        load("gsm8k", "x.jsonl")


def test_unknown_columns(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"text": "hi", "target": "1"}) + "\n")
    with pytest.raises(
        ValueError, match=r"columns \['target', 'text'\] match no known math-500 schema"
    ) as info:
        load("math-500", path)
    assert "problem|question" in str(info.value) and "answer" in str(info.value)


def test_empty_directory_and_missing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no \.parquet, \.json or \.jsonl files"):
        load("math-500", tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load("math-500", tmp_path / "missing.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"use \.parquet, \.json or \.jsonl"):
        load("math-500", tmp_path / "data.csv")


def test_hub_without_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match=r"pip install 'april-bench\[hub\]'.*local `path`") as info:
        load("aime-2024")
    assert isinstance(info.value, ValueError)  # the CLI reports it as a plain error
    assert "math-ai/aime24" in str(info.value)


def test_hub_load_goes_through_datasets(monkeypatch: pytest.MonkeyPatch, shared_data: Path) -> None:
    calls = []
    rows = read_jsonl(shared_data / "aime-2025" / "sample.jsonl")

    def load_dataset(repo: str, config: str | None, *, split: str) -> list[dict[str, Any]]:
        calls.append((repo, config, split))
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    ds = load("aime-2025")
    assert len(ds) == 30 and ds.report.source == "hub:math-ai/aime25[test]"
    assert (ds.path, ds.hub_id, ds.split) == (None, "math-ai/aime25", "test")
    load("aime-2025", hub_id="someone/aime:all", split="train", limit=2)
    assert calls == [("math-ai/aime25", None, "test"), ("someone/aime", "all", "train")]
    with pytest.raises(ValueError, match="either a local `path` or a `hub_id`"):
        load("aime-2025", shared_data / "aime-2025", hub_id="someone/aime")


def test_an_unreachable_hub_names_the_local_file_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def load_dataset(repo: str, config: str | None, *, split: str) -> list[dict[str, Any]]:
        raise ConnectionError("Couldn't reach 'math-ai/aime24' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(DataError, match=r"cannot be loaded \(ConnectionError.*--data-path aime-2024=FILE"):
        load("aime-2024")


# --------------------------------------------------------------------------------------------------
# Templates and rendering
# --------------------------------------------------------------------------------------------------


def test_dapo_template_reproduces_source_prompt(shared_data: Path) -> None:
    ds = load("dapo-math-17k", shared_data / "dapo-math-17k" / "sample.jsonl", repair=False)
    raw = read_jsonl(shared_data / "dapo-math-17k" / "sample.jsonl")
    for problem, row in zip(ds, raw, strict=True):
        assert messages(problem) == [{"role": "user", "content": row["source_prompt"][0]["content"]}]


def test_template_texts() -> None:
    deepscaler = messages("What is 1+1?", "deepscaler")
    assert deepscaler == [
        {
            "role": "user",
            "content": "What is 1+1? Let's think step by step and output the final answer within \\boxed{}.",
        }
    ]
    assert messages("What is 1+1?") == deepscaler  # a bare string gets "boxed", the same text
    assert messages("What is 1+1?", "deepmath") == [
        {
            "role": "system",
            "content": "Please reason step by step, and put your final answer within \\boxed{}.",
        },
        {"role": "user", "content": "What is 1+1?"},
    ]
    assert messages("Q", "plain") == [{"role": "user", "content": "Q"}]
    assert render("Q", template="deepmath") == TEMPLATES["deepmath"].system + "\n\nQ"
    assert render(MathProblem("math-500", "0", "Q", "1")) == "Q" + TEMPLATES["boxed"].suffix
    with pytest.raises(ValueError, match="unknown prompt template 'chatml'; valid templates: boxed, dapo"):
        messages("Q", "chatml")


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    from april_bench.models.checkpoint import make_tiny_checkpoint

    return AutoTokenizer.from_pretrained(make_tiny_checkpoint(tmp_path_factory.mktemp("tiny")))


def test_render_with_chat_template(tiny_tokenizer: Any) -> None:
    problem = MathProblem("deepmath-103k", "0", "What is 1+1?", "2")
    text = render(problem, tiny_tokenizer)
    assert text == (f"<|system|>{TEMPLATES['deepmath'].system}\n<|user|>What is 1+1?\n<|assistant|>")
    assert render("Q", tiny_tokenizer, "plain") == "<|user|>Q\n<|assistant|>"


def test_render_without_chat_template(tiny_tokenizer: Any) -> None:
    import copy

    bare = copy.deepcopy(tiny_tokenizer)
    bare.chat_template = None
    assert render("Q", bare, "deepmath") == TEMPLATES["deepmath"].system + "\n\nQ"
    assert render("Q", bare, "plain") == "Q"


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------


def test_math_500_lengths_follow_the_problem_text(shared_data: Path) -> None:
    ds = load("math-500", shared_data / "math-500")
    chars = [len(r["problem"]) for r in read_jsonl(shared_data / "math-500" / "sample.jsonl")]
    lengths, unit = prompt_lengths(ds)
    assert unit == "est. tokens (chars/3.5)" and len(lengths) == len(chars)
    s = stats(ds)
    suffix = len(TEMPLATES["boxed"].suffix)
    # The boxed template adds `suffix` characters to each problem; each length is rounded to a token.
    assert abs(s.p50 - (percentile(chars, 50) + suffix) / 3.5) <= 1
    assert abs(s.mean - (statistics.mean(chars) + suffix) / 3.5) <= 0.5
    assert s.min <= s.p50 <= s.p90 <= s.p99 <= s.max
    plain, _ = prompt_lengths(ds, template="plain")
    assert percentile(plain, 50) == pytest.approx(percentile(chars, 50) / 3.5, abs=1)
    if len(chars) == 500:  # the full copy: README's table, MATH-500 problem chars mean 196, p50 148
        assert round(statistics.mean(chars)) == 196 and percentile(chars, 50) == 148


def test_stats_card_and_answer_types(shared_data: Path) -> None:
    ds = load("aime-2024", shared_data / "aime-2024" / "sample.jsonl")
    s = stats(ds)
    assert isinstance(s, DatasetStats) and (s.rows_read, s.kept, s.repaired) == (30, 30, 0)
    assert set(s.answer_types) <= {"integer", "zero-padded integer"} and sum(s.answer_types.values()) == 30
    assert s.answer_types["zero-padded integer"] >= 1
    card = format_stats(s)
    assert card.startswith("## aime-2024") and "| zero-padded integer |" in card and "chars/3.5" in card
    assert s.template == "boxed" and "template: boxed" in card
    repaired = format_stats(stats(load("aime-2025", shared_data / "aime-2025")))
    assert "| 30 | 30 | 0 | 3 |" in repaired


def test_stats_in_tokens(shared_data: Path, tiny_tokenizer: Any) -> None:
    ds = load("aime-2025", shared_data / "aime-2025", limit=3)
    lengths, unit = prompt_lengths(ds, tiny_tokenizer)
    assert unit == "tokens"
    # the character-level tokenizer: one token per character of the rendered prompt
    assert lengths == [len(render(p, tiny_tokenizer)) for p in ds]
    assert stats(ds, tiny_tokenizer).unit == "tokens"


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ("34", "integer"),
        ("-7", "integer"),
        ("1,234", "integer"),
        ("025", "zero-padded integer"),
        ("1.25", "decimal"),
        (".5", "decimal"),
        ("\\frac{3}{56}", "fraction"),
        ("\\dfrac12", "fraction"),
        ("3/4", "fraction"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "tuple/interval"),
        ("(-\\infty,-4)\\cup (4,\\infty)", "tuple/interval"),
        ("3, 5, 7", "tuple/interval"),
        ("3\\sqrt{13}", "LaTeX expression"),
        ("90^\\circ", "LaTeX expression"),
        ("p - q", "expression"),
        ("x=5", "expression"),
        ("\\text{Evelyn}", "text"),
        ("(C)", "text"),
        ("", "empty"),
        ("  ", "empty"),
    ],
)
def test_answer_type(answer: str, kind: str) -> None:
    assert answer_type(answer) == kind
