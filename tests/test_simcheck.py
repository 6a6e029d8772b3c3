"""simcheck and the measured cost curve: on the fake engine (costs known) the prediction is exact."""

from __future__ import annotations

import json

import pytest
from helpers import flags

from april_bench.config import ConfigError
from april_bench.engines.sim.cost_curve import CostCurve, MeasuredCost
from april_bench.simcheck import measured_iterations_per_step, run_simcheck, trace_rows

FAKE_RUN = flags(
    engine="fake",
    steps=4,
    rollout_batch_size=2,
    n_samples_per_prompt=2,
    over_sampling_batch_size=4,
    max_response_len=64,
    workload_arg="drift_per_step=0",
    block_steps=2,  # paired over blocks: simcheck must use the run's own statistic
)


def _config(argv: list[str]):
    from april_bench.cli import build_parser
    from april_bench.cli.args import config_from_args

    return config_from_args(build_parser().parse_args(["run", *argv]))


@pytest.fixture(scope="module")
def fake_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("simcheck-fake")
    # The trace replays the measured arms' own lengths (same seed, every prompt covered, no drift): what
    # is left to predict is the engine, whose costs the cost curve must capture exactly.
    return out, run_simcheck(_config(FAKE_RUN), out, trace_seed=0, trace_steps=12)


def test_the_fake_engines_cost_curve_is_its_token_time(fake_check):
    out, _ = fake_check
    curve = CostCurve.load_file(out / "cost_curve.json")
    assert curve.virtual_time and curve.engine == "fake"
    assert curve.decode_base_s == pytest.approx(1.0) and curve.prefill_base_s == pytest.approx(1.0)
    assert curve.decode_per_seq_s == pytest.approx(0.0, abs=1e-9)
    assert curve.decode_per_context_token_s == pytest.approx(0.0, abs=1e-9)
    assert curve.prefill_per_token_s == pytest.approx(0.0, abs=1e-9)
    assert curve.abort_extra_steps == 0


def test_prediction_on_the_fake_engine_is_exact(fake_check):
    out, result = fake_check
    arm = result.arm("april")
    assert arm["predicted_gain"] == pytest.approx(arm["measured_gain"], rel=1e-9)
    assert arm["predicted_ratio_gain"] == pytest.approx(arm["measured_ratio_gain"], rel=1e-9)
    assert arm["predicted_inside_ci"] is True
    assert arm["predicted_iterations_per_step"] > 0
    # the fake engine counts its work exactly (docs/measured.md), and so does the simulator: equal
    predicted = arm["predicted_iterations_per_step"]
    assert arm["measured_iterations_per_step"] == pytest.approx(predicted, rel=1e-12)
    assert arm["baseline_measured_iterations_per_step"] == pytest.approx(
        arm["baseline_predicted_iterations_per_step"], rel=1e-12
    )
    assert arm["measured_iterations_deterministic"] is True
    assert arm["iterations_error"] == pytest.approx(0.0, abs=1e-12)
    saved = json.loads((out / "simcheck.json").read_text())
    assert saved["arms"][0]["arm"] == "april" and "predicted_gain" in saved["arms"][0]
    assert "| april" in (out / "simcheck.md").read_text()
    assert (out / "trace.jsonl").read_text().strip()
    # the measured arms are an ordinary run directory, with the trace whatif replays, and its provenance
    assert (out / "measured" / "trace.jsonl").read_text().strip()
    stored = json.loads((out / "measured" / "summary.json").read_text())["arms"]["april"]
    assert arm["measured_gain"] == stored["paired_gains"]["throughput"]["median"]  # the run's own statistic
    assert saved["provenance"]["git"] == json.loads((out / "measured" / "provenance.json").read_text())["git"]


def test_cost_curve_json_round_trips_and_refuses_foreign_files(tmp_path):
    curve = CostCurve(
        engine="hf",
        model="tiny",
        hardware="cpu",
        prefill_base_s=0.01,
        prefill_per_token_s=1e-5,
        decode_base_s=0.004,
        decode_per_seq_s=1e-4,
        decode_per_context_token_s=1e-7,
        max_running=8,
        kv_capacity_tokens=8192,
        chunk_tokens=512,
        prefill_points=((8, 0.0101),),
        decode_points=({"batch": 1, "context": 8, "step_s": 0.0041},),
    )
    path = tmp_path / "curve.json"
    curve.save(path)
    assert CostCurve.load_file(path) == curve
    path.write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(ConfigError, match="not an april-bench cost curve"):
        CostCurve.load_file(path)
    with pytest.raises(ConfigError, match="does not exist"):
        CostCurve.load_file(tmp_path / "missing.json")


