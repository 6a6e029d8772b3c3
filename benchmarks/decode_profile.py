"""What one decode step of the hf engine launches and moves, per decode path, without a GPU.

The step of each path runs on PyTorch's ``meta`` device (shapes only, no data, no memory) under a
dispatch mode that records every operation that is not a view: the kernels a CUDA graph of the step
holds (on the fused path each Triton kernel counts once, with the bytes it must move), the bytes each
reads and writes, and the matrix products' FLOPs.  Bytes are ideal (each input read once, each output
written once; a radix sort is counted as 4 passes over keys and indices), so ``bytes / peak bandwidth``
is a floor, not a prediction of the step time.

It answers two questions the first H100 lease left open (``results/gpu/h100-2026-11-26``):

* **kernels per step**: the stock step is ~1,100 kernels at the 1.5B shape, the fused one ~300;
* **cost per extra sequence**: the bytes and FLOPs one more row adds, by category (matrix products,
  attention, sampler, the rest).  On the H100 the static path cost ~33 us per extra sequence where
  bytes and FLOPs at peak predict ~8 us; the table shows where the stock step's per-row traffic goes
  (the sampler's float32 passes over 151,936 logits and its sort) - the next lease checks it
  (``hf_bench.py --mbu``: the fused path's per-sequence slope against the static path's).

    python benchmarks/decode_profile.py                       # r1-distill-qwen-1.5b, batches 1 and 64
    python benchmarks/decode_profile.py --model qwen3-4b --batches 1,64,256 --context 1024

Writes ``results/benchmarks/decode_profile_<model>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from april_bench.engines.hf.cache import SlotKVCache
from april_bench.engines.hf.kernels import THRESHOLD_ROUNDS, TorchOps
from april_bench.engines.hf.static import StaticDecoder
from april_bench.models.zoo import model_config
from april_bench.profiles.hardware import HARDWARE
from april_bench.results.provenance import collect_provenance
from april_bench.results.table import render_markdown

META = torch.device("meta")
#: Passes of a radix sort over (float32 key, int64 index) pairs: 8-bit digits of a 32-bit key.
SORT_PASSES = 4


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


class StepLedger(TorchDispatchMode):
    """Kernels, bytes and FLOPs of every non-view operation, by category."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.phase = "forward"
        self.kernels: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)
        self.muted = 0

    def record(self, category: str, moved: float, flops: float = 0.0, kernels: int = 1) -> None:
        self.kernels[category] += kernels
        self.bytes[category] += moved
        self.flops[category] += flops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.muted or func.is_view or func in _FREE:
            return out
        name = func.overloadpacket.__name__
        moved = float(_bytes(args) + _bytes(list(kwargs.values())) + _bytes(out))
        if name in ("index_put_", "index_put"):  # reads the values and the indices, writes as many
            moved = float(2 * _bytes(args[2]) + _bytes(args[1]))
        elif name == "sort":
            moved *= SORT_PASSES
        flops = 0.0
        if name == "linear" and isinstance(out, torch.Tensor):  # not decomposed to mm under this mode
            flops = 2.0 * out.numel() * args[1].shape[1]
        elif func.overloadpacket in flop_registry:
            shapes = [a.shape if isinstance(a, torch.Tensor) else a for a in args]
            out_shape = out.shape if isinstance(out, torch.Tensor) else None
            try:
                flops = float(flop_registry[func.overloadpacket](*shapes, out_shape=out_shape, **kwargs))
            except TypeError:
                flops = 0.0
        self.record(self._category(name, args, out), moved, flops)
        return out

    def _category(self, name: str, args: Any, out: Any) -> str:
        if self.phase == "sampler":
            return "sampler + state"
        if name in ("mm", "addmm", "linear", "bmm", "matmul"):
            if isinstance(out, torch.Tensor) and out.shape[-1] == self.vocab:
                return "lm head"
            return "matrix products"
        if "attention" in name:
            return "attention"
        if name in ("index_put_", "index_put"):
            return "KV store"
        return "norms, rotary, other"


