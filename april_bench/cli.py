"""``python -m april_bench``: run | ls | validate | report.

Examples::

    python -m april_bench run                                  # the embedded default, on this CPU
    python -m april_bench run --hw mi300x --algo dapo          # APRIL's paper setting, simulated here
    python -m april_bench run --hw h100 --dataset deepmath-103k --strategies sync,april --steps 50
    python -m april_bench run --engine-arg max_running_requests=64 --workload-arg response_median=3000
    python -m april_bench ls hardware
    python -m april_bench report runs/<run-id>
    python -m april_bench eval --model ckpt/ --datasets aime-2024,math-500 --samples 16
    python -m april_bench data stats deepscaler --path data/deepscaler.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.engines.protocol import EngineError

__all__ = ["build_parser", "main"]

HARDWARE_CHOICES = ("cpu", "h100", "h200", "mi300x")
ALGO_CHOICES = ("grpo", "dapo", "gspo")
DATASET_CHOICES = ("synthetic", "dapo-math-17k", "deepscaler", "deepmath-103k")
ENGINE_CHOICES = ("auto", "hf", "sim")


def _key_value(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip().replace("-", "_"), value


def _name_path(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PATH, e.g. math-500=data/math500.jsonl, got {text!r}"
        )
    name, path = text.split("=", 1)
    return name.strip(), path.strip()


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group(
        "what to compare (unset flags come from the recipe: embedded CPU default, or APRIL's paper setting)"
    )
    what.add_argument(
        "--hw",
        default="cpu",
        choices=HARDWARE_CHOICES,
        help="hardware to run or simulate; cpu runs the embedded default (default: cpu)",
    )
    what.add_argument("--algo", choices=ALGO_CHOICES, help="dapo turns on dynamic sampling")
    what.add_argument("--dataset", choices=DATASET_CHOICES, help="synthetic is the embedded task")
    what.add_argument(
        "--model", help="tiny, qwen3-4b, qwen3-8b, r1-distill-qwen-1.5b, or a checkpoint dir (hf)"
    )
    what.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        help="auto: a real engine when it can run the named hardware here, else the simulator",
    )
    what.add_argument("--strategies", help="comma-separated arms; sync is the baseline of every gain")
    what.add_argument("--steps", type=int, help="training steps per arm")
    what.add_argument("--seed", type=int, help="seed of prompts, length draws and sampling")
    batch = p.add_argument_group("rollout batch")
    batch.add_argument("--rollout-batch-size", type=int, help="N: groups trained per step")
    batch.add_argument("--n-samples-per-prompt", type=int, help="samples per group")
    batch.add_argument("--over-sampling-batch-size", type=int, help="N': groups per launch wave")
    batch.add_argument("--max-response-len", type=int, help="response token limit")
    batch.add_argument(
        "--dynamic-sampling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="DAPO dynamic sampling (default: on for dapo only)",
    )
    batch.add_argument(
        "--refill",
        choices=("wave", "granular"),
        help="after rejections relaunch a whole wave (reference) or just the deficit",
    )
    caps = p.add_argument_group("APRIL's off-policy tokens")
    caps.add_argument(
        "--off-policy",
        choices=("as-is", "mask", "tis"),
        help="train them as-is (the paper), mask them out, or weight them by TIS (cap 2)",
    )
    caps.add_argument(
        "--max-version-span",
        type=int,
        help="restart buffered samples whose oldest token is this many versions old",
    )
    caps.add_argument(
        "--max-aborts-per-sample", type=int, help="restart samples aborted more than this many times"
    )
    env = p.add_argument_group("engine, trainer and workload")
    env.add_argument("--eval-every", type=int, help="held-out evaluation every N steps (real runs)")
    env.add_argument("--num-gpus", type=int, help="GPUs to simulate (default: one 8-GPU node)")
    env.add_argument(
        "--engine-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=VALUE",
        help="native engine argument, e.g. tp_size=1 or max_running_requests=64 (repeatable)",
    )
    env.add_argument(
        "--trainer-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=VALUE",
        help="trainer setting, e.g. lr=3e-4 or mini_batches=2 (repeatable)",
    )
    env.add_argument(
        "--warmstart-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=VALUE",
        help="warm-start setting, e.g. steps=200 (repeatable)",
    )
    env.add_argument(
        "--task-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=VALUE",
        help="task setting: a math run's grader=, template=, eval_samples=, eval_limit= ... (repeatable)",
    )
    data = p.add_argument_group(
        "math data sets (a checkpoint --model trains on real prompts; the sim takes prompt lengths from them)"
    )
    data.add_argument(
        "--data-path",
        action="append",
        type=_name_path,
        default=[],
        metavar="NAME=PATH",
        help="local parquet/json/jsonl file or directory of a data set, e.g. dapo-math-17k=data/dapo.parquet "
        "(repeatable; unset: the hub)",
    )
    data.add_argument(
        "--eval-datasets",
        metavar="LIST",
        help="comma-separated evaluation sets of a math run, e.g. aime-2024,math-500 (avg@k)",
    )
    env.add_argument(
        "--workload-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=VALUE",
        help="simulated-workload override, e.g. response_median=3000 or length_trace=lens.jsonl",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m april_bench",
        description="APRIL (Active Partial Rollouts) against synchronous baselines, "
        "on real or simulated engines.",
        epilog="Every number is labelled simulated or measured. Docs: README.md and docs/simulator.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="compare strategies on one workload and print a paper-style table",
        description="Run every strategy on the same prompts, seeds and length draws; write a run directory.",
    )
    _add_run_arguments(run)
    out = run.add_argument_group("output")
    out.add_argument(
        "--out", type=Path, default=None, help="run directory (default: runs/<time>-<hw>-<algo>)"
    )
    out.add_argument("--no-progress", action="store_true", help="hide progress bars")
    validate = sub.add_parser("validate", help="check a configuration without running it")
    _add_run_arguments(validate)
    ls = sub.add_parser("ls", help="list strategies, engines, hardware, models, data sets, algorithms")
    ls.add_argument(
        "what",
        nargs="?",
        default="all",
        choices=("all", "strategies", "engines", "hardware", "models", "datasets", "algorithms"),
    )
    report = sub.add_parser("report", help="re-render a run directory's tables from its rows")
    report.add_argument("run_dir", type=Path)
    _add_eval_parser(sub)
    _add_data_parser(sub)
    return parser


def _add_eval_parser(sub: Any) -> None:
    ev = sub.add_parser(
        "eval",
        help="avg@k of a checkpoint on AIME 2024/2025, MATH-500 (any math data set)",
        description="Evaluate a checkpoint directory with the hf engine: avg@k accuracy per data set, graded "
        "with each data set's recipe grader. Data comes from --data-path files, else from the hub.",
    )
    ev.add_argument("--model", required=True, help="checkpoint directory (weights + tokenizer)")
    ev.add_argument("--datasets", default="aime-2024,aime-2025,math-500", help="comma-separated data sets")
    ev.add_argument(
        "--data-path",
        action="append",
        type=_name_path,
        default=[],
        metavar="NAME=PATH",
        help="local file or directory for a data set (repeatable), e.g. math-500=data/math500.jsonl",
    )
    ev.add_argument("--samples", type=int, default=4, help="k of avg@k (APRIL: 16)")
    ev.add_argument("--temperature", type=float, default=1.0, help="0 for greedy pass@1 (with --samples 1)")
    ev.add_argument("--top-p", type=float, default=1.0, help="nucleus threshold (APRIL's eval: 0.7)")
    ev.add_argument("--max-new-tokens", type=int, default=1024, help="response limit")
    ev.add_argument(
        "--grader", choices=("dapo", "deepscaler", "math-verify"), help="override every set's grader"
    )
    ev.add_argument(
        "--template", help="prompt template for every set (default: boxed; see `data stats --help`)"
    )
    ev.add_argument("--limit", type=int, help="first N problems of each set")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed")
    ev.add_argument(
        "--engine-arg",
        action="append",
        type=_key_value,
        default=[],
        metavar="NAME=VALUE",
        help="hf engine setting, e.g. device=cuda or max_running_requests=256",
    )
    ev.add_argument("--out", type=Path, help="write eval.json and eval_rows.jsonl here")


def _add_data_parser(sub: Any) -> None:
    data = sub.add_parser("data", help="inspect math data sets")
    verbs = data.add_subparsers(dest="data_command", required=True)
    st = verbs.add_parser("stats", help="rows, prompt-length distribution, answer types, skipped rows")
    st.add_argument(
        "dataset", help="dapo-math-17k, deepscaler, deepmath-103k, aime-2024, aime-2025, math-500"
    )
    st.add_argument("--path", help="local file or directory (default: the hub)")
    st.add_argument(
        "--tokenizer", help="a tokenizer directory: prompt lengths in tokens, chat template applied"
    )
    st.add_argument(
        "--template",
        help="dapo, dapo-boxed, deepscaler, deepmath, boxed or plain (default: the data set's recipe)",
    )


_TOP_LEVEL = {
    "algo": "algorithm",
    "dataset": "dataset",
    "model": "model",
    "engine": "engine",
    "steps": "steps",
    "seed": "seed",
    "dynamic_sampling": "dynamic_sampling",
    "max_version_span": "max_version_span",
    "max_aborts_per_sample": "max_aborts_per_sample",
    "num_gpus": "num_gpus",
    "off_policy": "off_policy",
    "eval_every": "eval_every",
}
_ROLLOUT = (
    "rollout_batch_size",
    "n_samples_per_prompt",
    "over_sampling_batch_size",
    "max_response_len",
    "refill",
)
_MAPPINGS = {
    "engine_arg": "engine_args",
    "trainer_arg": "trainer_args",
    "warmstart_arg": "warmstart_args",
    "workload_arg": "workload_args",
    "task_arg": "task_args",
}


def config_from_args(args: argparse.Namespace) -> Any:
    """The hardware's recipe, with every flag the user set applied on top."""
    from april_bench.recipes import recipe_for

    base = recipe_for(args.hw)
    changes: dict[str, Any] = {
        k: getattr(args, a) for a, k in _TOP_LEVEL.items() if getattr(args, a) is not None
    }
    if args.strategies is not None:
        changes["strategies"] = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    rollout = {k: getattr(args, k) for k in _ROLLOUT if getattr(args, k) is not None}
    if rollout:
        changes["rollout"] = base.rollout.replace(**rollout)
    for flag, key in _MAPPINGS.items():
        if getattr(args, flag):
            changes[key] = {**getattr(base, key), **dict(getattr(args, flag))}
    if args.data_path:
        changes["data_paths"] = {**base.data_paths, **dict(args.data_path)}
    if args.eval_datasets is not None:
        changes["eval_datasets"] = tuple(d.strip() for d in args.eval_datasets.split(",") if d.strip())
    return base.replace(**changes)


