"""Every arm of a grid runs at the workload's setting, or its row says why it cannot: the segment lengths
a workload can fill (predicted from its draws), and an arm that stalls mid-run left out while the others
finish (``ablate``; ``whatif`` in tests/test_whatif.py)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import sim_flags, table_rows

from april_bench.cli import build_parser, main
from april_bench.workload import ScriptedWorkload
from april_bench.zoo import GroupDraw, draw_groups, fit_segments, step_zero_launches

#: Longest response of each of 8 groups in stream order; group 2 fails the filter.
LONGEST = [100, 900, 200, 800, 300, 700, 400, 600]
DRAWS = [GroupDraw(longest=n, passes=i != 2) for i, n in enumerate(LONGEST)]


def test_step_zero_launches_whole_waves_until_enough_groups_end_within_one_segment() -> None:
    def launches(segment: int) -> int | None:
        return step_zero_launches(DRAWS, segment, target_groups=2, wave=2)

    assert launches(250) is None  # groups 0 and (filtered) 2 only: the draws run out
    assert launches(350) == 6  # groups 0 and 4 pass: the third wave holds the second
    assert launches(800) == 4  # groups 0 and 3
    assert launches(1000) == 2  # the first wave


def test_chosen_segments_a_step_cannot_fill_are_left_out_with_the_reason() -> None:
    fit = fit_segments(
        [250, 350, 1000], DRAWS, target_groups=2, wave=2, cap=8, max_response_len=1000, derive=False
    )
    assert fit.segments == [350, 1000] and fit.notes == []
    assert fit.left_out == {
        250: "only 1 of the workload's first 8 groups finish every response within one segment of 250 "
        "tokens and pass the filter, so step 0 cannot gather 2 groups in 8 launches"
    }


def test_default_segments_are_raised_to_the_shortest_length_that_fills_half_the_cap() -> None:
    # half the cap is 4 launches: 800 is the shortest longest-response that fills step 0 in 4 (groups
    # 0 and 3), rounded up to a multiple of 128; 1000 fills it already and stays
    fit = fit_segments(
        [250, 350, 1000], DRAWS, target_groups=2, wave=2, cap=8, max_response_len=1000, derive=True
    )
    assert fit.segments == [896, 1000] and fit.left_out == {}
    assert [note.split(":")[0] for note in fit.notes] == ["segment_len 250", "segment_len 350"]
    assert all(note.endswith("the grid uses 896 instead") for note in fit.notes)
    assert "so step 0 needs 6 of its 8 launches to gather 2 groups (more than 50%" in fit.notes[1]
    # no length up to the limit fills the step: the default is left out, not raised
    none = fit_segments([250], DRAWS, target_groups=5, wave=2, cap=8, max_response_len=1000, derive=True)
    assert none.segments == [] and list(none.left_out) == [250]


def test_draws_are_the_stream_groups_longest_response_and_the_filter_on_their_rewards() -> None:
    workload = ScriptedWorkload(
        length=lambda uid, i: 10 * uid + i, reward=lambda uid, i: 0.0 if uid == 1 else float(i % 2)
    )
    draws = draw_groups(workload, groups=3, n_samples=4, max_response_len=100, dynamic_sampling=True)
    assert draws == [GroupDraw(3, True), GroupDraw(13, False), GroupDraw(23, True)]
    unfiltered = draw_groups(workload, groups=2, n_samples=4, max_response_len=100, dynamic_sampling=False)
    assert unfiltered == [GroupDraw(3, True), GroupDraw(13, True)]


#: Short responses (median 200 tokens), so a segment of 1,024 holds most of them and one of 16 none.
SHORT = [*sim_flags(over_sampling_batch_size=None), "--algo", "dapo", "--workload-arg", "response_median=200"]


def test_ablate_reports_a_segment_the_workload_cannot_fill_and_runs_the_rest(tmp_path: Path, capsys) -> None:
    out = tmp_path / "a"
    grid = ["--strategies", "sync,segment", "--ratios", "2", "--spans", "none", "--drivers", "none"]
    assert main(["ablate", *SHORT, *grid, "--segments", "16,1024", "--out", str(out)]) == 0
    rows = {r["arm"]: r for r in json.loads((out / "ablation.json").read_text())["rows"]}
    assert list(rows) == [
        "sync",
        "segment[over_sampling_batch_size=8,segment_len=1024]",
        "segment[over_sampling_batch_size=8,segment_len=16]",
    ]
    left = rows["segment[over_sampling_batch_size=8,segment_len=16]"]
    assert left["cannot_run"] == (
        "only 0 of the workload's first 1,024 groups finish every response within one segment of 16 tokens "
        "and pass the filter, so step 0 cannot gather 4 groups in 1,024 launches"
    )
    assert left["throughput_gain"] is None and left["segment_len"] == 16
    ran = rows["segment[over_sampling_batch_size=8,segment_len=1024]"]
    assert ran["cannot_run"] is None and ran["throughput_gain"] is not None
    assert "| 16 | cannot run here: only 0 of" in (out / "ablation.md").read_text()
    assert "cannot run here" in capsys.readouterr().err


def test_an_arm_that_stalls_mid_run_is_left_out_and_the_others_are_not_run_again(tmp_path: Path) -> None:
    from april_bench import runner
    from april_bench.cli.args import config_from_args
    from april_bench.results.rundir import start_run_dir
    from april_bench.results.store import load_run

    argv = ["run", *SHORT, "--strategies", "sync,segment[segment_len=16]"]
    config = config_from_args(build_parser().parse_args(argv))
    status = start_run_dir(tmp_path / "r", default_name="r")
    said: list[str] = []
    claimed = runner.ClaimedRun(config, runner.prepare(config), status, progress=False, echo=said.append)
    outcome, ran, left_out = runner.execute_grid(claimed)
    assert list(left_out) == ["segment[segment_len=16]"]
    reason = left_out["segment[segment_len=16]"]
    # no group rejected (the filter never saw one): the reason says what happened, the command advises
    assert reason == (
        "step 0 launched 1024 groups and only 0 of 4 passed; 1024 came back unfinished (buffered for a "
        "later step)"
    )
    assert any(line.startswith("arm segment[segment_len=16] cannot run here") for line in said)
    assert ran.strategies == ("sync",) and outcome.stored is not None
    # sync completed before the stall and continued from its checkpoints: its 3 steps once each
    assert [r["step"] for r in table_rows(tmp_path / "r", "steps")] == [0, 1, 2]
    run = load_run(tmp_path / "r")
    assert list(run.summary()) == ["sync"]
    assert json.loads((tmp_path / "r" / "config.json").read_text())["strategies"] == ["sync"]
    assert json.loads((tmp_path / "r" / "status.json").read_text())["state"] == "complete"
