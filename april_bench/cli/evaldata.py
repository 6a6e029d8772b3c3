"""``eval`` (avg@k of a checkpoint) and ``data stats``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from april_bench.cli.args import key_value, name_path

__all__ = ["add_parsers", "cmd_data", "cmd_eval"]


def add_parsers(sub: Any) -> None:
    _add_eval_parser(sub)
    _add_data_parser(sub)


def _add_eval_parser(sub: Any) -> None:
    ev = sub.add_parser(
        "eval",
        help="avg@k of a checkpoint on AIME 2024/2025, MATH-500 (any math data set)",
        description="Evaluate a checkpoint directory with the hf engine: avg@k accuracy per data set, graded "
        "with each data set's recipe grader. Data comes from --data-path files, else from the hub.",
    )
    ev.add_argument(
        "--model",
        required=True,
        help="checkpoint directory (weights + tokenizer) or hub id (Qwen/Qwen3-0.6B, from the local cache)",
    )
    ev.add_argument("--datasets", default="aime-2024,aime-2025,math-500", help="comma-separated data sets")
    ev.add_argument(
        "--data-path",
        action="append",
        type=name_path,
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
        type=key_value,
        default=[],
        metavar="NAME=VALUE",
        help="hf engine setting, e.g. device=cuda or max_running_requests=256",
    )
    ev.add_argument("--out", type=Path, help="write eval.json and eval_rows.jsonl here")
    ev.add_argument(
        "--allow-dirty", action="store_true", help="write --out under results/ from uncommitted code"
    )
    ev.set_defaults(handler=cmd_eval)


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
    st.set_defaults(handler=cmd_data)


def cmd_eval(args: argparse.Namespace) -> int:
    from april_bench.config import ConfigError
    from april_bench.hub import resolve_model
    from april_bench.results.reference import check_reference_output

    args.model = resolve_model(args.model)  # a hub id: its snapshot in the local cache
    check_reference_output(args.out, allow_dirty=args.allow_dirty)  # results/ holds committed evidence
    if not Path(args.model).expanduser().is_dir():
        raise ConfigError(
            f"--model {args.model}: no such checkpoint directory; eval reads a local checkpoint "
            "(weights + tokenizer) and never downloads one"
        )
    args.model = str(Path(args.model).expanduser())
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
    from april_bench.results.schema import SCHEMA_VERSION

    summary = {
        "schema_version": SCHEMA_VERSION,
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
        from april_bench.fsio import write_atomic

        write_atomic(
            args.out / "eval.json", json.dumps({**summary, "provenance": provenance}, indent=2) + "\n"
        )
        write_atomic(
            args.out / "eval_rows.jsonl", "".join(json.dumps(as_row(row)) + "\n" for row in result.rows)
        )
        print(f"\neval directory: {args.out}")
    print(json.dumps(summary))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from april_bench.data import format_stats, load, stats

    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    loaded = load(args.dataset, args.path)
    print(format_stats(stats(loaded, tokenizer=tokenizer, template=args.template)))
    return 0
