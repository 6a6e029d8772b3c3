"""simcheck and the measured cost curve: on the fake engine (costs known) the prediction is exact."""

from __future__ import annotations

import json

import pytest

from april_bench.config import ConfigError
from april_bench.sim.cost_curve import CostCurve, MeasuredCost
from april_bench.simcheck import engine_forward_passes_per_step, run_simcheck, trace_rows

FAKE_RUN = [
    "--engine",
    "fake",
    "--steps",
    "4",
    "--rollout-batch-size",
    "2",
    "--n-samples-per-prompt",
    "2",
    "--over-sampling-batch-size",
    "4",
    "--max-response-len",
    "64",
    "--workload-arg",
    "drift_per_step=0",
]


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
    assert arm["measured_iterations_per_step"] is None  # the fake engine keeps no iteration counters
    saved = json.loads((out / "simcheck.json").read_text())
    assert saved["arms"][0]["arm"] == "april" and "predicted_gain" in saved["arms"][0]
    assert "| april" in (out / "simcheck.md").read_text()
    assert (out / "trace.jsonl").read_text().strip()


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


def test_forward_passes_per_step_from_engine_counters():
    rows = [
        {
            "arm": "april",
            "phase": "step_end",
            "repeat": 0,
            "metrics": {"decode_steps": 10, "prefill_batches": 2},
        },
        {
            "arm": "april",
            "phase": "step_end",
            "repeat": 0,
            "metrics": {"decode_steps": 30, "prefill_batches": 4},
        },
        {
            "arm": "april",
            "phase": "rollout_end",
            "repeat": 0,
            "metrics": {"decode_steps": 40, "prefill_batches": 4},
        },
        {
            "arm": "april",
            "phase": "step_end",
            "repeat": 1,
            "metrics": {"decode_steps": 26, "prefill_batches": 4},
        },
        {"arm": "sync", "phase": "step_end", "repeat": 0, "metrics": {"decode_steps": 1}},
    ]
    assert engine_forward_passes_per_step(rows, "april", steps=2) == pytest.approx((44 + 30) / 2 / 2)
    assert engine_forward_passes_per_step(rows, "missing", steps=2) is None
    assert engine_forward_passes_per_step([{**rows[0], "metrics": {"running": 1}}], "april", 2) is None


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
