"""Provenance of a run: code version, package versions, machine, time, command."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from april_bench.machine import detect_accelerators, installed_engines

__all__ = ["collect_provenance", "git_info"]

_PACKAGES = (
    "april-bench",
    "numpy",
    "tqdm",
    "torch",
    "transformers",
    "sglang",
    "vllm",
    "nvidia-ml-py",
    "amdsmi",
)


def git_info(path: Path | None = None) -> dict[str, Any]:
    """Commit, dirty flag and branch of the repository holding ``path`` (or the package)."""
    where = path or Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit,
        "dirty": bool(status) if status is not None else None,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
    }


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def collect_provenance(*, simulated: bool, engine: str, notes: list[str] | None = None) -> dict[str, Any]:
    accel = detect_accelerators()
    return {
        "result_kind": "simulated" if simulated else "measured",
        "engine": engine,
        "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git": git_info(),
        "versions": _versions(),
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "memory_bytes": _memory_bytes(),
            "nvidia_gpus": accel.nvidia,
            "amd_gpus": accel.amd,
            "engines_installed": installed_engines(),
        },
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "notes": notes or [],
    }
