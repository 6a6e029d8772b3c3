"""Nothing lost under crashes, races and damaged files (issue 23).

Fault injection for each data-loss case (a torn row a checkpoint covers, two runs started at once on one
directory, a second resume while one runs), the run-directory lock, durable and relocatable run
directories, write errors, and a hostile-input suite: every damaged file a run reads is exit 2, exactly one
``error:`` line naming the file, no traceback, and a status never left ``running``.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import comparable_rows, embedded_flags, interrupt_at, one_error, sim_flags, table_rows

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.results.rundir import LOCK_NAME, RunLock

REPO = Path(__file__).resolve().parents[1]
SIM = sim_flags()
ARMS = ["--strategies", "sync,april"]


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    line = one_error(capsys.readouterr().err)
    assert message in line, line
    return line


def _state(run: Path) -> str:
    return str(json.loads((run / "status.json").read_text())["state"])


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("complete") / "run"
    assert main(["run", *SIM, *ARMS, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sync done (3 steps), april interrupted after 1 of 3 steps."""
    out = tmp_path_factory.mktemp("interrupted") / "run"
    with interrupt_at(1, "april"):
        assert main(["run", *SIM, *ARMS, "--out", str(out)]) == 130
    assert _state(out) == "interrupted"
    return out


@pytest.fixture
def copy(tmp_path: Path) -> Callable[[Path], Path]:
    def make(run: Path) -> Path:
        target = tmp_path / "copy"
        shutil.copytree(run, target)
        return target

    return make


# ---------------------------------------------------------------- the lock


