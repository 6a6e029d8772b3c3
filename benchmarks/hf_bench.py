"""hf engine benchmark: decode-step cost on this CPU, the simulator's ``cpu`` profile fit to it,
and how well the simulator then predicts a measured run.

What it measures, and why:

1. **Decode curve.**  The embedded ``hf`` engine (the tiny model, float32) runs
   ``B`` requests of ``ctx`` prompt tokens for 24 decode steps; the median
   step time (forward + sampling + bookkeeping, as the engine times them) is
   recorded for every (B, ctx).  Also tokens/s at full batch (128).
2. **Fit.**  On a CPU, memory traffic and arithmetic do not overlap, so a
   decode step costs ``c + alpha*B + beta*S`` (S = the batch's context tokens).
   A least-squares fit gives the simulator's ``cpu`` profile: per-step
   overhead ``c``, effective FLOP/s = F/alpha and effective bandwidth =
   kv/beta (F, kv: the tiny model's FLOPs and KV bytes per token).  The profile
   is written to ``april_bench/sim/calibration/cpu.json`` with the data, the
   fit's error and provenance; ``--hw cpu --engine sim`` uses it.
3. **Prediction.**  Each arm of a measured embedded run (``--run DIR``, or a
   short run made now) is replayed in the simulator with that arm's own
   response lengths (a ``uid`` trace) and the engine's settings; the
   simulated rollout time is compared with the measured one (relative error),
   and the simulated APRIL gain with the measured gain.

Every number here is measured on this machine, except the "simulated" column
of the prediction, which is labelled.  Output: ``results/benchmarks/hf_bench.{json,md}``.

    python benchmarks/hf_bench.py                      # ~3 minutes on 2 cores
    python benchmarks/hf_bench.py --run runs/<default run>

``--mbu`` runs only the decode-step-against-bandwidth benchmark (``hf_mbu.py``):
step time, tokens/s and model-bandwidth utilisation at batch 1/8/64/256 on
``--device`` for a ``--model`` shape, written to ``results/benchmarks/hf_mbu_<device>_<model>.{json,md}``.

    python benchmarks/hf_bench.py --mbu --device cuda --model r1-distill-qwen-1.5b
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import hf_mbu  # benchmarks/ is on sys.path when this file runs as a script
import numpy as np

from april_bench.engines.hf import HFEngine
from april_bench.engines.protocol import GenerateRequest, SamplingParams
from april_bench.experiment import ExperimentConfig, run
from april_bench.profiles.hardware import CALIBRATION, GiB
from april_bench.profiles.models import MODELS
from april_bench.results.provenance import collect_provenance
from april_bench.results.store import load_run, write_run
from april_bench.results.table import render_markdown
from april_bench.rollout.loop import RolloutConfig
from april_bench.vtime import run_real

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXTS = (8, 32, 96, 192)
STEPS = 24
SLOTS = 128
PREFILL_TOKENS = 4096


async def _decode_point(engine: HFEngine, batch: int, ctx: int, repeats: int = 3) -> float:
    """Median decode-step time over ``repeats`` x 24 steps (a small VM's timings are noisy)."""
    sp = SamplingParams(temperature=1.0)
    times: list[float] = []
    for r in range(repeats):
        engine.reset_step_times()
        reqs = [
            GenerateRequest(
                f"b{batch}-c{ctx}-{r}-{i}", ctx, STEPS, sp, input_ids=tuple([5] * ctx), replay_len=STEPS
            )
            for i in range(batch)
        ]
        [c async for c in engine.generate(reqs)]
        times += engine.step_times.get(batch, [])
    return statistics.median(times)


async def _prefill_point(engine: HFEngine, batch: int, ctx: int) -> float:
    sp = SamplingParams(temperature=1.0)
    reqs = [
        GenerateRequest(f"p{batch}-c{ctx}-{i}", ctx, 1, sp, input_ids=tuple([5] * ctx)) for i in range(batch)
    ]
    times = []
    for _ in range(5):
        start = time.perf_counter()
        [c async for c in engine.generate(reqs)]  # one extend forward + the first token
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def prefill_curve() -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        engine = HFEngine.Config(model="tiny", max_running_requests=SLOTS, max_context_len=512).build(
            vocab_size=MODELS.get("tiny").vocab
        )
        await engine.start()
        await _prefill_point(engine, 8, 8)  # warm-up
        points = [
            {"batch": b, "ctx": c, "tokens": b * c, "prefill_s": await _prefill_point(engine, b, c)}
            for b in (1, 8, 32)
            for c in (8, 64, 192)
        ]
        await engine.close()
        return points

    return run_real(main())


def decode_curve() -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        engine = HFEngine.Config(model="tiny", max_running_requests=SLOTS, max_context_len=512).build(
            vocab_size=MODELS.get("tiny").vocab
        )
        await engine.start()
        await _decode_point(engine, 8, 8)  # warm-up
        points = []
        for ctx in CONTEXTS:
            for batch in BATCHES:
                t = await _decode_point(engine, batch, ctx)
                points.append(
                    {
                        "batch": batch,
                        "ctx": ctx,
                        "mean_context": ctx + STEPS / 2,
                        "step_s": t,
                        "tokens_per_s": batch / t,
                    }
                )
        await engine.close()
        return points

    return run_real(main())


def fit_prefill(points: list[dict[str, Any]]) -> dict[str, float]:
    tokens = np.array([p["tokens"] for p in points], dtype=float)
    t = np.array([p["prefill_s"] for p in points])
    (c, gamma), *_ = np.linalg.lstsq(np.stack([np.ones_like(tokens), tokens], axis=1), t, rcond=None)
    return {"c_s": float(c), "gamma_s_per_token": float(gamma)}


def fit(points: list[dict[str, Any]]) -> dict[str, Any]:
    tiny = MODELS.get("tiny")
    batch = np.array([p["batch"] for p in points], dtype=float)
    context = np.array([p["batch"] * p["mean_context"] for p in points], dtype=float)
    t = np.array([p["step_s"] for p in points])
    design = np.stack([np.ones_like(batch), batch, context], axis=1)
    (c, alpha, beta), *_ = np.linalg.lstsq(design, t, rcond=None)
    predicted = design @ np.array([c, alpha, beta])
    relative = np.abs(predicted - t) / t
    flops = tiny.flops_per_token / alpha
    bandwidth = tiny.kv_bytes_per_token / beta
    overhead = max(0.0, c - tiny.decode_weight_bytes / bandwidth)
    return {
        "c_s": float(c),
        "alpha_s_per_seq": float(alpha),
        "beta_s_per_context_token": float(beta),
        "effective_flops": float(flops),
        "effective_bandwidth": float(bandwidth),
        "step_overhead_s": overhead,
        "median_relative_error": float(np.median(relative)),
        "max_relative_error": float(relative.max()),
    }


def write_profile(result: dict[str, Any], prefill: dict[str, float], provenance: dict[str, Any]) -> None:
    when = f"{provenance['utc']} at commit {provenance['git']['commit']}"
    source = f"fit by benchmarks/hf_bench.py on {provenance['machine']['cpu']} ({when})"
    profile = {
        "name": "cpu",
        "vendor": "cpu",
        "memory_bytes": 16 * GiB,
        "memory_bw": result["effective_bandwidth"],
        "bf16_flops": result["effective_flops"],
        "eta_bw": 1.0,
        "eta_flops": 1.0,
        "step_overhead_s": result["step_overhead_s"],
        # an extend batch costs more than a decode step (padding, gathers, an extra sample)
        "eager_overhead_s": max(0.0, prefill["c_s"] - result["c_s"]),
        "allreduce_latency_s": 0.0,
        "allreduce_bw": 1e12,
        "graph_max_batch": 1 << 30,
        "chunked_prefill_tokens": PREFILL_TOKENS,
        "train_mfu": 1.0,
        "gpus_per_node": 1,
        "overlap": False,
        "sources": {
            "memory_bw": source + ": KV bytes per token / fitted seconds per context token",
            "bf16_flops": source + ": FLOPs per token / fitted seconds per sequence",
            "step_overhead_s": source + ": fitted per-step constant",
            "eager_overhead_s": source + ": the extend (prefill) batch's constant minus the decode step's",
            "overlap": "measured: on the CPU, step time is the sum of the two terms (see the fit's error)",
            "memory_bytes": "the hf engine's KV slots, not device memory, bound the CPU default",
        },
    }
    CALIBRATION.parent.mkdir(parents=True, exist_ok=True)
    CALIBRATION.write_text(json.dumps(profile, indent=2) + "\n")


def measured_run(path: Path | None) -> Any:
    if path is not None:
        return load_run(path)
    from april_bench.recipes import embedded

    config = embedded(steps=10, eval_every=None)
    result = run(config, progress=False)
    out = Path(tempfile.mkdtemp(prefix="hf-bench-run-"))
    rec = result.recorder
    return write_run(
        out,
        config=config.to_dict(),
        provenance=collect_provenance(simulated=False, engine="hf"),
        tables=rec.tables,
    )


def predict(measured: Any) -> dict[str, Any]:
    cfg = measured.config
    rollout = RolloutConfig(**cfg["rollout"])
    summary = measured.summary()
    out: dict[str, Any] = {"run": str(measured.path), "arms": {}}
    for arm in summary:
        rows = [s for s in measured.rows("samples") if s["arm"] == arm]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for s in rows:
                length = max(1, s["response_len"] + s["discarded_tokens"])
                f.write(
                    json.dumps({"uid": s["group_uid"], "length": length, "reward": s["reward"] or 0}) + "\n"
                )
            trace = f.name
        sim_config = ExperimentConfig(
            hardware="cpu",
            algorithm=cfg["algorithm"],
            dataset="synthetic",
            model="tiny",
            engine="sim",
            strategies=(arm,),
            steps=cfg["steps"],
            seed=cfg["seed"],
            rollout=rollout,
            num_gpus=1,
            engine_args={
                "tp_size": 1,
                "max_running_requests": SLOTS,
                "chunked_prefill_size": PREFILL_TOKENS,
            },
            workload_args={"length_trace": trace},
            eval_every=None,  # the simulator replays the measured arm: no evaluation, blocks or warm-up
            block_steps=None,
            warmup_steps=0,
        )
        rec = run(sim_config, progress=False).recorder
        simulated = rec.summary(baseline=arm)[arm]
        m = summary[arm]
        out["arms"][arm] = {
            "measured_rollout_s": m["rollout_time_s"],
            "simulated_rollout_s": simulated["rollout_time_s"],
            "relative_error": simulated["rollout_time_s"] / m["rollout_time_s"] - 1,
            "measured_tokens_per_s": m["generated_tokens_per_s"],
            "simulated_tokens_per_s": simulated["generated_tokens_per_s"],
        }
    arms = out["arms"]
    if "sync" in arms and "april" in arms:
        out["measured_gain"] = (
            arms["april"]["measured_tokens_per_s"] / arms["sync"]["measured_tokens_per_s"] - 1
        )
        out["simulated_gain"] = (
            arms["april"]["simulated_tokens_per_s"] / arms["sync"]["simulated_tokens_per_s"] - 1
        )
    return out


def render(result: dict[str, Any]) -> str:
    prov, f, pred = result["provenance"], result["fit"], result["prediction"]
    full = [p for p in result["curve"] if p["batch"] == SLOTS]
    lines = [
        "# hf engine on this CPU: decode curve, simulator fit, prediction (MEASURED unless labelled)",
        "",
        f"Commit `{prov['git']['commit']}` (dirty: {prov['git']['dirty']}), {prov['utc']}, "
        f"{prov['machine']['cpu']}, {prov['machine']['cpu_count']} cores.  "
        "Reproduce: `python benchmarks/hf_bench.py`.",
        "",
        "## Decode step (ms) by batch size and prompt length (tiny model, float32, 24 steps each)",
        "",
        render_markdown(
            ("ctx \\ batch", *map(str, BATCHES)),
            [
                [str(ctx), *(f"{1e3 * p['step_s']:.2f}" for p in result["curve"] if p["ctx"] == ctx)]
                for ctx in CONTEXTS
            ],
        ),
        "",
        "Tokens/s at full batch (128): "
        + ", ".join(f"{p['tokens_per_s']:,.0f} (ctx {p['ctx']})" for p in full),
        "",
        "## Fit: step = c + alpha x batch + beta x context tokens",
        "",
        f"c = {1e3 * f['c_s']:.2f} ms, alpha = {1e6 * f['alpha_s_per_seq']:.1f} us per sequence, "
        f"beta = {1e9 * f['beta_s_per_context_token']:.1f} ns per context token; median error "
        f"{f['median_relative_error']:.1%}, max {f['max_relative_error']:.1%} "
        f"over {len(result['curve'])} points.  "
        "Written to `april_bench/sim/calibration/cpu.json` (the `cpu` profile).",
        "",
        f"Extend (prefill) batch: {1e3 * result['prefill_fit']['c_s']:.2f} ms + "
        f"{1e6 * result['prefill_fit']['gamma_s_per_token']:.2f} us per prompt token (fit over "
        f"{len(result['prefill'])} points); its constant above a decode step's goes into the profile.",
        "",
        "## Prediction of a measured run by the simulator with that profile",
        "",
        render_markdown(
            (
                "Arm",
                "Measured rollout s",
                "Simulated rollout s",
                "Relative error",
                "Measured tok/s",
                "Simulated tok/s",
            ),
            [
                [
                    arm,
                    f"{a['measured_rollout_s']:.1f}",
                    f"{a['simulated_rollout_s']:.1f}",
                    f"{a['relative_error']:+.1%}",
                    f"{a['measured_tokens_per_s']:,.0f}",
                    f"{a['simulated_tokens_per_s']:,.0f}",
                ]
                for arm, a in pred["arms"].items()
            ],
        ),
    ]
    if "measured_gain" in pred:
        lines += [
            "",
            f"APRIL throughput gain: measured {pred['measured_gain']:+.1%}, "
            f"simulated {pred['simulated_gain']:+.1%} (run: `{pred['run']}`).",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, default=None, help="a measured embedded run to predict")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    hf_mbu.add_arguments(parser)
    args = parser.parse_args()
    if args.mbu:
        hf_mbu.main(args)
        return
    provenance = collect_provenance(simulated=False, engine="hf")
    start = time.perf_counter()
    curve = decode_curve()
    fitted = fit(curve)
    prefill = prefill_curve()
    prefill_fit = fit_prefill(prefill)
    write_profile(fitted, prefill_fit, provenance)
    from april_bench.profiles.hardware import hardware_profile

    hardware_profile.cache_clear()  # the next simulation reads the profile just written
    result = {
        "provenance": provenance,
        "curve": curve,
        "fit": fitted,
        "prefill": prefill,
        "prefill_fit": prefill_fit,
        "prediction": predict(measured_run(args.run)),
        "wall_s": time.perf_counter() - start,
    }
    text = render(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hf_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "hf_bench.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
