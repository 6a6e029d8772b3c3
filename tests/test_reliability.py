"""Nothing lost, nothing hangs: run directories, interruption and resume, and bad input.

Each bad-input case asserts the exit code (2), that the one-line message names the fix, and that no
traceback is printed.  Interruption cases check that what was done is on disk and that ``--resume``
finishes the run with exactly the rows of an uninterrupted one (the simulator is deterministic).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import comparable_rows, interrupt_at, sim_flags, table_rows

from april_bench.cli import main
from april_bench.results.rundir import claim_run_dir

SIM = sim_flags()


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    return err


# ---------------------------------------------------------------- run directories


def test_parallel_default_runs_land_in_distinct_directories(tmp_path: Path) -> None:
    claimed: list[Path] = []
    lock = threading.Lock()

    def claim() -> None:
        path = claim_run_dir(None, default_name="same-second", root=tmp_path)
        with lock:
            claimed.append(path)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(claimed)) == 8
    assert sorted(p.name for p in claimed) == sorted(
        ["same-second", *(f"same-second-{n}" for n in range(2, 9))]
    )


def test_an_existing_run_is_refused_unless_resume_or_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", *SIM, "--out", str(out)]) == 0
    before = (out / "steps.jsonl").read_text()
    capsys.readouterr()
    err = _fails(capsys, ["run", *SIM, "--out", str(out)], "already holds files")
    assert "--resume" in err and "--overwrite" in err
    assert (out / "steps.jsonl").read_text() == before  # nothing touched
    assert main(["run", *SIM, "--steps", "2", "--out", str(out), "--overwrite"]) == 0
    steps = table_rows(out, "steps")
    assert {s["step"] for s in steps} == {0, 1}  # the old run's rows are gone, not mixed in


def test_an_out_that_cannot_be_written_fails_before_the_first_step(tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    _fails(capsys, ["run", *SIM, "--out", str(a_file)], "is a file, not a directory")
    _fails(capsys, ["run", *SIM, "--out", str(a_file / "sub")], "cannot be created")


def test_out_with_a_tilde_is_the_home_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["run", *SIM, "--steps", "1", "--out", "~/x"]) == 0
    assert (tmp_path / "x" / "steps.jsonl").exists()
    assert not Path("~").exists()


def test_a_complete_run_has_its_status_and_every_table(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["run", *SIM, "--out", str(out)]) == 0
    assert json.loads((out / "status.json").read_text())["state"] == "complete"
    for table in ("requests", "samples", "steps", "evals", "engine_metrics", "events"):
        assert (out / f"{table}.jsonl").exists(), table
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["machine"]["load_average_start"] is not None and "utc_end" in provenance


# ---------------------------------------------------------------- interruption and resume


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("full") / "run"
    assert main(["run", *SIM, "--strategies", "sync,april", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(
    ("arm", "step"),
    [("sync", 0), ("sync", 2), ("april", 0), ("april", 1)],
    ids=["sync-first-step", "sync-last-step", "april-first-step", "april-mid-run"],
)
def test_interrupt_then_resume_gives_the_rows_of_an_uninterrupted_run(
    arm: str, step: int, uninterrupted: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    with interrupt_at(step, arm):
        assert main(["run", *SIM, "--strategies", "sync,april", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"--resume {out}" in err and "Traceback" not in err
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "interrupted"
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    for table in ("requests", "samples", "steps", "events"):
        assert comparable_rows(out, table) == comparable_rows(uninterrupted, table), table
    assert json.loads((out / "status.json").read_text())["state"] == "complete"


def test_resume_keeps_the_april_buffer_neither_dropped_nor_doubled(
    uninterrupted: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with interrupt_at(2, "april"):
        assert main(["run", *SIM, "--strategies", "sync,april", "--out", str(out)]) == 130
    saved = json.loads((out / "state" / "april-r0-s2.json").read_text())  # after 2 steps
    assert saved["completed_steps"] == 2 and saved["rollout"]["buffer"], "APRIL had partials to carry"
    versions = {
        seg["policy_version"]
        for g in saved["rollout"]["buffer"]
        for s in g["samples"]
        for seg in s["segments"]
    }
    assert versions <= {0, 1}  # partial tokens keep the version that produced them
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    fates = table_rows(out, "samples")
    per_prompt: dict[tuple[str, int, int], int] = {}
    for f in fates:
        key = (f["arm"], f["group_uid"], f["sample_index"])
        per_prompt[key] = per_prompt.get(key, 0) + 1
    assert set(per_prompt.values()) == {1}  # every sample has exactly one fate
    assert main(["report", str(out)]) == 0  # and the token balance adds up


def test_resume_takes_the_runs_own_config(uninterrupted: Path, capsys) -> None:
    err = _fails(capsys, ["run", "--resume", str(uninterrupted), "--steps", "9"], "would change it: steps")
    assert "-> 9" in err and "drop them" in err
    _fails(capsys, ["run", "--resume", str(uninterrupted), "--out", "x"], "drop --out")
    _fails(capsys, ["run", "--resume", str(uninterrupted)], "already complete")
    # the original command with --resume added: its flags equal the stored configuration
    again = ["run", *SIM, "--strategies", "sync,april", "--resume", str(uninterrupted)]
    _fails(capsys, again, "already complete")
    _fails(capsys, [*again, "--hw", "mi300x"], "hardware (h100 -> mi300x)")


def test_a_torn_last_row_from_an_interruption_is_dropped_on_resume(
    uninterrupted: Path, tmp_path: Path
) -> None:
    from april_bench.results.resume import RunStatus, read_rows_for_resume

    run = tmp_path / "run"
    run.mkdir()
    for table in ("requests", "samples", "steps"):
        (run / f"{table}.jsonl").write_text((uninterrupted / f"{table}.jsonl").read_text())
    with (run / "requests.jsonl").open("a") as f:
        f.write('{"arm": "sync", "step": 1, "request_id": "sync-00')  # cut mid-write
    status = RunStatus(path=run / "status.json", completed={"sync#0": 3, "april#0": 3}, finished=[])
    kept = read_rows_for_resume(run, status, total_steps=3)
    assert len(kept["requests"]) == len((uninterrupted / "requests.jsonl").read_text().splitlines())
    assert (run / "requests.jsonl").read_text().endswith("\n")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_run_stops_cleanly_and_the_run_resumes(sig: signal.Signals, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [sys.executable, "-m", "april_bench", "run", "--hw", "mi300x", "--algo", "dapo", "--steps", "40"]
    proc = subprocess.Popen(
        [*args, "--no-progress", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    status = out / "status.json"
    while time.monotonic() < deadline:  # wait until at least one step is checkpointed
        if status.exists() and json.loads(status.read_text() or "{}").get("completed"):
            break
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), err
    assert "Traceback" not in err and "--resume" in err
    state = json.loads(status.read_text())
    assert state["state"] == "interrupted" and sum(state["completed"].values()) >= 1
    done = subprocess.run(
        [sys.executable, "-m", "april_bench", "run", "--resume", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    steps = table_rows(out, "steps")
    assert len(steps) == 3 * 40 and len({(s["arm"], s["step"]) for s in steps}) == 120


# ---------------------------------------------------------------- hangs


def test_dynamic_sampling_that_no_group_passes_fails_with_a_cap(tmp_path: Path) -> None:
    """Every reward equal: no group passes DAPO's filter. The run stops at the relaunch cap (16 x the
    over-sampling batch by default) with one line saying why, instead of relaunching forever."""
    trace = tmp_path / "lengths.jsonl"
    trace.write_text(
        "".join(json.dumps({"uid": u, "length": 100 + u % 7, "reward": 0}) + "\n" for u in range(64))
    )
    argv = [
        "run",
        *SIM,
        "--algo",
        "dapo",
        "--workload-arg",
        f"length_trace={trace}",
        "--out",
        str(tmp_path / "r"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "april_bench", *argv, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rejected by dynamic sampling" in errors[0]
    assert "--no-dynamic-sampling" in errors[0] and "max_groups_per_step" in errors[0]
    launched = int(errors[0].split(" launched ")[1].split()[0])
    over_sampling = json.loads((tmp_path / "r" / "config.json").read_text())["rollout"][
        "over_sampling_batch_size"
    ]
    assert launched <= 16 * over_sampling


def test_a_batch_no_engine_can_hold_is_refused_before_starting(capsys) -> None:
    huge = ["--rollout-batch-size", "100000000", "--over-sampling-batch-size", "100000000"]
    _fails(capsys, ["run", *SIM, *huge], "requests per launch wave")
    _fails(capsys, ["run", *SIM, "--rollout-batch-size", "1e9"], "expected a whole number")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine-arg", "max_running_requests=-1"], "max_running_requests must be >= 1"),
        (["--engine-arg", "max_running_requests=abc"], "max_running_requests='abc': expected an integer"),
        (["--engine-arg", "max_running_requests=0"], "max_running_requests must be >= 1"),
        (["--workload-arg", "nonsense=1"], "unknown --workload-arg nonsense; known:"),
        (["--workload-arg", "response_median=abc"], "response_median='abc': expected a number"),
        (["--trainer-arg", "lr=1"], "unknown --trainer-arg lr for the simulated trainer"),
        (["--task-arg", "grader=dapo"], "--task-arg is not used by this run's lengths task"),
        (["--warmstart-arg", "steps=3"], "--warmstart-arg is not used by this run's lengths task"),
        (["--max-response-len", "70000"], "lower --max-response-len"),
        (["--num-gpus", "0"], "--num-gpus must be >= 1"),
        (["--num-gpus", "-2"], "--num-gpus must be >= 1"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--data-path", "math-500=/tmp/m.jsonl"], "--data-path math-500 is not used"),
        (["--strategies", "sync,april[max_versoin_span=2]"], "unknown option of strategy 'april'"),
        (
            ["--strategies", "sync,april", "--strategy-arg", "oversample-discard.over_sampling_batch_size=9"],
            "no arm runs it",
        ),
    ],
)
def test_bad_simulator_input_is_one_line_naming_the_fix(args: list[str], message: str, capsys) -> None:
    _fails(capsys, ["run", *SIM, *args], message)
    _fails(capsys, ["validate", *SIM, *args], message)  # validate catches what run would reject


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-response-len", "2000"], "prompt + response need"),
        (["--engine-arg", "dtype=float8"], "dtype must be"),
        (["--engine-arg", "device=cuda"], "no CUDA device is visible"),
        (["--model", "qwen3-4b", "--max-response-len", "20000"], "KV cache needs"),
        (["--workload-arg", "response_median=3"], "--workload-arg is not used by this run's synthetic task"),
    ],
)
def test_bad_embedded_input_is_caught_by_validate(args: list[str], message: str, capsys) -> None:
    _fails(capsys, ["validate", *args], message)


def test_validate_takes_every_flag_run_takes(capsys) -> None:
    assert main(["validate", *SIM, "--out", "/tmp/never-created-by-validate"]) == 0
    assert not Path("/tmp/never-created-by-validate").exists()


def test_a_run_without_a_sync_arm_says_what_its_gains_are_against(tmp_path: Path, capsys) -> None:
    assert main(["run", *SIM, "--strategies", "april,oversample-discard", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "gains are against april (the run has no sync arm)" in out
    assert json.loads(out.strip().splitlines()[-1])["baseline"] == "april"


def test_a_data_file_that_loses_most_rows_is_refused_with_counts(tmp_path: Path, capsys) -> None:
    from april_bench.config import ConfigError
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.tasks.base import check_loaded
    from april_bench.tasks.lengths import sim_workload

    rows = [{"problem": "What is 1+1?", "answer": "2"}, {"problem": "What is 2+2?", "answer": "4"}]
    rows += [{"problem": "", "answer": str(i)} for i in range(3)] + [{"problem": f"q{i}"} for i in range(3)]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = ExperimentConfig(dataset="deepscaler", data_paths={"deepscaler": str(path)})
    workload = sim_workload(config)
    notes: list[str] = []
    with pytest.raises(ConfigError, match=r"kept 2 of 8 rows; skipped .*too few usable rows"):
        check_loaded("deepscaler", workload.load_report, notes=notes)
    assert notes and "kept 2 of 8" in notes[0]


def test_a_binary_data_file_is_named(tmp_path: Path, capsys) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\x00\x01\xff\xfe\x80garbage")
    _fails(
        capsys,
        ["run", *SIM, "--dataset", "deepscaler", "--data-path", f"deepscaler={path}"],
        f"{path}: not UTF-8",
    )


def test_eval_of_a_missing_local_checkpoint_fails_at_once(capsys) -> None:
    start = time.monotonic()
    _fails(capsys, ["eval", "--model", "/nonexistent/ckpt"], "no such checkpoint directory")
    assert time.monotonic() - start < 5  # never a hub lookup


def test_report_names_the_damaged_file_and_line(uninterrupted: Path, tmp_path: Path, capsys) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    data = (run / "requests.jsonl").read_bytes()
    (run / "requests.jsonl").unlink()
    packed = gzip.compress(data)
    (run / "requests.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    _fails(capsys, ["report", str(run)], "requests.jsonl.gz: damaged")
    (run / "requests.jsonl.gz").unlink()
    (run / "requests.jsonl").write_bytes(data)
    (run / "steps.jsonl").write_text('{"arm": "sync", "step": 0}\n')
    _fails(capsys, ["report", str(run)], "steps.jsonl, line 1: not a steps row (missing")
    shutil.copy(uninterrupted / "steps.jsonl", run / "steps.jsonl")
    (run / "samples.jsonl").write_text("")
    _fails(capsys, ["report", str(run)], "step rows but no sample rows")
    shutil.copy(uninterrupted / "samples.jsonl", run / "samples.jsonl")
    (run / "config.json").write_text("{broken")
    _fails(capsys, ["report", str(run)], "config.json: not valid JSON")


def test_report_refuses_rows_that_do_not_conserve_tokens(uninterrupted: Path, tmp_path: Path, capsys) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    lines = (run / "samples.jsonl").read_text().splitlines()
    (run / "samples.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")  # lose half the fates
    _fails(capsys, ["report", str(run)], "rows are missing")


def test_a_damaged_warm_start_cache_names_the_file_to_delete(tmp_path: Path, monkeypatch) -> None:
    from april_bench.config import ConfigError
    from april_bench.tasks.synthetic import SyntheticTask
    from april_bench.tasks.warmstart import WarmStart

    monkeypatch.setenv("APRIL_BENCH_CACHE", str(tmp_path))
    warm = WarmStart.Config(steps=1).build(task=SyntheticTask.Config().build())
    warm.path.parent.mkdir(parents=True)
    warm.path.write_bytes(b"not a torch file")
    with pytest.raises(ConfigError, match=rf"{warm.path} is damaged .*delete it"):
        warm.weights(progress=False)


def test_provenance_names_the_source_checkout_not_the_callers(tmp_path: Path) -> None:
    other = tmp_path / "other-repo"
    other.mkdir()
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    code = "from april_bench.results.provenance import git_info; import json; print(json.dumps(git_info()))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    info = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], cwd=other, capture_output=True, text=True, env=env, check=True
        ).stdout
    )
    repo = Path(__file__).resolve().parents[1]
    assert info["source"] == str(repo)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    assert info["commit"] == (head or None)


# ---------------------------------------------------------------- reference runs


def test_a_reference_run_from_a_dirty_tree_is_refused(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from april_bench import runner
    from april_bench.results import provenance

    root = provenance.source_root()
    assert root is not None  # the tests run from the checkout
    monkeypatch.setattr(provenance, "git_info", lambda path=None, **kw: {"commit": "abc", "dirty": True})
    target = root / "results" / "runs" / "never-written"
    _fails(capsys, ["run", "--engine", "sim", "--steps", "1", "--out", str(target)], "--allow-dirty")
    assert not target.exists()
    runner.check_reference_run(target, allow_dirty=True)  # asked for: allowed
    runner.check_reference_run(root.parent / "elsewhere", allow_dirty=False)  # not a reference run
    monkeypatch.setattr(provenance, "git_info", lambda path=None, **kw: {"commit": "abc", "dirty": False})
    runner.check_reference_run(target, allow_dirty=False)  # a clean tree: allowed


def test_atomic_json_files_get_the_usual_permissions(tmp_path: Path) -> None:
    """Temporary files are created 0600; the renamed result must be readable like any other file."""
    from april_bench.results.store import write_json_atomic

    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "summary.json", {"ok": True})
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644


def test_an_interrupt_between_a_checkpoint_and_its_status_loses_no_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uninterrupted: Path
) -> None:
    """The narrowest window: the session's checkpoint is written, the status does not name it yet.
    The resume must continue from the checkpoint the status names (rows and state agree), so every
    step is there exactly once."""
    from april_bench.results.resume import RunStatus

    calls = {"n": 0}
    original = RunStatus.step_done

    def step_done_then_interrupt(self: RunStatus, arm: str, repeat: int, done: int, **kw: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # after the checkpoint file, before the status says so
        original(self, arm, repeat, done, **kw)

    run = tmp_path / "run"
    monkeypatch.setattr(RunStatus, "step_done", step_done_then_interrupt)
    assert main(["run", *SIM, "--strategies", "sync,april", "--out", str(run)]) == 130
    monkeypatch.setattr(RunStatus, "step_done", original)
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    for table in ("steps", "requests", "samples"):
        assert comparable_rows(run, table) == comparable_rows(uninterrupted, table), table
