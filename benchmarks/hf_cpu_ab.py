"""The hf engine's decode on this CPU: arms side by side, interleaved and repeated, as ratios with intervals.

An arm is a code tree (``head``: this checkout; ``base``: another revision, extracted with ``git
archive``) and a decode path.  One measurement runs in a fresh process: the embedded default's shape
(``tiny``, the synthetic task's 17-token vocabulary, float32, one torch thread), a warm-up wave, then
``--waves`` waves of ``B`` requests of 8-token prompts and ``--tokens`` replayed response tokens; it
reports the wave's wall time (prefill, decode, releases: what a rollout sees) and the median decode step.
Every round runs every arm once, in an order that rotates from round to round, so a burst of load on
the shared machine falls on each arm alike; ratios are taken within a round (paired), and the table gives
their median and a bootstrap 95% interval over rounds.

    python benchmarks/hf_cpu_ab.py                         # base = main, head = this tree: eager and fused
    python benchmarks/hf_cpu_ab.py --base 2eb9655 --arms base:eager,head:eager,head:static,head:fused

Writes ``results/benchmarks/hf_cpu_ab.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def child(args: argparse.Namespace) -> None:
    """One measurement in this process: print its figures as one JSON line."""
    from april_bench.engines.hf import HFEngine
    from april_bench.engines.protocol import GenerateRequest, SamplingParams

    engine = HFEngine.Config(
        model="tiny",
        device="cpu",
        dtype="float32",
        decode_path=args.path,
        max_running_requests=max(args.batch, 8),
        max_context_len=8 + args.tokens + 1,
        threads=1,
    ).build(vocab_size=17)

    async def main() -> dict[str, Any]:
        await engine.start()
        walls = []
        steps: list[float] = []
        for wave in range(args.waves + 1):
            engine.reset_step_times()
            sp = SamplingParams(temperature=1.0, seed=wave)
            requests = [
                GenerateRequest(
                    f"w{wave}-{i}",
                    8,
                    args.tokens,
                    sp,
                    input_ids=(1, *[3 + i % 10] * 7),
                    replay_len=args.tokens,
                )
                for i in range(args.batch)
            ]
            tick = time.perf_counter()
            [c async for c in engine.generate(requests)]
            if wave:  # the first wave warms up
                walls.append(time.perf_counter() - tick)
                steps += engine.step_times.get(args.batch, [])
        await engine.close()
        return {"wave_s": statistics.median(walls), "step_ms": 1e3 * statistics.median(steps)}

    print(json.dumps(asyncio.run(main())))


def _measure(root: Path, path: str, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--path",
        path,
        "--batch",
        str(batch),
    ]
    command += ["--tokens", str(args.tokens), "--waves", str(args.waves)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=root)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _interval(ratios: list[float], rng: random.Random) -> tuple[float, float]:
    """Bootstrap 95% interval of the median of ``ratios``."""
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return medians[50], medians[1949]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default="main", help="git revision of the base arm")
    parser.add_argument(
        "--arms", default="base:eager,head:eager,head:fused", help="tree:decode_path, first = reference"
    )
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--tokens", type=int, default=64, help="replayed response tokens per request")
    parser.add_argument("--waves", type=int, default=3, help="measured waves per process (median)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", default="eager", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return
    from april_bench.results.provenance import collect_provenance
    from april_bench.results.table import render_markdown

    arms = [tuple(a.split(":")) for a in args.arms.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    base_commit = subprocess.run(
        ["git", "rev-parse", args.base], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hf-ab-base-") as tmp:
        archive = subprocess.run(["git", "archive", base_commit], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        roots = {"base": Path(tmp), "head": ROOT}
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for batch in batches:
                order = arms[r % len(arms) :] + arms[: r % len(arms)]
                for tree, path in order:
                    runs.setdefault((f"{tree}:{path}", batch), []).append(
                        _measure(roots[tree], path, batch, args)
                    )
            print(f"round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    rng = random.Random(0)
    reference = f"{arms[0][0]}:{arms[0][1]}"
    rows, points = [], []
    for batch in batches:
        for tree, path in arms:
            arm = f"{tree}:{path}"
            mine, ref = runs[(arm, batch)], runs[(reference, batch)]
            point: dict[str, Any] = {"arm": arm, "batch": batch, "runs": mine}
            for figure in ("wave_s", "step_ms"):
                ratios = [m[figure] / b[figure] for m, b in zip(mine, ref, strict=True)]
                lo, hi = _interval(ratios, rng)
                point[figure] = statistics.median(m[figure] for m in mine)
                point[f"{figure}_ratio"] = (statistics.median(ratios), lo, hi)
            points.append(point)
            rows.append(
                [
                    arm,
                    str(batch),
                    f"{point['wave_s'] * 1e3:,.0f}",
                    "{:.3f} [{:.3f}, {:.3f}]".format(*point["wave_s_ratio"]),
                    f"{point['step_ms']:.2f}",
                    "{:.3f} [{:.3f}, {:.3f}]".format(*point["step_ms_ratio"]),
                ]
            )
    provenance = collect_provenance(simulated=False, engine="hf")
    result = {
        "label": "measured on this CPU",
        "base": base_commit,
        "arms": [f"{t}:{p}" for t, p in arms],
        "tokens": args.tokens,
        "waves": args.waves,
        "rounds": args.rounds,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "points": points,
        "provenance": provenance,
    }
    text = "\n".join(
        [
            "# hf engine decode on this CPU: arms side by side (MEASURED)",
            "",
            f"Base `{base_commit[:12]}` against this tree (commit `{provenance['git']['commit'][:12]}`, "
            f"dirty: {provenance['git']['dirty']}), {provenance['machine']['cpu']}, {provenance['utc']}.  "
            f"`tiny` (17-token vocabulary, float32, one thread), 8-token prompts, {args.tokens} replayed "
            f"tokens; per process a warm-up wave then the median of {args.waves}; {args.rounds} rounds, arms "
            f"interleaved in rotating order.  Ratios are to `{reference}` within each round: median "
            "[bootstrap 95% interval].  "
            f"Load average {load_start[0]:.1f} at the start, {result['load_average_end'][0]:.1f} at the end "
            f"({provenance['machine']['cpu_count']} cores, shared).",
            "",
            render_markdown(("arm", "batch", "wave ms", "wave ratio", "step ms", "step ratio"), rows),
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hf_cpu_ab.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "hf_cpu_ab.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
