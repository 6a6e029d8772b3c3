"""Rollout strategies by name, and arms: a strategy with its options.

An arm is written ``name`` or ``name[key=value,...]`` (``april[max_version_span=2]``):
the label is the text as given, so one run can compare several settings of one
strategy.  Options come from the run's ``strategy_args[name]`` and then the
brackets; unknown options are an error that lists the known ones.  The driver's
options (``driver``, ``max_staleness``, ``weight_update``, ``train_gpus``:
:mod:`april_bench.rollout.driver`) ride in the same brackets and are taken out
before the strategy sees them: ``april[driver=stale,max_staleness=2]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from april_bench.config import ConfigError, config_from
from april_bench.registry import Registry
from april_bench.rollout.driver_config import DRIVER_OPTIONS, DriverConfig
from april_bench.rollout.strategy import RolloutStrategy

__all__ = ["STRATEGIES", "ArmSpec", "build_strategy", "strategy_options"]

STRATEGIES: Registry[type[RolloutStrategy]] = Registry("strategy")
STRATEGIES.register(
    "sync", "baselines.sync:SyncStrategy", "launch N groups and wait for all (the paper's baseline)"
)
STRATEGIES.register(
    "oversample-discard",
    "baselines.oversample_discard:OversampleDiscardStrategy",
    "launch N' groups, abort at N, discard the rest (isolates recycling)",
)
STRATEGIES.register(
    "april", "april_impl.april:AprilStrategy", "launch N', abort at N, buffer partials and resume them first"
)
STRATEGIES.register(
    "tail-batching",
    "baselines.tail_batching:TailBatchingStrategy",
    "RollPacker: short steps race N' fresh groups to N; stragglers re-run together in tail steps",
)
STRATEGIES.register(
    "segment",
    "april_impl.segment:SegmentRolloutStrategy",
    "UloRL: APRIL with at most segment_len tokens per response per step; the rest continues next step",
)
STRATEGIES.register(
    "adaptive",
    "april_impl.adaptive:AdaptiveAprilStrategy",
    "APRIL whose N' grows or shrinks each step with the spread of the step's completion times",
)
STRATEGIES.register(
    "length-aware",
    "april_impl.length_aware:LengthAwareStrategy",
    "APRIL launching the longest buffered groups first; optionally aborts only the longest at N",
)
STRATEGIES.register(
    "consistent",
    "april_impl.consistent:ConsistentStrategy",
    "DORA: APRIL whose partials finish on the policy version that began them (engines hold old versions)",
)
STRATEGIES.register(
    "sagc",
    "april_impl.sagc:StragglerAwareGroupStrategy",
    "SAGC: APRIL whose samples per prompt adapt each step to keep the straggler rate under a bound",
)
STRATEGIES.register(
    "response-oversample",
    "april_impl.response_oversample:ResponseOversampleStrategy",
    "RollPacker: APRIL whose groups launch more than n responses and keep the first n that finish",
)

_ARM = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:\[(.*)\])?\s*$")


@dataclass(frozen=True, slots=True)
class ArmSpec:
    """One arm of a comparison: its label, its strategy's registry name, and options."""

    label: str
    strategy: str
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The driver's options from the brackets (empty: the synchronous driver).
    driver_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def driver(self) -> DriverConfig:
        return config_from(DriverConfig, self.driver_options, where=f"driver option (arm {self.label!r})")

    @classmethod
    def parse(cls, text: str) -> ArmSpec:
        match = _ARM.match(text)
        if match is None:
            raise ConfigError(
                f"cannot read arm {text!r}: write NAME or NAME[key=value,...], e.g. april[max_version_span=2]"
            )
        name, inner = match.group(1), match.group(2)
        if name not in STRATEGIES:
            STRATEGIES.get(name)  # raises with did-you-mean
        options: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in (inner or "").split(","))):
            key, sep, raw = part.partition("=")
            if not sep:
                raise ConfigError(f"arm {text!r}: expected key=value inside the brackets, got {part!r}")
            try:
                options[key.strip().replace("-", "_")] = json.loads(raw)
            except json.JSONDecodeError:
                options[key.strip().replace("-", "_")] = raw.strip()
        driver = {k: v for k, v in options.items() if k in DRIVER_OPTIONS}
        spec = cls(
            label=text.strip(),
            strategy=name,
            options={k: v for k, v in options.items() if k not in DRIVER_OPTIONS},
            driver_options=driver,
        )
        spec.driver  # noqa: B018 - a bad driver option fails here, where the arm is read
        return spec


def strategy_options(name: str) -> dict[str, str]:
    """Option name -> help text of a strategy (imports the strategy's module)."""
    cls: Any = STRATEGIES.get(name)
    return dict(cls.Config.field_help())


def build_strategy(
    arm: ArmSpec | str, defaults: Mapping[str, Mapping[str, Any]] | None = None
) -> RolloutStrategy:
    """Build an arm's strategy from ``defaults[strategy]`` (the run's ``strategy_args``) and the arm's
    own options; an option the strategy does not have is an error naming the ones it has."""
    spec = ArmSpec.parse(arm) if isinstance(arm, str) else arm
    cls: Any = STRATEGIES.get(spec.strategy)
    options = {**dict((defaults or {}).get(spec.strategy, {})), **dict(spec.options)}
    return config_from(
        cls.Config, options, where=f"option of strategy {spec.strategy!r} (arm {spec.label!r})"
    ).build()
