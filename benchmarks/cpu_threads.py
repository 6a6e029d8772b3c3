"""The embedded engine's decode rate on CPU by torch thread count, arms interleaved.

On a shared machine whose load exceeds its cores, torch's intra-op threads (OpenMP) wait on
each other and a tiny model's matrix products slow down tenfold or more; one thread avoids the
wait.  This measures it where you run: one engine, one wave of ``--requests`` x ``--tokens``
replayed tokens per trial, thread counts alternated trial by trial (the engine's ``threads``, which
it sets around each forward), ``--trials`` rounds, medians and ranges, with the load average.

    python benchmarks/cpu_threads.py [--threads 1,2] [--trials 5] [--out results/benchmarks]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_bench import build, make_checkpoint, wave

from april_bench.results.provenance import collect_provenance


async def measure(
    checkpoint: str, threads: list[int], trials: int, requests: int, tokens: int
) -> dict[int, list[float]]:
    from april_bench.engines.hf.engine import HFEngine

    engine = build("hf", checkpoint, requests, 8 + 2 * tokens)
    assert isinstance(engine, HFEngine)
    await engine.start()
    rates: dict[int, list[float]] = {t: [] for t in threads}
    try:
        [c async for c in engine.generate(wave("warm", requests, 4))]
        for trial in range(trials):
            order = threads if trial % 2 == 0 else threads[::-1]  # ABBA
            for n in order:
                engine.threads = n  # the hf engine sets its threads around each forward
                t0 = time.perf_counter()
                done = [c async for c in engine.generate(wave(f"t{trial}-{n}", requests, tokens))]
                rates[n].append(sum(c.num_tokens for c in done) / (time.perf_counter() - t0))
    finally:
        await engine.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default=f"1,{os.cpu_count() or 1}", help="thread counts to compare")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    threads = sorted({int(t) for t in args.threads.split(",")})
    load_start = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as scratch:
        rates = asyncio.run(
            measure(make_checkpoint(Path(scratch)), threads, args.trials, args.requests, args.tokens)
        )
    load_end = list(os.getloadavg())
    rows: list[dict[str, Any]] = [
        {
            "threads": n,
            "median_tok_s": statistics.median(r),
            "min_tok_s": min(r),
            "max_tok_s": max(r),
            "trials": r,
        }
        for n, r in rates.items()
    ]
    git = collect_provenance(simulated=False, engine="hf").get("git", {})
    lines = [
        "## Embedded engine decode rate by torch CPU threads (measured)",
        "",
        f"`tiny32` random checkpoint, waves of {args.requests} requests x {args.tokens} replayed tokens, "
        f"thread counts alternated ABBA over {args.trials} trials in one process.",
        "",
        "| torch threads | median tok/s | range |",
        "|---|---|---|",
        *(
            f"| {r['threads']} | {r['median_tok_s']:,.0f} | {r['min_tok_s']:,.0f}-{r['max_tok_s']:,.0f} |"
            for r in rows
        ),
        "",
        f"Command: `python benchmarks/cpu_threads.py --threads {args.threads} --trials {args.trials}` "
        f"at commit {git.get('commit')} (dirty: {git.get('dirty')}).",
        f"Load average {load_start} at the start, {load_end} at the end, on {os.cpu_count()} cores. "
        "Every number is measured.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_threads.json").write_text(
        json.dumps({"rows": rows, "load": [load_start, load_end]}, indent=2)
    )
    (args.out / "cpu_threads.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
