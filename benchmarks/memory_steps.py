"""Peak memory of a simulated run against its number of steps: it should stay flat.

A run streams its rows to disk as it goes and accumulates its summary row by row
(:mod:`april_bench.results.accumulate`), so a simulated run's requests and samples never pile up in
memory.  This runs the same simulated command at ``--steps`` 20, 200 and 2,000, each in a fresh
subprocess, and reports each one's peak resident memory (``ru_maxrss``) and wall time.  Target: the
2,000-step run's peak within 1.5x of the 20-step run's.

    python benchmarks/memory_steps.py                  # results/benchmarks/memory_steps.{json,md}
    python benchmarks/memory_steps.py --steps 20,80    # other step counts
    python benchmarks/memory_steps.py --args "--hw mi300x --algo dapo"   # another command (slower)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from april_bench.results.provenance import collect_provenance

#: A small simulated setting, so that 2,000 steps take minutes rather than an hour.
DEFAULT_ARGS = (
    "--hw h100 --rollout-batch-size 4 --n-samples-per-prompt 4 --over-sampling-batch-size 8 "
    "--max-response-len 2048 --strategies sync,oversample-discard,april"
)
_CHILD = (
    "import json, resource, sys\n"
    "from april_bench.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "print('PEAK ' + json.dumps({'rc': rc, 'maxrss_kib': peak}))\n"
)


def measure(args: list[str], steps: int, out: Path) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-c",
        _CHILD,
        "run",
        *args,
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--no-progress",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PEAK ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"error: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    peak = json.loads(line.removeprefix("PEAK "))
    return {"steps": steps, "peak_mib": peak["maxrss_kib"] / 1024, "wall_s": wall, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="20,200,2000", help="comma-separated step counts")
    parser.add_argument("--args", default=DEFAULT_ARGS, help="the simulated run's other arguments")
    parser.add_argument("--out", default="results/benchmarks", help="directory for the json and md")
    args = parser.parse_args()
    run_args = shlex.split(args.args)
    counts = [int(s) for s in args.steps.split(",")]
    with tempfile.TemporaryDirectory(prefix="memory-steps-") as scratch:
        rows = [measure(run_args, n, Path(scratch) / f"run{n}") for n in counts]
    ratio = rows[-1]["peak_mib"] / rows[0]["peak_mib"]
    result = {
        "command": " ".join(["python", *sys.argv]),
        "run_args": args.args,
        "rows": rows,
        "peak_ratio_last_to_first": ratio,
        "target": 1.5,
        "provenance": collect_provenance(simulated=True, engine="sim"),
    }
    lines = [
        "## Peak memory of a simulated run against its steps (measured)",
        "",
        f"`python -m april_bench run {args.args} --steps N`, each N in a fresh subprocess; peak = ru_maxrss.",
        "",
        "| Steps | Peak MiB | Wall s | Load (1 min) |",
        "|---|---|---|---|",
        *(f"| {r['steps']:,} | {r['peak_mib']:.0f} | {r['wall_s']:.0f} | {r['load']:.1f} |" for r in rows),
        "",
        f"Peak at {counts[-1]:,} steps / at {counts[0]:,}: **{ratio:.2f}x** (target: at most 1.5x).",
        f"Command: `{result['command']}` at commit {result['provenance']['git'].get('commit')} "
        f"(dirty: {result['provenance']['git'].get('dirty')}) on {os.cpu_count()} cores (shared).",
        "",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory_steps.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "memory_steps.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
