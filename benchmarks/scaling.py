"""Cluster-scale what-if (SIMULATED): sync vs APRIL from 64 to 1,024 GPUs.

For each GPU count and tensor-parallel size the simulator runs ``GPUs / tp`` SGLang replicas behind
the router, with the rollout batch grown with the replica count (``groups_per_replica`` prompt
groups of 8 samples per replica, APRIL's 2x over-sampling), and a colocated trainer on all GPUs.

Weight sync after each step = the local update and colocate switch (the simulator's
``sync_s_per_billion_params``, ~11 s for a 4B model on H200) + broadcasting the bf16 weights from
the trainer to every replica over the network:

* ``ring``: a pipelined ring/tree broadcast (NCCL's), ``bytes / bandwidth + hops x latency``;
* ``tree``: store-and-forward binary tree, ``log2(replicas) x bytes / bandwidth``;
* ``star``: the trainer sends each replica its own copy, ``replicas x bytes / bandwidth``.

Every number printed or saved is **simulated** (the simulator's cost model, not a measurement).
Output: ``results/benchmarks/scaling.json`` and ``.md``, and ``scaling.png`` when matplotlib is
installed (``--out`` to change).

    python benchmarks/scaling.py            # 64..1,024 GPUs, tp 1/2/4, three networks
    python benchmarks/scaling.py --quick    # 64 and 256 GPUs, fewer steps: a smoke check
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from april_bench.experiment import ExperimentConfig, run
from april_bench.profiles.models import MODELS
from april_bench.results.provenance import collect_provenance
from april_bench.rollout.loop import RolloutConfig

NETWORKS = ("ring", "tree", "star")
LABEL = "SIMULATED"


def broadcast_s(network: str, replicas: int, params: float, gbps: float, latency_s: float) -> float:
    """Seconds to get ``params`` bf16 weights to ``replicas`` engines over ``gbps`` links."""
    seconds_per_copy = 2 * params * 8 / (gbps * 1e9)
    if replicas <= 1:
        return 0.0
    if network == "ring":
        return seconds_per_copy + replicas * latency_s
    if network == "tree":
        return math.ceil(math.log2(replicas)) * (seconds_per_copy + latency_s)
    if network == "star":
        return replicas * seconds_per_copy + latency_s
    raise ValueError(f"unknown network {network!r}; choose from {', '.join(NETWORKS)}")


def one_point(args: argparse.Namespace, gpus: int, tp: int, network: str) -> dict[str, Any]:
    replicas = gpus // tp
    params = MODELS.get(args.model).total_params
    local_switch = args.switch_s_per_billion * params / 1e9
    sync_s = local_switch + broadcast_s(network, replicas, params, args.link_gbps, args.latency_us * 1e-6)
    groups = args.groups_per_replica * replicas
    config = ExperimentConfig(
        engine="sim",
        hardware=args.hardware,
        model=args.model,
        num_gpus=gpus,
        steps=args.steps,
        strategies=("sync", "april"),
        engine_args={"tp_size": tp, "sync_s_per_billion_params": sync_s / (params / 1e9)},
        rollout=RolloutConfig(
            rollout_batch_size=groups,
            n_samples_per_prompt=8,
            over_sampling_batch_size=2 * groups,
            max_response_len=args.max_response_len,
        ),
    )
    start = time.perf_counter()
    summary = run(config, progress=False).recorder.summary()
    wall = time.perf_counter() - start
    sync, april = summary["sync"], summary["april"]
    return {
        "gpus": gpus,
        "tp": tp,
        "replicas": replicas,
        "network": network,
        "groups_per_step": groups,
        "weight_sync_s": round(sync_s, 2),
        "sync_tokens_per_s": round(sync["generated_tokens_per_s"]),
        "april_tokens_per_s": round(april["generated_tokens_per_s"]),
        "throughput_gain": round(april["throughput_gain"], 4),
        "end_to_end_gain": round(april["end_to_end_gain"], 4),
        "sync_step_s": round(sync["step_time_per_step_s"], 1),
        "april_step_s": round(april["step_time_per_step_s"], 1),
        "sync_share_of_step": round(sync_s / april["step_time_per_step_s"], 3),
        "simulator_wall_s": round(wall, 1),
    }


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = (
        f"## Cluster-scale what-if ({LABEL})\n\n"
        f"{args.model} on {args.hardware}, {args.groups_per_replica} groups x 8 per replica, "
        f"over-sampling 2x, {args.max_response_len}-token limit, {args.steps} steps per arm; "
        f"weight broadcast over {args.link_gbps:g} Gb/s links, {args.latency_us:g} us per hop, "
        f"+ {args.switch_s_per_billion:g} s per 1e9 parameters local switch.  All numbers simulated.\n\n"
        "| GPUs | tp | replicas | network | groups/step | weight sync s | sync tok/s | APRIL tok/s "
        "| throughput gain | end-to-end gain | sync step s | APRIL step s "
        "| weight sync share of APRIL step |\n"
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    body = "".join(
        f"| {r['gpus']} | {r['tp']} | {r['replicas']} | {r['network']} | {r['groups_per_step']} "
        f"| {r['weight_sync_s']} | {r['sync_tokens_per_s']:,} | {r['april_tokens_per_s']:,} "
        f"| {r['throughput_gain']:+.1%} | {r['end_to_end_gain']:+.1%} | {r['sync_step_s']} "
        f"| {r['april_step_s']} | {r['sync_share_of_step']:.1%} |\n"
        for r in rows
    )
    return head + body


def figure(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for tp in sorted({r["tp"] for r in rows}):
        ring = sorted((r for r in rows if r["tp"] == tp and r["network"] == "ring"), key=lambda r: r["gpus"])
        left.plot(
            [r["gpus"] for r in ring], [100 * r["throughput_gain"] for r in ring], "o-", label=f"tp={tp}"
        )
    for network in NETWORKS:
        mine = sorted((r for r in rows if r["tp"] == 2 and r["network"] == network), key=lambda r: r["gpus"])
        if mine:
            right.plot(
                [r["gpus"] for r in mine], [100 * r["end_to_end_gain"] for r in mine], "o-", label=network
            )
    for ax, title in ((left, "APRIL rollout throughput gain (ring sync)"), (right, "end-to-end gain, tp=2")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("gain over sync (%)")
        ax.set_title(title, fontsize=10)
        ax.legend()
    fig.suptitle(f"{LABEL}: april-bench simulator, cluster-scale what-if", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 and 256 GPUs, 2 steps")
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--model", default="qwen3-4b")
    parser.add_argument("--groups-per-replica", type=int, default=4)
    parser.add_argument("--max-response-len", type=int, default=8192)
    parser.add_argument("--link-gbps", type=float, default=400.0, help="per-link bandwidth (InfiniBand NDR)")
    parser.add_argument("--latency-us", type=float, default=10.0)
    parser.add_argument("--switch-s-per-billion", type=float, default=2.5)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/scaling"))
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.tp, args.steps = [64, 256], [2], 2
    rows = []
    for gpus in args.gpus:
        for tp in args.tp:
            # every network at tp=2 (the figure's right panel); the ring elsewhere
            for network in NETWORKS if tp == 2 else ("ring",):
                row = one_point(args, gpus, tp, network)
                print(json.dumps(row), flush=True)
                rows.append(row)
    text = markdown(rows, args)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"label": LABEL, "settings": vars(args) | {"out": str(args.out)}, "rows": rows}
    record["provenance"] = collect_provenance(simulated=True, engine="sim")
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    args.out.with_suffix(".md").write_text(text)
    if figure(rows, args.out.with_suffix(".png")):
        print(f"figure: {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
