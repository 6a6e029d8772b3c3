"""Property: every file reader meets hostile input with one ``error:`` line (issue 32, item 6).

Random bytes, deep nesting and random numbers (NaN, infinities, overflowing and huge values) go to
every reader a user can point at a file: config files (YAML, JSON, TOML), a run's files (config,
provenance, status, rows), traces of each format (april-bench, verl, per-step CSV, slime ``.pt``)
and cost curves.  Each command exits 2 with exactly one ``error:`` line and no traceback (or 0 where
the bytes happen to be valid input), and nothing outside its directory changes: not the input, not a
file beside it, not the working directory.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import sim_flags
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from april_bench.cli import main

#: About 35 s in all (at load 3 on 2 cores): more than a few seconds, so `slow`; `tox` runs it.
pytestmark = pytest.mark.slow

EXAMPLES = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,  # the same cases on every run: a failure is reproducible
    database=None,  # and no .hypothesis/ directory is written
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

#: Numbers that break naive readers: NaN, infinities, overflow, huge and negative values.
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 10**308, 1e308]),
)
_TEXT = st.text(max_size=12)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), _NUMBERS, _TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)),
    max_leaves=12,
)


def _json_text(value: Any) -> str:
    return json.dumps(value)  # NaN and Infinity written bare, as a hostile file would


def _nesting(depth: int, kind: str) -> bytes:
    if kind == "json":
        return (b"[" * depth) + (b"]" * depth)
    if kind == "yaml":
        return b"a: " + (b"[" * depth) + (b"]" * depth) + b"\n"
    return b"a = " + (b"[" * depth) + (b"]" * depth) + b"\n"


#: Hostile content: random bytes, deep nesting, random JSON with random numbers, a JSON object of them.
CONTENT = st.one_of(
    st.binary(max_size=300),
    st.builds(
        _nesting, st.integers(min_value=30, max_value=5_000), st.sampled_from(["json", "yaml", "toml"])
    ),
    _JSON.map(lambda v: _json_text(v).encode()),
    st.dictionaries(_TEXT, _JSON, min_size=1, max_size=5).map(lambda v: _json_text(v).encode()),
    st.lists(st.dictionaries(_TEXT, _JSON, max_size=5), max_size=4).map(
        lambda rows: "".join(_json_text(r) + "\n" for r in rows).encode()
    ),
)


def _tree(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for root, dirs, files in os.walk(path):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            p = Path(root) / name
            out[str(p.relative_to(path))] = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
    return out


def _check(
    argv: Callable[[Path], list[str]], place: Callable[[Path], Path], content: bytes, *, writes: bool = False
) -> None:
    """Write ``content`` where ``place`` says inside a fresh directory, run the command, and check the
    one-line contract and that nothing outside the command's own output changed."""
    with tempfile.TemporaryDirectory() as root_name:
        root = Path(root_name)
        (root / "outside").mkdir()
        (root / "outside" / "keep.txt").write_text("a user's file\n")
        (root / "outside" / "link").symlink_to(root / "outside" / "keep.txt")
        work = root / "work"
        work.mkdir()
        target = place(work)
        target.write_bytes(content)
        before, inputs = _tree(root / "outside"), _tree(work)
        out, err = io.StringIO(), io.StringIO()
        cwd = os.getcwd()
        os.chdir(root / "outside")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv(work))
        finally:
            os.chdir(cwd)
        text = err.getvalue()
        assert "Traceback" not in text, text
        assert code in (0, 2), (code, text)
        if code == 2:
            errors = [line for line in text.splitlines() if line.startswith("error:")]
            assert len(errors) == 1, text
        assert _tree(root / "outside") == before  # nothing outside the directory changed
        if not writes:
            after = _tree(work)
            assert {
                k: v for k, v in after.items() if k in inputs
            } == inputs  # a reader never writes its input


# ---------------------------------------------------------------- config files


@pytest.mark.parametrize("suffix", [".yaml", ".json", ".toml"])
@EXAMPLES
@given(content=CONTENT)
def test_config_files(suffix: str, content: bytes) -> None:
    _check(lambda w: ["validate", "--config", str(w / f"c{suffix}")], lambda w: w / f"c{suffix}", content)


# ---------------------------------------------------------------- run files


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("complete") / "run"
    assert main(["run", *sim_flags(steps=1), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(
    "name", ["config.json", "provenance.json", "status.json", "steps.jsonl", "trace.jsonl"]
)
@EXAMPLES
@given(content=CONTENT)
def test_run_files(complete_run: Path, name: str, content: bytes) -> None:
    def place(work: Path) -> Path:
        shutil.copytree(complete_run, work / "run")
        return work / "run" / name

    command = ["report"] if name != "trace.jsonl" else ["trace", "show"]
    _check(lambda w: [*command, str(w / "run")], place, content)


@pytest.mark.parametrize("name", ["status.json", "config.json", "provenance.json"])
@EXAMPLES
@given(content=CONTENT)
def test_resume_reads_run_files(complete_run: Path, name: str, content: bytes) -> None:
    def place(work: Path) -> Path:
        shutil.copytree(complete_run, work / "run")
        status = json.loads((work / "run" / "status.json").read_text())
        (work / "run" / "status.json").write_text(json.dumps({**status, "state": "interrupted"}))
        return work / "run" / name

    def argv(work: Path) -> list[str]:
        return ["run", "--resume", str(work / "run"), "--no-progress"]

    _check(argv, place, content, writes=True)  # a resume that goes ahead writes its own run


# ---------------------------------------------------------------- traces of each format and cost curves


@EXAMPLES
@given(content=CONTENT)
def test_april_bench_trace_files(content: bytes) -> None:
    _check(lambda w: ["trace", "show", str(w / "t.jsonl")], lambda w: w / "t.jsonl", content)


@EXAMPLES
@given(content=CONTENT)
def test_verl_dumps(content: bytes) -> None:
    def place(work: Path) -> Path:
        (work / "verl").mkdir()
        return work / "verl" / "3.jsonl"

    _check(lambda w: ["trace", "import-verl", str(w / "verl"), "-o", str(w / "out.jsonl")], place, content)


@EXAMPLES
@given(content=CONTENT)
def test_per_step_csv(content: bytes) -> None:
    flags = ["--groups-per-step", "2", "--samples-per-prompt", "2", "--max-response-len", "100"]
    _check(
        lambda w: ["trace", "import-stats", str(w / "s.csv"), *flags, "-o", str(w / "out.jsonl")],
        lambda w: w / "s.csv",
        content,
    )


@EXAMPLES
@given(content=CONTENT)
def test_slime_dumps(content: bytes) -> None:
    _check(
        lambda w: ["trace", "import-slime", str(w / "d.pt"), "-o", str(w / "out.jsonl")],
        lambda w: w / "d.pt",
        content,
    )


@EXAMPLES
@given(content=CONTENT)
def test_cost_curves(content: bytes) -> None:
    def argv(work: Path) -> list[str]:
        return [
            "validate",
            "--engine",
            "sim",
            "--hw",
            "h100",
            "--engine-arg",
            f"cost_curve={work / 'curve.json'}",
        ]

    _check(argv, lambda w: w / "curve.json", content)
