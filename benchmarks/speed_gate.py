"""The gate on april-bench's own speed: the simulator's work per CPU second, against a reference loop.

Two fixed simulated workloads are timed in CPU seconds (``time.process_time``) together with a fixed
pure-Python reference loop (:func:`reference_loop`: heap, dict and float work of the same kind as the
simulator's event loop) in the same process, the three interleaved ``--repeats`` times:

- ``simulator``: a small simulated run (:func:`simulate`: sync and APRIL, 16 groups x 8 on the H100
  profile, 6 steps, in memory), counted in simulated requests;
- ``paper_table``: a cell of the paper table's agent row (:func:`simulate_agent_cell`: the code of
  ``benchmarks/paper_table.py``, 4 tool calls of 5 s per episode on MI300X, 2 steps per arm), counted in
  simulated steps: the paper table's time per simulated step, where every tool call is a turn of its
  own (the row that once made the whole table 57x slower).

The fastest time of each (the least disturbed by other processes) gives rates: work per CPU second
and reference operations per CPU second.  Each workload's ratio to the reference cancels the machine's
speed and most of its load; it is compared with the ratio committed in ``benchmarks/speed_gate.json``
and the gate fails (exit 1) when either falls below half of its reference, so a change that makes the
simulator or the paper table twice as slow cannot land unseen.  Every number is measured on the
machine that runs it; only the ratios are compared.

    python benchmarks/speed_gate.py                 # the gate (tox runs it): exit 1 below half
    python benchmarks/speed_gate.py --update        # measure and commit a new reference (say why)
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

#: The committed reference ratios (``--update`` writes them).
REFERENCE = Path(__file__).with_name("speed_gate.json")
#: The gate fails below this share of a committed ratio.
FLOOR = 0.5
#: Iterations of the reference loop: about as many CPU seconds as one simulated run.
REFERENCE_OPS = 150_000
#: The paper table's agent cell the gate times: MI300X, mean tool calls, median tool latency, steps per arm.
AGENT_CELL = ("mi300x", 4.0, 5.0, 2)


def simulate() -> int:
    """One fixed small simulated run; returns the simulated requests it served."""
    from april_bench.experiment import ExperimentConfig, run
    from april_bench.rollout.loop import RolloutConfig

    config = ExperimentConfig(
        hardware="h100",
        algorithm="grpo",
        engine="sim",
        steps=6,
        strategies=("sync", "april"),
        rollout=RolloutConfig(
            rollout_batch_size=16, n_samples_per_prompt=8, over_sampling_batch_size=32, max_response_len=8192
        ),
    )
    result = run(config, progress=False)
    return len(result.recorder.tables["requests"])


def _paper_table() -> Any:
    """``benchmarks/paper_table.py`` as a module (this file runs as a script and as a test's module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper_table", Path(__file__).with_name("paper_table.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def simulate_agent_cell(paper_table: Any) -> int:
    """One fixed agent cell of the paper table, through the table's own code; returns the simulated
    steps (of both arms) it ran."""
    hardware, calls, latency_s, steps = AGENT_CELL
    cell = paper_table.simulate_agent(hardware, calls, latency_s, steps=steps)
    assert cell["sync_turns_per_episode"], "the agent cell ran no tool turns"
    return steps * len(paper_table.ARMS)


def reference_loop(ops: int = REFERENCE_OPS) -> int:
    """A fixed pure-Python loop of the simulator's kind of work (a heap of timed events over a few
    thousand live entries, dict updates, float arithmetic, small lists); returns the operations done."""
    heap: list[tuple[float, int]] = []
    live: dict[int, list[float]] = {}
    clock, total = 0.0, 0.0
    for i in range(ops):
        heapq.heappush(heap, (clock + (i * 7919 % 1000) * 1e-3, i))
        live[i] = [clock, float(i % 13), float(i)]
        if len(heap) > 4096:
            clock, j = heapq.heappop(heap)
            entry = live.pop(j)
            total += (clock - entry[0]) * entry[1] + len(live) * 1e-9
    return ops if total >= 0.0 else 0


def _timed(work: Any) -> tuple[int, float]:
    gc.collect()  # each timing starts from the same heap, not from the last one's garbage
    start = time.process_time()
    count = work()
    return count, time.process_time() - start


def measure(repeats: int) -> dict[str, Any]:
    """The rates and their ratios: the fastest of ``repeats`` interleaved CPU timings of each."""
    paper_table = _paper_table()
    workloads = {"simulator": simulate, "paper_table": lambda: simulate_agent_cell(paper_table)}
    for work in (*workloads.values(), reference_loop):
        work()  # warm: imports, profiles and caches are not the per-request work
    times: dict[str, list[float]] = {name: [] for name in (*workloads, "reference")}
    counts: dict[str, int] = {}
    for _ in range(repeats):
        counts["reference"], seconds = _timed(reference_loop)
        times["reference"].append(seconds)
        for name, work in workloads.items():
            counts[name], seconds = _timed(work)
            times[name].append(seconds)
    ref_rate = counts["reference"] / min(times["reference"])
    sim_rate = counts["simulator"] / min(times["simulator"])
    table_rate = counts["paper_table"] / min(times["paper_table"])
    return {
        "simulated_requests": counts["simulator"],
        "simulator_cpu_s": min(times["simulator"]),
        "simulated_requests_per_cpu_s": sim_rate,
        "paper_table_steps": counts["paper_table"],
        "paper_table_cpu_s": min(times["paper_table"]),
        "paper_table_steps_per_cpu_s": table_rate,
        "reference_ops": counts["reference"],
        "reference_cpu_s": min(times["reference"]),
        "reference_ops_per_cpu_s": ref_rate,
        "ratio": sim_rate / ref_rate,
        "paper_table_ratio": table_rate / ref_rate,
        "repeats": repeats,
    }


def _machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


#: The gated ratios: (key in the reference file, what it measures).
GATED = (("ratio", "the simulator"), ("paper_table_ratio", "the paper table's agent cell"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timings of each (default 7)")
    parser.add_argument("--reference", type=Path, default=REFERENCE, help="the reference ratios' file")
    parser.add_argument("--update", action="store_true", help="write the measured ratios as the reference")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    reference: dict[str, float] = {}
    if not args.update:
        try:
            committed = json.loads(args.reference.read_text(encoding="utf-8"))
            reference = {key: float(committed[key]) for key, _ in GATED}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(
                f"error: {args.reference}: no reference ratio ({exc!r}); write one with --update",
                file=sys.stderr,
            )
            return 2
    got = measure(args.repeats)
    print(
        f"speed gate (measured, CPU time): simulator {got['simulated_requests_per_cpu_s']:,.0f} simulated "
        f"requests per CPU s ({1e6 / got['simulated_requests_per_cpu_s']:.0f} us each), paper table's agent "
        f"cell {got['paper_table_cpu_s'] / got['paper_table_steps'] * 1e3:.0f} ms per simulated step, "
        f"reference loop {got['reference_ops_per_cpu_s']:,.0f} ops per CPU s"
    )
    if not reference:
        record = {
            "ratio": got["ratio"],
            "paper_table_ratio": got["paper_table_ratio"],
            "floor": FLOOR,
            "measured": got,
            "machine": _machine(),
        }
        args.reference.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"ratios {got['ratio']:.4f} and {got['paper_table_ratio']:.4g}: written to {args.reference}")
        return 0
    failed = False
    for key, what in GATED:
        share = got[key] / reference[key]
        verdict = "pass" if share >= FLOOR else f"FAIL: below {FLOOR:.0%} of the reference"
        failed |= share < FLOOR
        against = f"{share:.0%} of the committed reference {reference[key]:.4g}"
        print(f"{what}: ratio {got[key]:.4g} = {against}: {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
