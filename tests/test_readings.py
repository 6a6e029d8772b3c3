"""Both readings of the DAPO-Math-17k row in one run (april_bench.experiment.readings), and the gate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import table_rows

from april_bench.cli import main
from april_bench.experiment.readings import other_readings
from april_bench.recipes import paper
from april_bench.results.readings import READINGS_FILE, readings_record, render_readings
from april_bench.sim.paper_settings import DAPO_ROW_READINGS

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "runs" / "sim-mi300x-dapo-dapo-math-17k"
#: The paper's DAPO row at its shape, two steps (a few seconds).
SHORT = ["run", "--hw", "mi300x", "--algo", "dapo", "--steps", "2", "--no-progress"]


def test_only_a_paper_row_with_an_uncertain_algorithm_has_other_readings() -> None:
    assert [c.algorithm for c in other_readings(paper("mi300x", algorithm="dapo"))] == ["grpo"]
    grpo = other_readings(paper("mi300x", algorithm="dapo"))[0]
    assert not grpo.dynamic_sampling_on and grpo.dataset == "dapo-math-17k" and grpo.steps == 30
    assert other_readings(paper("mi300x", algorithm="grpo", dataset="deepscaler")) == []
    assert other_readings(paper("mi300x", algorithm="dapo", steps=4).replace(dynamic_sampling=True)) == []
    assert other_readings(paper("mi300x", algorithm="dapo", workload_args={"response_median": 100.0})) == []


def test_the_record_puts_the_run_first_and_says_why() -> None:
    config = paper("mi300x", algorithm="dapo").to_dict()

    def summary(gain: float) -> dict:
        base = {"baseline": "sync", "tail_time_share": 0.1, "steps": 2, "rejected_groups": 3}
        april = {"baseline": "sync", "throughput_gain": gain, "throughput_gain_step_mean": gain + 0.01}
        return {"sync": base, "april": april}

    record = readings_record(config, summary(-0.1), [({**config, "algorithm": "grpo"}, summary(0.25))])
    assert record is not None and record["paper_gain"] == 0.17 and record["why"] == DAPO_ROW_READINGS
    first, second = record["readings"]
    assert (first["algorithm"], first["as_run"], second["algorithm"], second["as_run"]) == (
        "dapo",
        True,
        "grpo",
        False,
    )
    assert first["baseline_rejected_groups_per_step"] == 1.5
    assert second["arms"]["april"]["throughput_gain"] == 0.25 and "sync" not in second["arms"]
    text = render_readings(record)
    assert "| DAPO (as run)" in text and "| GRPO (other reading)" in text
    assert "-10.0%" in text and "+25.0%" in text and "+8.0 pt" in text and "may name the data set" in text
    assert readings_record(config, summary(0.0), []) is None


def test_the_run_writes_both_readings_and_compare_ignores_the_extra_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main([*SHORT, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / READINGS_FILE).read_text())
    assert [r["algorithm"] for r in record["readings"]] == ["dapo", "grpo"]
    summary = json.loads((out / "summary.json").read_text())["arms"]
    # the run's own arms are the DAPO reading's: the second reading adds a file, never a row
    assert record["readings"][0]["arms"]["april"]["throughput_gain"] == summary["april"]["throughput_gain"]
    steps = table_rows(out, "steps")
    assert {s["arm"] for s in steps} == {"sync", "oversample-discard", "april"} and len(steps) == 6
    for text in (printed, (out / "table.md").read_text()):
        assert "Both readings of the dapo-math-17k row" in text and "GRPO (other reading)" in text
        assert "Per-step mean gain" in text and "from the tail (last 10%)" in text
    bare = tmp_path / "bare"
    shutil.copytree(out, bare)
    (bare / READINGS_FILE).unlink()
    assert main(["compare", str(bare), str(out), "--fail", "total:0"]) == 0
    assert main(["compare", str(out), str(bare), "--fail", "total:0"]) == 0
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "GRPO (other reading)" in capsys.readouterr().out
    assert main(["run", "--resume", str(out)]) == 2  # complete: refused in one line, readings untouched


def test_another_row_writes_no_readings(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["run", "--hw", "mi300x", "--algo", "grpo", "--dataset", "deepscaler", "--steps", "1",
                 "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    assert not (out / READINGS_FILE).exists()


@pytest.mark.slow
def test_the_simulator_gate_passes_against_the_committed_reference(tmp_path: Path) -> None:
    """tox's gate, unchanged: the run with its second reading compares equal to the reference written
    before readings existed."""
    out = tmp_path / "gate"
    assert main(["run", "--hw", "mi300x", "--algo", "dapo", "--out", str(out), "--no-progress"]) == 0
    assert (out / READINGS_FILE).is_file() and not (REFERENCE / READINGS_FILE).exists()
    assert main(["compare", str(REFERENCE), str(out), "--fail", "total:0"]) == 0
