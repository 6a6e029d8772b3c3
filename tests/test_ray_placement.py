"""Ray placement for real: engine replicas (and the trainer) as actors on a local Ray cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import flags, table_rows

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.engines import ENGINES, EngineSettings
from april_bench.engines.routing import Router
from april_bench.results.store import check_run, load_run
from april_bench.trainers.registry import TRAINERS, TrainerSettings

SMALL = flags(
    steps=2, rollout_batch_size=2, n_samples_per_prompt=2, over_sampling_batch_size=4, no_progress=True
)


def _check_replicas_and_versions(out: Path) -> None:
    requests = table_rows(out, "requests")
    assert {r["arm"] for r in requests} == {"sync", "april"}
    for arm in ("sync", "april"):
        mine = [r for r in requests if r["arm"] == arm]
        assert {r["replica"] for r in mine} == {0, 1}, "the router spread requests over both replicas"
        # every replica got every step's weights: a request answered in step s carries version s
        assert all(r["policy_version"] == r["step"] for r in mine)


@pytest.mark.slow
@pytest.mark.ray
def test_sync_and_april_complete_on_two_fake_replicas(ray_cluster: list[str], tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [
        "run",
        "--engine",
        "ray-fake",
        "--engine-arg",
        "replicas=2",
        "--engine-arg",
        "router_policy=round_robin",
        "--engine-arg",
        "token_time_s=0.002",
        "--hw",
        "cpu",
        "--dataset",
        "deepscaler",
        "--model",
        "qwen3-4b",
        "--max-response-len",
        "64",
        *SMALL,
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert check_run(load_run(out)) == []
    _check_replicas_and_versions(out)


@pytest.mark.slow
@pytest.mark.ray
def test_embedded_replicas_and_a_trainer_actor_train_the_synthetic_task(
    ray_cluster: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    argv = [
        "run",
        "--engine",
        "ray",
        "--engine-arg",
        "replicas=2",
        "--engine-arg",
        "num_cpus=0.25",
        "--engine-arg",
        "router_policy=round_robin",
        "--trainer",
        "ray",
        "--trainer-arg",
        "num_cpus=0.25",
        "--trainer-arg",
        "lr=1e-4",
        "--max-response-len",
        "16",
        # a short warm start and a small held-out set: this test is about placement, not learning
        "--warmstart-arg",
        "steps=20",
        "--task-arg",
        "max_n=30",
        *SMALL,
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert check_run(load_run(out)) == []
    _check_replicas_and_versions(out)
    steps = table_rows(out, "steps")
    # the torch trainer ran inside its actor: its metrics came back (with a 20-step warm start the
    # rewards may all be 0, so the update itself can be zero: learning is test_trainer.py's business)
    assert steps and all(isinstance(s["train_metrics"]["loss"], float) for s in steps)


# ---------------------------------------------------------------- no Ray needed
def test_router_policies() -> None:
    rr = Router("round_robin", 3)
    assert [rr.route(None, [0, 0, 0]) for _ in range(4)] == [1, 2, 0, 1]
    least = Router("least_load", 3)
    assert least.route("k", [2, 1, 1]) == 1  # ties go to the lowest index
    cache = Router("cache_aware", 2)
    assert cache.route("p0", [5, 0]) == 1
    assert cache.route("p0", [5, 9]) == 1  # the prompt's prefix lives on replica 1
    assert cache.route(None, [5, 9]) == 0
    state = cache.export_state()
    cache.forget_prefixes()
    assert cache.route("p0", [0, 3]) == 0
    cache.restore_state(state)
    assert cache.route("p0", [0, 3]) == 1
    with pytest.raises(ValueError, match="router policy"):
        Router("random", 2)


def test_pool_and_trainer_options_are_checked_before_any_actor_starts() -> None:
    settings = EngineSettings(model="qwen3-4b", hardware="cpu", max_context_len=128)
    spec = ENGINES.get("ray-fake")
    spec.check(settings, {"replicas": 3, "token_time_s": 0.01})
    with pytest.raises(ConfigError, match="replicas"):
        spec.check(settings, {"replicas": 0})
    with pytest.raises(ConfigError, match="token_time_s"):
        spec.check(settings, {"token_time_s": -1})  # an option of the replicas' own engine
    with pytest.raises(ConfigError, match="always runs"):
        spec.check(settings, {"engine": "sim"})
    trainer_settings = TrainerSettings(
        algorithm="grpo",
        off_policy="as-is",
        temperature=1.0,
        max_response_len=8,
        model="tiny",
        hardware="cpu",
    )
    ray_trainer = TRAINERS.get("ray")
    options = {"trainer": "fsdp", "world_size": 2, "num_cpus": 2}
    ray_trainer.check(trainer_settings, options)
    assert ray_trainer.configure(trainer_settings, options).trainer_args == {"world_size": 2}
    with pytest.raises(ConfigError, match="real trainer"):
        ray_trainer.check(trainer_settings, {"trainer": "sim"})
