"""The torch trainer's memory estimate against the peak CUDA memory of a real train step.

The trainer checks, before its first step, that ``params + grads + AdamW + max(activations of the
largest micro-batch + one lm_head chunk + a head gradient, optimizer-step temporaries)`` fits the
device (:mod:`april_bench.trainers.memory`).  On a CPU that check could only be compared with RSS
(``benchmarks/trainer_bench.py``, one decoder layer); here every configuration runs the full model
on a GPU, in a fresh process, and reads the caching allocator's own counters:

* ``static``: ``torch.cuda.memory_allocated()`` after a first (small) step: weights, gradients and
  AdamW moments, against the estimate's ``params + grads + AdamW``;
* ``peak``: ``torch.cuda.max_memory_allocated()`` during the measured step (counters reset just
  before it), against the estimate's ``total``;
* ``reserved``: ``torch.cuda.max_memory_reserved()`` (what the allocator held, fragmentation included).

Weights are random (``--model`` names an architecture); the batch is seeded: ``groups x samples``
responses of ``response/2 .. response`` tokens after ``prompt``-token prompts.

    python benchmarks/trainer_memory_cuda.py                       # r1-distill-qwen-1.5b, real vocabulary
    python benchmarks/trainer_memory_cuda.py --vocab 17 --tag synthetic   # the GPU recipe's task vocabulary

Output: ``results/benchmarks/trainer_memory_cuda_<model>[_<tag>].{json,md}``.  Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trainer_bench's batch builder

GiB = 1024**3
#: (max_tokens_per_micro_batch, logprob_chunk_tokens, activation_checkpointing)
DEFAULT_CONFIGS = "2048:1024:0,4096:4096:0,16384:1024:1"


def measure_one(
    model: str,
    vocab: int | None,
    batch: tuple[int, int, int, int],
    config: tuple[int, int, bool],
    device: str = "cuda",
) -> dict[str, Any]:
    """One configuration, in this process (the parent runs each in a fresh one).  ``device="cpu"``
    runs the same steps with the memory counters read as 0 (a check of this script, not a measurement)."""
    import asyncio
    import time

    import torch
    from trainer_bench import _batch
    from transformers import AutoModelForCausalLM

    from april_bench.models.zoo import model_config
    from april_bench.trainers.torch_trainer import TorchTrainer

    budget, chunk, checkpointing = config
    torch.manual_seed(0)
    cuda = device.startswith("cuda")
    counters = torch.cuda if cuda else None
    with torch.device(device):  # initialise on the GPU: seconds, where the CPU takes a minute
        module = AutoModelForCausalLM.from_config(
            model_config(model, vocab_size=vocab), attn_implementation="sdpa"
        )
    trainer = TorchTrainer.Config(
        max_tokens_per_micro_batch=budget,
        logprob_chunk_tokens=chunk,
        activation_checkpointing=checkpointing,
        device=device,
        memory_budget_gib=0,  # measure even what the check would refuse
    ).build(module=module)
    size = module.config.vocab_size
    groups, samples, prompt, response = batch
    measured = _batch(groups, samples, prompt, response, size, seed=1)
    rows = trainer._rows(measured)
    micro = max(
        len(m) * max(rows.lengths[i] for i in m)
        for m in trainer._micro_batches(rows, list(range(len(rows.lengths))))
    )
    estimate = trainer.estimate_memory(micro)
    asyncio.run(trainer.train(_batch(1, 2, 4, 4, size, seed=2), step=0, policy_version=0))  # AdamW state
    if counters:
        counters.synchronize()
        counters.reset_peak_memory_stats()
    static = counters.memory_allocated() if counters else 0
    start = time.perf_counter()
    asyncio.run(trainer.train(measured, step=1, policy_version=1))
    if counters:
        counters.synchronize()
    seconds = time.perf_counter() - start
    return {
        "model": model,
        "vocab": size,
        "params": sum(p.numel() for p in module.parameters()),
        "max_tokens_per_micro_batch": budget,
        "logprob_chunk_tokens": chunk,
        "activation_checkpointing": checkpointing,
        "batch_tokens": sum(rows.lengths),
        "largest_micro_batch_tokens": micro,
        "step_s": seconds,
        "measured": {
            "static_bytes": static,
            "peak_bytes": counters.max_memory_allocated() if counters else 0,
            "reserved_peak_bytes": counters.max_memory_reserved() if counters else 0,
        },
        "estimate": {
            "static_bytes": estimate.params + estimate.grads + estimate.optimizer,
            "total_bytes": estimate.total,
            "terms": estimate.describe(),
        },
        "device_bytes": counters.mem_get_info()[1] if counters else 0,
    }


def _run_isolated(args: argparse.Namespace, config: tuple[int, int, bool]) -> dict[str, Any]:
    spec = json.dumps([args.model, args.vocab, [int(x) for x in args.batch.split("x")], list(config)])
    done = subprocess.run(
        [sys.executable, __file__, "--one", spec], capture_output=True, text=True, timeout=args.timeout
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"config": list(config), "error": last}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _gib(x: float) -> str:
    return f"{x / GiB:.2f}"


def render(result: dict[str, Any]) -> str:
    from april_bench.results.table import render_markdown

    prov = result["provenance"]
    gpus = ", ".join(g.get("name", "?") for g in prov["machine"].get("gpus") or []) or "no GPU seen"
    rows = []
    for r in result["rows"]:
        if "error" in r:
            budget, chunk, ckpt = r["config"]
            rows.append(
                [str(budget), str(chunk), "yes" if ckpt else "no", "-", "-", "-", "-", "-", "-", r["error"]]
            )
            continue
        m, e = r["measured"], r["estimate"]
        rows.append(
            [
                str(r["max_tokens_per_micro_batch"]),
                str(r["logprob_chunk_tokens"]),
                "yes" if r["activation_checkpointing"] else "no",
                str(r["largest_micro_batch_tokens"]),
                f"{_gib(e['static_bytes'])} / {_gib(m['static_bytes'])}",
                _gib(e["total_bytes"]),
                _gib(m["peak_bytes"]),
                f"{e['total_bytes'] / m['peak_bytes']:.2f}",
                _gib(m["reserved_peak_bytes"]),
                f"{r['step_s']:.2f}",
            ]
        )
    first = next((r for r in result["rows"] if "error" not in r), None)
    shape = (
        f"{first['params'] / 1e9:.2f} B parameters (vocabulary {first['vocab']:,}), batch "
        f"{result['batch']} (groups x samples x prompt x max response), {first['batch_tokens']:,} tokens"
        if first
        else f"batch {result['batch']}"
    )
    return "\n".join(
        [
            f"# Torch trainer: memory estimate vs measured CUDA peak, {result['model']} (MEASURED)",
            "",
            f"Commit `{prov['git']['commit']}`, {prov['utc']}, {gpus}.  {shape}; fp32 weights, "
            "AdamW, random weights.  Static: weights + gradients + AdamW moments (estimate / "
            "`memory_allocated` after a first step).  Peak: `max_memory_allocated` during one train "
            "step against the estimate's total (the check the trainer runs before its first step); "
            "ratio > 1 means the estimate is conservative.  Reserved: the allocator's peak hold.",
            "",
            render_markdown(
                (
                    "micro-batch budget",
                    "lm_head chunk",
                    "ckpt",
                    "largest micro-batch",
                    "static GiB est / meas",
                    "estimate GiB",
                    "peak GiB",
                    "estimate / peak",
                    "reserved GiB",
                    "step s",
                ),
                rows,
            ),
            "",
            "`python benchmarks/trainer_memory_cuda.py " + " ".join(result["argv"]) + "`",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="r1-distill-qwen-1.5b", help="architecture (random weights)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the model's)")
    parser.add_argument("--tag", default="", help="suffix of the output files")
    parser.add_argument("--batch", default="8x8x64x448", help="groups x samples x prompt x max response")
    parser.add_argument(
        "--configs", default=DEFAULT_CONFIGS, help="comma-separated budget:chunk:checkpointing(0/1)"
    )
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per configuration")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    if args.one is not None:
        model, vocab, batch, config, *device = json.loads(args.one)
        triple = (config[0], config[1], bool(config[2]))
        print(json.dumps(measure_one(model, vocab, tuple(batch), triple, *device)))
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("trainer_memory_cuda.py needs a CUDA device (on a CPU: benchmarks/trainer_bench.py)")
    from april_bench.results.provenance import collect_provenance

    configs = []
    for item in args.configs.split(","):
        budget, chunk, ckpt = item.split(":")
        configs.append((int(budget), int(chunk), ckpt == "1"))
    result: dict[str, Any] = {
        "label": "measured on cuda",
        "model": args.model,
        "batch": args.batch,
        "argv": [a for a in argv if a != "--one"],
        "rows": [],
    }
    for config in configs:
        row = _run_isolated(args, config)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    result["provenance"] = collect_provenance(simulated=False, engine="none")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"trainer_memory_cuda_{args.model}" + (f"_{args.tag}" if args.tag else "")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = render(result)
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
