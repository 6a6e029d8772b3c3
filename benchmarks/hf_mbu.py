"""hf engine decode step against the memory-bandwidth limit: step time, tokens/s and MBU by batch size.

For each decode path and batch ``B`` the embedded engine runs ``B`` requests of
``--context`` prompt tokens for ``--steps`` decode steps (replayed lengths, so
no request stops early) twice - a warm-up that also captures the CUDA graphs,
then the measured run - and takes the median step time the engine recorded.

Model-bandwidth utilisation is the bytes a step must read over the time it
took, against the device's peak bandwidth:

    MBU = (weight bytes + KV bytes read) / step time / peak bandwidth

* weight bytes: the model's parameters (element size of the engine's dtype),
  less an untied input-embedding table (a lookup reads only ``B`` rows);
* KV bytes: ``B`` x mean context x (2 x layers x KV heads x head dim x element size);
* peak bandwidth: the GPU's vendor figure from ``april_bench/profiles/hardware.py``
  (picked from the device name, or ``--hw``); on a CPU, the copy bandwidth
  ``measure_host`` measures on this machine (labelled so).

Weights are random (``--model`` names an architecture: ``tiny``, ``r1-distill-qwen-1.5b``,
``qwen3-4b`` ...; no hub is needed).  Every step time is measured; the table says on what.

The decode paths (``--decode-paths``, default all three): ``eager`` (host lists),
``static`` (device state, CUDA graphs, the ``transformers`` forward and sorted
sampler) and ``fused`` (the fused Qwen2/Qwen3 forward with Triton kernels on a
GPU, the sort-free sampler, every graph captured at engine start, ``done`` read
one step late).  Besides the table: each path's cost per extra sequence (a
least-squares line through its step times against batch size: the first H100
lease measured ~33 us for ``static``), the seconds spent capturing graphs at
start, and each point against the issue-33 targets where they apply.

    python benchmarks/hf_bench.py --mbu --device cpu --model tiny
    # on one H100 the targets are <= 2.0 ms per step at batch 1 and <= 3.5 ms at batch 64:
    python benchmarks/hf_bench.py --mbu --device cuda --model r1-distill-qwen-1.5b
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from april_bench.engines.hf import HFEngine
from april_bench.engines.protocol import GenerateRequest, SamplingParams
from april_bench.profiles.hardware import HARDWARE, measure_host
from april_bench.profiles.models import MODELS
from april_bench.results.provenance import collect_provenance
from april_bench.results.table import render_markdown
from april_bench.vtime import run_real

__all__ = ["add_arguments", "main", "measure"]

#: Issue 33's targets: decode step ms by batch for the 1.5B shape on one H100 (bf16, 512-token prompts).
TARGET = {"model": "r1-distill-qwen-1.5b", "hardware": "h100", "step_ms": {1: 2.0, 64: 3.5}}


def target_ms(model: str, hardware: str | None, batch: int) -> float | None:
    """The target step time for this point, or ``None`` where no target applies."""
    if model != TARGET["model"] or hardware != TARGET["hardware"]:
        return None
    return TARGET["step_ms"].get(batch)


def per_sequence_us(points: list[dict[str, Any]]) -> float | None:
    """Least-squares slope of step time against batch size, in microseconds per extra sequence."""
    if len({p["batch"] for p in points}) < 2:
        return None
    xs = [float(p["batch"]) for p in points]
    ys = [p["step_ms"] * 1e3 for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--mbu: decode step against the memory-bandwidth limit")
    group.add_argument("--mbu", action="store_true", help="run the MBU benchmark (only)")
    group.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    group.add_argument(
        "--model", default="tiny", help="architecture with random weights (profiles/models.py)"
    )
    group.add_argument("--dtype", default="auto", help="float32, bfloat16 ... (auto: bf16 on cuda)")
    group.add_argument("--batches", default="1,8,64,256", help="comma-separated batch sizes")
    group.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    group.add_argument("--steps", type=int, default=32, help="decode steps per measured run")
    group.add_argument("--decode-paths", default="eager,static,fused", help="comma-separated hf decode paths")
    group.add_argument(
        "--top-p", type=float, default=1.0, help="requests' top-p (1: the sort-free sampler's fast path)"
    )
    group.add_argument("--hw", default=None, help="peak-bandwidth profile (default: from the device name)")
    group.add_argument(
        "--profile",
        action="store_true",
        help="on cuda, also the GPU time of one step's kernels by category (torch.profiler over eager "
        "launches of the step a graph holds): where a step's time and its cost per extra sequence go",
    )


def _hardware(device: str, hw: str | None) -> str | None:
    """The hardware profile name for ``device`` (``--hw``, or from the GPU's name); ``None`` on a CPU."""
    if hw is not None or not device.startswith("cuda"):
        return hw
    import torch

    name = torch.cuda.get_device_name(torch.device(device)).lower()
    return next((h for h in ("h200", "h100", "mi300x") if h in name), None)


def _peak_bandwidth(device: str, hw: str | None) -> tuple[float, str]:
    """Peak bytes/s and where the figure comes from."""
    if hw is None and device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device)).lower()
        hw = next((h for h in ("h200", "h100", "mi300x") if h in name), None)
        if hw is None:
            raise SystemExit(f"no bandwidth profile for GPU {name!r}: pass --hw (one of {HARDWARE.names()})")
    if hw is not None:
        profile = HARDWARE.get(hw)
        return profile.memory_bw, f"{hw}: {profile.sources.get('memory_bw', 'vendor peak')}"
    host = measure_host(1.0)
    return host.memory_bw, "measured on this CPU: float32 copy bandwidth (measure_host), not a vendor peak"


