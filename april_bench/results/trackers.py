"""Experiment trackers (``--logger tensorboard,wandb,mlflow``): the run directory's rows, as they are
recorded, also sent to TensorBoard, Weights & Biases or MLflow.

A tracker is a row sink beside the run directory's: it gets exactly the rows ``steps.jsonl``,
``evals.jsonl``, ``telemetry.jsonl`` and ``engine_metrics.jsonl`` get, turned into scalars by one
pure function (:func:`scalars`), then the run's configuration (with ``--metadata``) at the start and
its per-arm summary at the end.  Keys are ``ARM/step/FIELD``, ``ARM/train/METRIC``,
``ARM/eval/...``, ``ARM/engine/PHASE/COUNTER`` (``ARM/repeatR/...`` for repeats after the first),
each arm on its own step axis (arms are interleaved), and ``telemetry/gpuD/FIELD`` on the run clock.

Offline modes: TensorBoard always writes ``RUN/tensorboard/``; W&B runs offline into ``RUN/wandb/``
with ``--logger-offline`` (or ``WANDB_MODE=offline``; ``wandb sync`` uploads it later); MLflow logs to
``MLFLOW_TRACKING_URI`` when set and otherwise (or with ``--logger-offline``) to ``RUN/mlflow.db``.
The libraries are optional extras (``pip install 'april-bench[tensorboard]'``, ``[wandb]``,
``[mlflow]``); a missing one is one line naming the install, before the run starts.  A tracker that
fails mid-run is closed with a note: the run directory, the record of truth, goes on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from april_bench.config import ConfigError

__all__ = ["TRACKERS", "Point", "TrackerSet", "check_trackers", "open_trackers", "scalars"]


@dataclass(frozen=True, slots=True)
class Point:
    """One scalar: ``key`` on the step axis ``axis`` (``ARM`` or ``telemetry/gpuD``) at ``step``."""

    key: str
    value: float
    axis: str
    step: int


#: Step-row fields that are identity, not measurements.
_STEP_IDENTITY = {"arm", "step", "repeat", "warmup", "t_start", "policy_version"}
_KEY_CHARS = re.compile(r"[^A-Za-z0-9_./ -]+")  # what MLflow accepts in a key (W&B and TB accept more)


def _axis(row: Mapping[str, Any]) -> str:
    arm = _KEY_CHARS.sub("_", str(row.get("arm", ""))).strip("_") or "arm"
    repeat = int(row.get("repeat") or 0)
    return f"{arm}/repeat{repeat}" if repeat else arm


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def scalars(table: str, row: Mapping[str, Any], *, telemetry_index: int = 0) -> list[Point]:
    """The scalars a tracker logs for one row of ``table`` (none for tables of single requests,
    samples and events: those stay in the run directory)."""
    points: list[Point] = []
    if table == "steps":
        axis, step = _axis(row), int(row["step"])
        for field, value in row.items():
            number = _number(value)
            if field not in _STEP_IDENTITY and number is not None:
                points.append(Point(f"{axis}/step/{field}", number, axis, step))
        rollout = _number(row.get("rollout_time_s")) or 0.0
        if rollout > 0:
            for name, field in (
                ("generated_tokens_per_s", "generated_tokens"),
                ("useful_tokens_per_s", "trained_tokens"),
            ):
                value = _number(row.get(field))
                if value is not None:
                    points.append(Point(f"{axis}/step/{name}", value / rollout, axis, step))
        for name, value in (row.get("train_metrics") or {}).items():
            number = _number(value)
            if number is not None:
                points.append(Point(f"{axis}/train/{_KEY_CHARS.sub('_', name)}", number, axis, step))
    elif table == "evals":
        axis, step = _axis(row), int(row["step"])
        for field in ("accuracy", "accuracy_stderr", "mean_response_len", "eval_time_s", "train_time_s"):
            number = _number(row.get(field))
            if number is not None:
                points.append(Point(f"{axis}/eval/{field}", number, axis, step))
        for name, stats in (row.get("by_dataset") or {}).items():
            number = _number((stats or {}).get("accuracy"))
            if number is not None:
                points.append(Point(f"{axis}/eval/{_KEY_CHARS.sub('_', name)}/accuracy", number, axis, step))
    elif table == "engine_metrics":
        axis, step = _axis(row), int(row["step"])
        phase = _KEY_CHARS.sub("_", str(row.get("phase", "")))
        for name, value in (row.get("metrics") or {}).items():
            number = _number(value)
            if number is not None:
                points.append(Point(f"{axis}/engine/{phase}/{_KEY_CHARS.sub('_', name)}", number, axis, step))
    elif table == "telemetry":
        axis = f"telemetry/gpu{int(row['device'])}"
        for field in _TELEMETRY_FIELDS:
            number = _number(row.get(field))
            if number is not None:
                points.append(Point(f"{axis}/{field}", number, axis, telemetry_index))
    return points


#: Telemetry fields sent to trackers (GPM's only where the GPU has them: ``None`` is skipped).
_TELEMETRY_FIELDS = (
    "util_gpu",
    "util_mem",
    "sm_clock_mhz",
    "mem_used_bytes",
    "power_w",
    "energy_j",
    "sm_active_pct",
    "sm_occupancy_pct",
    "dram_bw_pct",
    "t",
)


def _summary_scalars(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    out = {}
    for arm, metrics in summary.items():
        name = _KEY_CHARS.sub("_", arm)
        for field, value in metrics.items():
            number = _number(value)
            if number is not None:
                out[f"summary/{name}/{field}"] = number
    return out


def _flat(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), inner, out)
    else:
        out[prefix] = str(value)[:500]  # MLflow caps parameter values


Row = Mapping[str, Any]


class Tracker(Protocol):
    """One tracking backend."""

    def log(self, points: Sequence[Point]) -> None: ...

    def finish(self, summary: Mapping[str, Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TrackerOptions:
    """Where and how the trackers log."""

    out: Path
    run_name: str
    project: str = "april-bench"
    offline: bool = False


class TensorBoardTracker:
    """``torch.utils.tensorboard`` event files in ``RUN/tensorboard/`` (needs the ``tensorboard`` package)."""

    def __init__(
        self, options: TrackerOptions, config: Mapping[str, Any], provenance: Mapping[str, Any]
    ) -> None:
        import json

        from torch.utils.tensorboard import SummaryWriter

        from april_bench.fsio import record

        self.dir = options.out / "tensorboard"
        record(self.dir)
        self._writer = SummaryWriter(log_dir=str(self.dir))
        self._writer.add_text("config", "```\n" + json.dumps(dict(config), indent=1) + "\n```", 0)
        self._writer.add_text("metadata", json.dumps(dict(provenance.get("metadata", {}))), 0)

    def log(self, points: Sequence[Point]) -> None:
        for p in points:
            self._writer.add_scalar(p.key, p.value, p.step)

    def finish(self, summary: Mapping[str, Mapping[str, Any]]) -> None:
        for key, value in _summary_scalars(summary).items():
            self._writer.add_scalar(key, value, 0)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """A W&B run (``--logger-offline`` or ``WANDB_MODE=offline``: written to ``RUN/wandb/``)."""

    def __init__(
        self, options: TrackerOptions, config: Mapping[str, Any], provenance: Mapping[str, Any]
    ) -> None:
        import wandb

        from april_bench.fsio import record

        record(options.out / "wandb")
        self._run = wandb.init(
            project=options.project,
            name=options.run_name,
            dir=str(options.out),
            config={**dict(config), "metadata": dict(provenance.get("metadata", {}))},
            mode="offline" if options.offline else None,
            reinit="create_new",
        )
        self._axes: set[str] = set()

    def log(self, points: Sequence[Point]) -> None:
        by_axis: dict[tuple[str, int], dict[str, float]] = {}
        for p in points:
            if p.axis not in self._axes:  # each arm (and device) on its own step axis
                self._run.define_metric(f"{p.axis}/*", step_metric=f"{p.axis}/_step")
                self._axes.add(p.axis)
            by_axis.setdefault((p.axis, p.step), {f"{p.axis}/_step": p.step})[p.key] = p.value
        for metrics in by_axis.values():
            self._run.log(metrics)

    def finish(self, summary: Mapping[str, Mapping[str, Any]]) -> None:
        self._run.summary.update(_summary_scalars(summary))

    def close(self) -> None:
        self._run.finish()


class MlflowTracker:
    """An MLflow run through ``MlflowClient`` (no global active run): ``MLFLOW_TRACKING_URI``, or
    offline ``sqlite:///RUN/mlflow.db``."""

    def __init__(
        self, options: TrackerOptions, config: Mapping[str, Any], provenance: Mapping[str, Any]
    ) -> None:
        import os

        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if options.offline or not uri:
            from april_bench.fsio import record

            record(options.out / "mlflow.db")
            uri = f"sqlite:///{(options.out / 'mlflow.db').resolve()}"
        self.uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(options.project)
        experiment_id = (
            experiment.experiment_id if experiment else self._client.create_experiment(options.project)
        )
        tags = {f"metadata.{k}": str(v) for k, v in dict(provenance.get("metadata", {})).items()}
        self.run_id = self._client.create_run(experiment_id, run_name=options.run_name, tags=tags).info.run_id
        params: dict[str, str] = {}
        _flat("", dict(config), params)
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self._client.log_batch(self.run_id, params=items[start : start + 100])

    def _metrics(self, values: Sequence[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value, step in values]
        for start in range(0, len(metrics), 1000):
            self._client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def log(self, points: Sequence[Point]) -> None:
        self._metrics([(p.key, p.value, p.step) for p in points])

    def finish(self, summary: Mapping[str, Mapping[str, Any]]) -> None:
        self._metrics([(k, v, 0) for k, v in _summary_scalars(summary).items()])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


#: Tracker name -> (import name that must be installed, extra that installs it, factory).
TRACKERS: Mapping[str, tuple[str, str, Callable[..., Tracker]]] = {
    "tensorboard": ("tensorboard", "tensorboard", TensorBoardTracker),
    "wandb": ("wandb", "wandb", WandbTracker),
    "mlflow": ("mlflow", "mlflow", MlflowTracker),
}


def check_trackers(names: Sequence[str]) -> None:
    """One line naming the fix for an unknown tracker or one whose library is not installed."""
    for name in names:
        if name not in TRACKERS:
            folded = [n for n in TRACKERS if n == name.lower()]
            hint = f" Did you mean: {folded[0]}?" if folded else ""
            raise ConfigError(f"--logger {name!r} is not a tracker.{hint} Choose from {', '.join(TRACKERS)}")
        module, extra, _ = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"--logger {name} needs {module}: pip install 'april-bench[{extra}]'")


