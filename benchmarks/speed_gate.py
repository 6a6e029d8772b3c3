"""The gate on april-bench's own speed: the simulator's work per CPU second, against a reference loop.

A fixed small simulated run (:func:`simulate`: sync and APRIL, 16 groups x 8 on the H100 profile,
6 steps, in memory) is timed in CPU seconds (``time.process_time``) together with a fixed pure-Python
reference loop (:func:`reference_loop`: heap, dict and float work of the same kind as the simulator's
event loop) in the same process, the two interleaved ``--repeats`` times.  The fastest time of each
(the least disturbed by other processes) gives two rates: simulated requests per CPU second and
reference operations per CPU second.  Their ratio cancels the machine's speed and most of its load;
it is compared with the ratio committed in ``benchmarks/speed_gate.json`` and the gate fails (exit 1)
below half of it, so a change that makes the simulator twice as slow cannot land unseen (the paper
table once became 57x slower with nobody noticing).  Every number is measured on the machine that runs
it; only the ratio is compared.

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

#: The committed reference ratio (``--update`` writes it).
REFERENCE = Path(__file__).with_name("speed_gate.json")
#: The gate fails below this share of the committed ratio.
FLOOR = 0.5
#: Iterations of the reference loop: about as many CPU seconds as one simulated run.
REFERENCE_OPS = 150_000


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


def measure(repeats: int) -> dict[str, Any]:
    """The two rates and their ratio: the fastest of ``repeats`` interleaved CPU timings of each."""
    simulate()  # warm: imports, profiles and caches are not the simulator's per-request work
    reference_loop()
    sim_times, ref_times, requests = [], [], 0
    for _ in range(repeats):
        gc.collect()  # each timing starts from the same heap, not from the last one's garbage
        start = time.process_time()
        ops = reference_loop()
        ref_times.append(time.process_time() - start)
        gc.collect()
        start = time.process_time()
        requests = simulate()
        sim_times.append(time.process_time() - start)
    sim_rate = requests / min(sim_times)
    ref_rate = ops / min(ref_times)
    return {
        "simulated_requests": requests,
        "simulator_cpu_s": min(sim_times),
        "simulated_requests_per_cpu_s": sim_rate,
        "reference_ops": ops,
        "reference_cpu_s": min(ref_times),
        "reference_ops_per_cpu_s": ref_rate,
        "ratio": sim_rate / ref_rate,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timings of each (default 7)")
    parser.add_argument("--reference", type=Path, default=REFERENCE, help="the reference ratio's file")
    parser.add_argument("--update", action="store_true", help="write the measured ratio as the reference")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    reference = None
    if not args.update:
        try:
            reference = float(json.loads(args.reference.read_text(encoding="utf-8"))["ratio"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(
                f"error: {args.reference}: no reference ratio ({exc}); write one with --update",
                file=sys.stderr,
            )
            return 2
    got = measure(args.repeats)
    line = (
        f"speed gate (measured, CPU time): simulator {got['simulated_requests_per_cpu_s']:,.0f} simulated "
        f"requests per CPU s ({1e6 / got['simulated_requests_per_cpu_s']:.0f} us each), reference loop "
        f"{got['reference_ops_per_cpu_s']:,.0f} ops per CPU s; ratio {got['ratio']:.4f}"
    )
    if reference is None:
        record = {"ratio": got["ratio"], "floor": FLOOR, "measured": got, "machine": _machine()}
        args.reference.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"{line}; written to {args.reference}")
        return 0
    share = got["ratio"] / reference
    verdict = "pass" if share >= FLOOR else f"FAIL: below {FLOOR:.0%} of the reference"
    print(f"{line} = {share:.0%} of the committed reference {reference:.4f}: {verdict}")
    return 0 if share >= FLOOR else 1


if __name__ == "__main__":
    sys.exit(main())
