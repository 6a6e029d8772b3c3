"""GPU telemetry probe: check that this machine's GPUs can be sampled, and what the samples say.

What it does: prints the GPU facts a run's provenance records (``telemetry.gpu_facts.gpu_info``),
then runs the telemetry sampler (``--telemetry auto`` by default) for ``--seconds``
and prints, per device, the rows written, the achieved sampling rate, mean
utilisation, mean SM clock, peak memory, mean power, and energy two ways: from the
driver's energy counter (what runs report) and from integrating sampled power (a
cross-check; they should agree within a few percent on a steady load).  With
``--burn S`` it also runs matrix multiplications on every sampled GPU for S seconds
in the middle of the probe and reports the busy share inside and outside that
window, which should be near 1 and near 0.  Every number is measured on this
machine by the sampler; nothing is simulated.  The last stdout line is one JSON
document.

    python benchmarks/telemetry_probe.py                 # 5 s, no load
    python benchmarks/telemetry_probe.py --seconds 10 --burn 4 --rate 20
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from typing import Any

from april_bench.config import ConfigError
from april_bench.telemetry import ListSink, TelemetryConfig, TelemetryRecord
from april_bench.telemetry.gpu_facts import gpu_info
from april_bench.telemetry.metrics import window_metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to sample")
    parser.add_argument("--rate", type=float, default=10.0, help="samples per second")
    parser.add_argument("--backend", default="auto", help="auto, nvml, amdsmi or off")
    parser.add_argument(
        "--burn", type=float, default=0.0, help="seconds of matmul load mid-probe (needs torch)"
    )
    args = parser.parse_args(argv)
    try:
        config = TelemetryConfig(backend=args.backend, rate_hz=args.rate)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    facts = gpu_info()
    print(
        f"GPUs ({len(facts)}):" if facts else "GPUs: none found (no NVML, AMD SMI, CUDA device or nvidia-smi)"
    )
    for f in facts:
        print(
            f"  {f['index']}: {f['name']} | driver {f['driver_version']} | CUDA {f['cuda_version']} "
            f"ROCm {f['rocm_version']} | {_gib(f['memory_total_bytes'])} | SM {f['sm_clock_mhz']}/"
            f"{f['sm_clock_max_mhz']} MHz | limit {f['power_limit_w']} W | "
            f"persistence {f['persistence_mode']} | compute {f['compute_mode']} | via {f['source']}"
        )

    sink: ListSink[TelemetryRecord] = ListSink()
    sampler = config.build(sink=sink, clock=time.monotonic)
    try:
        sampler.start()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(sampler.reason)
    burn_window = None
    try:
        if sampler.available:
            burn_window = _sample_with_load(args.seconds, args.burn, [i for i, _ in sampler.devices])
    finally:
        sampler.stop()

    report: dict[str, Any] = {
        "kind": "measured",
        "backend": sampler.backend,
        "reason": sampler.reason,
        "gpus": facts,
        "devices": {},
        "field_errors": sampler.field_errors(),
    }
    rows = [dataclasses.asdict(r) for r in sink.snapshot()]
    for index, name in sampler.devices:
        mine = [r for r in rows if r["device"] == index]
        report["devices"][index] = summary = _device_summary(name, mine)
        if burn_window is not None:
            a, b = burn_window
            t0, t1 = mine[0]["t"], mine[-1]["t"]
            summary["busy_share_burn"] = window_metrics(mine, [(a, b)])["busy_share"]
            summary["busy_share_outside"] = window_metrics(mine, [(t0, a), (b, t1)])["busy_share"]
        print(
            f"GPU {index} {name}: {summary['rows']} rows at {_fmt(summary['rate_hz'])} Hz | "
            f"util {_fmt(summary['util_mean'])} % | SM {_fmt(summary['sm_clock_mean_mhz'])} MHz | "
            f"mem peak {_gib(summary['mem_peak_bytes'])} | power {_fmt(summary['power_mean_w'])} W | "
            f"energy {_fmt(summary['energy_counter_j'])} J (counter), "
            f"{_fmt(summary['energy_power_integral_j'])} J (power integral)"
            + (
                f" | busy {_fmt(summary['busy_share_burn'])} during burn, "
                f"{_fmt(summary['busy_share_outside'])} outside"
                if burn_window is not None
                else ""
            )
        )
    for line in report["field_errors"]:
        print(f"  not available: {line}")
    print(json.dumps(report, default=str))
    return 0


def _sample_with_load(seconds: float, burn: float, devices: list[int]) -> tuple[float, float] | None:
    """Sleep ``seconds``; with ``burn`` > 0, run matmuls on ``devices`` for ``burn`` s in the middle."""
    if burn <= 0:
        time.sleep(seconds)
        return None
    import torch  # only for --burn

    if not torch.cuda.is_available():
        print("--burn needs torch with a GPU; sampling idle instead", file=sys.stderr)
        time.sleep(seconds)
        return None
    lead = max(0.0, (seconds - burn) / 2)
    time.sleep(lead)
    start = time.monotonic()
    threads = [
        threading.Thread(target=_burn, args=(torch, d, burn)) for d in range(torch.cuda.device_count())
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.monotonic()
    time.sleep(max(0.0, seconds - lead - (end - start)))
    return start, end


def _burn(torch: Any, device: int, seconds: float) -> None:
    a = torch.randn(8192, 8192, device=f"cuda:{device}", dtype=torch.bfloat16)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize(device)


def _device_summary(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    span = rows[-1]["t"] - rows[0]["t"] if len(rows) > 1 else 0.0
    whole = window_metrics(rows, [(rows[0]["t"], rows[-1]["t"])]) if span else {}
    powered = (
        window_metrics([dict(r, energy_j=None) for r in rows], [(rows[0]["t"], rows[-1]["t"])])
        if span
        else {}
    )
    energies = [r["energy_j"] for r in rows if r["energy_j"] is not None]
    return {
        "name": name,
        "rows": len(rows),
        "rate_hz": (len(rows) - 1) / span if span else None,
        "util_mean": _mean(r["util_gpu"] for r in rows),
        "sm_clock_mean_mhz": whole.get("sm_clock_mhz"),
        "mem_peak_bytes": max(
            (r["mem_used_bytes"] for r in rows if r["mem_used_bytes"] is not None), default=None
        ),
        "power_mean_w": _mean(r["power_w"] for r in rows),
        "energy_counter_j": energies[-1] - energies[0] if len(energies) > 1 else None,
        "energy_power_integral_j": powered.get("energy_j"),
    }


def _mean(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.1f} GiB"


if __name__ == "__main__":
    raise SystemExit(main())
