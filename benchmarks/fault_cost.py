"""What a killed replica cost, from pairs of run directories (an undisturbed run and one with a replica
killed by the chaos schedule, same command otherwise): one markdown row per (pair, arm) with the
failure's step, the requests re-queued, the tokens re-prefilled, the restart time and the rollout and
step times against the undisturbed run (docs/faults.md, "Measured").

    python benchmarks/fault_cost.py RUNS/undisturbed-1:RUNS/killed-1 RUNS/undisturbed-2:RUNS/killed-2
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any


def _rows(run: Path, table: str) -> list[dict[str, Any]]:
    """A table's rows, plain or gzipped (a committed reference run's)."""
    plain = run / f"{table}.jsonl"
    text = (
        plain.read_text()
        if plain.exists()
        else gzip.decompress((run / f"{table}.jsonl.gz").read_bytes()).decode()
    )
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _steps(run: Path, arm: str) -> list[dict[str, Any]]:
    return sorted((r for r in _rows(run, "steps") if r["arm"] == arm), key=lambda r: r["step"])


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def cost_rows(undisturbed: Path, killed: Path) -> list[dict[str, Any]]:
    """Per arm: what the killed run's events say the failure cost, beside both runs' step times."""
    from april_bench.results.store import check_run, load_run

    events = _rows(killed, "events")
    problems = check_run(load_run(killed))
    status = json.loads((killed / "status.json").read_text())["state"]
    out = []
    for arm in dict.fromkeys(r["arm"] for r in _rows(killed, "steps")):
        mine = [e for e in events if e["arm"] == arm]
        failed = [e for e in mine if e["kind"] == "replica_failed"]
        requeued = [e for e in mine if e["kind"] == "requests_requeued"]
        restarted = [e for e in mine if e["kind"] == "replica_restarted"]
        ended = [e["t"] for e in mine if e["kind"] == "arm_end"]
        calm, hit = _steps(undisturbed, arm), _steps(killed, arm)
        k = failed[0]["step"] if failed else None
        out.append(
            {
                "arm": arm,
                "failed_at_step": failed[0]["step"] if failed else None,
                "found_by": (failed[0]["detail"] or "").split(":")[0] if failed else None,
                "requests_requeued": sum(e["requests"] or 0 for e in requeued),
                "tokens_reprefilled": sum(e["tokens"] or 0 for e in requeued),
                "restart_s": restarted[0]["t"] - failed[0]["t"] if failed and restarted else None,
                # not back when the arm ended: at least this long
                "down_at_end_s": ended[0] - failed[0]["t"] if failed and ended and not restarted else None,
                "rollout_s_undisturbed": [s["rollout_time_s"] for s in calm],
                "rollout_s_killed": [s["rollout_time_s"] for s in hit],
                # the step the failure was found in, and the mean of the steps after it
                "rollout_s_at_failure": None
                if k is None
                else (calm[k]["rollout_time_s"], hit[k]["rollout_time_s"]),
                "rollout_s_after": None
                if k is None
                else (
                    _mean([s["rollout_time_s"] for s in calm[k + 1 :]]),
                    _mean([s["rollout_time_s"] for s in hit[k + 1 :]]),
                ),
                "step_s_undisturbed": sum(s["step_time_s"] for s in calm),
                "step_s_killed": sum(s["step_time_s"] for s in hit),
                "generated_undisturbed": sum(s["generated_tokens"] for s in calm),
                "generated_killed": sum(s["generated_tokens"] for s in hit),
                "trained_killed": sum(s["trained_tokens"] for s in hit),
                "trained_undisturbed": sum(s["trained_tokens"] for s in calm),
                "check_run": "clean" if not problems else f"{len(problems)} problems",
                "status": status,
            }
        )
    return out


def render(pairs: list[tuple[int, list[dict[str, Any]]]]) -> str:
    lines = [
        "| pair | arm | failed at step (found by) | requests re-queued | tokens re-prefilled | restart s "
        "| rollout s of the failure's step, undisturbed / killed | mean rollout s of the later steps, "
        "undisturbed / killed | step s total, undisturbed / killed | check_run |",
        "|---|---|---|---:|---:|---|---|---|---|---|",
    ]
    for pair, rows in pairs:
        for r in rows:
            at = "-" if r["failed_at_step"] is None else f"{r['failed_at_step']} ({r['found_by']})"
            restart = "-" if r["restart_s"] is None else f"{r['restart_s']:.1f}"
            if r["down_at_end_s"] is not None:
                restart = f"> {r['down_at_end_s']:.1f} (not back by the end)"
            moved = f"{r['requests_requeued']} | {r['tokens_reprefilled']}"
            lines.append(
                f"| {pair} | {r['arm']} | {at} | {moved} | {restart} "
                f"| {_pair(r['rollout_s_at_failure'])} | {_pair(r['rollout_s_after'])} "
                f"| {r['step_s_undisturbed']:.2f} / {r['step_s_killed']:.2f} "
                f"| {r['check_run']}, {r['status']} |"
            )
    return "\n".join(lines)


def _pair(values: tuple[float | None, float | None] | None) -> str:
    return "-" if values is None else f"{_s(values[0])} / {_s(values[1])}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pairs", nargs="+", metavar="UNDISTURBED:KILLED", help="run directories, a pair each")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    pairs = []
    for i, pair in enumerate(args.pairs, start=1):
        calm, killed = pair.split(":")
        pairs.append((i, cost_rows(Path(calm), Path(killed))))
    if args.json is not None:
        args.json.write_text(json.dumps([{"pair": i, "rows": rows} for i, rows in pairs], indent=1) + "\n")
    print(render(pairs))


if __name__ == "__main__":
    main()
