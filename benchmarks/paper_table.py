"""The paper table, simulated: APRIL's three published rows on 8 x H100 and 8 x MI300X, predicted.

For each row of :data:`april_bench.sim.paper_settings.PAPER_SETTINGS` (DAPO on
DAPO-Math-17k, GRPO on DeepScaleR, GSPO on DeepMath-103K) and each GPU type,
run exactly what ``python -m april_bench run --hw HW --algo A --dataset D``
runs without a GPU, and print the paper's figure beside the predicted headline
gain (APRIL's ``partial_rollout/tokens_throughput``: every generated token over
rollout time, discarded ones included) and the error.  **Nothing is fitted to
the paper's gains**: the response lengths are the (data set, model) profiles of
:mod:`april_bench.sim.length_evidence`, chosen before this table was first
computed; a profile with no published evidence (every Qwen3-4B training set) is
shown at both ends of its open range too.  The DAPO-Math-17k row, whose
algorithm the sources leave uncertain, is shown under both readings (DAPO and
GRPO).  Every row carries its gain decomposition (the tail, fuller batches,
peak concurrency, not discarding: :mod:`april_bench.results.decomposition`), so
a reader sees whether it agrees for the paper's reason.  Beside the gains,
observables that were never fitted, judged against the tolerances of
:data:`OBSERVABLES` (written in ``docs/calibration.md`` before the comparison).

Every number is SIMULATED.  The simulator is deterministic, so the committed
``results/benchmarks/paper_table.json`` is reproduced exactly by

    python benchmarks/paper_table.py        # its cells in one process per usable core (--jobs N to change)

``--timed`` prints the time it took; ``tox -e compiled`` runs it on the simulator's compiled core
(about 60 s against about 100 s on 2 cores, the same bytes: docs/benchmarks.md, "The compiled core").
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from april_bench.experiment import run
from april_bench.recipes import paper_experiment
from april_bench.results.recorder import SMALL_TABLES, RunRecorder
from april_bench.results.table import render_markdown
from april_bench.sim.calibration import (
    PUBLISHED,
    PUBLISHED_DRIFT,
    LengthParams,
    all_equal_share,
    fit_drift,
    fit_lengths,
)
from april_bench.sim.length_evidence import LENGTH_PROFILES, MODEL_LENGTHS, length_profile
from april_bench.sim.paper_settings import (
    AGENT_ROW,
    HARDWARE,
    PAPER_SETTINGS,
    STEPS,
    PaperSetting,
    paper_setting,
)

#: Unfitted observables, with the published value and the tolerance fixed before comparing
#: (docs/calibration.md, "Observables").  (key, label, published, low, high, source)
OBSERVABLES: tuple[tuple[str, str, str, float, float, str], ...] = (
    (
        "april_off_policy_reference_def",
        "APRIL off-policy token share (APRIL's definition)",
        "~40%",
        0.30,
        0.50,
        "APRIL README FAQ: about 40% of tokens per round are off-policy",
    ),
    (
        "sync_rollout_share",
        "baseline rollout share of step time",
        ">90%",
        0.85,
        1.0,
        "APRIL abstract (arXiv 2509.18521): rollout is more than 90% of RL runtime",
    ),
)


#: The arms each cell reads (APRIL against the scripted baseline).  The runs' third default arm,
#: oversample-discard, is not shown in this table; every arm runs alone on its own virtual clock, so
#: leaving it out changes no number and saves a third of the table's time.
ARMS = ("sync", "april")


def _summary(config: Any) -> dict[str, dict[str, Any]]:
    """The per-arm summary of ``config``'s run, accumulated as rows come, as ``run`` accumulates it:
    only the per-step tables are kept (a cell holds no request or sample rows it never reads)."""
    return run(config, progress=False, recorder=RunRecorder(keep=SMALL_TABLES)).recorder.summary()


def simulate_setting(
    setting: PaperSetting, hardware: str, *, steps: int = STEPS, **overrides: Any
) -> dict[str, Any]:
    """One cell of the paper table: APRIL against the scripted baseline (SIMULATED); ``overrides`` (the
    sensitivity rows only) change the experiment."""
    config = paper_experiment(setting, hardware, steps=steps, strategies=ARMS, **overrides)
    summary = _summary(config)
    april, sync = summary["april"], summary["sync"]
    launched = (sync.get("prompts") or {}).get("launched")
    return {
        "setting": setting.key,
        "hardware": hardware,
        "dataset": setting.dataset,
        "algorithm": setting.algorithm,
        "reading": "as named"
        if setting.algorithm == paper_setting(setting.key).algorithm
        else "other reading",
        "steps": steps,
        "paper_gain": setting.paper_gain,
        "headline_gain": april["throughput_gain"],
        "headline_gain_step_mean": april["throughput_gain_step_mean"],
        "decomposition": april["gain_decomposition"],
        "useful_gain": april["useful_gain"],
        "end_to_end_gain": april["end_to_end_gain"],
        "difference": april["throughput_gain"] - setting.paper_gain,
        "fitted": "nothing (lengths: april_bench/sim/length_evidence.py)",
        "sync_mean_response": sync["mean_response_len"],
        "sync_truncated": sync["truncated_share"],
        "sync_rollout_share": sync["rollout_time_per_step_s"] / sync["step_time_per_step_s"],
        "sync_tail_share": sync["tail_time_share"],
        "sync_rejected_per_step": sync["rejected_groups"] / sync["steps"],
        "sync_launched_per_step": launched / sync["steps"] if launched is not None else None,
        "april_off_policy_reference_def": april["off_policy_ratio_reference_def"],
        "april_rollout_share": april["rollout_time_per_step_s"] / april["step_time_per_step_s"],
    }


def simulate_agent(
    hardware: str, calls: float | None, latency_s: float, *, steps: int = STEPS
) -> dict[str, Any]:
    """One cell of the fourth row (agent tasks; SIMULATED): APRIL against the scripted baseline on tool
    episodes of mean ``calls`` calls with median ``latency_s`` (``calls=None``: the same model and data
    set without tools, for reference)."""
    from april_bench.recipes import paper

    row = AGENT_ROW
    workload = {} if calls is None else row.workload_args(calls, latency_s)
    config = paper(
        hardware, model=row.model, dataset=row.dataset, algorithm=row.algorithm, engine="sim", trainer="sim",
        steps=steps, workload_args=workload, strategies=ARMS,
    )  # fmt: skip
    summary = _summary(config)
    april, sync = summary["april"], summary["sync"]
    episodes = sync.get("episodes") or {}
    return {
        "hardware": hardware,
        "calls": calls,
        "latency_s": None if calls is None else latency_s,
        "paper_gain": row.paper_gain,
        "headline_gain": april["throughput_gain"],
        "decomposition": april["gain_decomposition"],
        "useful_gain": april["useful_gain"],
        "difference": april["throughput_gain"] - row.paper_gain,
        "sync_turns_per_episode": episodes.get("turns_per_episode"),
        "sync_env_time_share": episodes.get("env_time_share"),
        "sync_rollout_per_step_s": sync["rollout_time_per_step_s"],
        "april_rollout_per_step_s": april["rollout_time_per_step_s"],
        "april_resumed_across_versions_share": (april.get("episodes") or {}).get(
            "resumed_across_versions_share"
        ),
    }


Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _call(job: Job) -> Any:
    function, args, kwargs = job
    return function(*args, **kwargs)


def _weight(job: Job) -> float:
    """A job's relative CPU cost, to start the longest first: an agent cell's grows with its tool calls
    (every call is a turn of its own), any other cell costs about what an agent cell without tools does."""
    function, args, _ = job
    if function is simulate_agent and args[1] is not None:
        return 1.0 + float(args[1])
    return 1.0


def _map(jobs: Sequence[Job], workers: int) -> list[Any]:
    """Every job's result, in the jobs' order; a job equal to an earlier one is simulated once (the
    DAPO row on MI300X is a cell of the table and a sensitivity case).  ``workers`` > 1: in that many
    processes, the costliest jobs started first so that no process is left with a long one at the end;
    each cell is deterministic and independent, so the answer is the same."""
    first = [next(j for j in range(i + 1) if jobs[j] == jobs[i]) for i in range(len(jobs))]
    unique = sorted(set(first))
    if workers <= 1:
        done = {i: _call(jobs[i]) for i in unique}
    else:
        order = sorted(unique, key=lambda i: -_weight(jobs[i]))  # stable: ties keep their order
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {i: pool.submit(_call, jobs[i]) for i in order}
            done = {i: futures[i].result() for i in unique}
    return [done[first[i]] if first[i] == i else copy.deepcopy(done[first[i]]) for i in range(len(jobs))]


def agent_jobs(steps: int) -> list[Job]:
    """The fourth row over the ranges the sources leave open (every cell a prediction; none chosen)."""
    jobs: list[Job] = []
    for hardware in HARDWARE:
        jobs.append((simulate_agent, (hardware, None, 0.0), {"steps": steps}))
        jobs += [
            (simulate_agent, (hardware, calls, latency), {"steps": steps})
            for calls in AGENT_ROW.calls
            for latency in AGENT_ROW.latency_s
        ]
    return jobs


def agent_row(steps: int, workers: int = 1) -> list[dict[str, Any]]:
    return _map(agent_jobs(steps), workers)


def readings() -> list[PaperSetting]:
    """Every row as the scripts' folder names it, then each other reading of a row whose algorithm the
    sources leave uncertain (the DAPO-Math-17k row as GRPO)."""
    out = list(PAPER_SETTINGS)
    for setting in PAPER_SETTINGS:
        out += [replace(setting, algorithm=algorithm) for algorithm in setting.other_readings]
    return out


def table_jobs(steps: int) -> list[Job]:
    """Each reading of each row on each GPU."""
    return [(simulate_setting, (s, hw), {"steps": steps}) for s in readings() for hw in HARDWARE]


def table(steps: int, workers: int = 1) -> list[dict[str, Any]]:
    """Each reading of each row on each GPU (SIMULATED)."""
    return _map(table_jobs(steps), workers)


def open_ranges(steps: int, workers: int = 1, hardware: str = "mi300x") -> list[dict[str, Any]]:
    """Each reading of each row at both ends of its length profile's open range (SIMULATED, one GPU):
    how far what nobody published moves the prediction.  The ranges were written down before any gain
    was computed with them (``april_bench.sim.length_evidence``)."""
    cells = _open_range_cells()
    return _open_range_rows(cells, _map(_open_range_jobs(cells, steps, hardware), workers))


def _open_range_cells() -> list[tuple[PaperSetting, str, dict[str, float]]]:
    cells = []
    for setting in readings():
        profile = length_profile(setting.model, setting.dataset)
        for end, args in profile.range_ends() if profile is not None else []:
            cells.append((setting, end, args))
    return cells


def _open_range_jobs(
    cells: list[tuple[PaperSetting, str, dict[str, float]]], steps: int, hardware: str = "mi300x"
) -> list[Job]:
    return [(simulate_setting, (s, hardware), {"steps": steps, "workload_args": a}) for s, _, a in cells]


def _open_range_rows(
    cells: list[tuple[PaperSetting, str, dict[str, float]]], rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    return [{**r, "end": end, "workload_args": a} for (_, end, a), r in zip(cells, rows, strict=True)]


def observables(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each unfitted observable in each cell, against its tolerance (fixed before comparing)."""
    out = []
    for key, label, published, low, high, source in OBSERVABLES:
        for r in rows:
            value = r[key]
            out.append(
                {
                    "observable": label,
                    "setting": _setting(r),
                    "hardware": r["hardware"],
                    "published": published,
                    "tolerance": [low, high],
                    "simulated": value,
                    "within": low <= value <= high,
                    "source": source,
                }
            )
    evidence = MODEL_LENGTHS["qwen3-4b"]
    params = LengthParams(
        evidence.response_median,
        evidence.prompt_sigma,
        evidence.within_sigma,
        evidence.incorrect_factor,
        evidence.solve_rate,
        evidence.solve_concentration,
    )
    share = all_equal_share(params, 16384)
    for r in rows:
        if r["algorithm"] != "dapo":
            continue
        # Each finished group is rejected with probability `share` (all rewards equal), so the baseline
        # sees about N * share / (1 - share) rejections while it gathers N groups, and relaunches a wave
        # of N groups at its first rejection (slime's refill rule).
        expected = 32 * share / (1 - share)
        out.append(
            {
                "observable": "DAPO baseline rejected groups / step",
                "setting": _setting(r),
                "hardware": r["hardware"],
                "published": f"{expected:.1f} (length model's all-equal share {share:.0%}, N = 32)",
                "tolerance": [0.5 * expected, 1.5 * expected],
                "simulated": r["sync_rejected_per_step"],
                "within": 0.5 * expected <= r["sync_rejected_per_step"] <= 1.5 * expected,
                "source": "expected from the length model alone (no run): E[p^8 + (1-p)^8] with truncated "
                "answers scored 0; slime's rule, not a published count",
            }
        )
        relaunched = (r["sync_launched_per_step"] or 0) - 32
        out.append(
            {
                "observable": "DAPO baseline relaunched groups / step",
                "setting": _setting(r),
                "hardware": r["hardware"],
                "published": ">= 32 (a wave of N at the first rejection; slime arguments.py L929, L242)",
                "tolerance": [32.0, float("inf")],
                "simulated": relaunched,
                "within": relaunched >= 32,
                "source": "APRIL@a72b585 sglang_example.py L242: a whole wave whenever accepted + in "
                "flight < N",
            }
        )
    return out