_FREE = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default}


class LedgerTritonOps(TorchOps):
    """:class:`~april_bench.engines.hf.triton_kernels.TritonOps`' accounting on the meta device: each
    operation runs as torch (muted, for its shapes) and is recorded as the one kernel the GPU launches,
    with the bytes it must move.  Attention reads each row's own keys: ``context`` of them."""

    name = "triton"

    def __init__(self, ledger: StepLedger, context: int, sm_count: int) -> None:
        self.ledger = ledger
        self.context = context
        self.sm_count = sm_count

    @contextmanager
    def _muted(self) -> Iterator[None]:
        self.ledger.muted += 1
        try:
            yield
        finally:
            self.ledger.muted -= 1

    def add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float) -> Any:
        with self._muted():
            out = super().add_rms_norm(x, residual, weight, eps)
        moved = _bytes(x) * (4 if residual is not None else 3) + _bytes(weight)
        self.ledger.record("norms, rotary, other", moved)
        return out

    def rope_store(self, qkv: Any, **kw: Any) -> Any:
        with self._muted():
            q = super().rope_store(qkv, **kw)
        self.ledger.record("norms, rotary, other", 2 * _bytes(qkv))
        return q

    def decode_attention(self, q: Any, keys: Any, values: Any, lengths: Any, **kw: Any) -> Any:
        with self._muted():
            out = super().decode_attention(q, keys, values, lengths, **kw)
        rows = q.shape[0]
        kv = 2 * rows * keys.shape[1] * self.context * keys.shape[3] * keys.element_size()
        heads, dim = q.shape[1], q.shape[2]
        flops = 4.0 * rows * heads * self.context * dim
        split = 2 * self.sm_count > rows * keys.shape[1]  # FusedQwen.splits_for on a GPU with sm_count SMs
        self.ledger.record("attention", kv + 2 * _bytes(q), flops, kernels=2 if split else 1)
        return out

    def silu_mul(self, gate_up: Any) -> Any:
        with self._muted():
            out = super().silu_mul(gate_up)
        self.ledger.record("norms, rotary, other", 1.5 * _bytes(gate_up))
        return out

    def top_p_threshold(self, weights: Any, need: Any) -> Any:
        with self._muted():
            out = super().top_p_threshold(weights, need)
        self.ledger.record("sampler + state", THRESHOLD_ROUNDS * _bytes(weights.float()))
        return out


def profile_step(
    model: Any, path: str, batch: int, context: int, sm_count: int, nucleus: bool
) -> dict[str, Any]:
    """The ledger of one decode step of ``batch`` rows at ``context`` tokens on ``path`` (meta device)."""
    from april_bench.engines.hf.fused import FusedQwen

    cfg = model.config
    vocab = model.get_output_embeddings().weight.shape[0]
    dtype = model.get_output_embeddings().weight.dtype
    cache = SlotKVCache.for_model(cfg, slots=batch, max_len=context + 1, dtype=dtype, device=META)
    ledger = StepLedger(vocab)
    fused = None
    if path == "fused":
        fused = FusedQwen(model, cache, kernels="torch")
        fused.ops = LedgerTritonOps(ledger, context, sm_count)
    decoder = StaticDecoder(
        model, cache, eos=frozenset({0}), cuda_graphs=False, max_graph_batch=batch, fused=fused
    )
    forward_owner: Any = fused if fused is not None else model
    name = "decode" if fused is not None else "forward"
    original = getattr(forward_owner, name)

    def traced(*args: Any, **kwargs: Any) -> Any:
        ledger.phase = "forward"
        out = original(*args, **kwargs)
        ledger.phase = "sampler"
        return out

    setattr(forward_owner, name, traced)
    try:
        with ledger, torch.inference_mode():
            decoder._step(batch, context + 1, nucleus)
    finally:
        delattr(forward_owner, name) if name in vars(forward_owner) else None
    return {
        "decode_path": path,
        "batch": batch,
        "kernels": dict(ledger.kernels),
        "bytes": dict(ledger.bytes),
        "flops": dict(ledger.flops),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    cfg = model_config(args.model)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16)
    model.eval()
    hw = HARDWARE.get(args.hw)
    points = []
    for path in args.decode_paths.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            points.append(profile_step(model, path, batch, args.context, args.sm_count, args.top_p < 1))
    return {
        "label": "counted on the meta device (no GPU): kernels, ideal bytes and FLOPs per decode step",
        "model": args.model,
        "context": args.context,
        "top_p": args.top_p,
        "hardware": args.hw,
        "peak_bandwidth": hw.memory_bw,
        "peak_flops": hw.bf16_flops,
        "points": points,
    }


