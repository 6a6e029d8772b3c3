"""Torch trainer benchmark: peak memory and time of one train step vs log-prob chunk and micro-batch budget.

Two shapes, on this CPU:

* ``tiny``: the embedded model (3 layers, hidden 96, vocabulary 32): activations dominate, so the
  micro-batch budget and activation checkpointing are what moves the peak.
* ``1.5b-shaped``: DeepSeek-R1-Distill-Qwen-1.5B's layer and vocabulary (hidden 1536, ffn 8960,
  GQA 12/2, 151,936 tokens) with one decoder layer and tied embeddings (to fit a shared CPU host):
  the ``[tokens, vocab]`` logits dominate, so the log-prob chunk is what moves the peak.  A chunk of
  every token of the batch is the old, unchunked behaviour.

Each configuration runs in a fresh process (so the peak RSS is its own, with glibc's mmap threshold
pinned so that freed tensors leave RSS): one tiny step creates the AdamW state, then the measured
step trains on a seeded batch.  Reported, all measured: ``peak`` = the process's peak RSS during
the step minus its RSS just before (the step's transient memory: activations, gradients, logits);
``before`` = RSS before the step (weights, AdamW state, the runtime); ``step s`` = wall time of the
step (on a shared, loaded machine: compare within a shape, not across runs).  ``estimate`` is the
trainer's own pre-step estimate of the same terms for the largest micro-batch: gradients + the larger
of (activations + logits chunk) and the optimizer step's temporaries.  ``1.5b-logprobs`` measures the
log-prob forward + backward alone (no optimizer), where the logits are the largest term.

    python benchmarks/trainer_bench.py                  # ~10 minutes on 2 cores, ~7 GB peak
    python benchmarks/trainer_bench.py --shapes tiny

Output: ``results/benchmarks/trainer_bench.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from april_bench.results.provenance import collect_provenance
from april_bench.results.table import render_markdown

#: shape -> (model settings, batch: groups, samples per group, prompt tokens, max response tokens)
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {"model": "tiny", "vocab": 32, "layers": None, "batch": (4, 8, 32, 224)},
    "1.5b-shaped": {"model": "r1-distill-qwen-1.5b", "vocab": None, "layers": 1, "batch": (2, 4, 32, 64)},
    # the log-prob pass alone (forward + backward, no optimizer), with more response tokens
    "1.5b-logprobs": {"model": "r1-distill-qwen-1.5b", "vocab": None, "layers": 1, "batch": (2, 8, 16, 160)},
}
#: shape -> [(max_tokens_per_micro_batch, logprob_chunk_tokens, activation_checkpointing)]; chunk
#: None = every token of the batch in one chunk (the unchunked behaviour).
CONFIGS: dict[str, list[tuple[int | None, int | None, bool]]] = {
    "tiny": [(None, 1024, False), (2048, 1024, False), (512, 1024, False), (None, 1024, True)],
    "1.5b-shaped": [(None, None, False), (None, 256, False), (None, 64, False), (256, 64, False)],
    "1.5b-logprobs": [(None, None, False), (None, 128, False)],
}


def _rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _batch(groups: int, samples: int, prompt: int, response: int, vocab: int, seed: int) -> list[Any]:
    import random

    from april_bench.types import FinishReason, Group, Prompt, Segment

    rng = random.Random(seed)
    batch = []
    for uid in range(groups):
        group = Group.fresh(
            Prompt(
                uid=uid,
                source_id=f"p{uid}",
                length=prompt,
                token_ids=tuple(rng.randrange(3, vocab) for _ in range(prompt)),
            ),
            samples,
        )
        for sample in group.samples:
            ids = tuple(rng.randrange(3, vocab) for _ in range(rng.randint(response // 2, response)))
            sample.append(
                Segment(f"r{uid}", 0, len(ids), FinishReason.STOP, 0, ids, tuple(-1.0 for _ in ids))
            )
            sample.reward = float(rng.random() < 0.5)
        batch.append(group)
    return batch


def measure_one(shape: str, budget: int | None, chunk: int | None, checkpointing: bool) -> dict[str, Any]:
    """One configuration, in this process (run it in a fresh one)."""
    import asyncio
    import resource
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from april_bench.trainers.torch_trainer import TorchTrainer

    torch.manual_seed(0)
    spec = SHAPES[shape]
    config = _model_config(shape)
    module = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    groups, samples, prompt, response = spec["batch"]
    batch = _batch(groups, samples, prompt, response, config.vocab_size, seed=1)
    tokens = sum(s.prompt.length + s.response_len for g in batch for s in g.samples)
    trainer = TorchTrainer.Config(
        max_tokens_per_micro_batch=budget,
        logprob_chunk_tokens=chunk or tokens,
        activation_checkpointing=checkpointing,
        device="cpu",
    ).build(module=module)
    rows = trainer._rows(batch)
    if shape.endswith("-logprobs"):
        return _measure_logprobs(trainer, rows, tokens, shape, budget, chunk)
    asyncio.run(trainer.train(_batch(1, 2, 4, 4, config.vocab_size, seed=2), step=0, policy_version=0))
    micro = max(
        sum(1 for _ in m) * max(rows.lengths[i] for i in m)
        for m in trainer._micro_batches(rows, list(range(len(rows.lengths))))
    )
    estimate = trainer.estimate_memory(micro)
    before = _rss_kib()
    start = time.perf_counter()
    asyncio.run(trainer.train(batch, step=1, policy_version=1))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "shape": shape,
        "max_tokens_per_micro_batch": budget,
        "logprob_chunk_tokens": chunk,
        "activation_checkpointing": checkpointing,
        "batch_tokens": tokens,
        "largest_micro_batch_tokens": micro,
        "params": sum(p.numel() for p in module.parameters()),
        "step_s": seconds,
        "rss_before_mib": before / 1024,
        "step_peak_mib": max(peak - before, 0) / 1024,
        "estimate_step_mib": (estimate.grads + estimate.transient) / 2**20,
    }


def _measure_logprobs(
    trainer: Any, rows: Any, tokens: int, shape: str, budget: int | None, chunk: int | None
) -> dict[str, Any]:
    """Forward + backward of the log-probs of every response token of the batch (no optimizer)."""
    import resource
    import time

    import torch

    index = torch.arange(len(rows.lengths))
    width = max(rows.lengths) - 1
    estimate = trainer.estimate_memory(len(rows.lengths) * max(rows.lengths))
    before = _rss_kib()
    start = time.perf_counter()
    logp, _ = trainer._logprobs(trainer.model, rows, index, width)
    logp.sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "shape": shape,
        "max_tokens_per_micro_batch": budget,
        "logprob_chunk_tokens": chunk,
        "activation_checkpointing": False,
        "batch_tokens": tokens,
        "largest_micro_batch_tokens": estimate.micro_batch_tokens,
        "response_tokens": int(rows.mask.sum()),
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "step_s": seconds,
        "rss_before_mib": before / 1024,
        "step_peak_mib": max(peak - before, 0) / 1024,
        "estimate_step_mib": None,  # computed by the parent (estimate_mib)
    }


def _model_config(shape: str) -> Any:
    from april_bench.models.zoo import model_config

    spec = SHAPES[shape]
    config = model_config(spec["model"], vocab_size=spec["vocab"])
    if spec["layers"] is not None:
        config.num_hidden_layers = spec["layers"]
        config.tie_word_embeddings = True
    return config


def estimate_mib(row: dict[str, Any]) -> float:
    """The trainer's estimate of a measured row's transient terms, from its settings (no weights built)."""
    import torch
    from transformers import AutoModelForCausalLM

    from april_bench.trainers.memory import estimate_step_memory

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_model_config(row["shape"]))
    estimate = estimate_step_memory(
        model,
        micro_batch_tokens=row["largest_micro_batch_tokens"],
        chunk_tokens=row["logprob_chunk_tokens"] or row["batch_tokens"],
        checkpointing=row["activation_checkpointing"],
    )
    if row["shape"].endswith("-logprobs"):  # no optimizer step in that measurement
        return (estimate.grads + estimate.activations + estimate.logits_chunk + estimate.head_grad) / 2**20
    return (estimate.grads + estimate.transient) / 2**20


def _run_isolated(shape: str, budget: int | None, chunk: int | None, checkpointing: bool) -> dict[str, Any]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # freed tensors return to the OS
    args = json.dumps([shape, budget, chunk, checkpointing])
    done = subprocess.run(
        [sys.executable, __file__, "--one", args], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _markdown(results: list[dict[str, Any]]) -> str:
    header = [
        "Shape",
        "Micro-batch budget",
        "Chunk",
        "Ckpt",
        "Largest micro-batch",
        "Step peak MiB",
        "Estimate MiB",
        "RSS before MiB",
        "Step s",
    ]
    rows = [
        [
            r["shape"],
            str(r["max_tokens_per_micro_batch"] or "whole batch"),
            str(r["logprob_chunk_tokens"] or f"all ({r['batch_tokens']})"),
            "yes" if r["activation_checkpointing"] else "no",
            str(r["largest_micro_batch_tokens"]),
            f"{r['step_peak_mib']:.0f}",
            f"{r['estimate_step_mib']:.0f}",
            f"{r['rss_before_mib']:.0f}",
            f"{r['step_s']:.2f}",
        ]
        for r in results
    ]
    return (
        "# Torch trainer benchmark (measured, CPU)\n\n"
        + render_markdown(header, rows)
        + "\n\nStep peak: peak RSS during one train step minus RSS before it (activations, gradients, "
        "logits; AdamW state already allocated). Estimate: the trainer's pre-step estimate of the same "
        "terms (gradients + the larger of activations + logits chunk + a second head gradient and the "
        "optimizer step's temporaries; no optimizer term for 1.5b-logprobs). 1.5b-shaped: one decoder "
        "layer of R1-Distill-Qwen-1.5B with its 151,936-token vocabulary, tied embeddings; its step peak is "
        "set by the gradients plus AdamW's per-parameter temporaries (the embedding's), not by the "
        "logits, at this batch size. 1.5b-logprobs: the same model, the log-prob forward + backward "
        "alone (no optimizer step) on more response tokens: there the chunk sets the peak. Times are "
        "on a shared 2-core machine under heavy load (load average above 10): compare within a shape "
        "only.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument("--merge", action="store_true", help="keep the other shapes' rows of --out")
    parser.add_argument(
        "--reestimate", action="store_true", help="recompute the estimate column of --out; measure nothing"
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(*json.loads(args.one))))
        return
    if args.reestimate:
        stored = json.loads((args.out / "trainer_bench.json").read_text())
        for row in stored["results"]:
            row["estimate_step_mib"] = estimate_mib(row)
        (args.out / "trainer_bench.json").write_text(json.dumps(stored, indent=2) + "\n")
        (args.out / "trainer_bench.md").write_text(_markdown(stored["results"]))
        return
    started = collect_provenance(simulated=False, engine="none (torch trainer only)")
    results = []
    shapes = args.shapes.split(",")
    if args.merge and (args.out / "trainer_bench.json").exists():
        previous = json.loads((args.out / "trainer_bench.json").read_text())["results"]
        results = [r for r in previous if r["shape"] not in shapes]
    for shape in shapes:
        for budget, chunk, checkpointing in CONFIGS[shape]:
            results.append(_run_isolated(shape, budget, chunk, checkpointing))
            print(json.dumps(results[-1]), flush=True)
    for row in results:
        row["estimate_step_mib"] = estimate_mib(row)
    provenance = collect_provenance(simulated=False, engine="none (torch trainer only)", started=started)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trainer_bench.json").write_text(
        json.dumps({"results": results, "provenance": provenance}, indent=2) + "\n"
    )
    (args.out / "trainer_bench.md").write_text(_markdown(results))


if __name__ == "__main__":
    main()