def test_a_second_process_on_a_locked_directory_gets_one_line_naming_the_holder(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True, env=_env()
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        line = _fails(
            capsys,
            ["run", *SIM, "--out", str(out)],
            f"in use by another april-bench process (pid {holder.pid})",
        )
        assert "--out" in line
        assert [p.name for p in out.iterdir()] == [LOCK_NAME]  # nothing written
    finally:
        holder.kill()
        holder.communicate()


def test_a_killed_holders_lock_is_taken_over(tmp_path: Path) -> None:
    """flock is released by the kernel when its holder dies: SIGKILL leaves no stale lock."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=_env()
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
        RunLock(tmp_path).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    with RunLock(tmp_path) as lock:
        assert lock.held
        assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())


_HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from april_bench.results.rundir import RunLock\n"
    "RunLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); time.sleep(600)\n"
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_runs_started_at_once_on_one_out_never_share_it(tmp_path: Path) -> None:
    """The race of issue 23 (both exited 0 into one directory, interleaved rows), made certain: eight
    claims of one --out released together by a barrier; exactly one wins, the others are refused."""
    from april_bench.results.rundir import claim_run_dir

    out = tmp_path / "run"
    barrier = threading.Barrier(8)
    won: list[Path] = []
    refused: list[str] = []
    locks = [RunLock() for _ in range(8)]

    def claim(lock: RunLock) -> None:
        barrier.wait()
        try:
            won.append(claim_run_dir(out, default_name="x", lock=lock))
            (out / "status.json").write_text("{}")  # what the winner writes first
        except ConfigError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=claim, args=(lock,)) for lock in locks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7, refused
    assert all("in use by" in r or "already holds files" in r for r in refused)
    for lock in locks:
        lock.release()


def test_two_processes_started_together_leave_one_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "april_bench", "run", *SIM, "--out", str(out)]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        for _ in range(2)
    ]
    results = [(p.wait(timeout=600), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    err = next(e for code, e in results if code == 2)
    assert "in use by" in one_error(err) or "already holds files" in one_error(err)
    steps = table_rows(out, "steps")
    assert len(steps) == len({(s["arm"], s["step"]) for s in steps}) == 3 * 3  # 3 default arms, 3 steps


def test_a_second_resume_while_one_runs_is_refused_and_touches_nothing(
    interrupted_run: Path, copy: Callable[[Path], Path], capsys
) -> None:
    """Staggered double resume (issue 23: the directory ended failed with rows missing): the second is
    refused while the first holds the lock; the first then completes with every row."""
    run = copy(interrupted_run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != LOCK_NAME}
    with RunLock(run):  # the first resume, running
        _fails(capsys, ["run", "--resume", str(run), "--no-progress"], f"pid {os.getpid()}")
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != LOCK_NAME}
    assert after == before
    assert main(["run", "--resume", str(run), "--no-progress"]) == 0
    steps = table_rows(run, "steps")
    assert len(steps) == len({(s["arm"], s["step"]) for s in steps}) == 6


# ---------------------------------------------------------------- durable rows


def test_a_torn_row_the_checkpoint_covers_is_refused_not_dropped(
    interrupted_run: Path, copy: Callable[[Path], Path], capsys
) -> None:
    """Issue 23: a torn last line of a covered row was dropped and the run finished with 299 of 300."""
    run = copy(interrupted_run)
    steps = run / "steps.jsonl"
    lines = steps.read_text().splitlines()
    covered = [i for i, line in enumerate(lines) if json.loads(line)["arm"] == "sync"]
    kept = [line for i, line in enumerate(lines) if i != covered[-1]]
    torn = lines[covered[-1]][: len(lines[covered[-1]]) // 2]
    steps.write_text("\n".join(kept) + "\n" + torn)  # the last line cut mid-write
    before = steps.read_bytes()
    line = _fails(capsys, ["run", "--resume", str(run), "--no-progress"], "holds 2 of the 3 steps rows")
    assert str(steps) in line and "sync#0" in line
    assert steps.read_bytes() == before  # refused before any file is rewritten
    assert _state(run) == "interrupted"


def test_the_status_counts_rows_only_after_they_are_fsynced(tmp_path: Path, monkeypatch) -> None:
    """Rows a checkpoint covers reach the disk (fsync) before the status that counts them is renamed
    into place, and every JSON file is fsynced before its rename."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    out = tmp_path / "run"
    assert main(["run", *SIM, "--strategies", "sync", "--out", str(out)]) == 0
    status_writes = [
        i for i, (kind, path) in enumerate(events) if kind == "replace" and path.endswith("status.json")
    ]
    assert len(status_writes) >= 4  # start, 3 steps, end
    for i in status_writes[1:4]:  # after each step
        synced = {Path(path).name for kind, path in events[:i] if kind == "fsync"}
        assert {"steps.jsonl", "requests.jsonl", "samples.jsonl"} <= synced
        assert events[i - 1][0] == "fsync"  # the status's own temporary file
    status = json.loads((out / "status.json").read_text())
    assert status["rows"]["sync#0"]["steps"] == 3


def test_a_full_disk_ends_the_run_as_interrupted_with_the_resume_line(tmp_path: Path) -> None:
    """RLIMIT_FSIZE (``ulimit -f``) in a subprocess: the write fails with EFBIG; one error line with the
    resume command, status interrupted; the resume (limit lifted) finishes the run."""
    import resource

    out = tmp_path / "run"
    limit = 60_000  # bytes: requests.jsonl outgrows it within the run

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    argv = [sys.executable, "-m", "april_bench", "run", *SIM, *ARMS, "--steps", "6", "--out", str(out)]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=_env(), preexec_fn=small_files, timeout=600
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error(proc.stderr)
    assert "File too large" in line and f"--resume {out}" in line
    assert _state(out) == "interrupted"
    done = subprocess.run(
        [sys.executable, "-m", "april_bench", "run", "--resume", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = table_rows(out, "steps")
    assert len(steps) == len({(s["arm"], s["step"]) for s in steps}) == 12


# ---------------------------------------------------------------- relocatable run directories


def test_the_trainer_file_is_found_inside_the_run_directory(tmp_path: Path) -> None:
    from april_bench.results.validate_files import trainer_file

    original, moved = tmp_path / "a", tmp_path / "b"
    for run in (original, moved):
        (run / "state").mkdir(parents=True)
        (run / "state" / "sync-r0-s2.trainer.pt").write_bytes(b"x")
    assert trainer_file(moved, "state/sync-r0-s2.trainer.pt") == moved / "state" / "sync-r0-s2.trainer.pt"
    # a checkpoint written before paths were relative named the original's file: the copy's own is used
    legacy = str(original / "state" / "sync-r0-s2.trainer.pt")
    assert trainer_file(moved, legacy) == moved / "state" / "sync-r0-s2.trainer.pt"
    assert (
        trainer_file(moved, "runs/x/state/sync-r0-s2.trainer.pt") == moved / "state" / "sync-r0-s2.trainer.pt"
    )


def test_a_copied_run_directory_resumes_on_its_own(
    interrupted_run: Path, tmp_path: Path, complete_run: Path
) -> None:
    moved = tmp_path / "elsewhere" / "moved"
    shutil.copytree(interrupted_run, moved)
    stale = moved / "state" / "april-bench-weights-killed"  # what a SIGKILLed session leaves
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x")
    cwd = Path.cwd()
    os.chdir(tmp_path / "elsewhere")
    try:
        assert main(["run", "--resume", "moved", "--no-progress"]) == 0
    finally:
        os.chdir(cwd)
    for table in ("steps", "requests", "samples"):
        assert comparable_rows(moved, table) == comparable_rows(complete_run, table), table
    assert _state(interrupted_run) == "interrupted"  # the original is untouched
    assert not stale.exists()
    assert not list((moved / "state").glob("april-bench-weights-*"))  # the sessions' own were removed


# ---------------------------------------------------------------- refusing results


def test_compare_report_and_paper_refuse_an_interrupted_run_unless_asked(
    interrupted_run: Path, complete_run: Path, capsys
) -> None:
    line = _fails(
        capsys, ["compare", str(complete_run), str(interrupted_run)], "interrupted after 4 of 6 steps"
    )
    assert "--allow-incomplete" in line
    _fails(capsys, ["report", str(interrupted_run)], "interrupted after")
    assert main(["report", str(interrupted_run), "--allow-incomplete"]) == 0
    assert "interrupted" in capsys.readouterr().err
    assert main(["compare", str(complete_run), str(interrupted_run), "--allow-incomplete"]) in (0, 1)
    from april_bench.results.paper import paper_tables
    from april_bench.results.store import load_run

    cells = paper_tables([load_run(complete_run), load_run(interrupted_run)])[0].cells
    marked = [row for row in cells if "INCOMPLETE" in " ".join(row)]
    assert len(marked) == 2 and len(cells) == 4  # the interrupted run's two arms, marked


def test_duplicated_rows_are_refused(complete_run: Path, copy: Callable[[Path], Path], capsys) -> None:
    run = copy(complete_run)
    for table in ("steps", "requests"):
        text = (run / f"{table}.jsonl").read_text()
        (run / f"{table}.jsonl").write_text(text + text)  # row files concatenated twice
    line = _fails(capsys, ["report", str(run)], "duplicated steps rows")
    assert "duplicated requests rows" in line
    _fails(capsys, ["compare", str(complete_run), str(run)], "duplicated steps rows")


def test_compare_refuses_rows_that_do_not_conserve_tokens(
    complete_run: Path, copy: Callable[[Path], Path], capsys
) -> None:
    run = copy(complete_run)
    lines = (run / "samples.jsonl").read_text().splitlines()
    (run / "samples.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    _fails(capsys, ["compare", str(complete_run), str(run)], "rows are missing")


# ---------------------------------------------------------------- reference runs


def test_untracked_files_make_the_checkout_dirty_and_the_run_dir_does_not(tmp_path: Path) -> None:
    from april_bench.results.provenance import git_info

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "code.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("ignored/\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    assert git_info(repo)["dirty"] is False
    (repo / "ignored").mkdir()
    (repo / "ignored" / "x.py").write_text("")
    assert git_info(repo)["dirty"] is False  # gitignored: not code of the run
    (repo / "results" / "runs" / "new").mkdir(parents=True)
    (repo / "results" / "runs" / "new" / "steps.jsonl").write_text("{}\n")
    assert git_info(repo)["dirty"] is True
    assert git_info(repo, exclude=repo / "results" / "runs" / "new")["dirty"] is False  # the run's own rows
    (repo / "new_module.py").write_text("y = 2\n")
    assert git_info(repo, exclude=repo / "results" / "runs" / "new")["dirty"] is True  # an untracked module


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--resume", "results/runs/sim-mi300x-dapo-dapo-math-17k"],
        ["ablate", "--hw", "h100", "--steps", "1", "--out", "results/ablations/never-written"],
        ["run", "--hw", "h100", "--steps", "1", "--out", "results/runs/never-written"],
        ["eval", "--model", "/nonexistent", "--out", "results/runs/never-written"],
        ["plot", "results/runs/sim-mi300x-dapo-dapo-math-17k", "--out", "results/runs/never-written"],
    ],
    ids=["resume", "ablate", "run", "eval", "plot"],
)
def test_every_command_writing_under_results_keeps_the_reference_rule(
    argv: list[str], capsys, monkeypatch
) -> None:
    from april_bench.results import provenance

    monkeypatch.setattr(provenance, "git_info", lambda path=None, **kw: {"commit": "abc", "dirty": True})
    root = provenance.source_root()
    assert root is not None
    argv = [str(root / a) if a.startswith("results/") else a for a in argv]
    before = (
        _state(root / "results/runs/sim-mi300x-dapo-dapo-math-17k")
        if (root / "results/runs/sim-mi300x-dapo-dapo-math-17k/status.json").exists()
        else None
    )
    _fails(capsys, argv, "--allow-dirty")
    assert not (root / "results" / "runs" / "never-written").exists()
    assert not (root / "results" / "ablations" / "never-written").exists()
    if before is not None:
        assert _state(root / "results/runs/sim-mi300x-dapo-dapo-math-17k") == before


# ---------------------------------------------------------------- where a run may be written


def test_an_unwritable_working_directory_says_out(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "runs").write_text("a file where the runs folder would go")  # root ignores chmod
    monkeypatch.chdir(tmp_path)
    _fails(capsys, ["run", *SIM], "pass --out DIR")


def test_an_unwritable_cache_says_april_bench_cache(tmp_path: Path, monkeypatch) -> None:
    from april_bench.tasks.warmstart import cache_dir, writable_cache

    home = tmp_path / "home"
    home.write_text("not a directory")
    monkeypatch.delenv("APRIL_BENCH_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ConfigError, match="set APRIL_BENCH_CACHE to a writable directory"):
        writable_cache(cache_dir() / "warmstart")


# ---------------------------------------------------------------- temporary files


def test_trainer_state_files_use_unique_temporary_names(tmp_path: Path, monkeypatch) -> None:
    import torch

    from april_bench.trainers.state_file import save_atomic

    target = tmp_path / "s.trainer.pt"
    (tmp_path / "s.trainer.pt.tmp").write_text("another process's temporary file")
    save_atomic({"w": torch.ones(2)}, target)
    assert (tmp_path / "s.trainer.pt.tmp").read_text() == "another process's temporary file"
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(2))

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(27, "File too large")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError):
        save_atomic({"w": torch.ones(2)}, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.trainer.pt", "s.trainer.pt.tmp"]  # no leftover


def test_config_and_trace_files_use_unique_temporary_names(tmp_path: Path) -> None:
    """The probes rerun found two more fixed ``.NAME.tmp`` names (config.yaml, `whatif --out` traces):
    another process's file of that name is left alone, and no temporary file is left behind."""
    from april_bench.config_files import read_config_file, write_config_file
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.trace.format import TraceHeader, TraceRow, write_trace

    config_path, trace_path = tmp_path / "config.yaml", tmp_path / "t.jsonl"
    for path in (config_path, trace_path):
        path.with_name(f".{path.name}.tmp").write_text("another process's temporary file")
    write_config_file(config_path, ExperimentConfig())
    assert read_config_file(config_path)
    header = TraceHeader(source="test", evidence="per-sample", token_counts="exact")
    row = TraceRow(
        step=1, prompt_id="p", sample_index=0, prompt_tokens=1, response_tokens=3, finish="stop", reward=None
    )
    assert write_trace(trace_path, header, [row]) == 1
    assert json.loads(trace_path.read_text().splitlines()[0])["source"] == "test"
    for path in (config_path, trace_path):
        assert path.with_name(f".{path.name}.tmp").read_text() == "another process's temporary file"
        assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode
    assert len(list(tmp_path.iterdir())) == 4


# ---------------------------------------------------------------- the hostile-input suite

#: (file in the run directory, content) -> the message's part. ``None`` content: the file is deleted.
_DAMAGED_RUN_FILES: list[tuple[str, bytes | None, str]] = [
    ("status.json", b"{}", "field 'state' is missing"),
    ("status.json", b"[]", "must be a JSON object"),
    ("status.json", b"", "is not valid JSON"),
    ("status.json", b'{"state": "inter', "is not valid JSON"),
    ("status.json", b"\xff\xfe\x00garbage", "is not UTF-8"),
    ("status.json", b"null", "must be a JSON object"),
    ("status.json", None, "has no status.json"),
    ("status.json", b'{"state": 3, "completed": {}}', "field 'state' must be one of"),
    ("status.json", b'{"state": "paused", "completed": {}}', "field 'state' must be one of"),
    ("status.json", b'{"state": "interrupted", "completed": []}', "field 'completed' must be"),
    ("status.json", b'{"state": "interrupted", "completed": {"sync#0": "3"}}', "field 'completed' must be"),
    ("status.json", b'{"state": "interrupted", "completed": {"sync#0": -1}}', "field 'completed' must be"),
    ("status.json", b'{"state": "interrupted", "completed": {}, "finished": "sync#0"}', "'finished' must be"),
    ("status.json", b'{"state": "interrupted", "completed": {}, "rows": {"sync#0": 3}}', "'rows' must map"),
    ("status.json", b'{"state": "interrupted", "completed": {"nonsense": 1}}', "is not a session name"),
    ("state/april-r0-s1.json", None, "the checkpoint of session april#0 is missing"),
    ("state/april-r0-s1.json", b"", "is not valid JSON"),
    ("state/april-r0-s1.json", b"{}", "field 'completed_steps' is missing"),
    ("state/april-r0-s1.json", b'{"completed_steps": 1, "clo', "is not valid JSON"),
    ("state/april-r0-s1.json", b"\x80\x81random", "is not UTF-8"),
    ("state/april-r0-s1.json", b"[1, 2]", "must be a JSON object"),
    ("provenance.json", b"{broken", "is not valid JSON"),
    ("provenance.json", b"[]", "must be a JSON object"),
    ("provenance.json", b'{"machine": {}}', "field 'result_kind' is missing"),
    ("provenance.json", b"\xff\xff", "is not UTF-8"),
    ("config.json", b"{broken", "is not valid JSON"),
    ("config.json", None, "the run configuration is missing"),
    ("requests.jsonl", b"\xff\xfe\xfd binary\n", "not UTF-8"),
    ("requests.jsonl", b"not json at all\n{}\n", "line 1: not a JSON row"),
    ("steps.jsonl", b"[1, 2]\n", "line 1: a row must be a JSON object"),
]

#: Checkpoint fields of the wrong type.
_BAD_CHECKPOINT_FIELDS: list[tuple[str, Any, str]] = [
    ("completed_steps", 7, "field 'completed_steps' must be 1"),
    ("clock_now", "abc", "field 'clock_now' must be a number"),
    ("run_elapsed", None, "field 'run_elapsed' must be a number"),
    ("rollout", None, "field 'rollout' must be an object"),
    ("strategy", [], "field 'strategy' must be an object"),
    ("engine", "x", "field 'engine' must be an object or null"),
    ("trainer_file", 5, "field 'trainer_file' must be a file name or null"),
    ("trainer_file", "state/april-r0-s1.trainer.pt", "the trainer state of session april#0 is missing"),
]


@pytest.mark.parametrize(("name", "content", "message"), _DAMAGED_RUN_FILES, ids=lambda v: None)
def test_a_damaged_run_file_is_one_line_and_the_status_is_never_left_running(
    name: str,
    content: bytes | None,
    message: str,
    interrupted_run: Path,
    copy: Callable[[Path], Path],
    capsys,
) -> None:
    run = copy(interrupted_run)
    if content is None:
        (run / name).unlink()
    else:
        (run / name).write_bytes(content)
    line = _fails(capsys, ["run", "--resume", str(run), "--no-progress"], message)
    assert name.split("/")[-1] in line or "status.json" in line or "is missing" in line
    try:
        state = json.loads((run / "status.json").read_text()).get("state")
    except (OSError, ValueError, AttributeError):
        state = None
    assert state != "running"


@pytest.mark.parametrize(("field", "value", "message"), _BAD_CHECKPOINT_FIELDS)
def test_a_checkpoint_field_of_the_wrong_type_is_one_line(
    field: str, value: Any, message: str, interrupted_run: Path, copy: Callable[[Path], Path], capsys
) -> None:
    run = copy(interrupted_run)
    path = run / "state" / "april-r0-s1.json"
    saved = json.loads(path.read_text())
    saved[field] = value
    path.write_text(json.dumps(saved))
    line = _fails(capsys, ["run", "--resume", str(run), "--no-progress"], message)
    assert "april-r0-s1" in line
    assert _state(run) == "interrupted"


_BAD_TRACES: list[tuple[str, bytes, str]] = [
    ("nan.jsonl", b'{"uid": 0, "length": NaN}\n', "line 1: 'length' must be a whole number"),
    ("inf.jsonl", b'{"uid": 0, "length": 100}\n{"uid": 1, "length": Infinity}\n', "line 2: 'length' must be"),
    ("text.jsonl", b'{"uid": 0, "length": "abc"}\n', "line 1: 'length' must be"),
    ("null.jsonl", b'{"uid": 0, "length": null}\n', "line 1: 'length' must be"),
    ("bool.jsonl", b'{"uid": 0, "length": true}\n', "line 1: 'length' must be"),
    ("zero.jsonl", b'{"uid": 0, "length": 0}\n', "line 1: 'length' must be"),
    ("frac.jsonl", b'{"uid": 0, "length": 12.5}\n', "line 1: 'length' must be"),
    ("random.jsonl", bytes(range(256)) * 2, "not UTF-8"),
    ("plain.jsonl", b"these are not json rows\n", "line 1: not a JSON object"),
    ("list.jsonl", b"[1, 2, 3]\n", "line 1: a row must be a JSON object"),
    ("nolength.jsonl", b'{"uid": 0, "length": 5}\n{"uid": 1, "len": 5}\n', "line 2: no 'length' field"),
    ("uid.jsonl", b'{"uid": "first", "length": 5}\n', "line 1: 'uid' must be a whole number"),
    ("missing-uid.jsonl", b'{"uid": 0, "length": 5}\n{"length": 6}\n', "line 2: no 'uid'"),
    ("empty-cell.csv", b"uid,length\n0,5\n1,\n", "line 3: 'length' must be"),
    ("nul.csv", b"uid,length\n0,5\x00\n", "a NUL byte"),
    ("long-row.csv", b"uid,length\n0,5,9\n", "line 2: more cells than the header"),
    ("nocolumn.csv", b"plain text, not a trace\nmore text\n", "no 'length' field"),
    ("random.csv", b"\xff\xfe\x00\x01" * 20, "not UTF-8"),
]


@pytest.mark.parametrize(("name", "content", "message"), _BAD_TRACES, ids=[t[0] for t in _BAD_TRACES])
@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_bad_length_trace_is_one_line_naming_file_and_line(
    name: str, content: bytes, message: str, command: str, tmp_path: Path, capsys
) -> None:
    trace = tmp_path / name
    trace.write_bytes(content)
    argv = [command, *SIM, "--workload-arg", f"length_trace={trace}", "--out", str(tmp_path / "r")]
    line = _fails(capsys, argv, message)
    assert str(trace) in line


def test_a_truncated_trainer_state_is_one_line(tmp_path: Path) -> None:
    import torch

    from april_bench.results.validate_files import load_trainer_state

    path = tmp_path / "s.trainer.pt"
    torch.save({"model": {"w": torch.ones(100)}, "optimizer": {}}, path)
    path.write_bytes(path.read_bytes()[:200])

    def load(p: str) -> None:
        torch.load(p, weights_only=True)

    with pytest.raises(ConfigError, match=r"trainer state is damaged or truncated.*--overwrite"):
        load_trainer_state(path, load)


class _NotATensor:
    pass


def test_a_trainer_state_a_safe_load_refuses_is_one_line(tmp_path: Path) -> None:
    import torch

    from april_bench.results.validate_files import load_trainer_state

    path = tmp_path / "s.trainer.pt"
    torch.save({"model": _NotATensor()}, path)

    def load(p: str) -> None:
        torch.load(p, weights_only=True)

    with pytest.raises(ConfigError, match="objects a safe load refuses"):
        load_trainer_state(path, load)
    path.write_bytes(pickle.dumps({"x": 1}, protocol=2)[:5])
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        load_trainer_state(path, load)


def test_the_hostile_suite_has_at_least_forty_cases() -> None:
    cases = len(_DAMAGED_RUN_FILES) + len(_BAD_CHECKPOINT_FIELDS) + 2 * len(_BAD_TRACES)
    assert cases >= 40, cases


@pytest.fixture
def interactive_sigint():
    """SIGINT as an interactive Python has it.  A process started in the background by a
    non-interactive shell (``cmd &``, as a CI script may run the suite) inherits SIGINT ignored, and
    Python then installs no handler: the interrupt tests need the handler a terminal user has."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_signals_cancel_the_loop_instead_of_raising_inside_it(interactive_sigint) -> None:
    """SIGINT while the loop runs cancels the main task: every task unwinds at an ``await`` (no lost
    wake-up, no task destroyed pending) and the caller sees ``KeyboardInterrupt``."""
    import asyncio
    import gc
    import warnings

    from april_bench.vtime import run_real

    finished: list[str] = []

    async def worker() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            finished.append("worker")

    async def main_task() -> None:
        task = asyncio.ensure_future(worker())
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)
        await task

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KeyboardInterrupt):
            run_real(main_task())
        gc.collect()
    assert finished == ["worker"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    time.sleep(0)  # nothing pending is left to run


def test_a_signal_another_thread_takes_still_stops_the_loop_at_once(interactive_sigint) -> None:
    """The kernel may deliver SIGINT to any thread (telemetry's sampler, an engine's worker); the loop,
    asleep in ``select()``, must wake for it then, not when its 30 s sleep ends.  Checked on the loop's
    own clock against the sleep's length: a plain Python handler runs only once ``select()`` returns
    (after the whole sleep), the loop's signal handling wakes it through its self-pipe at once."""
    import asyncio
    import threading

    from april_bench.vtime import run_real

    release = threading.Event()
    other = threading.Thread(target=release.wait, args=(120,), daemon=True)
    other.start()
    sleep_s = 30.0
    woke_after: list[float] = []

    async def main_task() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.05)
        sent = loop.time()
        signal.pthread_kill(other.ident or 0, signal.SIGINT)  # to the other thread, not this one
        try:
            await asyncio.sleep(sleep_s)
        finally:
            woke_after.append(loop.time() - sent)

    try:
        with pytest.raises(KeyboardInterrupt):
            run_real(main_task())
    finally:
        release.set()
        other.join()
    assert woke_after and woke_after[0] < sleep_s / 2  # not woken by the sleep's end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ---------------------------------------------------------------- the vLLM server's dev routes


async def _canned_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any], *, unix: str | None = None
) -> asyncio.AbstractServer:
    if unix is not None:
        return await asyncio.start_unix_server(handle, path=unix)
    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _answer_200(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nfalse")
    await writer.drain()
    writer.close()


def test_a_launched_vllm_server_listens_on_a_private_unix_socket() -> None:
    from april_bench.engines.vllm.server import VLLMServerEngine, launch_command

    engine = VLLMServerEngine.Config(model_path="/ckpt", max_model_len=64).build()
    assert engine.server is not None and engine.server.unix_socket is not None
    socket_dir = Path(engine.server.unix_socket).parent
    assert socket_dir.stat().st_mode & 0o777 == 0o700  # this user only
    assert "--uds" in engine.server.command and "--port" not in engine.server.command
    assert engine.server.env["VLLM_SERVER_DEV_MODE"] == "1"
    asyncio.run(engine.close())
    assert not socket_dir.exists()  # removed with the engine
    tcp = launch_command(VLLMServerEngine.Config(model_path="/ckpt", unix_socket=False), 8123)
    assert "--uds" not in tcp and tcp[tcp.index("--port") + 1] == "8123"


def test_the_http_client_speaks_over_a_unix_socket(tmp_path: Path) -> None:
    from april_bench.engines.server.http import HTTPClient

    async def body() -> int:
        server = await _canned_server(_answer_200, unix=str(tmp_path / "s.sock"))
        client = HTTPClient("http://localhost", unix_socket=str(tmp_path / "s.sock"))
        try:
            return (await client.get("/health", timeout=10)).status
        finally:
            await client.aclose()
            server.close()
            await server.wait_closed()

    assert asyncio.run(body()) == 200


def test_attaching_to_a_server_with_open_dev_routes_warns(capsys) -> None:
    from april_bench.engines.server.http import HTTPClient
    from april_bench.engines.vllm.server import VLLMServerEngine

    async def body() -> None:
        server = await _canned_server(_answer_200)
        port = server.sockets[0].getsockname()[1]
        engine = VLLMServerEngine.Config(url=f"http://127.0.0.1:{port}").build()
        engine._client = HTTPClient(engine.url)
        try:
            await engine._warn_if_dev_routes_open()
        finally:
            await engine._client.aclose()
            server.close()
            await server.wait_closed()

    asyncio.run(body())
    err = capsys.readouterr().err
    assert err.startswith("warning:") and "without authentication" in err


@pytest.mark.slow
def test_a_copied_embedded_run_resumes_from_its_own_trainer_state(tmp_path: Path, monkeypatch) -> None:
    """A real trainer's state file: the copy's checkpoint names it relative to the copy, so the resume
    reads the copy's file (the original's is destroyed here and the resume still succeeds)."""
    tiny = embedded_flags(
        strategies="sync",
        steps=2,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        over_sampling_batch_size=2,
        max_response_len=32,
        warmstart_arg="steps=5",
        eval_every=100,
    )
    monkeypatch.setenv("APRIL_BENCH_CACHE", os.environ.get("APRIL_BENCH_CACHE", str(tmp_path / "cache")))
    monkeypatch.chdir(tmp_path)
    with interrupt_at(1):
        assert main(["run", *tiny, "--out", "first"]) == 130
    saved = json.loads((tmp_path / "first" / "state" / "sync-r0-s1.json").read_text())
    assert saved["trainer_file"] == "state/sync-r0-s1.trainer.pt"  # relative to the run directory
    (tmp_path / "elsewhere").mkdir()
    shutil.copytree(tmp_path / "first", tmp_path / "elsewhere" / "copy")
    (tmp_path / "first" / "state" / "sync-r0-s1.trainer.pt").write_bytes(b"destroyed")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["run", "--resume", "copy", "--no-progress"]) == 0
    steps = table_rows(tmp_path / "elsewhere" / "copy", "steps")
    assert [s["step"] for s in steps] == [0, 1]