#: Kernel-name patterns (lower case) of each category, first match wins.
KERNEL_CATEGORIES = (
    ("attention", ("attention", "fmha", "flash", "_combine")),
    ("sampler", ("sort", "radix", "scan", "softmax", "searchsorted", "argmax", "_top_p", "logsumexp")),
    ("matrix products", ("gemm", "gemv", "cutlass", "cublas", "sm90_", "sm80_", "nvjet")),
    ("fused elementwise", ("_add_rms_norm", "_rope_store", "_silu_mul")),
)


def kernel_category(name: str) -> str:
    lowered = name.lower()
    return next((cat for cat, keys in KERNEL_CATEGORIES if any(k in lowered for k in keys)), "other")


def _kernel_profile(engine: HFEngine, batch: int, context: int, repeats: int = 5) -> dict[str, Any] | None:
    """GPU microseconds per step by kernel category: the step a graph holds, launched eagerly under
    torch.profiler (kernel times are the graph's; launch gaps are not counted).  Rows are set to
    ``context`` tokens, so attention reads what a real step reads; the rows are padding (no live state)."""
    import torch

    decoder = engine.static_decoder
    if decoder is None or engine.device.type != "cuda":
        return None
    rows = batch
    if decoder.pad_to_buckets:
        rows = next((b for b in decoder.batch_buckets if b >= batch), batch)
    view = (
        decoder.max_len
        if not decoder.needs_view
        else next((b for b in decoder.kv_buckets if b >= context + 1), decoder.max_len)
    )
    saved = decoder.ints[:rows].clone()
    decoder.position[:rows] = context
    with torch.inference_mode():
        decoder._step(rows, view, False)  # warm (Triton, cuBLAS handles)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                decoder._step(rows, view, False)
            torch.cuda.synchronize()
    decoder.ints[:rows].copy_(saved)
    decoder.done.zero_()
    by_category: dict[str, float] = {}
    kernels = 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kernels += 1
        category = kernel_category(event.name)
        by_category[category] = by_category.get(category, 0.0) + event.time_range.elapsed_us() / repeats
    return {"kernels_per_step": kernels / repeats, "us_by_category": by_category}


def _bytes_per_step(engine: HFEngine, batch: int, mean_context: float) -> tuple[float, float]:
    """(weight bytes, KV bytes) one decode step of ``batch`` sequences must read."""
    model: Any = engine.model
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    if embed is not model.get_output_embeddings().weight:
        weights -= embed.numel() * embed.element_size() - batch * embed.shape[1] * embed.element_size()
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = 2 * cfg.num_hidden_layers * heads * head_dim * embed.element_size()
    return float(weights), float(batch * mean_context * per_token)