def _floor_us(point: dict[str, Any], category: str, bw: float, flops: float) -> float:
    return 1e6 * max(point["bytes"].get(category, 0.0) / bw, point["flops"].get(category, 0.0) / flops)


CATEGORIES = (
    "matrix products",
    "lm head",
    "attention",
    "norms, rotary, other",
    "KV store",
    "sampler + state",
)


def render(result: dict[str, Any]) -> str:
    bw, peak = result["peak_bandwidth"], result["peak_flops"]
    rows = []
    for p in result["points"]:
        total_bytes = sum(p["bytes"].values())
        rows.append(
            [
                p["decode_path"],
                str(p["batch"]),
                str(sum(p["kernels"].values())),
                f"{total_bytes / 1e6:,.1f}",
                f"{sum(p['flops'].values()) / 1e9:,.1f}",
                f"{sum(_floor_us(p, c, bw, peak) for c in CATEGORIES):,.0f}",
            ]
        )
    per_seq = []
    paths = sorted({p["decode_path"] for p in result["points"]})
    for path in paths:
        pts = sorted((p for p in result["points"] if p["decode_path"] == path), key=lambda p: p["batch"])
        if len(pts) < 2:
            continue
        lo, hi = pts[0], pts[-1]
        extra = hi["batch"] - lo["batch"]
        cells = [path]
        for c in CATEGORIES:
            cells.append(f"{(_floor_us(hi, c, bw, peak) - _floor_us(lo, c, bw, peak)) / extra:.2f}")
        cells.append(
            f"{sum(_floor_us(hi, c, bw, peak) - _floor_us(lo, c, bw, peak) for c in CATEGORIES) / extra:.2f}"
        )
        per_seq.append(cells)
    kernels = [
        [p["decode_path"], str(p["batch"])] + [str(p["kernels"].get(c, 0)) for c in CATEGORIES]
        for p in result["points"]
    ]
    return "\n".join(
        [
            f"# hf decode step, counted: {result['model']} at {result['context']} tokens of context "
            "(COUNTED, no GPU)",
            "",
            f"{result['label']}; top_p {result['top_p']:g}.  Floors at {result['hardware']}'s peak: "
            f"{bw / 1e12:.2f} TB/s, {peak / 1e12:,.0f} TFLOP/s (each category: max of bytes/bandwidth and "
            "FLOPs/peak).  A floor is not a step time: it leaves out every kernel's launch and ramp.",
            "",
            render_markdown(("decode path", "batch", "kernels", "MB moved", "GFLOP", "floor us"), rows),
            "",
            "Kernels per step by category:",
            "",
            render_markdown(("decode path", "batch", *CATEGORIES), kernels),
            "",
            "Floor microseconds per extra sequence (between the smallest and largest batch), by category:",
            "",
            render_markdown(("decode path", *CATEGORIES, "total"), per_seq),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="r1-distill-qwen-1.5b")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--context", type=int, default=528, help="tokens per row (hf_bench --mbu: 512 + 16)")
    parser.add_argument("--decode-paths", default="static,fused")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--hw", default="h100", help="hardware profile for the floors")
    parser.add_argument(
        "--sm-count", type=int, default=132, help="the GPU's SMs (split-KV factor): H100 SXM 132"
    )
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args(argv)
    result = measure(args)
    result["provenance"] = collect_provenance(simulated=False, engine="hf")
    text = render(result)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"decode_profile_{args.model}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
