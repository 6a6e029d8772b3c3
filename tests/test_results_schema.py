"""The results schema: versioned, documented in one place, committed runs still load, old names
readable; provenance names every package that ran and the environment that changes results."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import sim_flags

from april_bench.cli import main
from april_bench.results.records import TABLES
from april_bench.results.schema import RENAMED, SCHEMA_VERSION, read_summary
from april_bench.results.store import RunDirectory, check_run

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "results-schema.md"
COMMITTED = sorted(p for p in (ROOT / "results" / "runs").iterdir() if (p / "config.json").is_file())
SIM = sim_flags(steps=2, over_sampling_batch_size=None, max_response_len=None, no_progress=None)
SIM += ["--over-sampling-batch-size", "8", "--max-response-len", "2048", "--no-progress"]


def _documented() -> set[str]:
    return set(re.findall(r"`([a-z_0-9]+)`", DOC.read_text()))


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("schema") / "run"
    argv = ["run", *SIM, "--metadata", "cluster=pool-a", "--metadata", "ticket=123", "--out", str(out)]
    assert main(argv) == 0
    return out


def test_every_row_and_summary_field_is_documented(fresh_run: Path) -> None:
    documented = _documented()
    for table, record in TABLES.items():
        missing = [f.name for f in dataclasses.fields(record) if f.name not in documented]
        assert not missing, f"{table}: {missing} not in docs/results-schema.md"
    summary = json.loads((fresh_run / "summary.json").read_text())
    for arm, metrics in summary["arms"].items():
        missing = [k for k in metrics if k not in documented]
        assert not missing, f"summary {arm}: {missing} not in docs/results-schema.md"
    assert f"# Results schema (version {SCHEMA_VERSION})" in DOC.read_text()


def test_a_new_run_writes_its_version_its_metadata_and_both_names(fresh_run: Path) -> None:
    summary = json.loads((fresh_run / "summary.json").read_text())
    assert summary["schema_version"] == SCHEMA_VERSION
    assert summary["metadata"] == {"cluster": "pool-a", "ticket": 123}
    april = summary["arms"]["april"]
    assert april["throughput_gain_vs_sync"] == april["throughput_gain"]  # the old name, for one version
    provenance = json.loads((fresh_run / "provenance.json").read_text())
    assert provenance["schema_version"] == SCHEMA_VERSION
    assert provenance["metadata"] == {"cluster": "pool-a", "ticket": 123}
    assert "numpy" in provenance["packages_loaded"] and "environment" in provenance


@pytest.mark.parametrize("run", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_runs_still_load(run: Path, committed_run: Callable[[Path], RunDirectory]) -> None:
    loaded = committed_run(run)
    assert check_run(loaded) == []
    summary = read_summary(run / "summary.json")
    recomputed = loaded.summary()
    for arm, metrics in summary["arms"].items():
        assert metrics["throughput_gain"] == pytest.approx(recomputed[arm]["throughput_gain"], rel=1e-9)


def test_old_names_read_under_new_ones_and_newer_versions_are_refused(tmp_path: Path) -> None:
    from april_bench.config import ConfigError

    old = tmp_path / "summary.json"
    old.write_text(
        json.dumps({"result_kind": "simulated", "arms": {"april": {"throughput_gain_vs_sync": 0.2}}})
    )
    summary = read_summary(old)
    assert summary["schema_version"] == 1 and summary["arms"]["april"]["throughput_gain"] == 0.2
    assert set(RENAMED.values()) >= {"throughput_gain", "useful_gain", "end_to_end_gain"}
    old.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "arms": {}}))
    with pytest.raises(ConfigError, match="upgrade april-bench"):
        read_summary(old)


def test_provenance_names_packages_that_ran_and_the_environment_that_matters() -> None:
    import pyarrow  # noqa: F401  (a package a math run imports)

    from april_bench.results.provenance import loaded_packages, result_environment

    assert "pyarrow" in loaded_packages()
    env = result_environment(
        {
            "OMP_NUM_THREADS": "1",
            "VLLM_CPU_KVCACHE_SPACE": "4",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "HOME": "/root",
            "VLLM_API_KEY": "secret",
            "HF_TOKEN": "secret",
        }
    )
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "4"}