def mechanisms(steps: int, workers: int = 1) -> list[dict[str, Any]]:
    """Sensitivity of the DAPO row to what the length model and the refill rule assume (MI300X).  These
    rows are not predictions and nothing is chosen from them: they show which way each assumption moves
    the gain."""
    cases = _mechanism_cases()
    return _mechanism_rows(cases, _map(_mechanism_jobs(cases, steps), workers))


def _mechanism_cases() -> tuple[tuple[str, PaperSetting, dict[str, Any]], ...]:
    from april_bench.rollout.loop import RolloutConfig

    dapo = paper_setting("dapo-math")
    median = MODEL_LENGTHS["qwen3-4b"].response_median
    cases: tuple[tuple[str, PaperSetting, dict[str, Any]], ...] = (
        ("DAPO row as predicted (evidence lengths)", dapo, {}),
        (
            f"right-answer median / 2 ({median / 2:,.0f})",
            dapo,
            {"workload_args": {"response_median": median / 2}},
        ),
        (
            f"right-answer median x 2 ({median * 2:,.0f})",
            dapo,
            {"workload_args": {"response_median": median * 2}},
        ),
        ("solve rates near 0.59 (Beta a+b = 400)", dapo, {"workload_args": {"solve_concentration": 400.0}}),
        ("granular refill (slime PR #2218)", dapo, {"rollout": RolloutConfig(refill="granular")}),
        (
            "GRPO DeepScaleR, equal lengths (no tail: concurrency alone)",
            paper_setting("deepscaler"),
            {"workload_args": {"prompt_sigma": 0.0, "within_sigma": 0.0, "incorrect_factor": 1.0}},
        ),
    )
    return cases


