"""The ``run`` / ``validate`` flags, derived from the configs and registries they set.

Help texts are the config fields' own (:meth:`BaseConfig.field_help`), choices
come from the registries, so nothing is typed twice.  :func:`config_from_args`
starts from the hardware's recipe and applies every flag the user set.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "add_run_arguments",
    "check_resume_flags",
    "config_from_args",
    "flags_set",
    "key_value",
    "metadata_pair",
    "name_path",
    "split_list",
]


_OPTIONS_LISTED = {
    "engine": "; `ls engines` lists each engine's options",
    "trainer": "; `ls trainers` lists each trainer's options",
}


def key_value(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    return key.strip().replace("-", "_"), _json_or_text(raw)


def metadata_pair(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with the key kept as written and the value read as JSON when it parses."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. cluster=a100-pool, got {text!r}")
    return key.strip(), _json_or_text(raw)


def _json_or_text(raw: str) -> Any:
    """``raw`` read as strict JSON (``NaN``, ``Infinity`` and overflowing numbers are not JSON), else the
    text itself: ``--metadata x=NaN`` keeps the string "NaN", and a setting that wants a number refuses
    it in one line."""
    from april_bench.bounded import check_values
    from april_bench.config import ConfigError

    def refuse(name: str) -> Any:
        raise ValueError(name)

    def finite(text: str) -> float:
        value = float(text)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(text)
        return value

    try:
        value = json.loads(raw, parse_constant=refuse, parse_float=finite)
        check_values(value, "a flag value")
    except (ValueError, RecursionError, ConfigError):
        return raw
    return value


def name_path(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PATH, e.g. math-500=data/math500.jsonl, got {text!r}"
        )
    name, path = text.split("=", 1)
    return name.strip(), str(Path(path.strip()).expanduser())


def _strategy_key_value(text: str) -> tuple[str, str, Any]:
    key, value = key_value(text)
    strategy, dot, option = key.partition(".")
    if not dot or not option:
        raise argparse.ArgumentTypeError(
            f"expected STRATEGY.OPTION=VALUE, e.g. april.max_version_span=2, got {text!r}"
        )
    return strategy.replace("_", "-"), option, value


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    return value


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``run`` and ``validate`` (the two take the same flags)."""
    from april_bench.algorithms import ALGORITHMS, OFF_POLICY_MODES
    from april_bench.data.specs import training_sets
    from april_bench.engines import ENGINES
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.profiles.hardware import hardware_names
    from april_bench.recipes import RECIPES
    from april_bench.rollout.loop import RolloutConfig
    from april_bench.rollout.strategy import RefillMode
    from april_bench.strategies import STRATEGIES
    from april_bench.telemetry.sampler import BACKENDS, TelemetryConfig
    from april_bench.trainers.registry import TRAINERS

    exp, roll = ExperimentConfig.field_help(), RolloutConfig.field_help()
    what = p.add_argument_group(
        "what to compare (unset flags come from the recipe: embedded CPU default, or APRIL's paper setting)"
    )
    what.add_argument(
        "--hw",
        default=None,
        choices=hardware_names(),
        help=exp["hardware"] + "; default cpu (the embedded default), mi300x with a paper-* --recipe, h100 "
        "with --recipe gpu-check; a --config file's own hardware otherwise",
    )
    what.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="start from a .toml or .yaml file of run fields (a run's config.yaml repeats it); fields it "
        "leaves out come from the --hw recipe, flags given apply on top (docs/conventions.md)",
    )
    what.add_argument(
        "--recipe",
        choices=list(RECIPES),
        help="start from a row of APRIL's paper table (paper-*: simulated on --hw, default mi300x; "
        "docs/calibration.md), or gpu-check: one GPU lease's measured sync-vs-APRIL run (docs/gpu.md)",
    )
    what.add_argument("--algo", choices=ALGORITHMS.names(), help=exp["algorithm"])
    what.add_argument(
        "--dataset", choices=["synthetic", "synthetic-agent", *training_sets()], help=exp["dataset"]
    )
    what.add_argument("--model", help=exp["model"])
    what.add_argument("--engine", choices=["auto", *ENGINES.names()], help=exp["engine"])
    what.add_argument(
        "--engine-url",
        metavar="URL",
        help="attach to a running server (vllm, sglang) at http://host:port or https://host:port (TLS "
        "verified against the system's CAs; SSL_CERT_FILE for a private one) instead of launching one",
    )
    what.add_argument(
        "--trainer",
        choices=["auto", *TRAINERS.names()],
        help="auto (torch on a token engine, sim on the simulator) or one of " + ", ".join(TRAINERS.names()),
    )
    what.add_argument(
        "--strategies",
        metavar="LIST",
        help=f"comma-separated arms ({', '.join(STRATEGIES.names())}); {exp['strategies']}",
    )
    what.add_argument("--baseline", metavar="ARM", help=exp["baseline"])
    what.add_argument(
        "--length-oracle",
        metavar="PROFILE",
        help="forced-length run: every response's length and reward are drawn from PROFILE, a data set's "
        "length model (deepscaler, dapo-math-17k, deepmath-103k, synthetic; DATASET@MODEL; options in "
        "brackets: cap=, scale=, solve_rate= ...) or a length-trace file; the engine ignores the stop token "
        "until the drawn length, so the schedule is the same on every machine (docs/measured.md)",
    )
    what.add_argument("--steps", type=_int, help=exp["steps"])
    what.add_argument("--seed", type=_int, help=exp["seed"])
    batch = p.add_argument_group("rollout batch")
    for name in (
        "rollout_batch_size",
        "n_samples_per_prompt",
        "over_sampling_batch_size",
        "max_response_len",
    ):
        batch.add_argument(f"--{name.replace('_', '-')}", type=_int, help=roll[name])
    batch.add_argument(
        "--dynamic-sampling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=exp["dynamic_sampling"],
    )
    batch.add_argument("--refill", choices=[m.value for m in RefillMode], help=roll["refill"])
    batch.add_argument(
        "--rollout-arg",
        action="append",
        type=key_value,
        default=[],
        metavar="NAME=VALUE",
        help="any other rollout setting, e.g. temperature=0.6, top_p=0.95 or max_groups_per_step=2048",
    )
    strat = p.add_argument_group("strategy options and APRIL's off-policy tokens")
    strat.add_argument("--off-policy", choices=OFF_POLICY_MODES, help=exp["off_policy"])
    from april_bench.strategies import strategy_options

    april = strategy_options("april")  # the flags' help is the April Config's own
    for cap in _APRIL_CAPS:
        strat.add_argument("--" + cap.replace("_", "-"), type=_int, help=f"APRIL: {april[cap]}")
    strat.add_argument(
        "--strategy-arg",
        action="append",
        type=_strategy_key_value,
        default=[],
        metavar="STRATEGY.OPTION=VALUE",
        help="an option for every arm of a strategy, e.g. april.max_version_span=2 (repeatable)",
    )
    env = p.add_argument_group("engine, trainer, task and workload")
    env.add_argument("--eval-every", type=_int, help=exp["eval_every"])
    env.add_argument("--num-gpus", type=_int, help=exp["num_gpus"])
    env.add_argument("--colocate", action="store_true", default=None, help=exp["colocate"])
    for flag, example in (
        ("engine", "max_running_requests=64 (simulator: SGLang's names; hf: device=cuda)"),
        ("trainer", "lr=3e-4 or mini_batches=2"),
        ("warmstart", "steps=200"),
        ("task", "grader=math-verify (math) or max_k=29 (synthetic)"),
        ("workload", "response_median=3000 or length_trace=lens.jsonl"),
    ):
        env.add_argument(
            f"--{flag}-arg",
            action="append",
            type=key_value,
            default=[],
            metavar="NAME=VALUE",
            help=f"{exp[flag + '_args']}, e.g. {example} (repeatable)" + _OPTIONS_LISTED.get(flag, ""),
        )
    data = p.add_argument_group(
        "math data sets (a checkpoint --model trains on real prompts; the sim takes prompt lengths from them)"
    )
    data.add_argument(
        "--data-path",
        action="append",
        type=name_path,
        default=[],
        metavar="NAME=PATH",
        help="local parquet/json/jsonl file or directory of a data set, e.g. dapo-math-17k=data/dapo.parquet "
        "(repeatable; unset: the hub)",
    )
    data.add_argument("--eval-datasets", metavar="LIST", help="comma-separated: " + exp["eval_datasets"])
    measure = p.add_argument_group("measurement (measured runs: arms interleaved in blocks, ABBA)")
    telemetry = TelemetryConfig.field_help()
    measure.add_argument("--telemetry", choices=BACKENDS, help=telemetry["backend"])
    measure.add_argument("--telemetry-rate", type=float, metavar="HZ", help=telemetry["rate_hz"])
    measure.add_argument("--telemetry-devices", metavar="LIST", help=telemetry["devices"] + ", e.g. 0,1")
    measure.add_argument("--repeats", type=_int, help=exp["repeats"])
    measure.add_argument("--block-steps", type=_int, help=exp["block_steps"])
    measure.add_argument("--warmup-steps", type=_int, help=exp["warmup_steps"])
    out = p.add_argument_group("output")
    out.add_argument(
        "--out", type=Path, default=None, help="run directory (default: runs/<time>-<hw>-<algo>-<data>)"
    )
    out.add_argument("--overwrite", action="store_true", help="replace the run already in --out")
    out.add_argument(
        "--resume", type=Path, metavar="DIR", help="continue the interrupted run in DIR (with its own config)"
    )
    out.add_argument("--checkpoint-every", type=_int, metavar="N", help=exp["checkpoint_every"])
    out.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write a reference run (--out under the checkout's results/) from a tree with uncommitted "
        "changes; refused otherwise, since its provenance could not name the code that produced it",
    )
    out.add_argument("--no-progress", action="store_true", help="hide progress bars")
    out.add_argument(
        "--logger",
        metavar="LIST",
        type=split_list,
        help="also send the rows (steps, evals, telemetry, engine counters) and the summary to "
        "experiment trackers: comma-separated tensorboard, wandb, mlflow (optional extras; "
        "docs/conventions.md)",
    )
    out.add_argument(
        "--logger-project", default="april-bench", metavar="NAME", help="W&B project / MLflow experiment"
    )
    out.add_argument(
        "--logger-offline",
        action="store_true",
        help="W&B offline into RUN/wandb (`wandb sync` later), MLflow into RUN/mlflow.db even if "
        "MLFLOW_TRACKING_URI is set",
    )
    out.add_argument(
        "--metadata",
        action="append",
        type=metadata_pair,
        default=[],
        metavar="KEY=VALUE",
        help="a label merged into the results (provenance.json and summary.json 'metadata', and every "
        "--logger sink), e.g. cluster=a100-pool or ticket=123, as `vllm bench serve --metadata` (repeatable)",
    )
    from april_bench.cli.helptext import name_defaults

    name_defaults(p)


