"""Issue 24 item 4: ``whatif`` on a measured run's own trace, with its engine's cost curve, against that run.

Input: a ``simcheck`` directory (its ``measured/`` run directory and ``cost_curve.json``).  The script
runs ``whatif`` on the measured run's sync-arm trace with the measured cost curve (one engine, the
sync and APRIL arms, APRIL's N'/N taken from the run) and writes a markdown table of the predicted
(SIMULATED) gains beside the measured ones, read from ``measured/summary.json``:

    python benchmarks/whatif_vs_measured.py results/validation/simcheck-hf-cpu \
        --out results/whatif/hf-cpu-own-trace

The table is a pure function of the two summaries; nothing in the prediction is fitted to the run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from april_bench.simcheck import _predict, measured_iterations_per_step
from april_bench.trace.format import read_trace
from april_bench.whatif import WhatIf, run_whatif, whatif_config

ROWS = (
    ("Generated-token gain (ratio of totals)", "throughput_gain", "generated_gain"),
    ("Useful-token gain (ratio of totals)", "useful_gain", "useful_gain"),
    ("End-to-end gain (ratio of totals)", "end_to_end_gain", "end_to_end_gain"),
    ("Off-policy share of trained tokens", "off_policy_token_ratio", "off_policy_share"),
)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


def compare(check: Path, out: Path) -> str:
    measured_dir = check / "measured"
    config = json.loads((measured_dir / "config.json").read_text())
    provenance = json.loads((measured_dir / "provenance.json").read_text())
    arms = json.loads((measured_dir / "summary.json").read_text())["arms"]
    rollout = config["rollout"]
    ratio = rollout["over_sampling_batch_size"] / rollout["rollout_batch_size"]
    setup = WhatIf(
        strategies=("sync", "april"),
        drivers=(),
        ratio=ratio,
        arm="sync",
        cost_curve=check / "cost_curve.json",
    )
    result = run_whatif(measured_dir, setup, out, overwrite=True)
    predicted = next(r for r in result["rows"] if r["strategy"] == "april")
    measured: dict[str, Any] = arms["april"]
    paired = measured.get("paired_gains", {}).get("throughput", {})
    load = provenance["machine"]
    lines = [
        f"# whatif on the measured {provenance['engine']} run's own trace vs that run",
        "",
        f"Measured: `{' '.join(provenance['command'])}` at commit {provenance['git']['commit'][:7]} "
        f"(dirty: {provenance['git']['dirty']}), {config['steps']} steps x {config['repeats']} repeats, "
        f"{rollout['rollout_batch_size']} groups x {rollout['n_samples_per_prompt']}, N' "
        f"{rollout['over_sampling_batch_size']}; load average {load['load_average_start']} at its start, "
        f"{load['load_average_end']} at its end, {load['cpu_count']} cores.",
        f"Predicted (SIMULATED): `whatif {measured_dir} --arm sync --cost-curve {check / 'cost_curve.json'} "
        f"--strategies sync,april --drivers none --ratio {ratio:g}` (the sync arm's trace, repeat 0; the "
        "engine priced by the cost curve measured in the same simcheck command), run directory "
        f"`{out}`.",
        "",
        "| APRIL vs sync | Measured | Predicted (simulated) | Error (points) |",
        "|---|---|---|---|",
    ]
    for label, m_key, p_key in ROWS:
        m, p = measured.get(m_key), predicted.get(p_key)
        error = "n/a" if m is None or p is None else f"{(p - m) * 100:+.1f}"
        show = _share if m_key == "off_policy_token_ratio" else _pct
        lines.append(f"| {label} | {show(m)} | {show(p)} | {error} |")
    # engine iterations per step: the replay's forward passes (the same simulation again, deterministic)
    # against the measured engine's own accounting (steps.jsonl)
    replay, _ = whatif_config(read_trace(measured_dir, arm="sync"), setup)
    _, passes = _predict(replay, progress=False)
    steps = [json.loads(line) for line in (measured_dir / "steps.jsonl").read_text().splitlines()]
    for arm in ("sync", "april"):
        m_it = measured_iterations_per_step(steps, arm).per_step
        p_it = next(v for k, v in passes.items() if k.split("[")[0] == arm)
        error = "n/a" if not m_it else f"{(p_it / m_it - 1) * 100:+.1f}%"
        shown = "n/a" if m_it is None else f"{m_it:.1f}"
        lines.append(f"| Engine iterations per step, {arm} | {shown} | {p_it:.1f} | {error} (relative) |")
    median, ci = paired.get("median"), paired.get("ci")
    if median is not None and ci is not None:
        p = predicted["generated_gain"]
        inside = "inside" if ci[0] <= p <= ci[1] else "outside"
        lines += [
            "",
            f"Measured generated-token gain as a paired median over {paired.get('pairs')} interleaved "
            f"blocks: {_pct(median)}, 95% CI [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]; the prediction "
            f"{_pct(p)} is {inside} it ({(p - median) * 100:+.1f} points from the median).",
        ]
    text = "\n".join(lines) + "\n"
    (out / "comparison.md").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("simcheck", type=Path, help="a simcheck output directory")
    parser.add_argument("--out", type=Path, required=True, help="the whatif run directory to write")
    args = parser.parse_args()
    print(compare(args.simcheck, args.out))


if __name__ == "__main__":
    main()
