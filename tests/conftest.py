"""Test tiers: markers for hardware- and package-bound tests skip themselves where unavailable."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pytest
from hypothesis import HealthCheck, settings

from april_bench.machine import detect_accelerators

if TYPE_CHECKING:
    from april_bench.results.store import RunDirectory

# Property tests run on loaded, shared machines: no per-example deadline (hypothesis's default of
# 200 ms fails a correct test when the CPU is busy) and no too-slow health check.
settings.register_profile("shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-machine")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    accel = detect_accelerators()
    has_gpu = bool(accel.nvidia or accel.amd)
    reasons = {
        "gpu": None if has_gpu else "needs a CUDA or ROCm GPU",
        "sglang": None if importlib.util.find_spec("sglang") else "needs the sglang package",
        "vllm": None if importlib.util.find_spec("vllm") else "needs the vllm package",
        "ray": None
        if importlib.util.find_spec("ray")
        else "needs the ray package (pip install 'april-bench[ray]')",
        "megatron": None
        if importlib.util.find_spec("megatron")
        else "needs megatron-core (pip install 'april-bench[megatron]')",
        "triton": None
        if importlib.util.find_spec("triton") and (has_gpu or os.environ.get("TRITON_INTERPRET") == "1")
        else "needs the triton package and a GPU, or TRITON_INTERPRET=1 (tox -e triton)",
        "compiled": None
        if os.environ.get("APRIL_BENCH_EXPECT_COMPILED") == "1" or _core_compiled()
        else "needs the compiled core (tox -e compiled; april_bench/compiled.py)",
    }
    for item in items:
        for marker, reason in reasons.items():
            if reason and item.get_closest_marker(marker) is not None:  # not keywords: a checkout named
                # "sglang" or "gpu" would put that word in every item's keywords
                item.add_marker(pytest.mark.skip(reason=reason))


def _core_compiled() -> bool:
    from april_bench.compiled import core_compiled

    return core_compiled()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Real rows of the math data sets, vendored in ``tests/data/math`` (``VENDORED.md`` there: which rows,
    written by ``tests/data/vendor.py``; ``README.md``: their provenance), so a clean clone runs every data
    test. ``APRIL_BENCH_SHARED_DATA`` points the tests at another copy of the same files (for example the
    full sample); the tests derive their expectations from the rows they read."""
    root = Path(os.environ.get("APRIL_BENCH_SHARED_DATA", Path(__file__).parent / "data" / "math"))
    if not (root / "README.md").is_file():
        raise FileNotFoundError(f"math data samples not found at {root}: check APRIL_BENCH_SHARED_DATA")
    return root


@pytest.fixture(scope="session")
def committed_run() -> Callable[[Path], RunDirectory]:
    """``load_run`` for the committed run directories (``results/runs``, ``results/gates``), each read once
    per test session (per worker under ``-n 2``): the simulated reference alone is 34 MB of rows (about
    1.3 CPU-seconds to read), and several files check the same runs.  The loaded runs are shared, so a
    test only reads them; one that changes a run copies its directory first (``tmp_path``)."""
    from april_bench.results.store import load_run

    loaded: dict[Path, RunDirectory] = {}

    def load(path: Path) -> RunDirectory:
        key = path.resolve()
        if key not in loaded:
            loaded[key] = load_run(key)
        return loaded[key]

    return load


def _ray_cluster_scope(fixture_name: str, config: pytest.Config) -> Literal["session", "module"]:
    """``session`` (one cluster for every Ray module), but ``module`` where vLLM is installed: the vLLM
    tier (``tox -e vllm``) has one Ray test, and its cluster ends with that module as it always did, so
    the vLLM tests after it never run beside a live cluster (in the one run where it outlived the module,
    the next test's setup met an unclosed socket left in the driver; not yet traced)."""
    return "module" if importlib.util.find_spec("vllm") else "session"


@pytest.fixture(scope=_ray_cluster_scope)
def ray_cluster() -> Iterator[list[str]]:
    """One local Ray cluster for every Ray test of the session (per worker under ``-n``; per module
    where vLLM is installed: ``_ray_cluster_scope``): simulated nodes on this machine
    (``ray.cluster_utils.Cluster``), a head node with no CPU (the driver's: nothing is placed there)
    and two worker nodes of two CPUs each; yields the worker nodes' ids.  Starting a cluster costs
    10-30 s on two loaded cores, and six modules each started their own (issue 34).  A test leaves
    the cluster as it found it: its pools and trainers closed, its actors gone (the rank tests check
    that every CPU is free again)."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("needs the ray package (pip install 'april-bench[ray]')")
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        yield [node.node_id for node in nodes]
    finally:
        ray.shutdown()
        cluster.shutdown()
