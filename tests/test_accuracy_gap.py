"""``benchmarks/accuracy_gap.py`` (issue 20 item 6): the committed table is what the committed runs' rows
give, and the per-seed mean counts each seed once."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
D = ROOT / "results" / "ablations" / "embedded-cpu-accuracy"
RUNS = [
    "seed0",
    "seed1",
    "seed2",
    "seed3",
    "seed4",
    "seed0-120steps",
    "offpolicy-mask-tis/mask",
    "offpolicy-mask-tis/tis",
    "span1-discard/as-is",
    "ratios/as-is",
]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("accuracy_gap", ROOT / "benchmarks" / "accuracy_gap.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_table_is_what_the_committed_rows_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "gap.md"
    monkeypatch.setattr("sys.argv", ["accuracy_gap.py", *(str(D / r) for r in RUNS), "--out", str(out)])
    _module().main()
    assert out.read_text() == (D / "accuracy_gap.md").read_text()


def test_the_seed_mean_counts_each_seed_once() -> None:
    m = _module()
    rows = [r for run in ("seed0", "seed1", "seed0-120steps") for r in m.summarise(D / run)]
    mean_row = m.gaps(rows).splitlines()[-1]
    assert "mean over 2 seeds" in mean_row
    assert "-1.6 pt" in mean_row  # (-3.1 + -0.1) / 2: seed 0 at step 60 and seed 1, not seed 0 at 120
