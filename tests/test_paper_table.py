"""The committed simulated paper table: within tolerance of the paper, and reproduced exactly.

``results/benchmarks/paper_table.json`` is written by ``benchmarks/paper_table.py``; the simulator
is deterministic, so re-simulating a cell must give the committed numbers exactly.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict
from pathlib import Path
from types import ModuleType

import pytest

from april_bench.recipes import paper_experiment
from april_bench.sim.paper_settings import HARDWARE, PAPER_SETTINGS, STEPS, TOLERANCE, paper_setting

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "results" / "benchmarks" / "paper_table.json"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("paper_table", ROOT / "benchmarks" / "paper_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def committed():
    return json.loads(TABLE.read_text())


def test_table_is_labelled_simulated_and_covers_every_setting_and_gpu(committed):
    assert committed["result_kind"] == "simulated"
    cells = {(r["setting"], r["hardware"]) for r in committed["table"]}
    assert cells == {(s.key, hw) for s in PAPER_SETTINGS for hw in HARDWARE}


def test_committed_table_was_made_with_the_committed_settings(committed):
    for saved, setting in zip(committed["settings"], PAPER_SETTINGS, strict=True):
        current = {k: v for k, v in asdict(setting).items() if k != "sources"}
        assert {k: saved[k] for k in current} == current, setting.key


@pytest.mark.parametrize("hardware", HARDWARE)
@pytest.mark.parametrize("key", [s.key for s in PAPER_SETTINGS])
def test_every_headline_gain_is_within_tolerance_of_the_paper(committed, key, hardware):
    row = next(r for r in committed["table"] if r["setting"] == key and r["hardware"] == hardware)
    assert abs(row["headline_gain"] - row["paper_gain"]) <= TOLERANCE, row
    assert row["difference"] == pytest.approx(row["headline_gain"] - row["paper_gain"])


def test_a_cell_re_simulates_to_the_committed_numbers(committed):
    key, hardware = "deepmath", "mi300x"
    row = next(r for r in committed["table"] if r["setting"] == key and r["hardware"] == hardware)
    assert _benchmark().simulate_setting(paper_setting(key), hardware, steps=committed["steps"]) == row
    assert committed["steps"] == STEPS


def test_paper_recipes_build_the_calibrated_settings():
    from april_bench.config import ConfigError
    from april_bench.recipes import PAPER_RECIPES, recipe_for

    for name, key in PAPER_RECIPES.items():
        config = recipe_for("h100", name, steps=4)
        expected = paper_experiment(paper_setting(key), "h100", steps=4)
        assert config == expected, name
    with pytest.raises(ConfigError, match="--hw h100 or --hw mi300x"):
        recipe_for("cpu", "paper-deepmath")


def test_cli_recipe_flag_starts_from_the_paper_row_and_applies_flags_on_top():
    import subprocess
    import sys

    from april_bench.cli import build_parser
    from april_bench.cli.args import config_from_args

    args = build_parser().parse_args(["run", "--hw", "mi300x", "--recipe", "paper-deepmath", "--steps", "2"])
    config = config_from_args(args)
    assert config == paper_experiment(paper_setting("deepmath"), "mi300x", steps=2)
    proc = subprocess.run(
        [sys.executable, "-m", "april_bench", "run", "--recipe", "paper-deepmath", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --recipe paper-deepmath simulates 8 GPUs")
    assert "Traceback" not in proc.stderr


def test_fit_setting_bisects_the_length_level_to_the_paper_gain(monkeypatch):
    bench = _benchmark()
    setting = paper_setting("deepscaler")

    def fake(trial, hardware, *, steps):  # a gain that falls with the length level, as simulated
        return {
            "headline_gain": 0.6 - 0.04 * (trial.response_median / 1000) + (0.01 if hardware == "h100" else 0)
        }

    monkeypatch.setattr(bench, "simulate_setting", fake)
    fitted, err = bench.fit_setting(setting, iters=20)
    # mean gain 0.605 - 0.04 m = 0.21  ->  m = 9,875 tokens
    assert fitted.response_median == pytest.approx(9875, rel=0.01)
    assert err < 0.002
