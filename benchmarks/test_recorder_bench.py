"""Micro-benchmark: the recorder (``pytest benchmarks --benchmark-only``).

Adding rows as the rollout loop does (each request and sample row streamed to a run directory's
JSON Lines files), and writing a whole run at once (rows, then the summary and tables recomputed from
them).  The rows are one paper-scale step of two arms: 32 groups x 8 samples, 2 requests each.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pytest

from april_bench.results.recorder import RunRecorder
from april_bench.results.records import RequestRecord, SampleRecord, StepRecord
from april_bench.results.store import RunWriter, write_run

ARMS, GROUPS, GROUP_SIZE = ("sync", "april"), 32, 8


def _records() -> list[Any]:
    records: list[Any] = []
    for arm in ARMS:
        for uid in range(GROUPS):
            for i in range(GROUP_SIZE):
                for segment in range(2):  # aborted after 500 tokens, resumed for 500 more
                    records.append(
                        RequestRecord(
                            arm=arm,
                            step=0,
                            request_id=f"{arm}-{uid}-{i}-{segment}",
                            group_uid=uid,
                            sample_index=i,
                            prompt_len=200,
                            prefix_len=500 * segment,
                            max_new_tokens=8192,
                            output_len=500,
                            finish_reason="abort" if segment == 0 else "stop",
                            policy_version=segment,
                            t_submit=1.0 * segment,
                            t_first_token=1.1,
                            t_done=2.0,
                            replica=0,
                            num_retractions=0,
                        )
                    )
                records.append(
                    SampleRecord(
                        arm=arm,
                        step=0,
                        group_uid=uid,
                        sample_index=i,
                        fate="trained",
                        reason="accepted",
                        prompt_len=200,
                        response_len=1000,
                        status="completed",
                        reward=1.0,
                        start_step=0,
                        abort_count=1,
                        version_runs=[[0, 500], [1, 500]],
                        train_version=1,
                        off_policy_tokens=500,
                        discarded_tokens=0,
                    )
                )
        given: dict[str, Any] = {
            "arm": arm,
            "step": 0,
            "policy_version": 1,
            "t_start": 0.0,
            "rollout_time_s": 10.0,
            "train_time_s": 5.0,
            "weight_sync_time_s": 1.0,
            "step_time_s": 16.0,
            "drain_time_s": 0.5,
            "generated_tokens": GROUPS * GROUP_SIZE * 1000,
            "mean_context": 1200.0,
            "saturated_tokens_per_s": None,
            "bookkeeping_s": 0.01,
        }
        counters = {
            f.name: 0 for f in dataclasses.fields(StepRecord) if f.type == "int" and f.name not in given
        }
        records.append(StepRecord(**given, **counters))
    return records


RECORDS = _records()


@pytest.mark.benchmark(group="recorder")
def test_add_rows_streamed_to_disk(benchmark: Any, tmp_path: Path) -> None:
    def add_all() -> RunRecorder:
        out = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh run directory per round
        writer = RunWriter(out)
        recorder = RunRecorder(sink=writer)
        recorder.extend(RECORDS)
        writer.close()
        return recorder

    recorder = benchmark(add_all)
    assert sum(len(rows) for rows in recorder.tables.values()) == len(RECORDS)


@pytest.mark.benchmark(group="recorder")
def test_write_run(benchmark: Any, tmp_path: Path) -> None:
    tables = RunRecorder()
    tables.extend(RECORDS)
    config = {"dataset": "d", "model": "m", "algorithm": "grpo", "hardware": "cpu", "steps": 1, "rollout": {}}

    run = benchmark(
        write_run,
        tmp_path / "run",
        config=config,
        provenance={"result_kind": "measured"},
        tables=tables.tables,
    )
    assert run.summary()["april"]["trained_tokens"] == GROUPS * GROUP_SIZE * 1000
