"""The zoo through the CLI on the simulator: every arm conserves prompts and tokens, and an interrupted
run resumes with the rows an uninterrupted one writes (the strategies' own state included)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import comparable_rows, interrupt_at, sim_flags

from april_bench.cli import main
from april_bench.results.store import check_run, load_run

SIM = sim_flags(
    steps=4,
    # short responses, so most finish under the 2,048 limit: the mechanics of each strategy's state are
    # under test, not the paper's lengths (Qwen3-4B's evidence median, 7,075, would truncate nearly all)
    workload_arg="response_median=500",
)
#: N'=5 queues about one group per short step, so the tail step comes from max_wait_steps (the state).
TAIL = "tail-batching[max_wait_steps=2,over_sampling_batch_size=5]"
SEGMENT = "segment[segment_len=1024]"
SAGC = "sagc[max_straggler_rate=0.2]"
ARMS = f"sync,{TAIL},{SEGMENT},adaptive,length-aware[abort_share=0.5],consistent,{SAGC},response-oversample"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zoo") / "run"
    assert main(["run", *SIM, "--strategies", ARMS, "--out", str(out)]) == 0
    return out


def test_every_arm_conserves_prompts_and_tokens(uninterrupted: Path) -> None:
    run = load_run(uninterrupted)
    assert check_run(run) == []
    summary = run.summary()
    assert len(summary) == 8
    for arm, m in summary.items():
        assert m["prompts"]["inconsistent"] == 0, arm
        assert m["prompts"]["launched"] == sum(m["prompts"][k] for k in ("trained", "dropped", "buffered")), (
            arm
        )
    assert summary[SEGMENT]["partial_samples"] > 0
    assert summary[TAIL]["off_policy_token_ratio"] == 0.0  # deferred prompts are re-run in full
    assert summary["consistent"]["max_version_span"] == 0 < summary[SEGMENT]["max_version_span"]
    assert summary["response-oversample"]["wasted_tokens"] > 0  # the responses past the first n


@pytest.mark.parametrize(
    ("arm", "step"),
    [(TAIL, 2), ("adaptive", 2), (SEGMENT, 1), (SAGC, 2), ("consistent", 2)],
    ids=["tail-batching", "adaptive", "segment", "sagc", "consistent"],
)
def test_interrupt_then_resume_restores_the_strategy_and_its_buffer(
    arm: str, step: int, uninterrupted: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    with interrupt_at(step, arm):
        assert main(["run", *SIM, "--strategies", ARMS, "--out", str(out)]) == 130
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    for table in ("requests", "samples", "steps", "events"):
        assert comparable_rows(out, table) == comparable_rows(uninterrupted, table), table
    assert check_run(load_run(out)) == []
