"""Import cost and the public surface."""

from __future__ import annotations

import subprocess
import sys

import april_bench


def test_import_april_bench_loads_no_engine_or_heavy_dependency() -> None:
    code = (
        "import sys, april_bench, april_impl, baselines\n"
        "heavy = {'torch', 'sglang', 'vllm', 'transformers', 'pynvml', 'amdsmi', 'numpy', 'tqdm'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_surface_is_pinned() -> None:
    assert sorted(april_bench.__all__) == ["ExperimentConfig", "RunResult", "__version__", "run"]
    assert callable(april_bench.run)
