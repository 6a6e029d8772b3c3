"""The configuration of an experiment: one workload, several arms, everything a run needs to repeat.

``ExperimentConfig`` holds every choice; recipes (:mod:`april_bench.recipes`)
return complete ones and the CLI applies the user's flags on top.  Its field
help texts are the CLI's help texts.

``ExperimentConfig(**given)`` starts where ``run --hw HARDWARE`` starts: the
embedded run on the CPU (the default hardware, as on the command line), APRIL's
published setting on a GPU (:func:`hardware_defaults`); a named engine's recipe
rules (:func:`engine_rules`, from what its ``EngineSpec`` declares) apply to what was
not given, for every caller (Python, flags, a ``--config`` file).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from april_bench.algorithms import ALGORITHMS, OFF_POLICY_MODES
from april_bench.config import BaseConfig, ConfigError, config_from, param, to_jsonable
from april_bench.engines import ENGINES
from april_bench.rollout.loop import RolloutConfig
from april_bench.strategies import ArmSpec, build_strategy
from april_bench.telemetry.sampler import TelemetryConfig

__all__ = [
    "CONFIG_VERSION",
    "DEFAULT_HARDWARE",
    "ExperimentConfig",
    "engine_rules",
    "hardware_defaults",
    "load_config",
    "paper_defaults",
]

#: More steps or repeats than any run takes: a config.json holding 1e308 steps is damaged, not a plan.
MAX_STEPS = 1_000_000
MAX_REPEATS = 10_000

#: The hardware the command line (``--hw``) and ``ExperimentConfig()`` default to: this CPU.
DEFAULT_HARDWARE = "cpu"
#: The version of a run's ``config.json`` (its ``config_version`` field).  1: no version field, the
#: defaults of before version 2 (H100, Qwen3-4B, three arms, 20 steps) for fields a file lacks.
CONFIG_VERSION = 2

# The field defaults are the embedded run (recipes.embedded): a tiny Qwen3 learning the synthetic task on
# the CPU with GRPO (the paper's headline setting; --algo dapo adds dynamic sampling, whose sync baseline
# then refills whole waves and throws most away: see the README), sync vs APRIL.  Measured on a shared
# machine, so the arms alternate every 5 steps (ABBA) and a burst of load lands on both; the gain is the
# median of 12 paired blocks per repeat, and each arm's first step (allocator, first kernels) is left out.
_DEFAULT_WARMUP = 1
#: The embedded default's rollout: 16 groups x 8 of up to 192 tokens (two cores, about five minutes).
_EMBEDDED_ROLLOUT = RolloutConfig(
    rollout_batch_size=16,
    n_samples_per_prompt=8,
    over_sampling_batch_size=32,
    max_response_len=192,
    temperature=1.0,
)


@dataclass(kw_only=True, slots=True, frozen=True)
class ExperimentConfig(BaseConfig):
    hardware: str = param(DEFAULT_HARDWARE, help="hardware to run or simulate: cpu, h100, h200, mi300x")
    algorithm: str = param("grpo", help="grpo, dapo (adds dynamic sampling) or gspo")
    dataset: str = param("synthetic", help="synthetic, dapo-math-17k, deepscaler or deepmath-103k")
    model: str = param(
        "tiny",
        help="policy model: a named architecture (ls models: what the simulator takes), or on a real "
        "engine a checkpoint dir or a hub id (Qwen/Qwen3-4B)",
    )
    engine: str = param("auto", help="auto (a real engine when it can run the hardware here, else sim)")
    trainer: str = param(
        "auto", help="auto (torch on a token engine, sim on the simulator) or a trainer (ls trainers)"
    )
    strategies: tuple[str, ...] = param(
        ("sync", "april"),
        help="arms to compare: NAME or NAME[key=value,...], e.g. april[max_version_span=2]; any arm "
        "takes driver=sync|one-step-off|stale|lookahead (with max_staleness=ETA or steps_ahead=K, "
        "weight_update=inflight|drain, train_gpus=G on the simulator), "
        "e.g. april[driver=stale,max_staleness=2]",
    )
    baseline: str | None = param(
        None, help="arm every gain is measured against (default: sync, else the first)"
    )
    steps: int = param(60, help="training steps per arm")
    repeats: int = param(1, help="runs of every arm, interleaved with the others (measured runs)")
    block_steps: int | None = param(
        5, help="steps per interleaved block, arms alternating ABBA (unset: all steps in one block)"
    )
    warmup_steps: int = param(_DEFAULT_WARMUP, help="first steps left out of the paired gain statistics")
    seed: int = param(0, help="seed of the workload draws and of sampling")
    rollout: RolloutConfig = param(help="rollout batch settings", default_factory=lambda: _EMBEDDED_ROLLOUT)
    dynamic_sampling: bool | None = param(None, help="override the algorithm's DAPO dynamic sampling")
    strategy_args: Mapping[str, Mapping[str, Any]] = param(
        help="options of each strategy, by strategy name (e.g. april: max_version_span)", default_factory=dict
    )
    num_gpus: int | None = param(None, help="GPUs to simulate (default: one node of the hardware)")
    eval_every: int | None = param(
        10, help="held-out evaluation every this many steps (and at 0 and the end)"
    )
    off_policy: str = param("as-is", help="tokens of older policies in the loss: as-is (paper), mask or tis")
    engine_args: Mapping[str, Any] = param(
        help="native engine arguments, passed through", default_factory=dict
    )
    workload_args: Mapping[str, Any] = param(help="simulated-workload overrides", default_factory=dict)
    trainer_args: Mapping[str, Any] = param(
        help="trainer settings (lr, mini_batches, ...)", default_factory=lambda: {"lr": 3e-4}
    )
    task_args: Mapping[str, Any] = param(
        help="task settings: the synthetic task's, or a math run's (grader, template, eval_samples ...)",
        default_factory=dict,
    )
    data_paths: Mapping[str, str] = param(
        help="local copies of data sets, by name (else the hub): the training set and evaluation sets",
        default_factory=dict,
    )
    eval_datasets: tuple[str, ...] = param(
        (), help="evaluation sets of a math run (aime-2024, aime-2025, math-500), avg@k every --eval-every"
    )
    warmstart_args: Mapping[str, Any] = param(help="warm-start (SFT) settings", default_factory=dict)
    telemetry: TelemetryConfig = param(
        help="GPU telemetry of measured runs (NVML or AMD SMI)", default_factory=TelemetryConfig
    )
    checkpoint_every: int = param(
        10,
        help="write the trainer's state (weights and optimizer moments: 12 bytes a parameter) with the "
        "checkpoint every this many steps, and when the run is interrupted; 0: only then.  Rows, the "
        "partial buffer and the status are saved after every step; --resume continues from the last "
        "checkpoint with the trainer's state, running the steps after it again (docs/run-directories.md)",
    )
    colocate: bool = param(
        False,
        help="engines and trainer share the accelerators: before each train step the engine releases its "
        "weights and KV memory (vLLM sleep mode level 2, SGLang release_memory_occupation) and after it "
        "wakes and takes the new weights; the switch is timed as its own phase (switch_time_s). Needs an "
        "engine that sleeps (vllm on a GPU, sglang, fake, ray with those) and the sync driver",
    )
    length_oracle: str | None = param(
        None,
        help="force every response's length and reward from a length profile (DATASET[@MODEL][opts] or a "
        "length-trace file): the engine ignores the stop token until the drawn length, so the schedule "
        "depends on the seed alone (a forced-length run; april_bench/sim/length_oracle.py)",
    )

    def __post_init__(self) -> None:
        self._validate(None)

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A copy with ``changes``, checked where they matter: only the checks that read a changed field
        run again (a new model does not rebuild every arm).  A new ``engine`` brings its recipe rules for
        what ``changes`` does not set, as ``ExperimentConfig(engine=...)`` does."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"ExperimentConfig has no field {', '.join(unknown)}")
        if "engine" in changes and changes["engine"] != self.engine:
            model = changes.get("model", self.model)
            changes = {**engine_rules(changes["engine"], model, given=changes), **changes}
        changes.update(_warmup_rule(self.warmup_steps, changes))
        copy = object.__new__(type(self))
        for name in names:
            object.__setattr__(copy, name, changes[name] if name in changes else getattr(self, name))
        copy._validate(frozenset(changes))
        return copy

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready, with the ``config_version`` that :func:`load_config` reads."""
        return {"config_version": CONFIG_VERSION, **BaseConfig.to_dict(self)}

    def _validate(self, changed: frozenset[str] | None) -> None:
        """Raise ``ConfigError`` naming the fix; ``changed``: the fields a :meth:`replace` set (``None``:
        all), so the costly checks (every arm's strategy, the length profile) run only when they must."""

        def touched(*fields: str) -> bool:
            return changed is None or not changed.isdisjoint(fields)

        from april_bench.data import DATASETS as DATA_SETS  # light: no pyarrow or datasets on import
        from april_bench.profiles.hardware import hardware_names

        if touched("hardware") and self.hardware not in hardware_names():
            raise ConfigError(
                f"unknown hardware {self.hardware!r}; choose from {', '.join(hardware_names())}"
            )
        ALGORITHMS.get(self.algorithm)
        if not self.strategies:
            raise ConfigError("--strategies needs at least one strategy, e.g. sync,april")
        labels = [ArmSpec.parse(s).label for s in self.strategies]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"--strategies lists an arm twice: {','.join(self.strategies)}")
        if touched("strategies", "strategy_args"):
            used = {arm.strategy for arm in self.arms}
            for name in self.strategy_args:
                if name not in used:
                    raise ConfigError(
                        f"options are given for strategy {name!r} but no arm runs it; add it to "
                        "--strategies or drop its --strategy-arg"
                    )
            for arm in self.arms:
                build_strategy(arm, self.strategy_args)  # unknown or ill-typed options fail here
        if self.baseline is not None and self.baseline not in labels:
            raise ConfigError(f"--baseline {self.baseline!r} is not one of the arms: {', '.join(labels)}")
        for name, top in (("steps", MAX_STEPS), ("repeats", MAX_REPEATS)):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"--{name} must be >= 1, got {value}")
            if value > top:
                raise ConfigError(f"--{name} must be <= {top:,} (more than any run takes), got {value}")
        if self.block_steps is not None and self.block_steps < 1:
            raise ConfigError(f"--block-steps must be >= 1, got {self.block_steps}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ConfigError(f"--warmup-steps must be in [0, --steps), got {self.warmup_steps}")
        if self.seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {self.seed}")
        if self.seed >= 2**63:
            raise ConfigError(f"--seed must be < 2**63 (a 64-bit seed), got {self.seed}")
        if self.engine != "auto" and self.engine not in ENGINES:
            ENGINES.get(self.engine)  # raises with did-you-mean
        if touched("engine", "trainer", "engine_args", "trainer_args"):
            self._parse_component_options()
        if self.workload_args and touched("workload_args"):
            object.__setattr__(self, "workload_args", to_jsonable(_parse_workload_args(self.workload_args)))
        if self.warmstart_args and touched("warmstart_args"):
            from april_bench.config import coerce_options
            from april_bench.registry import load

            warm = load("april_bench.tasks.warmstart:WarmStart.Config")  # torch: only when options are given
            parsed = coerce_options(
                warm, self.warmstart_args, where="--warmstart-arg", fixed=("model", "seed")
            )
            object.__setattr__(self, "warmstart_args", to_jsonable(parsed))
        if self.off_policy not in OFF_POLICY_MODES:
            raise ConfigError(
                f"--off-policy must be one of {', '.join(OFF_POLICY_MODES)}, got {self.off_policy!r}"
            )
        if self.eval_every is not None and self.eval_every < 1:
            raise ConfigError(f"--eval-every must be >= 1, got {self.eval_every}")
        if self.checkpoint_every < 0:
            raise ConfigError(
                f"--checkpoint-every must be >= 0 (0: the trainer's state only at an interruption), got "
                f"{self.checkpoint_every}"
            )
        if self.num_gpus is not None and self.num_gpus < 1:
            raise ConfigError(f"--num-gpus must be >= 1 (or unset for one node), got {self.num_gpus}")
        if self.length_oracle is not None and touched("length_oracle"):
            from april_bench.sim.length_oracle import parse_profile

            parse_profile(self.length_oracle)  # a bad profile fails here, before anything runs
        for name in (*self.data_paths, *self.eval_datasets) if touched("data_paths", "eval_datasets") else ():
            if name not in DATA_SETS:
                raise ConfigError(
                    f"unknown data set {name!r} in --data-path/--eval-datasets; known: {', '.join(DATA_SETS)}"
                )

    def _parse_component_options(self) -> None:
        """The named engine's and trainer's options, parsed once from their registry entry's Config
        (``Spec.parse_options``: unknown names and wrong types name the ``--engine-arg`` or
        ``--trainer-arg``) and stored as the JSON form of their typed values (``"4"`` becomes 4).
        ``--engine auto`` is chosen by the machine a run starts on, so its options (and an ``auto``
        trainer's) are parsed when it is resolved."""
        from april_bench.trainers.registry import TRAINERS, resolve_trainer

        if self.engine == "auto":
            trainer = None if self.trainer == "auto" else TRAINERS.get(self.trainer)
        else:
            spec = ENGINES.get(self.engine)
            object.__setattr__(self, "engine_args", to_jsonable(spec.parse_options(self.engine_args)))
            trains = spec.produces_tokens and not spec.simulated
            trainer = resolve_trainer(self.trainer, engine=self.engine, produces_tokens=trains)
        if trainer is not None:
            object.__setattr__(self, "trainer_args", to_jsonable(trainer.parse_options(self.trainer_args)))

    @property
    def arms(self) -> list[ArmSpec]:
        return [ArmSpec.parse(s) for s in self.strategies]

    @property
    def dynamic_sampling_on(self) -> bool:
        if self.dynamic_sampling is not None:
            return self.dynamic_sampling
        return ALGORITHMS.get(self.algorithm).dynamic_sampling

    def rollout_config(self, *, replay_lengths: bool = False) -> RolloutConfig:
        """The rollout loop's settings: the config's, with its seed and dynamic sampling (and
        ``replay_lengths`` on where the task replays the workload's lengths)."""
        changes: dict[str, Any] = {"dynamic_sampling": self.dynamic_sampling_on, "seed": self.seed}
        if replay_lengths:
            changes["replay_lengths"] = True
        return dataclasses.replace(self.rollout, **changes)


def hardware_defaults(hardware: str) -> dict[str, Any]:
    """What a config on ``hardware`` holds where a field is not given, as ``run --hw HARDWARE`` starts:
    the field defaults (the embedded run, :func:`april_bench.recipes.embedded`) on the CPU, APRIL's
    published setting (:func:`april_bench.recipes.paper`) on a GPU."""
    return {} if hardware == DEFAULT_HARDWARE else paper_defaults()


def paper_defaults() -> dict[str, Any]:
    """APRIL's published setting where it differs from the field defaults (the embedded run)."""
    from april_bench.sim.paper_settings import STEPS

    return {**_PAPER, "steps": STEPS}


#: APRIL's published setting where it differs from the embedded run: Qwen3-4B on DAPO-Math-17k, three
#: arms, the scripts' rollout (``RolloutConfig``'s defaults), no held-out evaluation or ABBA blocks.
_PAPER: dict[str, Any] = {
    "dataset": "dapo-math-17k",
    "model": "qwen3-4b",
    "strategies": ("sync", "oversample-discard", "april"),
    "block_steps": None,
    "warmup_steps": 0,
    "rollout": RolloutConfig(),
    "eval_every": None,
    "trainer_args": {},
}
#: What a version-1 config.json (no ``config_version``) meant by a field it lacks: the defaults then.
_VERSION_1_DEFAULTS: dict[str, Any] = {**_PAPER, "hardware": "h100", "steps": 20}


def engine_rules(engine: str, model: str, *, given: Mapping[str, Any]) -> dict[str, Any]:
    """What a named engine changes in a recipe, for the fields not in ``given``, from what its
    :class:`~april_bench.engines.EngineSpec` declares: a simulated engine pairs with the simulated
    trainer (the recipe's trainer settings are for a real one); a recipe model it cannot run is
    swapped for the one it can (``model_for_recipe``).  Nothing for ``auto`` or an unknown name
    (refused by the checks)."""
    if engine == "auto" or engine not in ENGINES:
        return {}
    spec = ENGINES.get(engine)
    changes: dict[str, Any] = {"trainer_args": {}} if spec.simulated else {}
    swap = dict(spec.model_for_recipe).get(model)
    if swap is not None:
        changes["model"] = swap
    return {name: value for name, value in changes.items() if name not in given}


def _parse_workload_args(options: Mapping[str, Any]) -> dict[str, Any]:
    """``--workload-arg`` options checked against the simulated workload's Config (the data set, model
    and seed are the run's) and the ``agent_*`` tool-call shape, converted to their types."""
    from april_bench.config import coerce_options
    from april_bench.sim.agent_workload import AGENT_ARGS, ToolShape
    from april_bench.sim.workload import SimWorkload

    agent = {name: value for name, value in options.items() if name in AGENT_ARGS}
    rest = {name: value for name, value in options.items() if name not in AGENT_ARGS}
    fixed = ("dataset", "model", "seed")
    try:
        ToolShape.from_args(dict(agent))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--workload-arg {', '.join(agent)}: {exc}") from None
    return {**coerce_options(SimWorkload.Config, rest, where="--workload-arg", fixed=fixed), **agent}


def _warmup_rule(warmup_steps: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """A run shorter than the recipe's warm-up keeps every step (``warmup_steps`` 0) unless the warm-up
    is given too: the recipe's warm-up is for its own length."""
    steps = given.get("steps")
    if isinstance(steps, int) and "warmup_steps" not in given and warmup_steps >= steps:
        return {"warmup_steps": 0}
    return {}


_generated_init = ExperimentConfig.__init__


def _init(self: ExperimentConfig, **given: Any) -> None:
    """``ExperimentConfig(**given)``: :func:`hardware_defaults` for the hardware, then ``given``, then
    the engine's recipe rules for what was not given (the command line's order)."""
    defaults = hardware_defaults(given.get("hardware", DEFAULT_HARDWARE))
    values = {**defaults, **given}
    values.update(engine_rules(values.get("engine", "auto"), values.get("model", "tiny"), given=given))
    values.update(_warmup_rule(defaults.get("warmup_steps", _DEFAULT_WARMUP), given))
    _generated_init(self, **values)


ExperimentConfig.__init__ = _init  # type: ignore[method-assign]


#: Fields of older config.json files, and where they live now.
_MOVED = {"max_version_span": "april", "max_aborts_per_sample": "april"}


def load_config(data: Mapping[str, Any]) -> ExperimentConfig:
    """Rebuild an :class:`ExperimentConfig` from its ``to_dict()`` form (a run's config.json), migrating
    an older version: version 1 (no ``config_version``) gets that version's defaults for the fields it
    lacks and its April options moved into ``strategy_args``."""
    data = dict(data)
    version = data.pop("config_version", 1)
    if version not in (1, CONFIG_VERSION):
        raise ConfigError(
            f"config_version {version!r} is not one this april-bench reads (1 to {CONFIG_VERSION}); "
            "a newer april-bench wrote it: upgrade april-bench"
        )
    if version == 1:
        data = {**_VERSION_1_DEFAULTS, **data}
    strategy_args = {k: dict(v) for k, v in data.get("strategy_args", {}).items()}
    for key, strategy in _MOVED.items():
        value = data.pop(key, None)
        if value is not None:
            strategy_args.setdefault(strategy, {})[key] = value
    data["strategy_args"] = strategy_args
    return config_from(ExperimentConfig, data, where="config field")
