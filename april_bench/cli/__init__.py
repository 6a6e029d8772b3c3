"""``python -m april_bench``: run | validate | ablate | ls | report | eval | data | plot | paper | simcheck.

Examples::

    python -m april_bench run                                  # the embedded default, on this CPU
    python -m april_bench run --hw mi300x --algo dapo          # APRIL's paper setting, simulated here
    python -m april_bench run --hw h100 --dataset deepmath-103k --strategies sync,april --steps 50
    python -m april_bench run --strategies 'sync,april,april[max_version_span=2]'
    python -m april_bench ablate --hw h100 --algo dapo              # the strategy zoo x knobs, simulated
    python -m april_bench run --engine-arg max_running_requests=64 --workload-arg response_median=3000
    python -m april_bench ls hardware
    python -m april_bench report runs/<run-id>
    python -m april_bench eval --model ckpt/ --datasets aime-2024,math-500 --samples 16
    python -m april_bench data stats deepscaler --path data/deepscaler.json
    python -m april_bench plot runs/<run-id> --out figures/
    python -m april_bench paper --check                        # README tables and figures up to date?
    python -m april_bench whatif example                       # replay a trace under the zoo
    python -m april_bench simcheck --engine hf --steps 6       # simulator's prediction, then the measurement
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from april_bench.config import ConfigError
from april_bench.engines.protocol import EngineError

__all__ = ["build_parser", "main", "prog_name"]


class _Parser(argparse.ArgumentParser):
    """Bad flags get one line naming the fix, not a page of usage."""

    def error(self, message: str) -> NoReturn:
        from april_bench.redact import redact_text

        self.exit(2, f"error: {redact_text(message)} (see `{self.prog} --help`)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """An invalid choice that differs only in case names the right one (``--hw MI300X``)."""
        choices = action.choices
        if choices is not None and value not in choices and isinstance(value, str):
            folded = [str(c) for c in choices if str(c).lower() == value.lower()]
            if folded:
                raise argparse.ArgumentError(action, f"invalid choice: {value!r}. Did you mean: {folded[0]}?")
        super()._check_value(action, value)


def _message(exc: BaseException) -> str:
    """An error's message with every secret redacted (``http://user:***@host``)."""
    from april_bench.redact import redact_text

    return redact_text(str(exc))


def prog_name(argv0: str | None = None) -> str:
    """How the user invoked us: ``april-bench`` (the console script) or ``python -m april_bench``."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return "april-bench" if name.startswith("april-bench") else "python -m april_bench"


def build_parser() -> argparse.ArgumentParser:
    from april_bench.cli import ablate, commands, evaldata, gate, paper, simcheck, whatif
    from april_bench.cli.args import add_run_arguments

    parser = _Parser(
        prog=prog_name(),
        description="APRIL (Active Partial Rollouts) against synchronous baselines, on real or simulated "
        "engines. Every number is labelled simulated or measured.",
        epilog="Start with `run` (the embedded default on this CPU) or `run --hw mi300x --algo dapo` (the "
        "paper's setting, simulated). Docs: README.md, docs/simulator.md, docs/embedded.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="compare strategies on one workload and print a paper-style table",
        description="Run every arm on the same prompts, seeds and length draws; write a run directory.",
    )
    add_run_arguments(run)
    run.set_defaults(handler=commands.cmd_run)
    validate = sub.add_parser(
        "validate",
        help="check a configuration without running it (takes run's flags)",
        description="Everything `run` would reject, found without loading a model or running a step.",
    )
    add_run_arguments(validate)
    validate.set_defaults(handler=commands.cmd_validate)
    ablate.add_parsers(sub)
    commands.add_inspect_parsers(sub)
    evaldata.add_parsers(sub)
    gate.add_parsers(sub)
    paper.add_parsers(sub)
    whatif.add_parsers(sub)
    simcheck.add_parsers(sub)
    from april_bench.cli.helptext import name_defaults
    from april_bench.cli.output import LEVELS

    for name, command in sub.choices.items():
        command.add_argument(
            "--log-level",
            choices=LEVELS,
            default=None,
            help="how much to say along the way on stderr (default info, or APRIL_BENCH_LOG_LEVEL); "
            "tables and results always go to stdout",
        )
        if name not in ("run", "validate"):  # those two name the recipes' defaults already
            name_defaults(command, recipe={})
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a flag argparse rejected (its one line is printed)
        return int(exc.code or 0)
    try:
        from april_bench.cli.output import setup

        setup(args)
        return int(args.handler(args))
    except (ConfigError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        print(f"error: {_message(exc)}", file=sys.stderr)
        return 2
    except EngineError as exc:
        print(f"engine error: {_message(exc)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