async def _run_batch(
    engine: HFEngine, batch: int, context: int, steps: int, tag: str, top_p: float = 1.0
) -> float:
    sp = SamplingParams(temperature=1.0, top_p=top_p)
    engine.reset_step_times()
    requests = [
        GenerateRequest(f"{tag}-{i}", context, steps, sp, input_ids=tuple([5] * context), replay_len=steps)
        for i in range(batch)
    ]
    [c async for c in engine.generate(requests)]
    times = engine.step_times.get(batch, [])
    if not times:
        raise SystemExit(f"no decode step at batch {batch} was timed; raise --steps")
    return statistics.median(times)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    batches = [int(b) for b in args.batches.split(",")]
    vocab = MODELS.get(args.model).vocab if args.model in MODELS.names() else None
    peak, peak_source = _peak_bandwidth(args.device, args.hw)
    hardware = _hardware(args.device, args.hw)
    points = []
    runtime: dict[str, Any] = {}
    for path in args.decode_paths.split(","):
        engine = HFEngine.Config(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            decode_path=path,
            max_running_requests=max(batches),
            max_context_len=args.context + args.steps + 1,
            max_prefill_tokens=max(args.context, 8192),
            prefill_chunk_tokens=8192,
        ).build(vocab_size=vocab)

        async def sweep(engine: HFEngine = engine, path: str = path) -> list[dict[str, Any]]:
            await engine.start()
            out = []
            top_p = args.top_p
            for batch in batches:
                await _run_batch(engine, batch, args.context, args.steps, f"warm-{path}-{batch}", top_p)
                step = await _run_batch(engine, batch, args.context, args.steps, f"{path}-{batch}", top_p)
                weights, kv = _bytes_per_step(engine, batch, args.context + args.steps / 2)
                out.append(
                    {
                        "decode_path": path,
                        "batch": batch,
                        "step_ms": 1e3 * step,
                        "tokens_per_s": batch / step,
                        "weight_bytes": weights,
                        "kv_bytes": kv,
                        "mbu": (weights + kv) / step / peak,
                        "target_ms": target_ms(args.model, hardware, batch),
                        "kernel_profile": (
                            _kernel_profile(engine, batch, args.context) if args.profile else None
                        ),
                    }
                )
            decoder = engine.static_decoder
            runtime[path] = {
                "device": str(engine.device),
                "dtype": str(engine.dtype).removeprefix("torch."),
                "decode_path": engine.decode_path,
                "fused_kernels": decoder.fused.ops.name if decoder and decoder.fused else None,
                "fused_kernels_note": decoder.fused.kernels_note if decoder and decoder.fused else None,
                "cuda_graphs_captured": decoder.graphs_captured if decoder else 0,
                "cuda_graph_error": decoder.graph_error if decoder else None,
                "capture_seconds_at_start": engine.capture_seconds,
                "per_sequence_us": per_sequence_us(out),
            }
            await engine.close()
            return out

        try:  # one path failing (a kernel that does not build on this GPU) must not cost the others
            points += run_real(sweep())
        except Exception as exc:
            runtime[path] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print(f"decode path {path} failed: {runtime[path]['error']}", file=sys.stderr)
    return {
        "label": f"measured on {args.device}",
        "model": args.model,
        "context": args.context,
        "steps": args.steps,
        "peak_bandwidth": peak,
        "peak_bandwidth_source": peak_source,
        "hardware": hardware,
        "top_p": args.top_p,
        "runtime": runtime,
        "points": points,
        "target": TARGET,
    }