def test_a_hung_up_stream_returns_only_what_arrived_before_the_hang_up(tmp_path: Path) -> None:
    """The vLLM server adapter's abort: after ``HTTPStream.close()`` its events end, without an error,
    and nothing the server sends after the hang-up is returned (docs/engines.md: an aborted request's
    tokens were streamed before its abort)."""
    from april_bench.engines.server.http import HTTPStream

    hung_up = asyncio.Event()
    sent_after: list[bool] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        event = b"data: first\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await hung_up.wait()
        await asyncio.sleep(0.05)
        late = b"data: after the hang-up\n\n"
        try:
            writer.write(b"%x\r\n%s\r\n" % (len(late), late))
            await writer.drain()
            sent_after.append(True)
        except ConnectionError:
            sent_after.append(False)
        writer.close()

    async def body() -> list[str]:
        server = await _canned_server(handle, unix=str(tmp_path / "s.sock"))
        stream = HTTPStream("localhost", 0, b"POST / HTTP/1.1\r\n\r\n", unix_socket=str(tmp_path / "s.sock"))
        got = []
        try:
            assert await stream.open() == 200
            async for data in stream.events():
                got.append(data)
                stream.close()  # the abort: hang up after the first event
                hung_up.set()
            await asyncio.sleep(0.2)
        finally:
            server.close()
            await server.wait_closed()
        return got

    assert asyncio.run(body()) == ["first"]
    assert sent_after  # the server did try to send more
