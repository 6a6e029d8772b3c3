"""The occupancy figure puts requests and GPU samples on one clock: the run's (events and telemetry are
stamped with it; requests carry their arm's clock and are moved onto it step by step)."""

from __future__ import annotations

import pytest
from helpers import sim_flags

from april_bench.cli import main


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from april_bench.results.frames import load_runs

    out = tmp_path_factory.mktemp("fig") / "run"
    assert main(["run", *sim_flags(steps=2, strategies="sync,april"), "--out", str(out)]) == 0
    return dict(load_runs([out]))


def test_requests_and_gpu_samples_share_the_run_clock(tables: dict) -> None:
    import matplotlib.pyplot as plt
    import pandas as pd

    from april_bench.results.figures import occupancy_figure

    events = tables["events"].copy()
    later = events["arm"] == "april"
    events.loc[later, "t"] += 100.0  # APRIL ran 100 s later on the run clock than on its own
    start = float(events[later & (events["kind"] == "rollout_start")]["t"].min())
    telemetry = pd.DataFrame(
        [{"t": i * 1.0, "device": 0, "util_gpu": 50.0} for i in range(200)],
        columns=tables["telemetry"].columns,
    )
    fig = occupancy_figure({**tables, "events": events, "telemetry": telemetry})
    assert fig is not None
    sync_ax, april_ax, gpu_ax = fig.axes
    april_x = april_ax.lines[0].get_xdata()
    assert min(april_x) == pytest.approx(start)  # its first request, at its rollout's start
    assert max(sync_ax.lines[0].get_xdata()) < start  # sync's requests stay where sync ran
    assert april_ax.get_xlabel() == "run clock (s)" and gpu_ax.get_xlabel() == "run clock (s)"
    assert april_ax.get_shared_x_axes().joined(april_ax, gpu_ax)
    plt.close(fig)


def test_a_run_without_rollout_events_keeps_the_arm_clock(tables: dict) -> None:
    import matplotlib.pyplot as plt

    from april_bench.results.figures import occupancy_figure

    events = tables["events"]
    fig = occupancy_figure({**tables, "events": events[events["kind"] != "rollout_start"]})
    assert fig is not None and fig.axes[1].get_xlabel() == "arm clock (s)"
    plt.close(fig)