def render(result: dict[str, Any], provenance: dict[str, Any]) -> str:
    prov = provenance
    device = result["label"].removeprefix("measured on ")
    gpus = prov["machine"].get("gpus") or []
    where = (
        ", ".join(g.get("name", "?") for g in gpus) if device.startswith("cuda") else prov["machine"]["cpu"]
    )
    lines = [
        f"# hf engine decode step vs the bandwidth limit: {result['model']} on {device} (MEASURED)",
        "",
        f"Commit `{prov['git']['commit']}` (dirty: {prov['git']['dirty']}), {prov['utc']}, {where}.  "
        f"Random weights, {result['context']}-token prompts, median of {result['steps']} decode steps "
        "after a warm-up run.  MBU = (weight + KV bytes read per step) / step time / peak bandwidth; peak: "
        f"{result['peak_bandwidth'] / 1e9:,.1f} GB/s ({result['peak_bandwidth_source']}).  "
        f"Load average at the start: {prov['machine'].get('load_average_start')} "
        f"({prov['machine']['cpu_count']} cores; a shared machine's timings are noisy).",
        "",
        render_markdown(
            ("decode path", "batch", "step ms", "tokens/s", "weights MB", "KV MB", "MBU", "target ms", "met"),
            [
                [
                    p["decode_path"],
                    str(p["batch"]),
                    f"{p['step_ms']:.2f}",
                    f"{p['tokens_per_s']:,.0f}",
                    f"{p['weight_bytes'] / 1e6:,.2f}",
                    f"{p['kv_bytes'] / 1e6:,.2f}",
                    f"{p['mbu']:.2%}",
                    "-" if p.get("target_ms") is None else f"{p['target_ms']:g}",
                    "-"
                    if p.get("target_ms") is None
                    else ("yes" if p["step_ms"] <= p["target_ms"] else "NO"),
                ]
                for p in result["points"]
            ],
        ),
        "",
        "Runtime: "
        + "; ".join(
            f"{path}: FAILED ({r['error']})"
            if "error" in r
            else f"{path}: {r['device']} {r['dtype']} ({r.get('decode_path', path)} path"
            + (f", {r['fused_kernels']} kernels" if r.get("fused_kernels") else "")
            + (f" [{r['fused_kernels_note']}]" if r.get("fused_kernels_note") else "")
            + f"), {r['cuda_graphs_captured']} CUDA graphs"
            + (
                f" captured in {r['capture_seconds_at_start']:.1f} s at start"
                if r["cuda_graphs_captured"]
                else ""
            )
            + (f" (capture failed: {r['cuda_graph_error']})" if r["cuda_graph_error"] else "")
            + (
                f", {r['per_sequence_us']:.1f} us per extra sequence"
                if r.get("per_sequence_us") is not None
                else ""
            )
            for path, r in result["runtime"].items()
        ),
        "",
        *_profile_lines(result),
        f"Targets (issue 33): <= {TARGET['step_ms'][1]:g} ms per decode step at batch 1 and <= "
        f"{TARGET['step_ms'][64]:g} ms at batch 64 for {TARGET['model']} on one {TARGET['hardware'].upper()} "
        f"(bf16, 512-token prompts: `--device cuda --model {TARGET['model']}`); requests' top-p "
        f"{result['top_p']:g}.",
    ]
    return "\n".join(lines)


def _profile_lines(result: dict[str, Any]) -> list[str]:
    """The kernel-time table (``--profile``), and each category's cost per extra sequence."""
    points = [p for p in result["points"] if p.get("kernel_profile")]
    if not points:
        return []
    names = ("matrix products", "attention", "fused elementwise", "sampler", "other")
    rows = [
        [p["decode_path"], str(p["batch"]), f"{p['kernel_profile']['kernels_per_step']:.0f}"]
        + [f"{p['kernel_profile']['us_by_category'].get(n, 0.0):,.0f}" for n in names]
        for p in points
    ]
    slopes = []
    for path in sorted({p["decode_path"] for p in points}):
        mine = sorted((p for p in points if p["decode_path"] == path), key=lambda p: p["batch"])
        if len(mine) >= 2 and mine[-1]["batch"] > mine[0]["batch"]:
            lo, hi = mine[0]["kernel_profile"]["us_by_category"], mine[-1]["kernel_profile"]["us_by_category"]
            span = mine[-1]["batch"] - mine[0]["batch"]
            cells = [f"{(hi.get(n, 0.0) - lo.get(n, 0.0)) / span:.2f}" for n in names]
            slopes.append([path, f"{mine[0]['batch']}..{mine[-1]['batch']}", *cells])
    return [
        "GPU time of one step's kernels by category (us; `--profile`: eager launches of the graph's step "
        "under torch.profiler, launch gaps not counted):",
        "",
        render_markdown(("decode path", "batch", "kernels", *names), rows),
        "",
        "Kernel microseconds per extra sequence, by category:",
        "",
        render_markdown(("decode path", "batches", *names), slopes),
        "",
    ]


def main(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    result = measure(args)
    provenance = collect_provenance(simulated=False, engine="hf")
    result["provenance"] = provenance
    result["wall_s"] = time.perf_counter() - start
    text = render(result, provenance)
    device = args.device.split(":")[0]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"hf_mbu_{device}_{args.model}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
