"""The committed simulated paper table: a prediction (nothing fitted), reproduced exactly.

``results/benchmarks/paper_table.json`` is written by ``benchmarks/paper_table.py``; the simulator
is deterministic, so re-simulating a cell must give the committed numbers exactly.  The table is not
required to agree with the paper: its misses are reported, not tuned away.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import asdict
from pathlib import Path
from types import ModuleType

import pytest

from april_bench.recipes import paper_experiment
from april_bench.sim.length_evidence import LENGTH_FIELDS, MODEL_LENGTHS
from april_bench.sim.paper_settings import HARDWARE, PAPER_SETTINGS, STEPS, paper_setting

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "results" / "benchmarks" / "paper_table.json"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("paper_table", ROOT / "benchmarks" / "paper_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its cells pickle by module name when they run in processes
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
        current = json.loads(json.dumps({k: v for k, v in asdict(setting).items() if k != "sources"}))
        assert {k: saved[k] for k in current} == current, setting.key


def test_committed_table_was_made_with_the_committed_length_profiles(committed):
    from april_bench.sim.length_evidence import LENGTH_PROFILES

    saved = {(p["dataset"], p["model"]): p for p in committed["length_profiles"]}
    assert set(saved) == set(LENGTH_PROFILES)
    for key, profile in LENGTH_PROFILES.items():
        assert saved[key]["params"] == dict(profile.params) and saved[key]["status"] == profile.status, key
        assert saved[key]["open_range"] == {k: list(v) for k, v in profile.open_range.items()}, key


def test_the_dapo_row_is_shown_under_both_readings(committed):
    readings = {(r["setting"], r["algorithm"], r["reading"], r["hardware"]) for r in committed["table"]}
    for hw in HARDWARE:
        assert ("dapo-math", "dapo", "as named", hw) in readings
        assert ("dapo-math", "grpo", "other reading", hw) in readings
    assert all(r["reading"] == "as named" for r in committed["table"] if r["setting"] != "dapo-math")
    text = (TABLE.parent / "paper_table.md").read_text()
    assert "dapo-math-17k / GRPO (other reading)" in text and "may name the data set" in text


def test_every_simulated_row_carries_its_gain_decomposition(committed):
    cells = committed["table"] + committed["open_ranges"] + committed["mechanisms"]
    cells += [c for c in committed["agent_row"]]
    for r in cells:
        d = r["decomposition"]
        assert d["throughput_gain"] == pytest.approx(r["headline_gain"], abs=1e-12)
        assert d["tail"] + d["fill"] + d["concurrency"] == pytest.approx(r["headline_gain"], abs=1e-9)
        assert d["useful_gain"] == pytest.approx(r["useful_gain"], rel=1e-9, abs=1e-12)
    assert "## Where each row's gain comes from" in (TABLE.parent / "paper_table.md").read_text()


def test_each_open_profile_is_shown_at_both_ends_of_its_range(committed):
    from april_bench.sim.length_evidence import length_profile

    for r in committed["table"]:
        if r["hardware"] != "mi300x":
            continue
        profile = length_profile(paper_setting(r["setting"]).model, r["dataset"])
        assert profile is not None and profile.status == "open"
        ends = {
            o["end"]: o["workload_args"]
            for o in committed["open_ranges"]
            if (o["setting"], o["algorithm"]) == (r["setting"], r["algorithm"])
        }
        assert ends == dict(profile.range_ends()), (r["setting"], r["algorithm"])


def test_cells_can_run_in_processes_in_their_order():
    bench = _benchmark()
    jobs = [(dict, (), {"cell": i}) for i in range(5)]
    assert bench._map(jobs, 2) == bench._map(jobs, 1) == [{"cell": i} for i in range(5)]


def test_an_equal_cell_is_simulated_once_and_every_cell_read_back_in_its_place():
    bench = _benchmark()
    calls: list[int] = []

    def cell(i: int) -> dict[str, int]:
        calls.append(i)
        return {"cell": i}

    out = bench._map([(cell, (i % 2,), {}) for i in range(4)], 1)
    assert out == [{"cell": 0}, {"cell": 1}, {"cell": 0}, {"cell": 1}] and calls == [0, 1]
    assert out[2] is not out[0]  # a copy: a section that edits its rows leaves the other's alone
    jobs = [(dict, (), {"cell": i % 3}) for i in range(7)]
    assert bench._map(jobs, 2) == [{"cell": i % 3} for i in range(7)]


@pytest.mark.parametrize("hardware", HARDWARE)
@pytest.mark.parametrize("key", [s.key for s in PAPER_SETTINGS])
def test_every_cell_reports_the_paper_figure_and_its_error_with_nothing_fitted(committed, key, hardware):
    row = next(r for r in committed["table"] if r["setting"] == key and r["hardware"] == hardware)
    assert row["paper_gain"] == paper_setting(key).paper_gain
    assert row["difference"] == pytest.approx(row["headline_gain"] - row["paper_gain"])
    assert row["fitted"].startswith("nothing")
    assert committed["fitted_to_paper"] == []


def test_the_table_was_made_with_the_shared_length_model(committed):
    evidence = MODEL_LENGTHS["qwen3-4b"].workload_args()
    assert {k: committed["length_model"][k] for k in LENGTH_FIELDS} == evidence


def test_observables_carry_their_tolerances_and_verdicts(committed):
    seen = {o["observable"] for o in committed["observables"]}
    assert any("off-policy" in o for o in seen) and any("rollout share" in o for o in seen)
    assert any("rejected" in o for o in seen) and any("relaunched" in o for o in seen)
    for o in committed["observables"]:
        low, high = o["tolerance"]
        high = float(high)
        assert o["within"] == (low <= o["simulated"] <= high), o


def test_a_cell_re_simulates_to_the_committed_numbers(committed):
    key, hardware = "deepmath", "mi300x"
    row = next(r for r in committed["table"] if r["setting"] == key and r["hardware"] == hardware)
    assert _benchmark().simulate_setting(paper_setting(key), hardware, steps=committed["steps"]) == row
    assert committed["steps"] == STEPS


def test_paper_recipes_are_the_headline_command_with_the_rows_algorithm_and_data_set():
    from april_bench.config import ConfigError
    from april_bench.recipes import PAPER_RECIPES, recipe_for

    for name, key in PAPER_RECIPES.items():
        setting = paper_setting(key)
        config = recipe_for("h100", name, steps=4)
        assert config == paper_experiment(setting, "h100", steps=4), name
        assert (config.algorithm, config.dataset) == (setting.algorithm, setting.dataset)
        # no per-row parameter of any kind: the same as `run --hw h100 --algo A --dataset D`
        assert config == recipe_for("h100", algorithm=setting.algorithm, dataset=setting.dataset).replace(
            engine="sim", trainer="sim", steps=4
        )
    with pytest.raises(ConfigError, match="--hw h100 or --hw mi300x"):
        recipe_for("cpu", "paper-deepmath")


def test_no_recipe_overrides_the_length_model_per_row():
    from april_bench.recipes import PAPER_RECIPES, recipe_for

    configs = [recipe_for(hw, name) for name in PAPER_RECIPES for hw in HARDWARE]
    configs += [recipe_for(hw) for hw in HARDWARE]
    for config in configs:
        overridden = set(config.workload_args) & set(LENGTH_FIELDS)
        assert not overridden, f"{config.algorithm}/{config.dataset} overrides {sorted(overridden)}"


def test_the_dapo_row_is_dapo_and_the_headline_command_runs_it():
    from april_bench.cli import build_parser
    from april_bench.cli.args import config_from_args

    assert paper_setting("dapo-math").algorithm == "dapo"
    config = config_from_args(build_parser().parse_args(["run", "--hw", "mi300x", "--algo", "dapo"]))
    assert (config.algorithm, config.dataset, config.model) == ("dapo", "dapo-math-17k", "qwen3-4b")
    assert config.dynamic_sampling_on
    from april_bench.sim.paper_settings import paper_reference

    assert paper_reference(config.to_dict()) == paper_setting("dapo-math")
    assert paper_reference(config.replace(workload_args={"response_median": 100.0}).to_dict()) is None


def test_cli_recipe_flag_starts_from_the_paper_row_and_applies_flags_on_top():
    import subprocess
    import sys

    from april_bench.cli import build_parser
    from april_bench.cli.args import config_from_args

    args = build_parser().parse_args(["run", "--hw", "mi300x", "--recipe", "paper-deepmath", "--steps", "2"])
    config = config_from_args(args)
    assert config == paper_experiment(paper_setting("deepmath"), "mi300x", steps=2)
    # without --hw a paper row runs on the paper's MI300X node; --hw cpu is refused in one line
    alone = build_parser().parse_args(["run", "--recipe", "paper-deepmath", "--steps", "2"])
    assert config_from_args(alone) == config
    proc = subprocess.run(
        [sys.executable, "-m", "april_bench", "run", "--hw", "cpu", "--recipe", "paper-deepmath"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --recipe paper-deepmath simulates 8 GPUs")
    assert "Traceback" not in proc.stderr


def test_headline_command_prints_the_paper_figure_and_no_one_pair_interval(tmp_path, capsys):
    from april_bench.cli import main

    out = tmp_path / "head"
    assert main(["run", "--hw", "mi300x", "--algo", "dapo", "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    table = text.split("###")[0]
    assert "| DAPO " in table and "Paper (APRIL README)" in table and "+17%" in table
    assert "(1 pair)" not in text and "Paired median" not in table
    assert "docs/calibration.md" in table  # the one line saying what the simulator assumes
    april = next(line for line in table.splitlines() if "| april " in line)
    cells = [c.strip() for c in april.split("|")]
    gain = float(cells[cells.index("+17%") - 1].rstrip("%")) / 100
    diff = float(cells[cells.index("+17%") + 1].removesuffix(" pt")) / 100
    assert diff == pytest.approx(gain - 0.17, abs=0.0011)


def test_the_agent_row_covers_every_open_value_on_every_gpu_with_its_error(committed):
    # APRIL's fourth row names no task, tool or latency: every (calls, latency) pair the sources leave
    # open is a cell, none chosen, each beside the paper's +23% with its error (docs/calibration.md)
    from april_bench.sim.paper_settings import AGENT_ROW

    saved = committed["agent_setting"]
    assert {k: saved[k] for k in ("model", "dataset", "algorithm", "paper_gain")} == {
        "model": AGENT_ROW.model, "dataset": AGENT_ROW.dataset, "algorithm": AGENT_ROW.algorithm,
        "paper_gain": AGENT_ROW.paper_gain,
    }  # fmt: skip
    cells = {(c["hardware"], c["calls"], c["latency_s"]) for c in committed["agent_row"]}
    grid = {(hw, calls, lat) for hw in HARDWARE for calls in AGENT_ROW.calls for lat in AGENT_ROW.latency_s}
    assert cells == grid | {(hw, None, None) for hw in HARDWARE}  # and each GPU's no-tool reference
    for c in committed["agent_row"]:
        assert c["paper_gain"] == 0.23
        assert c["difference"] == pytest.approx(c["headline_gain"] - 0.23)
        if c["calls"] is not None:
            assert c["sync_turns_per_episode"] > 1


@pytest.mark.slow  # one agent cell is about 15 s; a setting cell re-simulates in the fast tier
def test_an_agent_cell_re_simulates_to_the_committed_numbers(committed):
    cell = next(
        c for c in committed["agent_row"] if (c["hardware"], c["calls"], c["latency_s"]) == ("h100", 1.0, 0.1)
    )
    assert _benchmark().simulate_agent("h100", 1.0, 0.1, steps=committed["steps"]) == cell
