"""``--config FILE.toml|yaml``: the same typed configs and errors as flags; a run's config.yaml
repeats it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import flags

from april_bench.cli import build_parser, main
from april_bench.cli.args import config_from_args
from april_bench.experiment_config import load_config

SIM = flags(engine="sim", steps=2, no_progress=True)


def _config(argv: list[str]):  # type: ignore[no-untyped-def]
    return config_from_args(build_parser().parse_args(["run", *argv]))


def test_a_runs_config_yaml_repeats_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [*SIM, "--strategies", "sync,april[max_version_span=2]", "--rollout-arg", "temperature=0.7"]
    assert main(["run", *argv, "--out", str(out)]) == 0
    assert (out / "config.yaml").read_text().startswith("# april-bench run configuration")
    written = load_config(json.loads((out / "config.json").read_text()))
    assert _config(["--config", str(out / "config.yaml")]) == written
    again = tmp_path / "again"
    assert main(["run", "--config", str(out / "config.yaml"), "--no-progress", "--out", str(again)]) == 0
    assert json.loads((again / "config.json").read_text()) == json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_a_partial_file_fills_in_from_the_recipe_and_flags_apply_on_top(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"exp{suffix}"
    if suffix == ".toml":
        path.write_text(
            'hardware = "h100"\nalgorithm = "dapo"\nsteps = 7\n\n[rollout]\nrollout_batch_size = 4\n'
        )
    else:
        path.write_text("hardware: h100\nalgorithm: dapo\nsteps: 7\nrollout:\n  rollout_batch_size: 4\n")
    config = _config(["--config", str(path), "--seed", "3"])
    assert (config.hardware, config.algorithm, config.steps, config.seed) == ("h100", "dapo", 7, 3)
    assert config.rollout.rollout_batch_size == 4
    assert config.rollout.max_response_len == 16384  # the paper recipe's, as for unset flags
    assert config.model == "qwen3-4b"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stepz = 3\n", "field stepz; known:"),
        ('steps = "many"\n', "field steps='many': expected"),
        ("[rollout]\ntop_k = 3\n", "rollout field top_k"),
        ("steps = \n", "not valid TOML"),
        ("steps = 0\n", "--steps must be >= 1"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_field(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_config_conflicts_and_missing_files_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cpu.yaml"
    path.write_text("hardware: cpu\n")
    assert main(["validate", "--config", str(path), "--hw", "h100"]) == 2
    assert "disagree" in capsys.readouterr().err
    assert main(["validate", "--config", str(tmp_path / "absent.toml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["validate", "--config", str(tmp_path / "x.ini")]) == 2
    assert "expected a .toml, .yaml or .json file" in capsys.readouterr().err
