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


#: The fake engine with forced lengths: the prediction replays exactly what the engine will generate.
FORCED_RUN = [*FAKE_RUN, "--length-oracle", "deepscaler[cap=4096]"]


@pytest.fixture(scope="module")
def fake_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("simcheck-fake")
    log = out.parent / f"{out.name}-log.jsonl"
    from april_bench import runner

    sealed: list[dict] = []
    run_into = runner.run_into

    def measuring(*args, **kwargs):  # what simcheck.json held when the measured arms started
        sealed.append(json.loads((out / "simcheck.json").read_text()))
        return run_into(*args, **kwargs)

    runner.run_into = measuring
    try:
        result = run_simcheck(_config(FORCED_RUN), out, validation_log=log)
    finally:
        runner.run_into = run_into
    return out, result, sealed, log


def test_the_fake_engines_cost_curve_is_its_token_time(fake_check):
    out, *_ = fake_check
    curve = CostCurve.load_file(out / "cost_curve.json")
    assert curve.virtual_time and curve.engine == "fake"
    assert curve.decode_base_s == pytest.approx(1.0) and curve.prefill_base_s == pytest.approx(1.0)
    assert curve.decode_per_seq_s == pytest.approx(0.0, abs=1e-9)
    assert curve.decode_per_context_token_s == pytest.approx(0.0, abs=1e-9)
    assert curve.prefill_per_token_s == pytest.approx(0.0, abs=1e-9)
    assert curve.abort_extra_steps == 0


def test_with_forced_lengths_the_fake_engines_counts_are_predicted_exactly(fake_check):
    out, result, _, _ = fake_check
    assert result.verdict == "pass", result.data["why"]
    assert result.data["lengths"]["replayed"]["share"] == 1.0  # the engine generated every draw
    for arm in result.data["arms"]:
        quantities = {c["quantity"]: c for c in arm["checks"]}
        assert set(quantities) >= {
            "iterations_per_step",
            "prefill_tokens_per_step",
            "reprefill_tokens_per_step",
            "aborted_requests_per_step",
            "mean_decode_batch",
            "off_policy_token_ratio",
            "decode_batch_histogram",
            "iteration_throughput_gain",
        }
        for check in arm["checks"]:
            if check["predicted"] is not None or check["quantity"].startswith("iteration_"):
                assert check["ok"] is not False, check
        assert quantities["iterations_per_step"]["error"] == pytest.approx(0.0, abs=1e-12)
    april = result.arm("april")
    assert april["wall_clock"]["pairs"] == 2 and april["wall_clock"]["ci"] is None  # 2 pairs: no interval
    assert april["wall_clock"]["verdict"] == "inconclusive"
    assert "| april" in (out / "simcheck.md").read_text()
    stored = json.loads((out / "measured" / "summary.json").read_text())["arms"]["april"]
    assert april["wall_clock"]["measured_median"] == stored["paired_gains"]["throughput"]["median"]
    saved = json.loads((out / "simcheck.json").read_text())
    assert saved["provenance"]["git"] == json.loads((out / "measured" / "provenance.json").read_text())["git"]


def test_the_prediction_is_sealed_before_the_measured_arms_start(fake_check):
    out, result, sealed, _ = fake_check
    import hashlib

    digest = hashlib.sha256((out / "prediction.json").read_bytes()).hexdigest()
    assert len(sealed) == 1 and sealed[0]["prediction_sha256"] == digest
    assert sealed[0]["state"] == "predicted; measuring" and "verdict" not in sealed[0]
    assert result.data["prediction_sha256"] == digest
    assert result.data["prediction_utc"] <= result.data["finished_utc"]


def test_every_simcheck_run_appends_a_line_to_the_validation_log(fake_check):
    out, result, _, log = fake_check
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 1
    assert lines[0]["prediction_sha256"] == result.data["prediction_sha256"]
    assert lines[0]["verdict"] == "pass" and lines[0]["out"] == str(out)
    assert lines[0]["iterations_error"]["april"] == pytest.approx(0.0, abs=1e-12)


