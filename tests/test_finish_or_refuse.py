"""Everything interrupted can be finished, or is refused in one line (issue 32, item 5).

``ablate --resume OUT`` finishes every mode from the plan written before the first one ran and writes
the ablation's outputs; ``simcheck --resume`` is refused; a run a newer april-bench wrote is not
resumed by this one; ``whatif --failure-rate`` is bounded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import one_error, sim_flags

from april_bench.cli import main
from april_bench.cli.ablate import PLAN_NAME

SIM = sim_flags(over_sampling_batch_size=None)
GRID = ["--strategies", "sync,april", "--ratios", "1,2", "--spans", "none", "--drivers", "none"]
MODES = ["--off-policy-modes", "as-is,mask"]


def _rows(out: Path) -> list[dict[str, Any]]:
    return list(json.loads((out / "ablation.json").read_text())["rows"])


def test_an_interrupted_ablation_is_finished_by_ablate_resume(tmp_path: Path, capsys, monkeypatch) -> None:
    from april_bench import experiment

    reference = tmp_path / "reference"
    assert main(["ablate", *SIM, *GRID, *MODES, "--out", str(reference)]) == 0

    original = experiment.ArmSession._step
    calls = {"n": 0}

    async def stop(self: Any, s: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # inside the first mode: its later steps and the second mode never ran
            raise KeyboardInterrupt
        await original(self, s)

    out = tmp_path / "ablation"
    monkeypatch.setattr(experiment.ArmSession, "_step", stop)
    capsys.readouterr()
    assert main(["ablate", *SIM, *GRID, *MODES, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"ablate --resume {out}" in err, err
    assert not (out / "ablation.json").exists() and not (out / "mask").exists()
    assert (out / PLAN_NAME).is_file()

    monkeypatch.setattr(experiment.ArmSession, "_step", original)
    assert main(["ablate", "--resume", str(out)]) == 0
    assert _rows(out) == _rows(reference)  # every arm of every mode, as an uninterrupted ablation has them
    assert (out / "ablation.md").read_text() == (reference / "ablation.md").read_text()
    capsys.readouterr()
    assert main(["ablate", "--resume", str(out)]) == 2
    assert "already complete" in one_error(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda plan: plan.update(schema_version=99), "written by a newer april-bench (schema_version 99"),
        (lambda plan: plan.update(kind="x"), "not an april-bench ablation plan"),
        (lambda plan: plan.pop("arms"), "damaged (KeyError"),
        (lambda plan: plan["configs"]["as-is"]["engine_args"].update(api_key="***"), "redacted credentials"),
    ],
)
def test_a_plan_ablate_resume_cannot_trust_is_one_line(
    tmp_path: Path, capsys, change: Any, message: str
) -> None:
    out = tmp_path / "ablation"
    out.mkdir()
    plan = {
        "kind": "april-bench ablation plan",
        "schema_version": 2,
        "arms": [],
        "baseline": "sync",
        "configs": {"as-is": {"engine_args": {}}},
    }
    change(plan)
    (out / PLAN_NAME).write_text(json.dumps(plan))
    capsys.readouterr()
    assert main(["ablate", "--resume", str(out)]) == 2
    assert message in one_error(capsys.readouterr().err)


def test_ablate_resume_refuses_other_flags_and_a_directory_without_a_plan(tmp_path: Path, capsys) -> None:
    assert main(["ablate", "--resume", str(tmp_path), "--steps", "3"]) == 2
    assert "drop --steps" in one_error(capsys.readouterr().err)
    assert main(["ablate", "--resume", str(tmp_path)]) == 2
    assert f"no {PLAN_NAME}" in one_error(capsys.readouterr().err)


def test_simcheck_resume_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    before = sorted(tmp_path.iterdir())
    assert main(["simcheck", "--resume", str(tmp_path)]) == 2
    assert "simcheck cannot resume" in one_error(capsys.readouterr().err)
    assert sorted(tmp_path.iterdir()) == before  # nothing started


@pytest.mark.parametrize("name", ["provenance.json", "config.json", "status.json"])
def test_a_run_a_newer_april_bench_wrote_is_not_resumed(tmp_path: Path, capsys, name: str) -> None:
    out = tmp_path / "run"
    assert main(["run", *sim_flags(steps=1, strategies="sync"), "--out", str(out)]) == 0
    status = json.loads((out / "status.json").read_text())
    status["state"] = "interrupted"
    (out / "status.json").write_text(json.dumps(status))
    data = json.loads((out / name).read_text())
    data["schema_version"] = 99
    (out / name).write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["run", "--resume", str(out)]) == 2
    line = one_error(capsys.readouterr().err)
    assert f"{out / name}: written by a newer april-bench (schema_version 99" in line


@pytest.mark.parametrize("rate", ["1e9", "inf", "nan", "-1"])
def test_whatif_failure_rate_is_bounded(tmp_path: Path, capsys, rate: str) -> None:
    out = tmp_path / "w"
    argv = [
        "whatif",
        "example",
        "--hw",
        "h100",
        "--model",
        "qwen3-4b",
        "--failure-rate",
        rate,
        "--out",
        str(out),
    ]
    assert main(argv) == 2
    assert "failure" in one_error(capsys.readouterr().err)
    assert not out.exists()
