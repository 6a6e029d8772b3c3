"""benchmarks/gpu_recipe.sh works before a GPU is lent: its CPU dry run (``SMALL=1``, the tiny model) runs
every stage to exit status 0 and packs each stage's outputs; and the lease's budget adds up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_recipe.sh"
STAGES = ("facts", "tests", "run", "simcheck", "mbu")


def _limits() -> dict[str, int]:
    """Each default stage's limit in seconds, as the script sets it (``stage NAME SECONDS ...``)."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^stage (\w+) (\d+) ", SCRIPT.read_text(), re.MULTILINE)}


def test_the_default_stages_fit_a_lease_with_time_to_rerun() -> None:
    limits = _limits()
    default = re.search(r"STAGES=\$\{STAGES:-([^}]*)\}", SCRIPT.read_text())
    assert default is not None and tuple(default[1].split()) == STAGES
    assert sum(limits[s] for s in STAGES) < 7 * 60  # under 7 minutes: a 15-minute lease can run it twice
    assert "--recipe gpu-check" in SCRIPT.read_text()


@pytest.mark.slow
def test_the_cpu_dry_run_runs_every_stage_and_packs_its_outputs(tmp_path: Path) -> None:
    work = tmp_path / "gpu-recipe"
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "MODEL": "tiny",
        "HW": "cpu",
        "SMALL": "1",
        "WORK": str(work),
        "APRIL_BENCH_CACHE": str(tmp_path / "cache"),
        "PYTHON": sys.executable,  # this test's interpreter: april-bench and its test extras
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = (work / "stages.txt").read_text()
    for stage in STAGES:
        assert re.search(rf"^   {stage} rc=0 in \d+s$", stages, re.MULTILINE), stages
    assert "memory" not in stages  # measured on the first lease; not a default stage
    with tarfile.open(f"{work}.tar.gz") as pack:
        names = set(pack.getnames())
    run = "gpu-recipe/run-gpu-check-tiny"
    expected = [
        *(f"gpu-recipe/{stage}.log" for stage in STAGES),
        f"{run}/table.md",
        f"{run}/summary.json",
        f"{run}/steps.jsonl",
        "gpu-recipe/simcheck-hf-cpu/simcheck.json",
        "gpu-recipe/simcheck-log.jsonl",
    ]
    assert not [name for name in names if "/state" in name]  # checkpoints stay out of the pack
    missing = [name for name in expected if name not in names]
    assert not missing, sorted(names)
    assert any(name.startswith("gpu-recipe/benchmarks/hf_mbu") for name in names), sorted(names)
    config = (work / "run-gpu-check-tiny" / "config.json").read_text()
    assert '"length_oracle": "deepscaler"' in config and '"checkpoint_every": 0' in config
