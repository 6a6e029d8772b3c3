"""The sglang adapter over the fake SGLang server: HTTP overhead, and a small strategy run.

What it measures, and why:

1. **Overhead.**  One wave of ``R`` requests of ``L`` tokens through the adapter
   to a fake server launched as its own process (as a real server would be),
   with a short decode step.  The fake's model says the wave takes ``L`` decode
   steps; the measured wall time minus that is what HTTP, JSON and the fake's
   Python scheduler add.  It bounds the decode rates at which strategy
   experiments against the fake are still about the strategy, not about the fake.
2. **A strategy run.**  sync and APRIL for a few steps over the same launched
   fake on a scripted long-tail workload (every 4th prompt wants 6x the typical
   length): rollout seconds per step, aborted requests, and requests per step,
   measured end to end through the adapter.

Engine timing is the fake's model (``decode_step_s`` per token), so the strategy
numbers are *simulated engine time measured through real HTTP*; the overhead
numbers are measured.  Output: ``results/benchmarks/sglang_fake_bench.json`` and
``.md`` (``--out`` to change), and the markdown on stdout.

    python benchmarks/sglang_fake_bench.py           # ~1 minute on 2 cores
    python benchmarks/sglang_fake_bench.py --quick   # a smoke check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from april_bench.engines.protocol import GenerateRequest, SamplingParams, WeightUpdate
from april_bench.engines.sglang import SGLangEngine
from april_bench.results.provenance import collect_provenance
from april_bench.results.recorder import RunRecorder
from april_bench.rollout.loop import RolloutConfig
from april_bench.workload import ScriptedWorkload
from april_impl import AprilStrategy
from baselines import SyncStrategy


def launched_fake(log_dir: str, **fake: Any) -> SGLangEngine:
    """The adapter launching ``python -m april_bench.engines.sglang.fake_server`` on loopback."""
    return SGLangEngine.Config(
        model_path="fake-model",
        launch_module="april_bench.engines.sglang.fake_server",
        engine_args=fake,
        log_file=f"{log_dir}/fake-server.log",
        launch_timeout_s=60,
    ).build()


async def overhead(requests: int, tokens: int, step_s: float, log_dir: str) -> dict[str, float]:
    engine = launched_fake(log_dir, decode_step_s=step_s, max_running_requests=requests)
    await engine.start()
    try:
        walls = []
        for repeat in range(3):
            wave = [
                GenerateRequest(f"w{repeat}-{i:05d}", 3, tokens, SamplingParams(seed=i), input_ids=(i, 1, 2))
                for i in range(requests)
            ]
            start = time.perf_counter()
            done = [c async for c in engine.generate(wave)]
            walls.append(time.perf_counter() - start)
            assert sum(c.num_tokens for c in done) == requests * tokens
    finally:
        await engine.close()
    wall = statistics.median(walls)
    model = tokens * step_s
    return {
        "requests": requests,
        "tokens": tokens,
        "decode_step_s": step_s,
        "model_s": model,
        "wall_s": round(wall, 3),
        "overhead_s": round(wall - model, 3),
        "tokens_per_s": round(requests * tokens / wall),
    }


async def strategy_run(name: str, steps: int, step_s: float, log_dir: str) -> dict[str, Any]:
    def length(uid: int, i: int) -> int:
        return 240 if uid % 4 == 0 else 30 + 5 * ((uid * 7 + i * 3) % 8)

    config = RolloutConfig(
        rollout_batch_size=8,
        n_samples_per_prompt=4,
        over_sampling_batch_size=16 if name == "april" else 8,
        max_response_len=256,
        replay_lengths=True,
        reabort_interval_s=0.2,
    )
    strategy = AprilStrategy.Config(over_sampling_batch_size=16).build() if name == "april" else None
    strategy = strategy or SyncStrategy.Config().build()
    workload = ScriptedWorkload(length)
    recorder = RunRecorder()
    engine = launched_fake(log_dir, decode_step_s=step_s, max_running_requests=256)
    await engine.start()
    try:
        loop = config.build(
            arm=name,
            engine=engine,
            strategy=strategy,
            workload=workload,
            prompts=workload.prompt_stream(),
            recorder=recorder,
        )
        for step in range(steps):
            recorder.steps.append((await loop.run_step(step, step)).record)
            await engine.update_weights(WeightUpdate(step + 1))
    finally:
        await engine.close()
    records = recorder.steps
    return {
        "arm": name,
        "steps": steps,
        "rollout_s_per_step": [round(r.rollout_time_s, 3) for r in records],
        "mean_rollout_s": round(statistics.mean(r.rollout_time_s for r in records), 3),
        "trained_tokens": sum(r.trained_tokens for r in records),
        "generated_tokens": sum(r.generated_tokens for r in records),
        "requests": sum(r.requests for r in records),
        "aborted_requests": sum(r.aborted_requests for r in records),
        "abort_rounds": sum(r.abort_rounds for r in records),
    }


def render(result: dict[str, Any]) -> str:
    lines = ["## Adapter + fake server overhead (measured)", ""]
    lines += ["| requests | tokens | step s | model s | wall s | overhead s | tokens/s |", "|---" * 7 + "|"]
    for r in result["overhead"]:
        lines.append(
            f"| {r['requests']} | {r['tokens']} | {r['decode_step_s']} | {r['model_s']:.2f} "
            f"| {r['wall_s']:.2f} | {r['overhead_s']:.2f} | {r['tokens_per_s']} |"
        )
    lines += ["", "## sync vs APRIL through the adapter (fake engine timing, measured wall time)", ""]
    lines += ["| arm | mean rollout s | per step | trained tok | generated tok | requests | aborted |"]
    lines += ["|---" * 7 + "|"]
    for r in result["strategies"]:
        lines.append(
            f"| {r['arm']} | {r['mean_rollout_s']:.2f} | {r['rollout_s_per_step']} | {r['trained_tokens']} "
            f"| {r['generated_tokens']} | {r['requests']} | {r['aborted_requests']} |"
        )
    return "\n".join(lines) + "\n"


async def main_async(quick: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as logs:
        points = [(64, 50, 0.002)] if quick else [(64, 100, 0.002), (256, 100, 0.002), (512, 100, 0.005)]
        over = [await overhead(r, t, s, logs) for r, t, s in points]
        steps = 2 if quick else 4
        strategies = [await strategy_run(name, steps, 0.01, logs) for name in ("sync", "april")]
    return {"overhead": over, "strategies": strategies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one overhead point and two steps per arm")
    parser.add_argument("--out", default="results/benchmarks", help="directory for the json and md")
    args = parser.parse_args()
    result = asyncio.run(main_async(args.quick))
    result["provenance"] = collect_provenance(
        simulated=True,
        engine="sglang-fake",
        notes=["engine timing is the fake server's model; wall time measured through the adapter"],
    )
    markdown = render(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sglang_fake_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "sglang_fake_bench.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
