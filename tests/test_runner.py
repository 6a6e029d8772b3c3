"""The run lifecycle as a library: ``april_bench.run(config, out=...)`` writes what ``run --out`` writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import flags

import april_bench
from april_bench.cli import build_parser, main
from april_bench.cli.args import config_from_args

FLAGS = flags(engine="sim", hw="h100", algo="dapo", steps=2, seed=5, no_progress=True)


def _untimed(value: object) -> object:
    """``value`` without the wall-clock measurements (the bookkeeping cost is measured, even when the
    engine is simulated)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if "bookkeeping" not in k}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


#: result.json's fields that differ between two directories of the same run.
_PER_DIRECTORY = ("run", "date", "provenance_sha256")


def _contents(run: Path) -> dict[str, object]:
    """Every file of a run directory, rows without wall-clock measurements; provenance's keys only (its
    clock differs per run)."""
    found: dict[str, object] = {}
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        name, text = str(path.relative_to(run)), path.read_text()
        if name == "provenance.json":
            found[name] = sorted(json.loads(text))
        elif name == "result.json":  # the directory's name, its end time and its provenance's digest
            result = json.loads(text)
            found[name] = _untimed({k: v for k, v in result.items() if k not in _PER_DIRECTORY})
        elif name.endswith(".jsonl"):
            found[name] = [_untimed(json.loads(line)) for line in text.splitlines()]
        elif name.endswith(".json"):
            found[name] = _untimed(json.loads(text))
        elif name != "table.md":  # the table shows the measured bookkeeping share
            found[name] = text
    return found


def test_the_library_run_writes_the_same_run_directory_as_the_cli(tmp_path: Path, capsys) -> None:
    assert main(["run", *FLAGS, "--out", str(tmp_path / "cli")]) == 0
    capsys.readouterr()
    config = config_from_args(build_parser().parse_args(["run", *FLAGS]))
    result = april_bench.run(config, out=tmp_path / "lib", progress=False)
    assert result.recorder["steps"], "the run returns its records"
    cli, lib = _contents(tmp_path / "cli"), _contents(tmp_path / "lib")
    assert sorted(cli) == sorted(lib)
    assert cli == lib
    assert json.loads((tmp_path / "lib" / "status.json").read_text())["state"] == "complete"


def test_the_library_run_refuses_a_run_directory_that_holds_a_run(tmp_path: Path) -> None:
    from april_bench.config import ConfigError
    from april_bench.experiment_config import ExperimentConfig

    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "steps.jsonl").write_text("")
    (tmp_path / "taken" / "status.json").write_text('{"state": "interrupted", "completed": {}}')
    with pytest.raises(ConfigError, match="--overwrite"):
        april_bench.run(ExperimentConfig(engine="sim", steps=1), out=tmp_path / "taken", progress=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "steps.jsonl").write_text("")  # no status or provenance: not a run's
    with pytest.raises(ConfigError, match="did not write"):
        april_bench.run(ExperimentConfig(engine="sim", steps=1), out=tmp_path / "mine", progress=False)


def test_the_screen_prints_the_table_md_the_run_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tables are rendered once, into table.md; `run` prints that file, then the directory and JSON."""
    from helpers import sim_flags

    out = tmp_path / "run"
    assert main(["run", *sim_flags(), "--strategies", "sync,april", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = (out / "table.md").read_text()
    assert table.startswith("## Results: SIMULATED")
    assert printed.startswith(table.removesuffix("\n") + "\n\nrun directory: ")
    (out / "table.md").write_text("## Results: edited\n")  # the report is the file, not a second rendering
    from april_bench.results.store import load_run, run_report

    assert run_report(load_run(out), out).startswith("## Results: edited\n\nrun directory: ")


def test_claim_validates_before_it_claims(tmp_path: Path) -> None:
    """``ClaimedRun.claim`` without components validates first: a config the wiring refuses (here an
    arm the engine cannot run) is one error line and leaves no directory behind."""
    from april_bench.config import ConfigError
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.runner import ClaimedRun

    config = ExperimentConfig(hardware="h100", engine="sim", colocate=True, steps=2)
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="--colocate: engine 'sim' cannot release its memory"):
        ClaimedRun.claim(config, None, out)
    assert not out.exists()
