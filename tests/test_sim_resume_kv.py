"""The simulator's KV policy on resume: recompute the partial's prefix (default) or keep it cached."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import sim_flags, table_rows

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.engines.sim.engine import SimEngine

SIM = sim_flags(steps=4, strategies="sync,april")


def _steps(run: Path) -> dict[tuple[str, int], dict]:
    rows = table_rows(run, "steps")
    return {(r["arm"], r["step"]): r for r in rows}


def _prefill(run: Path, arm: str) -> int:
    """Input tokens of resumed requests (what a recompute re-prefills)."""
    rows = table_rows(run, "requests")
    return sum(r["prompt_len"] + r["prefix_len"] for r in rows if r["arm"] == arm and r["prefix_len"])


def test_keeping_the_kv_of_resumed_partials_saves_their_re_prefill(tmp_path: Path) -> None:
    runs = {}
    for policy in ("recompute", "keep"):
        runs[policy] = tmp_path / policy
        argv = ["run", *SIM, "--engine-arg", f"resume_kv={policy}", "--out", str(runs[policy])]
        assert main(argv) == 0
    recompute, keep = _steps(runs["recompute"]), _steps(runs["keep"])
    assert _prefill(runs["recompute"], "april") > 0  # APRIL resumed partials
    # Nothing is resumed in step 0, nor ever by sync: the same schedule to the microsecond.
    for key in [("april", 0), *((a, s) for a, s in recompute if a == "sync")]:
        assert keep[key]["rollout_time_s"] == recompute[key]["rollout_time_s"], key
    # Later APRIL steps skip the re-prefill of every resumed prompt + partial, so they are faster.
    later = [s for a, s in recompute if a == "april" and s > 0]
    assert sum(keep[("april", s)]["rollout_time_s"] for s in later) < sum(
        recompute[("april", s)]["rollout_time_s"] for s in later
    )


def test_an_unknown_kv_policy_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="resume_kv must be one of recompute, keep"):
        SimEngine.Config(resume_kv="warm")