def _mechanism_jobs(cases: tuple[tuple[str, PaperSetting, dict[str, Any]], ...], steps: int) -> list[Job]:
    return [(simulate_setting, (setting, "mi300x"), {"steps": steps, **o}) for _, setting, o in cases]


def _mechanism_rows(
    cases: tuple[tuple[str, PaperSetting, dict[str, Any]], ...], rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    return [{"case": label, **row} for (label, _, _), row in zip(cases, rows, strict=True)]


def _lengths(**values: float) -> dict[str, Any]:
    return {"workload_args": values}


#: Published shares of step time in rollout and of rollout time in its tail (landscape.md 5a).
PUBLISHED_BREAKDOWN = (
    ("rollout share of step time", ">90%", "APRIL abstract (arXiv 2509.18521)"),
    (
        "rollout share of step time",
        "~80% (Moonlight 84%, Qwen2-VL-72B 63%)",
        "Seer (arXiv 2511.14617) Table 1",
    ),
    ("rollout share of step time", "~70%", "RollPacker, SortedRL at 16k, ROLL Flash, verl DAPO-32B"),
    ("tail share of rollout time", "up to 50% (last 10% of requests)", "Seer, Moonlight and Qwen2-VL-72B"),
)


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


def drift() -> list[dict[str, Any]]:
    out = []
    for target in PUBLISHED_DRIFT:
        fit = fit_drift(target)
        out.append(
            {
                "target": target.name,
                "cap": target.cap,
                "steps": target.steps,
                "published": [target.start_mean, target.end_mean],
                "model": [fit.start_mean, fit.end_mean],
                "drift_per_step": fit.drift_per_step,
                "sources": target.sources,
            }
        )
    return out


def _setting(r: dict[str, Any]) -> str:
    """``dapo-math``, or ``dapo-math as GRPO`` for a row's other reading."""
    return r["setting"] + (f" as {r['algorithm'].upper()}" if r.get("reading") == "other reading" else "")


def _row_name(r: dict[str, Any]) -> str:
    name = f"{r['dataset']} / {r['algorithm'].upper()}"
    return name + (" (other reading)" if r.get("reading") == "other reading" else "")


def _pts(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}"


def _parts(d: dict[str, Any] | None) -> str:
    """'+3.7 / -9.4 / -3.6' points from the tail / fuller batches / peak concurrency."""
    return "n/a" if not d else " / ".join(_pts(d[k]) for k in ("tail", "fill", "concurrency"))


def _reason(d: dict[str, Any] | None) -> str:
    """Whether a gain comes from the paper's mechanism: the tail (the last 10% of requests) and the
    batch emptying before it, against a higher peak concurrency."""
    if not d or d["throughput_gain"] is None:
        return "n/a"
    gain, tail, fill, conc = d["throughput_gain"], d["tail"], d["fill"], d["concurrency"] or 0.0
    if gain <= 0:
        return "no gain"
    if tail >= gain / 2:
        return "yes: mostly the tail"
    if tail + fill >= conc:
        if tail > 0:
            return "mostly: the tail and fuller batches"
        return "partly: fuller batches, not the last-10% tail"
    return "no: mostly the higher peak concurrency"


def _profile(result: dict[str, Any], r: dict[str, Any]) -> dict[str, Any] | None:
    model = next(s["model"] for s in result["settings"] if s["key"] == r["setting"])
    return next(
        (p for p in result["length_profiles"] if p["dataset"] == r["dataset"] and p["model"] == model), None
    )


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:+.{digits}%}"


