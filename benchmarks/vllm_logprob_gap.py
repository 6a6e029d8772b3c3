"""Engine-vs-trainer log-prob gap by engine dtype: vLLM in float32 and bfloat16, and the hf engine.

Each engine serves a random ``tiny32`` checkpoint and samples ``R`` requests of ``L`` tokens per
prompt length at the rollout temperature, then reloads a second checkpoint (as every run step does)
and samples again; the trainer's own log-prob function (``trainers/logprobs.token_logprobs``,
float32, what the torch trainer computes as the behaviour policy's log-probs) scores the same tokens.
The gap is ``|engine - trainer|`` per token: numerics only (same weights, same tokens).  All measured.

    python benchmarks/vllm_logprob_gap.py                          # float32 and bfloat16, ~3 minutes
    python benchmarks/vllm_logprob_gap.py --dtypes float32 --out /tmp/gap

vLLM spawns its engine core: this script keeps its ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from april_bench.engines.protocol import Completion, Engine, GenerateRequest, SamplingParams, WeightUpdate
from april_bench.results.provenance import collect_provenance


def make_checkpoints(directory: Path) -> tuple[str, str]:
    """Two random ``tiny32`` checkpoints (seeds 0 and 1): the served weights and an update."""
    from april_bench.models.checkpoint import save_state_dict
    from april_bench.models.zoo import build_model

    a, b = (
        save_state_dict(build_model("tiny32", vocab_size=64, seed=s), directory / f"tiny32-{s}")
        for s in (0, 1)
    )
    return str(a), str(b)


def build(name: str, dtype: str, checkpoint: str, requests: int) -> Engine:
    if name == "hf":
        from april_bench.engines.hf.engine import HFEngine

        config = HFEngine.Config(
            model=checkpoint, device="cpu", dtype=dtype, max_running_requests=requests, max_context_len=512
        )
        return config.build()
    from april_bench.engines.vllm.engine import VLLMEngine

    return VLLMEngine.Config(
        model_path=checkpoint, dtype=dtype, max_num_seqs=requests, max_model_len=512
    ).build()


def wave(
    prefix: str, prompt_lens: list[int], requests: int, tokens: int, temperature: float
) -> list[GenerateRequest]:
    return [
        GenerateRequest(
            f"{prefix}-{n}-{i}", n, tokens, SamplingParams(temperature=temperature, seed=i),
            input_ids=tuple(5 + (i * 7 + j) % 50 for j in range(n)), replay_len=tokens,
        )
        for n in prompt_lens
        for i in range(requests)
    ]  # fmt: skip


def gaps_by_prompt(
    checkpoint: str, requests: list[GenerateRequest], done: dict[str, Completion], temperature: float
) -> dict[int, list[float]]:
    """``|engine - trainer|`` per token by prompt length (the trainer: float32, ``checkpoint``)."""
    import torch

    from april_bench.models.zoo import build_model
    from april_bench.trainers.logprobs import token_logprobs

    trainer = build_model(checkpoint)  # float32, as the torch trainer holds it
    out: dict[int, list[float]] = {}
    for r in requests:
        c = done[r.request_id]
        assert r.input_ids is not None and c.output_ids is not None and c.logprobs is not None
        ids = torch.tensor([[*r.input_ids, *c.output_ids]])
        with torch.no_grad():
            ours, _ = token_logprobs(trainer, ids, torch.ones_like(ids), temperature=temperature)
        tail = ours[0, len(r.input_ids) - 1 :].tolist()
        out.setdefault(r.input_len, []).extend(abs(a - b) for a, b in zip(tail, c.logprobs, strict=True))
    return out


async def measure(
    name: str, dtype: str, checkpoints: tuple[str, str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The gap on the served weights, then again after a reload of the second checkpoint (the path
    every step of a run takes: pause, reload, prefix cache cleared, resume)."""
    prompt_lens = [int(n) for n in args.prompt_lens.split(",")]
    engine = build(name, dtype, checkpoints[0], args.requests * len(prompt_lens))
    await engine.start()
    phases = []
    try:
        for phase, checkpoint in (("fresh", checkpoints[0]), ("after reload", checkpoints[1])):
            if phase != "fresh":
                await engine.update_weights(WeightUpdate(1, path=checkpoint))
            requests = wave(phase[:5], prompt_lens, args.requests, args.tokens, args.temperature)
            done = {c.request_id: c async for c in engine.generate(requests)}
            phases.append((phase, checkpoint, requests, done))
        info = engine.info
    finally:
        await engine.close()
    rows = []
    for phase, checkpoint, requests, done in phases:
        for prompt_len, gaps in gaps_by_prompt(checkpoint, requests, done, args.temperature).items():
            rows.append(
                {
                    "engine": name,
                    "dtype": info.dtype,
                    "version": info.version or "april-bench",
                    "phase": phase,
                    "prompt_len": prompt_len,
                    "tokens": len(gaps),
                    "gap_mean": sum(gaps) / len(gaps),
                    "gap_max": max(gaps),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16", help="vLLM dtypes, comma-separated")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument(
        "--prompt-lens",
        default="6,150",
        help="prompt lengths (150 + tokens crosses vLLM's 128-token CPU block)",
    )
    parser.add_argument("--temperature", type=float, default=0.8, help="the rollout default")
    parser.add_argument("--out", default="results/benchmarks", help="directory for the json and md")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="vllm-gap-") as scratch:
        checkpoints = make_checkpoints(Path(scratch))
        cases = [("hf", "float32"), *(("vllm", d) for d in args.dtypes.split(","))]
        for name, dtype in cases:
            rows += asyncio.run(measure(name, dtype, checkpoints, args))
    result = {
        "setup": vars(args),
        "rows": rows,
        "provenance": collect_provenance(simulated=False, engine="hf,vllm"),
    }
    lines = [
        "## Engine-vs-trainer log-prob gap by engine dtype (measured)",
        "",
        f"Random `tiny32` checkpoints; per prompt length {args.requests} requests x {args.tokens} sampled "
        f"tokens at temperature {args.temperature}, on the served weights and again after a reload of "
        "another checkpoint; the trainer's float32 `token_logprobs` scores the same tokens.",
        "",
        "| Engine | Version | dtype | Weights | Prompt len | Tokens | Gap mean | Gap max |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['engine']} | {r['version']} | {r['dtype']} | {r['phase']} | {r['prompt_len']} | "
            f"{r['tokens']} | {r['gap_mean']:.1e} | {r['gap_max']:.1e} |"
            for r in rows
        ),
        "",
        "Command: `python benchmarks/vllm_logprob_gap.py`. Every number is measured.",
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_logprob_gap.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "vllm_logprob_gap.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