def _cmd_run(args: argparse.Namespace) -> int:
    from april_bench.experiment import run
    from april_bench.results.provenance import collect_provenance
    from april_bench.results.store import render_tables, write_run

    config = config_from_args(args)
    result = run(config, progress=not args.no_progress, echo=lambda line: print(line, file=sys.stderr))
    out = (
        args.out
        or Path("runs")
        / f"{time.strftime('%Y%m%d-%H%M%S')}-{config.hardware}-{config.algorithm}-{config.dataset}"
    )
    provenance = collect_provenance(simulated=result.simulated, engine=result.engine, notes=result.notes)
    rec = result.recorder
    stored = write_run(
        out,
        config=config.to_dict(),
        provenance=provenance,
        requests=rec.requests,
        samples=rec.samples,
        steps=rec.steps,
        evals=rec.evals,
    )
    summary = stored.summary()
    print(render_tables(stored.config, summary, stored.simulated))
    print(f"\nrun directory: {out}")
    final = {
        "result_kind": provenance["result_kind"],
        "out": str(out),
        "throughput_gain_vs_sync": {arm: m["throughput_gain_vs_sync"] for arm, m in summary.items()},
    }
    print(json.dumps(final))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    """Build the configuration and its components without running anything (no warm start, no GPU)."""
    from april_bench.backends.resolve import resolve_engine
    from april_bench.experiment import build_components

    config = config_from_args(args)
    engine, note = resolve_engine(config.engine, config.hardware)
    if note:
        print(note)
    build_components(config, engine)
    where = f"{config.model} on {config.hardware}"
    if engine == "sim":
        info = build_components(config, engine).engine().info
        where = f"{info.replicas} replica(s) of {info.model} on {info.hardware}"
    print(
        f"ok: {engine} engine, {where}; dataset {config.dataset}; arms: {', '.join(config.strategies)}; "
        f"{config.steps} steps; dynamic sampling {'on' if config.dynamic_sampling_on else 'off'}"
    )
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:
    from april_bench.algorithms import ALGORITHMS
    from april_bench.engines import ENGINES
    from april_bench.profiles.hardware import HARDWARE
    from april_bench.profiles.models import MODELS
    from april_bench.sim.workload import DATASETS
    from april_bench.strategies import STRATEGIES

    sections = {
        "strategies": STRATEGIES,
        "engines": ENGINES,
        "algorithms": ALGORITHMS,
        "models": MODELS,
        "datasets": DATASETS,  # the simulator's length profiles
    }
    for name, registry in sections.items():
        if args.what in ("all", name):
            print(f"{name} (simulator length profiles):" if name == "datasets" else f"{name}:")
            for key in registry:
                print(f"  {key:22s} {registry.describe(key)}")
    if args.what in ("all", "datasets"):
        from april_bench.data import DATASETS as DATA_SETS
        from april_bench.graders import style_for

        print("math data sets (--data-path NAME=PATH, else the hub):")
        for key, spec in DATA_SETS.items():
            print(
                f"  {key:22s} {spec.role:5s} hub {spec.hub_id}, template {spec.template}, "
                f"grader {style_for(key)}"
            )
    if args.what in ("all", "hardware"):
        print("hardware:")
        print("  cpu                    this machine, measured at first use (numpy matmul and copy)")
        for key in HARDWARE:
            hw = HARDWARE.get(key)
            print(
                f"  {key:22s} {HARDWARE.describe(key)}: {hw.memory_bw / 1e12:.2f} TB/s x {hw.eta_bw:.2f}, "
                f"{hw.bf16_flops / 1e12:,.0f} TFLOP/s x {hw.eta_flops:.2f}"
            )
            if args.what == "hardware":
                for field, source in hw.sources.items():
                    print(f"      {field}: {source}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from april_bench.results.store import load_run, render_tables

    run = load_run(args.run_dir)
    print(render_tables(run.config, run.summary(), run.simulated))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from april_bench.results.provenance import collect_provenance
    from april_bench.results.records import as_row
    from april_bench.results.table import render_markdown
    from april_bench.tasks.math import evaluate_checkpoint

    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    result = evaluate_checkpoint(
        args.model,
        datasets,
        paths=dict(args.data_path),
        samples=args.samples,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        grader=args.grader,
        template=args.template,
        limit=args.limit,
        seed=args.seed,
        engine_args=dict(args.engine_arg),
    )
    rows = [
        [
            name,
            Path(args.model).name,
            f"avg@{args.samples}",
            f"{d['accuracy']:.1%} ± {d['stderr'] * 100:.1f}",
            str(int(d["problems"])),
            "measured",
        ]
        for name, d in result.by_dataset.items()
    ]
    print(render_markdown(("Dataset", "Model", "Metric", "Accuracy", "Problems", "Source"), rows))
    summary = {
        "result_kind": "measured",
        "model": args.model,
        "samples": args.samples,
        "accuracy": result.accuracy,
        "stderr": result.stderr,
        "by_dataset": result.by_dataset,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        provenance = collect_provenance(simulated=False, engine="hf")
        (args.out / "eval.json").write_text(
            json.dumps({**summary, "provenance": provenance}, indent=2) + "\n"
        )
        with (args.out / "eval_rows.jsonl").open("w") as f:
            for row in result.rows:
                f.write(json.dumps(as_row(row)) + "\n")
        print(f"\neval directory: {args.out}")
    print(json.dumps(summary))
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from april_bench.data import format_stats, load, stats

    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    loaded = load(args.dataset, args.path)
    print(format_stats(stats(loaded, tokenizer=tokenizer, template=args.template)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {
        "run": _cmd_run,
        "validate": _cmd_validate,
        "ls": _cmd_ls,
        "report": _cmd_report,
        "eval": _cmd_eval,
        "data": _cmd_data,
    }[args.command]
    try:
        return handler(args)
    except (ConfigError, KeyError, FileNotFoundError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"error: {message}", file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"engine error: {exc}", file=sys.stderr)
        return 1
