"""``--logger tensorboard,wandb,mlflow``: the rows the run directory gets, read back from each real
library's own files (each test skips when its library is not installed; tensorboard is in ``dev``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import flags, table_rows

from april_bench.cli import main
from april_bench.results.trackers import Point, scalars

SIM = flags(
    engine="sim",
    steps=3,
    rollout_batch_size=4,
    n_samples_per_prompt=4,
    over_sampling_batch_size=8,
    max_response_len=256,
    no_progress=True,
)


def test_scalars_are_the_rows_numbers_on_each_arms_own_axis() -> None:
    row = {"arm": "april[max_version_span=2]", "step": 4, "repeat": 1, "rollout_time_s": 2.0, "warmup": False}
    row |= {"generated_tokens": 100, "trained_tokens": 60, "train_metrics": {"loss": 0.5}}
    points = {p.key: p for p in scalars("steps", row)}
    axis = "april_max_version_span_2/repeat1"  # MLflow-safe key characters
    assert points[f"{axis}/step/generated_tokens"] == Point(f"{axis}/step/generated_tokens", 100.0, axis, 4)
    assert points[f"{axis}/step/useful_tokens_per_s"].value == 30.0
    assert points[f"{axis}/train/loss"].value == 0.5
    assert not any(k.endswith(("/warmup", "/step/step", "/repeat")) for k in points)
    telemetry = scalars("telemetry", {"t": 1.5, "device": 0, "util_gpu": 80.0}, telemetry_index=7)
    assert {p.key: (p.value, p.step) for p in telemetry} == {
        "telemetry/gpu0/util_gpu": (80.0, 7), "telemetry/gpu0/t": (1.5, 7)
    }  # fmt: skip
    assert scalars("requests", {"arm": "a", "step": 0}) == []  # single requests stay in the run directory


def test_a_missing_or_unknown_tracker_is_one_line_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    out = tmp_path / "run"
    assert main(["run", *SIM, "--logger", "wandb", "--out", str(out)]) == 2
    assert "--logger wandb needs wandb: pip install 'april-bench[wandb]'" in capsys.readouterr().err
    assert not out.exists()
    assert main(["validate", *SIM, "--logger", "TensorBoard"]) == 2
    assert "Did you mean: tensorboard?" in capsys.readouterr().err


def test_tensorboard_gets_every_step_row(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert main(["run", *SIM, "--logger", "tensorboard", "--metadata", "pool=a", "--out", str(out)]) == 0
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    steps = table_rows(out, "steps")
    for arm in ("sync", "april"):
        logged = {e.step: e.value for e in events.Scalars(f"{arm}/step/generated_tokens")}
        assert logged == {r["step"]: float(r["generated_tokens"]) for r in steps if r["arm"] == arm}
    summary = json.loads((out / "summary.json").read_text())["arms"]["april"]
    gain = events.Scalars("summary/april/throughput_gain")
    assert gain[0].value == pytest.approx(summary["throughput_gain"], rel=1e-6)  # float32 in the event file
    assert any(tag.startswith("config") for tag in events.Tags()["tensors"])  # the run's config, as text


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # MLflow's SQLAlchemy calls, not ours
def test_mlflow_gets_every_step_row_offline(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")  # the offline store is a local SQLite database
    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    argv = ["run", *SIM, "--logger", "mlflow", "--logger-offline", "--metadata", "pool=a", "--out", str(out)]
    assert main(argv) == 0
    client = MlflowClient(f"sqlite:///{(out / 'mlflow.db').resolve()}")
    experiment = client.get_experiment_by_name("april-bench")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["metadata.pool"] == "a" and run.data.params["steps"] == "3"
    history = client.get_metric_history(run.info.run_id, "april/step/trained_tokens")
    steps = table_rows(out, "steps")
    assert {m.step: m.value for m in history} == {
        r["step"]: float(r["trained_tokens"]) for r in steps if r["arm"] == "april"
    }
    assert run.info.status == "FINISHED"


def test_wandb_offline_run_holds_the_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert main(["run", *SIM, "--logger", "wandb", "--logger-offline", "--out", str(out)]) == 0
    (record,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    keys = (b"april/step/generated_tokens", b"sync/step/trained_tokens", b"summary/april/throughput_gain")
    for _ in range(600):  # W&B's service process writes the record file after finish() returns
        data = record.read_bytes()
        if all(key in data for key in keys):
            break
        time.sleep(0.1)
    for key in keys:
        assert key in data, key
