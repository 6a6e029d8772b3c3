"""Issue 20 item 6: why APRIL's held-out accuracy sits below sync on the embedded default.

Reads measured run directories (``run`` outputs, or an ``ablate`` directory's ``<mode>/`` runs) and
writes one markdown table: per run and arm, the held-out accuracy at step 0 and after the last step
(avg@4 on the 314 held-out problems, with its standard error), the change from step 0, and what the
arm trained on (mean response length and reward of the trained samples, the share of trained groups
whose rewards differ, i.e. that carry a GRPO advantage, the off-policy token share and the mean age
of a trained token in policy versions).  Below it, the APRIL - sync gap per seed, their mean and
spread, against the evaluation's own standard error.

    python benchmarks/accuracy_gap.py results/ablations/embedded-cpu-accuracy/*/ \
        --out results/ablations/embedded-cpu-accuracy/accuracy_gap.md

Nothing here runs a model: it is a pure function of the rows the runs recorded.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _rows(run: Path, table: str) -> Iterator[dict[str, Any]]:
    plain, packed = run / f"{table}.jsonl", run / f"{table}.jsonl.gz"
    if plain.exists():
        lines = plain.read_text().splitlines()
    elif packed.exists():
        lines = gzip.decompress(packed.read_bytes()).decode().splitlines()
    else:
        return
    for line in lines:
        if line.strip():
            yield json.loads(line)


def _label(run: Path, config: dict[str, Any]) -> str:
    """An ablate run (``OUT/<mode>/``) is named with its ablation directory."""
    return f"{run.parent.name}/{run.name}" if (run.parent / "ablation.json").exists() else run.name


def _short(arm: str) -> str:
    out = arm.replace("over_sampling_batch_size=32", "").replace("[,", "[").replace(",]", "]")
    return out.replace("[]", "")


def summarise(run: Path) -> list[dict[str, Any]]:
    """One row per arm (repeat 0) of a run directory."""
    config = json.loads((run / "config.json").read_text())
    evals: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for e in _rows(run, "evals"):
        if e.get("repeat", 0) == 0:
            evals[e["arm"]][e["step"]] = e
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    for s in _rows(run, "samples"):
        if s.get("repeat", 0) == 0 and s["fate"] == "trained":
            groups[(s["arm"], s["step"], s["group_uid"])].append(s)
    out = []
    for arm, by_step in evals.items():
        last = max(by_step)
        first, end = by_step[min(by_step)], by_step[last]
        trained = [g for (a, _, _), g in groups.items() if a == arm]
        samples = [s for g in trained for s in g]
        tokens = sum(s["response_len"] for s in samples) or 1
        # age of a token: the policy version that trained it minus the one that generated it
        # (version_runs: (version, token count) pairs)
        age = sum((s["train_version"] - v) * n for s in samples for v, n in s["version_runs"])
        out.append(
            {
                "run": _label(run, config),
                "seed": config["seed"],
                "off_policy": config["off_policy"],
                "arm": arm,
                "steps": last,
                "acc0": first["accuracy"],
                "acc": end["accuracy"],
                "se": end["accuracy_stderr"],
                "curve": {k: v["accuracy"] for k, v in sorted(by_step.items())},
                "len": statistics.fmean(s["response_len"] for s in samples) if samples else math.nan,
                "reward": statistics.fmean(s["reward"] for s in samples) if samples else math.nan,
                "mixed": (
                    sum(len({s["reward"] for s in g}) > 1 for g in trained) / len(trained)
                    if trained
                    else math.nan
                ),
                "off_policy_share": sum(s["off_policy_tokens"] for s in samples) / tokens,
                "age": age / tokens,
            }
        )
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| Run | Seed | Off-policy | Arm | Acc step 0 | Acc last (± se) | Change | Trained len | "
        "Trained reward | Groups with an advantage | Off-policy share | Token age (versions) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['seed']} | {r['off_policy']} | {_short(r['arm'])} | {r['acc0'] * 100:.1f}% "
            f"| {r['acc'] * 100:.1f}% ± {r['se'] * 100:.1f} (step {r['steps']}) "
            f"| {(r['acc'] - r['acc0']) * 100:+.1f} pt | {r['len']:.1f} | {r['reward']:.3f} "
            f"| {r['mixed'] * 100:.0f}% | {r['off_policy_share'] * 100:.0f}% | {r['age']:.2f} |"
        )
    return "\n".join(lines)


def gaps(rows: list[dict[str, Any]]) -> str:
    """APRIL (as-is, default knobs) minus sync, per seed, from runs holding both arms."""
    by_run: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        by_run[r["run"]][_short(r["arm"])] = r
    per_seed = []
    for run, arms in by_run.items():  # in the order given
        if "sync" in arms and "april" in arms and arms["april"]["off_policy"] == "as-is":
            s, a = arms["sync"], arms["april"]
            step = max(set(s["curve"]) & set(a["curve"]))  # the last step both arms evaluated
            d = (a["curve"][step] - s["curve"][step]) * 100
            later = sorted(k for k in set(s["curve"]) & set(a["curve"]) if k > 0)
            mean = statistics.fmean(a["curve"][k] - s["curve"][k] for k in later) * 100 if later else math.nan
            per_seed.append((run, s["seed"], step, d, math.hypot(a["se"], s["se"]) * 100, mean))
    if not per_seed:
        return ""
    lines = [
        "| Run | Seed | Step | APRIL - sync (equal steps) | Eval se of the difference (unpaired) "
        "| Mean gap over the evaluations after step 0 |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r} | {sd} | {st} | {d:+.1f} pt | ± {se:.1f} | {m:+.1f} pt |" for r, sd, st, d, se, m in per_seed
    ]
    # the mean counts each seed once (its first run given): a longer run of the same seed is the same
    # trajectory, not another sample
    first: dict[int, tuple[float, float]] = {}
    for _, sd, _, d, _, m in per_seed:
        first.setdefault(sd, (d, m))
    ds = [d for d, _ in first.values()]
    ms = [m for _, m in first.values()]
    if len(ds) > 1:
        sd = statistics.stdev(ds)
        half = 2 * sd / math.sqrt(len(ds))  # rough: a t interval would be wider at few seeds
        lines.append(
            f"| **mean over {len(ds)} seeds** | | | **{statistics.fmean(ds):+.1f} pt** "
            f"(seed sd {sd:.1f}; mean ± 2 se: [{statistics.fmean(ds) - half:+.1f}, "
            f"{statistics.fmean(ds) + half:+.1f}]) | | {statistics.fmean(ms):+.1f} pt |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (each with config.json)")
    ap.add_argument("--out", type=Path, help="write the markdown here too")
    args = ap.parse_args()
    rows = [r for run in args.runs for r in summarise(run)]
    text = "## Accuracy after the last step, and what each arm trained on (MEASURED)\n\n" + table(rows)
    g = gaps(rows)
    if g:
        text += "\n\n## APRIL - sync per seed\n\n" + g
    curves = "\n".join(
        f"- {r['run']} {_short(r['arm'])}: " + ", ".join(f"{k}: {v * 100:.1f}" for k, v in r["curve"].items())
        for r in rows
    )
    text += "\n\n## Accuracy curves (% at each evaluated step)\n\n" + curves + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