_TOP_LEVEL = {
    "algo": "algorithm",
    "dataset": "dataset",
    "model": "model",
    "engine": "engine",
    "trainer": "trainer",
    "baseline": "baseline",
    "steps": "steps",
    "seed": "seed",
    "dynamic_sampling": "dynamic_sampling",
    "num_gpus": "num_gpus",
    "off_policy": "off_policy",
    "eval_every": "eval_every",
    "repeats": "repeats",
    "block_steps": "block_steps",
    "warmup_steps": "warmup_steps",
    "length_oracle": "length_oracle",
    "checkpoint_every": "checkpoint_every",
    "colocate": "colocate",
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
_APRIL_CAPS = ("max_version_span", "max_aborts_per_sample")


def _split(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in _split_arms(text) if s.strip())


def split_list(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _split_arms(text: str) -> list[str]:
    """Split on commas outside brackets: ``sync,april[a=1,b=2]`` is two arms."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def config_from_args(args: argparse.Namespace, base: Any = None) -> Any:
    """The hardware's recipe, with every flag the user set applied on top (on top of ``base`` instead,
    when given: a resumed run's stored configuration)."""
    from april_bench.recipes import recipe_for

    strategies = None if args.strategies is None else _split(args.strategies)
    devices = None if args.telemetry_devices is None else _devices(args.telemetry_devices)
    eval_datasets = None if args.eval_datasets is None else _split(args.eval_datasets)
    if base is not None:
        pass
    elif getattr(args, "config", None) is not None:
        from april_bench.config_files import config_from_file

        base = config_from_file(args.config, hardware=args.hw, recipe=getattr(args, "recipe", None))
    else:
        base = recipe_for(args.hw, getattr(args, "recipe", None))  # no --hw: the recipe's hardware
    if args.engine is not None:  # first: its recipe rules change the recipe, the flags then apply on top
        base = base.replace(engine=args.engine)
    changes: dict[str, Any] = {
        k: getattr(args, a) for a, k in _TOP_LEVEL.items() if getattr(args, a) is not None
    }
    if strategies is not None:
        changes["strategies"] = strategies
    rollout = {k: getattr(args, k) for k in _ROLLOUT if getattr(args, k) is not None}
    rollout.update(dict(args.rollout_arg))
    if rollout:
        from april_bench.config import config_from
        from april_bench.rollout.loop import RolloutConfig

        current: dict[str, Any] = {f: getattr(base.rollout, f) for f in RolloutConfig.field_help()}
        changes["rollout"] = config_from(RolloutConfig, {**current, **rollout}, where="--rollout-arg")
    for flag, key in _MAPPINGS.items():
        if getattr(args, flag):
            changes[key] = {**getattr(base, key), **dict(getattr(args, flag))}
    if args.engine_url is not None:
        changes["engine_args"] = {**changes.get("engine_args", base.engine_args), "url": args.engine_url}
    strategy_args = {name: dict(options) for name, options in base.strategy_args.items()}
    for cap in _APRIL_CAPS:
        if getattr(args, cap) is not None:
            strategy_args.setdefault("april", {})[cap] = getattr(args, cap)
    for strategy, option, value in args.strategy_arg:
        strategy_args.setdefault(strategy, {})[option] = value
    if strategy_args != base.strategy_args:
        changes["strategy_args"] = strategy_args
    telemetry = {
        k: v
        for k, v in (
            ("backend", args.telemetry),
            ("rate_hz", args.telemetry_rate),
            ("devices", devices),
        )
        if v is not None
    }
    if telemetry:
        changes["telemetry"] = base.telemetry.replace(**telemetry)
    if args.data_path:
        changes["data_paths"] = {**base.data_paths, **dict(args.data_path)}
    if eval_datasets is not None:
        changes["eval_datasets"] = eval_datasets
    return base.replace(**changes)


#: Flags ``--resume`` takes whatever their value: they say how to run, not what.
_RESUME_FREE = ("--resume", "--no-progress", "--allow-dirty", "--log-level")
#: Flags that name where a configuration comes from or where a new run goes: a resume has its own.
_RESUME_NEVER = ("--recipe", "--config", "--out", "--overwrite", "--metadata")


def check_resume_flags(args: argparse.Namespace, stored_config: Callable[[], Any]) -> None:
    """``--resume`` continues a run with its own configuration (``stored_config()``, read only when a
    flag needs comparing).  The original command with
    ``--resume`` added is accepted: a flag is refused only when it would change the stored configuration
    (named with both values), or when it names a new run's source or place (--config, --out, ...)."""
    from april_bench.config import ConfigError

    extra = [f for f in flags_set(args) if f not in _RESUME_FREE]
    if not extra:
        return
    never = [f for f in extra if f in _RESUME_NEVER or f.startswith("--logger")]
    if never:
        raise ConfigError(f"--resume continues a run with its own configuration; drop {', '.join(never)}")
    stored = stored_config()
    changed: list[str] = []
    if args.hw is not None and args.hw != stored.hardware:
        changed.append(f"hardware ({stored.hardware} -> {args.hw})")
    old, new = stored.to_dict(), config_from_args(args, base=stored).to_dict()
    changed += [f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in new if new.get(k) != old.get(k)]
    if changed:
        raise ConfigError(
            "--resume continues a run with its own configuration, and these flags would change it: "
            f"{'; '.join(changed)}; drop them (or start a new run with --out)"
        )


def flags_set(args: argparse.Namespace) -> list[str]:
    """The run flags the user gave (those whose value differs from the parser's default)."""
    defaults = {"hw": "cpu", "no_progress": False, "overwrite": False, "logger_project": "april-bench"}
    given = []
    for name, value in vars(args).items():
        if name in ("command", "handler"):
            continue
        if value in (None, [], False) or defaults.get(name) == value:
            continue
        given.append("--" + name.replace("_", "-"))
    return given


def _devices(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        from april_bench.config import ConfigError

        raise ConfigError(f"--telemetry-devices {text!r}: expected GPU indices like 0,1") from None