def test_measured_cost_prices_a_decode_run_as_the_sum_of_its_steps():
    curve = CostCurve(
        engine="x",
        model="tiny",
        hardware="cpu",
        prefill_base_s=0.5,
        prefill_per_token_s=0.01,
        decode_base_s=0.002,
        decode_per_seq_s=0.0003,
        decode_per_context_token_s=1e-6,
    )
    cost = MeasuredCost(curve)
    batch, context, k = 5, 400.0, 37
    stepwise = sum(cost.decode_iteration_time(batch, context + batch * i) for i in range(k))
    assert cost.decode_run_time(batch, context, k) == pytest.approx(stepwise, rel=1e-12)
    assert cost.iterations_within(batch, context, k, cost.decode_run_time(batch, context, 10)) == 10
    assert cost.prefill_time([(0, 10), (5, 20)]) == pytest.approx(0.5 + 0.3)


def test_measured_iterations_per_step_from_step_rows():
    rows = [
        {"arm": "april", "repeat": 0, "engine_iterations": 10, "work_deterministic": True},
        {"arm": "april", "repeat": 0, "engine_iterations": 30, "work_deterministic": True},
        {"arm": "april", "repeat": 1, "engine_iterations": 26, "work_deterministic": True},
        {"arm": "april", "repeat": 1, "engine_iterations": 14, "work_deterministic": True},
        {"arm": "sync", "repeat": 0, "engine_iterations": 1, "work_deterministic": False},
        {"arm": "sim", "repeat": 0, "engine_iterations": None, "work_deterministic": None},
    ]
    april = measured_iterations_per_step(rows, "april")
    assert april.per_step == pytest.approx((10 + 30 + 26 + 14) / 4) and april.deterministic is True
    assert measured_iterations_per_step(rows, "sync").deterministic is False  # vLLM: not deterministic
    assert measured_iterations_per_step(rows, "sim").per_step is None  # the engine does not count
    assert measured_iterations_per_step(rows, "missing").per_step is None


def test_render_says_when_iterations_are_not_deterministic():
    from april_bench.simcheck import _iterations

    assert _iterations(12.0, False) == "12.0 (not deterministic)"
    assert _iterations(12.0, True) == "12.0"
    assert _iterations(None, None).startswith("n/a")


def test_trace_rows_keep_trained_samples_only():
    samples = [
        {"group_uid": 3, "sample_index": 1, "response_len": 9, "reward": 1.0, "fate": "trained"},
        {"group_uid": 3, "sample_index": 0, "response_len": 4, "reward": 0.0, "fate": "trained"},
        {"group_uid": 4, "sample_index": 0, "response_len": 5, "reward": 0.0, "fate": "dropped"},
    ]
    assert [r["length"] for r in trace_rows(samples)] == [4, 9]


def test_simcheck_refuses_the_simulator_with_one_line(tmp_path, capsys):
    from april_bench.cli import main

    code = main(
        ["simcheck", "--engine", "sim", "--steps", "1", "--no-progress", "--out", str(tmp_path / "x")]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: simcheck compares the simulator with a real engine")


def test_simcheck_under_results_checks_the_tree_once_for_its_whole_directory(tmp_path, monkeypatch):
    """The measured run inside a reference simcheck must not count simcheck's own first outputs
    (cost curve, trace) as uncommitted changes: the tree is checked once, for all of ``out``."""
    from pathlib import Path

    from april_bench.results import provenance

    out = tmp_path / "results" / "validation" / "simcheck-fake"
    checked: list[Path | None] = []

    def git_info(path=None, *, exclude=None):
        checked.append(exclude)
        # dirty unless the whole simcheck directory is left out of the check
        return {"commit": "abc", "dirty": exclude is None or Path(exclude).resolve() != out.resolve()}

    monkeypatch.setattr(provenance, "source_root", lambda: tmp_path)
    monkeypatch.setattr(provenance, "git_info", git_info)
    result = run_simcheck(_config(FAKE_RUN), out, trace_seed=0, trace_steps=2)
    assert result.data["arms"] and (out / "measured" / "summary.json").exists()
    assert checked and Path(checked[0]).resolve() == out.resolve()
    with pytest.raises(ConfigError, match="commit them first"):
        monkeypatch.setattr(provenance, "git_info", lambda path=None, **kw: {"commit": "abc", "dirty": True})
        run_simcheck(_config(FAKE_RUN), tmp_path / "results" / "validation" / "other")
