"""Several Ray nodes on one machine (``ray.cluster_utils.Cluster``, each node with its own CPUs):
replicas spread one per node, chaos across nodes, and the placement in the events table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import table_rows
from test_replica_faults import _check_nothing_lost, _faults

from april_bench.cli import main


@pytest.mark.slow
@pytest.mark.ray
def test_replicas_spread_over_nodes_and_survive_a_killed_one(ray_cluster: list[str], tmp_path: Path) -> None:
    import ray

    out = tmp_path / "run"
    argv = ["run", "--engine", "ray-fake", "--out", str(out), "--no-progress", "--strategies", "sync,april"]
    for option in (
        "replicas=2",
        "num_cpus=0.25",
        "placement=STRICT_SPREAD",
        "token_time_s=0.0002",
        "health_interval_s=1",
        "health_timeout_s=30",
        "chaos_seed=1",
        "chaos_window_tokens=100000",
    ):
        argv += ["--engine-arg", option]
    argv += ["--rollout-arg", "replay_lengths=true", "--hw", "cpu", "--dataset", "deepscaler"]
    argv += ["--model", "qwen3-4b", "--max-response-len", "16384", "--steps", "3"]
    argv += ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--over-sampling-batch-size", "8"]
    assert main(argv) == 0
    _check_nothing_lost(out)
    workers = set(ray_cluster)  # the two worker nodes (the head node has no CPU to place a replica on)
    assert len(workers) == 2 and workers <= {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    events = _faults(out)
    for arm in ("sync", "april"):
        placed = [e for e in events if e["arm"] == arm and e["kind"] == "replica_placed"]
        first = {int(str(e["replica"])): str(e["detail"]).split()[-1] for e in placed[:2]}
        assert sorted(first) == [0, 1] and set(first.values()) == workers, "one replica per worker node"
        kinds = {e["kind"] for e in events if e["arm"] == arm}
        assert {"fault_injected", "replica_failed", "replica_restarted"} <= kinds
        # the restarted replica went back to its own node's bundle
        again = placed[2:]
        assert again and all(str(e["detail"]).split()[-1] == first[int(str(e["replica"]))] for e in again)
    placement = json.loads((out / "provenance.json").read_text())["placement"]
    for arm in ("sync", "april"):  # the provenance has where each replica ran at the end
        assert {p["node_id"] for p in placement[f"{arm}#0"]} == workers
    served = {(r["arm"], r["replica"]) for r in table_rows(out, "requests")}
    assert served == {(a, i) for a in ("sync", "april") for i in (0, 1)}
    assert json.loads((out / "status.json").read_text())["state"] == "complete"