class TrackerSet:
    """Trackers fed beside the run directory's writer; a tracker that fails is dropped with a note."""

    def __init__(self, trackers: dict[str, Tracker], inner: Any) -> None:
        self._trackers = trackers
        self.inner = inner  # the run directory's writer: the record of truth
        self._telemetry: dict[int, int] = {}

    def write(self, table: str, row: dict[str, Any]) -> None:
        self.inner.write(table, row)
        if not self._trackers:
            return
        index = 0
        if table == "telemetry":
            device = int(row.get("device", 0))
            index = self._telemetry[device] = self._telemetry.get(device, -1) + 1
        points = scalars(table, row, telemetry_index=index)
        if points:
            self._each(lambda t: t.log(points))

    def flush(self) -> None:
        flush = getattr(self.inner, "flush", None)
        if flush is not None:
            flush()

    def finish(self, summary: Mapping[str, Mapping[str, Any]]) -> None:
        self._each(lambda t: t.finish(summary))

    def close(self) -> None:
        for name, tracker in list(self._trackers.items()):
            try:
                tracker.close()
            except Exception as exc:  # a tracker's own failure never costs the run
                print(f"note: --logger {name} failed to close ({type(exc).__name__}: {exc})", file=sys.stderr)
        self._trackers.clear()

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for name, tracker in list(self._trackers.items()):
            try:
                call(tracker)
            except Exception as exc:
                print(
                    f"note: --logger {name} stopped ({type(exc).__name__}: {exc}); the run directory has "
                    "every row",
                    file=sys.stderr,
                )
                self._trackers.pop(name)
                with contextlib.suppress(Exception):  # already failing; the note above says so
                    tracker.close()


def open_trackers(
    names: Sequence[str],
    *,
    inner: Any,
    out: Path,
    config: Mapping[str, Any],
    provenance: Mapping[str, Any],
    project: str = "april-bench",
    offline: bool = False,
) -> TrackerSet:
    """Start every tracker in ``names`` around ``inner``; the names were checked once, with
    :func:`check_trackers`, before the run directory was claimed."""
    options = TrackerOptions(out=out, run_name=out.name, project=project, offline=offline)
    from april_bench.redact import redact

    config, provenance = redact(config), redact(provenance)  # a tracker's server never sees a secret
    trackers: dict[str, Tracker] = {}
    for name in dict.fromkeys(names):
        trackers[name] = TRACKERS[name][2](options, config, provenance)
    return TrackerSet(trackers, inner)
