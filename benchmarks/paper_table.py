"""The paper table, simulated: APRIL's three published settings on 8 x H100 and 8 x MI300X.

For each setting of :data:`april_bench.sim.paper_settings.PAPER_SETTINGS` and
each GPU type, simulate the scripted baseline (sync) and APRIL and print the
paper's figure next to the simulated headline gain (APRIL's
``partial_rollout/tokens_throughput``: every generated token over rollout time,
discarded ones included), the useful-token gain (trained response tokens over
rollout time) and the difference.  Then the mechanism rows: the DAPO setting
under the other refill rule and the throughput definitions, and the length
calibration against published statistics (:mod:`april_bench.sim.calibration`).

Every number is SIMULATED.  The simulator is deterministic, so the committed
``results/benchmarks/paper_table.json`` is reproduced exactly by

    python benchmarks/paper_table.py              # ~3 minutes on one core
    python benchmarks/paper_table.py --fit        # re-fit the unpublished parameters first (~20 minutes)

``--fit`` prints the fitted values; copy them into ``paper_settings.py``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from april_bench.results.table import render_markdown
from april_bench.sim.calibration import PUBLISHED, fit_lengths, fit_setting, simulate_setting
from april_bench.sim.paper_settings import HARDWARE, PAPER_SETTINGS, STEPS, paper_setting

#: How close each simulated headline gain must stay to the paper's (absolute, in gain units).
TOLERANCE = 0.05


def table(steps: int) -> list[dict[str, Any]]:
    return [simulate_setting(s, hw, steps=steps) for s in PAPER_SETTINGS for hw in HARDWARE]


def mechanisms(steps: int) -> list[dict[str, Any]]:
    """The DAPO setting under the two refill rules, to show where the baseline's semantics matter."""
    dapo = paper_setting("dapo")
    rows = []
    for label, setting in (
        ("fitted rejection rate (table row)", dapo),
        ("Beta a+b = 2: U-shaped solve rates", dapo.with_values(solve_concentration=2.0)),
        ("no rejections (a+b = 400)", dapo.with_values(solve_concentration=400.0)),
    ):
        row = simulate_setting(setting, "mi300x", steps=steps)
        rows.append({"case": label, "solve_concentration": setting.solve_concentration, **row})
    return rows


def calibration() -> list[dict[str, Any]]:
    out = []
    for target in PUBLISHED:
        fit = fit_lengths(target)
        out.append(
            {
                "target": target.name,
                "model": target.model,
                "cap": target.cap,
                "params": asdict(fit.params),
                "rows": [{"statistic": k, "published": p, "model": m} for k, p, m in fit.rows()],
                "sources": target.sources,
            }
        )
    return out


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:+.{digits}%}"


def render(result: dict[str, Any]) -> str:
    rows = result["table"]
    out = [
        "# The paper table, SIMULATED",
        "",
        f"APRIL vs the scripted baseline, Qwen3-4B, 32 groups x 8, over-sampling 64, 16,384-token limit, "
        f"{result['steps']} steps per arm, 4 SGLang engines at TP2 with mem_fraction_static 0.6.  "
        "All numbers SIMULATED by `python benchmarks/paper_table.py` (deterministic); assumptions and "
        "sources in `docs/calibration.md`.  Tolerance: "
        f"{result['tolerance']:.0%} (absolute) on the headline gain.",
        "",
        render_markdown(
            (
                "Setting",
                "GPU",
                "Paper",
                "Headline gain (sim)",
                "Useful-token gain (sim)",
                "Difference",
                "Sync mean len",
                "Sync truncated",
                "Rollout share of step",
                "Tail share of rollout",
                "DAPO rejected / step",
            ),
            [
                [
                    f"{r['dataset']} / {r['algorithm'].upper()}",
                    r["hardware"].upper(),
                    _pct(r["paper_gain"], 0),
                    _pct(r["headline_gain"]),
                    _pct(r["useful_gain"]),
                    f"{r['difference'] * 100:+.1f} pt",
                    f"{r['sync_mean_response']:,.0f}",
                    f"{r['sync_truncated']:.0%}",
                    f"{r['sync_rollout_share']:.0%}",
                    f"{r['sync_tail_share']:.0%}",
                    f"{r['sync_rejected_per_step']:.1f}",
                ]
                for r in rows
            ],
        ),
        "",
        "## Mechanism: the DAPO baseline refills a whole wave on its first rejection (SIMULATED, MI300X)",
        "",
        render_markdown(
            ("Per-prompt solve rates", "Beta a+b", "Rejected / step (sync)", "Headline gain", "Useful gain"),
            [
                [
                    r["case"],
                    f"{r['solve_concentration']:g}",
                    f"{r['sync_rejected_per_step']:.1f}",
                    _pct(r["headline_gain"]),
                    _pct(r["useful_gain"]),
                ]
                for r in result["mechanisms"]
            ],
        ),
        "",
        "## Length model against published statistics (model side SIMULATED by drawing the model)",
        "",
        render_markdown(
            ("Source", "Cap", "Statistic", "Published", "Fitted model", "Fitted parameters"),
            [
                [
                    c["target"],
                    f"{c['cap']:,}",
                    row["statistic"],
                    f"{row['published']:,.3g}",
                    f"{row['model']:,.3g}",
                    (
                        f"median {c['params']['median']:,.0f}, sigma "
                        f"{(c['params']['prompt_sigma'] ** 2 + c['params']['within_sigma'] ** 2) ** 0.5:.2f}, "
                        f"wrong x{c['params']['incorrect_factor']:.2f}"
                    )
                    if i == 0
                    else "",
                ]
                for c in result["calibration"]
                for i, row in enumerate(c["rows"])
            ],
        ),
    ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--fit", action="store_true", help="re-fit the unpublished parameters and print them")
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = parser.parse_args()
    if args.fit:
        for setting in PAPER_SETTINGS:
            fitted, err = fit_setting(setting, steps=args.steps, log=print)
            print(
                f"FITTED {setting.key}: response_median={fitted.response_median} "
                f"solve_concentration={fitted.solve_concentration} (|gain - paper| = {err:.3f})"
            )
        return
    result = {
        "result_kind": "simulated",
        "steps": args.steps,
        "tolerance": TOLERANCE,
        "settings": [
            {k: v for k, v in asdict(s).items() if k != "sources"} | {"sources": dict(s.sources)}
            for s in PAPER_SETTINGS
        ],
        "table": table(args.steps),
        "mechanisms": mechanisms(args.steps),
        "calibration": calibration(),
    }
    text = render(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paper_table.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "paper_table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