def _params(p: dict[str, float]) -> str:
    sigma = (p["prompt_sigma"] ** 2 + p["within_sigma"] ** 2) ** 0.5
    return f"median {p['median']:,.0f}, sigma {sigma:.2f}, wrong x{p['incorrect_factor']:.2f}"


def _tolerance(bounds: list[float]) -> str:
    low, high = bounds
    if high == float("inf"):
        return f">= {low:g}"
    if high <= 1.0:
        return f"{low:.0%} - {high:.0%}"
    return f"{low:.1f} - {high:.1f}"


def _value(x: float) -> str:
    return f"{x:.0%}" if abs(x) <= 1.0 else f"{x:,.1f}"


def _span(rows: list[dict[str, Any]], key: str) -> str:
    values = [r[key] for r in rows if r[key] is not None]
    return f"{min(values):.0%} - {max(values):.0%}" if values else "n/a"


def render(result: dict[str, Any]) -> str:
    rows = result["table"]
    evidence = result["length_model"]
    out = [
        "# The paper table, SIMULATED: predicted, not fitted",
        "",
        f"APRIL vs the scripted baseline, Qwen3-4B, 32 groups x 8, over-sampling 64, 16,384-token limit, "
        f"{result['steps']} steps per arm, 4 SGLang engines at TP2 with mem_fraction_static 0.6: each cell "
        "is `python -m april_bench run --hw HW --algo A --dataset D`.  All numbers SIMULATED by "
        "`python benchmarks/paper_table.py` (deterministic).  **Fitted to the paper: nothing.**  Lengths: "
        f"every Qwen3-4B row's profile is open, its central value the AIME'24-anchored model (right-answer "
        f"median {evidence['response_median']:,.0f} tokens, log-sd "
        f"{(evidence['prompt_sigma'] ** 2 + evidence['within_sigma'] ** 2) ** 0.5:.1f}, wrong answers "
        f"x{evidence['incorrect_factor']:g}, solve rate {evidence['solve_rate']:g}), each parameter from "
        "published evidence (`april_bench/sim/length_evidence.py`, `docs/calibration.md`).",
        "",
        render_markdown(
            (
                "Setting",
                "GPU",
                "Paper",
                "Predicted (sim)",
                "Per-step mean (sim)",
                "Error",
                "Fitted",
                "Useful-token gain (sim)",
                "Sync mean len",
                "Sync truncated",
                "Tail share of rollout",
            ),
            [
                [
                    _row_name(r),
                    r["hardware"].upper(),
                    _pct(r["paper_gain"], 0),
                    _pct(r["headline_gain"]),
                    _pct(r["headline_gain_step_mean"]),
                    f"{r['difference'] * 100:+.1f} pt",
                    "nothing",
                    _pct(r["useful_gain"]),
                    f"{r['sync_mean_response']:,.0f}",
                    f"{r['sync_truncated']:.0%}",
                    f"{r['sync_tail_share']:.0%}",
                ]
                for r in rows
            ]
            + [
                [
                    f"agent tasks / GRPO, R1-Distill-1.5B (range over {len(cells)} tool-episode shapes)",
                    hardware.upper(),
                    _pct(AGENT_ROW.paper_gain, 0),
                    f"{_pct(min(gains))} .. {_pct(max(gains))} (median {_pct(_median(gains))})",
                    "",
                    f"{(min(gains) - AGENT_ROW.paper_gain) * 100:+.1f} .. "
                    f"{(max(gains) - AGENT_ROW.paper_gain) * 100:+.1f} pt",
                    "nothing",
                    f"{_pct(min(useful))} .. {_pct(max(useful))}",
                    "",
                    "",
                    "",
                ]
                for hardware in HARDWARE
                for cells in [
                    [c for c in result["agent_row"] if c["hardware"] == hardware and c["calls"] is not None]
                ]
                for gains in [[c["headline_gain"] for c in cells]]
                for useful in [[c["useful_gain"] for c in cells]]
                if cells
            ],
        ),
        "",
        "'Per-step mean': APRIL's `tokens_throughput` as the paper logged it, per step, averaged over the "
        "steps, beside the ratio of totals.  The DAPO-Math-17k row is shown under both readings: "
        + (PAPER_SETTINGS[0].reading_note or "")
        + " (`docs/calibration.md`, 'Two readings of the DAPO row').",
        "",
        "## Where each row's gain comes from (SIMULATED, points of the throughput gain)",
        "",
        "Throughput gain = tail (rollout time after 90% of a step's requests finished) + fuller batches "
        "(the engine nearer its peak rate before that) + peak concurrency (a higher peak: more requests "
        "in flight); useful-token gain = throughput gain + not discarding (`april_bench/results/"
        "decomposition.py`, exact).  APRIL's argument is the first two: long responses hold a step open "
        "while its batch empties.",
        "",
        render_markdown(
            (
                "Setting",
                "GPU",
                "Throughput gain",
                "Tail",
                "Fuller batches",
                "Peak concurrency",
                "Useful-token gain",
                "Not discarding",
                "For the paper's reason?",
            ),
            [
                [
                    _row_name(r),
                    r["hardware"].upper(),
                    _pct(r["headline_gain"]),
                    _pts(d["tail"]),
                    _pts(d["fill"]),
                    _pts(d["concurrency"]),
                    _pct(d["useful_gain"]),
                    _pts(d["discard"]),
                    _reason(d),
                ]
                for r in rows
                for d in [r["decomposition"]]
                if d
            ],
        ),
        "",
        "## The baseline beside the length evidence (SIMULATED baseline; evidence as published)",
        "",
        render_markdown(
            (
                "Setting",
                "GPU",
                "Sync mean len",
                "Sync truncated",
                "Sync rejected / step",
                "Sync tail share",
                "Length profile",
                "Evidence for the (data set, model)",
            ),
            [
                [
                    _row_name(r),
                    r["hardware"].upper(),
                    f"{r['sync_mean_response']:,.0f}",
                    f"{r['sync_truncated']:.0%}",
                    f"{r['sync_rejected_per_step']:.1f}",
                    f"{r['sync_tail_share']:.0%}",
                    profile["status"] if profile else "none",
                    profile["evidence"] if profile else "",
                ]
                for r in rows
                for profile in [_profile(result, r)]
            ],
        ),
        "",
        "## Each row over its open length range (SIMULATED, MI300X)",
        "",
        "No Qwen3-4B length or solve-rate statistic on these training sets is published, so each profile is "
        "open: the central value is the AIME'24-anchored model, and the range (written down before any "
        "gain was computed with it) runs from an easier set (right answers half as long, solve rate 0.8) "
        "to a harder one (1.5x, 0.4).  The prediction is any value in between; none is chosen.",
        "",
        render_markdown(
            (
                "Setting",
                "Paper",
                "Central",
                "Easier end",
                "Harder end",
                "Tail / batches / concurrency (ends)",
            ),
            [
                [
                    _row_name(r),
                    _pct(r["paper_gain"], 0),
                    _pct(r["headline_gain"]),
                    _pct(ends["easier"]["headline_gain"]) if "easier" in ends else "n/a",
                    _pct(ends["harder"]["headline_gain"]) if "harder" in ends else "n/a",
                    "; ".join(f"{end}: {_parts(e['decomposition'])}" for end, e in ends.items()),
                ]
                for r in rows
                if r["hardware"] == "mi300x"
                for ends in [
                    {
                        o["end"]: o
                        for o in result["open_ranges"]
                        if o["setting"] == r["setting"] and o["algorithm"] == r["algorithm"]
                    }
                ]
                if ends
            ],
        ),
        "",
        "## The fourth row, agent tasks (SIMULATED): the prediction over what the sources leave open",
        "",
        "APRIL names no agent task, tool or latency for this row.  Each cell is APRIL against the scripted "
        "baseline on DeepSeek-R1-Distill-Qwen-1.5B (DeepScaleR lengths), GRPO, the scripts' rollout "
        "settings, with every response cut into tool-calling turns as in slime's `examples/retool` (at most "
        f"{AGENT_ROW.max_calls} calls, {AGENT_ROW.tool_slots} sandbox slots, "
        f"{AGENT_ROW.timeout_s:g} s timeout, "
        f"{AGENT_ROW.observation_tokens} observation tokens per call).  The mean calls per episode and the "
        "median call latency are not published: every plausible pair is shown, none picked "
        "(`docs/calibration.md`, 'The fourth row').  The 'no tools' line is the same run single-turn.",
        "",
        render_markdown(
            (
                "GPU",
                "Calls / episode (mean)",
                "Median call latency",
                "Predicted (sim)",
                "Error",
                "Useful-token gain (sim)",
                "Sync turns / episode",
                "Sync env share of episode time",
                "Sync / APRIL rollout s/step",
                "Tail / batches / concurrency (pts)",
            ),
            [
                [
                    c["hardware"].upper(),
                    "no tools" if c["calls"] is None else f"{c['calls']:g}",
                    "" if c["latency_s"] is None else f"{c['latency_s']:g} s",
                    _pct(c["headline_gain"]),
                    f"{c['difference'] * 100:+.1f} pt",
                    _pct(c["useful_gain"]),
                    "" if c["sync_turns_per_episode"] is None else f"{c['sync_turns_per_episode']:.2f}",
                    "" if c["sync_env_time_share"] is None else f"{c['sync_env_time_share']:.0%}",
                    f"{c['sync_rollout_per_step_s']:.1f} / {c['april_rollout_per_step_s']:.1f}",
                    _parts(c["decomposition"]),
                ]
                for c in result["agent_row"]
            ],
        ),
        "",
        "## Unfitted observables against tolerances fixed before comparing (SIMULATED)",
        "",
        render_markdown(
            ("Observable", "Setting", "GPU", "Published / expected", "Tolerance", "Simulated", "Within"),
            [
                [
                    o["observable"],
                    o["setting"],
                    o["hardware"].upper(),
                    o["published"],
                    _tolerance(o["tolerance"]),
                    _value(o["simulated"]),
                    "yes" if o["within"] else "**no**",
                ]
                for o in result["observables"]
            ],
        ),
        "",
        "## Sensitivity of the DAPO row (SIMULATED, MI300X; not predictions, nothing chosen from them)",
        "",
        render_markdown(
            (
                "Case",
                "Headline gain",
                "Useful-token gain",
                "Sync rejected / step",
                "Sync groups launched / step",
                "Sync truncated",
            ),
            [
                [
                    r["case"],
                    _pct(r["headline_gain"]),
                    _pct(r["useful_gain"]),
                    f"{r['sync_rejected_per_step']:.1f}",
                    "n/a" if r["sync_launched_per_step"] is None else f"{r['sync_launched_per_step']:.1f}",
                    f"{r['sync_truncated']:.0%}",
                ]
                for r in result["mechanisms"]
            ],
        ),
        "",
        "## Step-time breakdown: published against simulated (sync arm of the table above)",
        "",
        render_markdown(
            ("Share", "Published", "Source", "Simulated (min - max over the 6 cells)"),
            [
                [
                    share,
                    published,
                    source,
                    _span(
                        rows,
                        "sync_rollout_share" if share.startswith("rollout") else "sync_tail_share",
                    ),
                ]
                for share, published, source in PUBLISHED_BREAKDOWN
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
                    _params(c["params"]) if i == 0 else "",
                ]
                for c in result["calibration"]
                for i, row in enumerate(c["rows"])
            ],
        ),
        "",
        "How lengths move over training (model side SIMULATED; the paper settings use +0.0006 per step, "
        "the clip-higher growth APRIL's eps-clip-high 0.28 shares with DAPO):",
        "",
        render_markdown(
            ("Source", "Cap", "Steps", "Published mean start -> end", "Fitted model", "Drift / step"),
            [
                [
                    d["target"],
                    f"{d['cap']:,}",
                    f"{d['steps']:,}",
                    f"{d['published'][0]:,.0f} -> {d['published'][1]:,.0f}",
                    f"{d['model'][0]:,.0f} -> {d['model'][1]:,.0f}",
                    f"{d['drift_per_step']:+.5f}",
                ]
                for d in result["drift"]
            ],
        ),
    ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    parser.add_argument(
        "--jobs",
        type=int,
        default=_usable_cores(),
        help="simulate this many cells at once, in processes (same answer; default: the usable cores)",
    )
    parser.add_argument(
        "--timed",
        action="store_true",
        help="print the wall and CPU time the table took (its worker processes included), and whether "
        "the simulator's core was compiled (april_bench/compiled.py), to stderr",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    # Every cell of every section in one pool, the two fits included, so that the cores stay busy to
    # the end; each section reads its results back in its own order.
    ranges, cases = _open_range_cells(), _mechanism_cases()
    fits: list[Job] = [(calibration, (), {}), (drift, (), {})]
    sections = [
        table_jobs(args.steps),
        _open_range_jobs(ranges, args.steps),
        _mechanism_jobs(cases, args.steps),
        agent_jobs(args.steps),
        fits,
    ]
    results = iter(_map([job for section in sections for job in section], args.jobs))
    rows, range_rows, case_rows, agent_rows, (calibrated, drifted) = (
        [next(results) for _ in section] for section in sections
    )
    evidence = MODEL_LENGTHS["qwen3-4b"]
    result = {
        "result_kind": "simulated",
        "steps": args.steps,
        "fitted_to_paper": [],
        "length_model": {
            **evidence.workload_args(),
            "sources": dict(evidence.sources),
            "anchor": asdict(evidence.anchor) if evidence.anchor else None,
        },
        "settings": [asdict(s) | {"sources": dict(s.sources)} for s in PAPER_SETTINGS],
        "table": rows,
        "length_profiles": [
            {
                **asdict(p),
                "params": dict(p.params),
                "open_range": {k: list(v) for k, v in p.open_range.items()},
            }
            for p in LENGTH_PROFILES.values()
        ],
        "observables": observables(rows),
        "open_ranges": _open_range_rows(ranges, range_rows),
        "mechanisms": _mechanism_rows(cases, case_rows),
        "agent_setting": asdict(AGENT_ROW) | {"sources": dict(AGENT_ROW.sources)},
        "agent_row": agent_rows,
        "calibration": calibrated,
        "drift": drifted,
    }
    text = render(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paper_table.json").write_text(json.dumps(result, indent=2, default=_json) + "\n")
    (args.out / "paper_table.md").write_text(text + "\n")
    print(text)
    if args.timed:
        print(_timing(time.perf_counter() - started, args.jobs), file=sys.stderr)


def _timing(wall_s: float, jobs: int) -> str:
    """The time the table took, for the ``--timed`` line (the pool's workers have exited: their CPU is
    in this process's children's)."""
    from april_bench.compiled import core_compiled

    cpu = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    core = "compiled" if core_compiled() else "pure Python"
    return f"paper table: {wall_s:.1f} s wall, {cpu:.1f} s CPU, {jobs} processes, simulator core {core}"


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform says, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _json(value: object) -> object:
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    raise TypeError(f"not JSON: {value!r}")


if __name__ == "__main__":
    main()