def test_without_forced_lengths_the_schedule_is_not_checkable(tmp_path):
    result = run_simcheck(_config(FAKE_RUN), tmp_path / "free", trace_seed=0, trace_steps=4)
    assert result.verdict == "not checkable" and "--length-oracle" in result.data["why"]
    assert (tmp_path / "free" / "trace.jsonl").read_text().strip()  # the held-out length trace


def test_an_error_past_the_tolerance_fails_and_a_shared_quantity_is_absolute():
    from april_bench.simcheck import check_arm

    predicted = {
        "iterations_per_step": 105.0,
        "prefill_tokens_per_step": 10.0,
        "off_policy_token_ratio": 0.52,
        "decode_batch_histogram": {"4": 10},
    }
    measured = {
        "iterations_per_step": 100.0,
        "prefill_tokens_per_step": 10.0,
        "off_policy_token_ratio": 0.50,
        "decode_batch_histogram": {"4": 9, "9": 1},
    }
    checks = {c["quantity"]: c for c in check_arm(predicted, measured, 0.03)}
    assert checks["iterations_per_step"]["ok"] is False  # +5% > 3%
    assert checks["prefill_tokens_per_step"]["ok"] is True
    assert checks["off_policy_token_ratio"]["error"] == pytest.approx(0.02)  # points, not a ratio
    assert checks["decode_batch_histogram"]["error"] == pytest.approx(0.1)  # a tenth of the steps moved
    assert checks["reprefill_tokens_per_step"]["ok"] is None  # not measured: neither pass nor fail


def test_the_wall_clock_check_never_calls_two_pairs_an_interval():
    from april_bench.simcheck import wall_clock_verdict

    two = wall_clock_verdict({"median": 0.2, "ci": [0.1, 0.3], "pairs": 2}, 0.2)
    assert two["ci"] is None and two["verdict"] == "inconclusive"
    wide = wall_clock_verdict({"median": 0.2, "ci": [0.0, 0.5], "pairs": 12}, 0.2)
    assert wide["verdict"] == "inconclusive" and "wider than +-10" in wide["why"]
    assert wall_clock_verdict({"median": 0.2, "ci": [0.15, 0.25], "pairs": 12}, 0.22)["verdict"] == "inside"
    assert wall_clock_verdict({"median": 0.2, "ci": [0.15, 0.25], "pairs": 12}, 0.4)["verdict"] == "outside"


def test_the_validation_log_never_makes_the_checkout_dirty(tmp_path):
    import subprocess

    from april_bench.results.provenance import SIMCHECK_LOG, git_info

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    log = tmp_path / SIMCHECK_LOG
    log.parent.mkdir(parents=True)
    log.write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init")
    with log.open("a") as f:
        f.write("{}\n")
    assert git_info(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_info(tmp_path)["dirty"] is True


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
    result = run_simcheck(_config(FORCED_RUN), out)
    assert result.data["arms"] and (out / "measured" / "summary.json").exists()
    assert checked and Path(checked[0]).resolve() == out.resolve()
    with pytest.raises(ConfigError, match="commit them first"):
        monkeypatch.setattr(provenance, "git_info", lambda path=None, **kw: {"commit": "abc", "dirty": True})
        run_simcheck(_config(FAKE_RUN), tmp_path / "results" / "validation" / "other")


def test_a_dirty_reference_simcheck_is_refused_before_its_directory_is_claimed(tmp_path, monkeypatch, capsys):
    from april_bench.cli import main
    from april_bench.results import provenance

    monkeypatch.setattr(provenance, "source_root", lambda: tmp_path)
    monkeypatch.setattr(provenance, "git_info", lambda path=None, **kw: {"commit": "abc", "dirty": True})
    out = tmp_path / "results" / "validation" / "simcheck-x"
    assert main(["simcheck", *FORCED_RUN, "--no-progress", "--out", str(out)]) == 2
    assert "commit them first" in capsys.readouterr().err
    assert not out.exists()  # nothing claimed, nothing left behind
