from __future__ import annotations

import dataclasses

import pytest

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.registry import Registry
from april_bench.rollout.loop import RolloutConfig
from april_bench.strategies import STRATEGIES, build_strategy


def test_configurable_requires_slotted_frozen_kw_only_config() -> None:
    with pytest.raises(TypeError, match="slots=True"):

        class Bad(Configurable):
            @dataclasses.dataclass(kw_only=True, frozen=True)  # not slotted
            class Config(BaseConfig):  # type: ignore[misc]
                x: int = 1


def test_build_rejects_values_that_belong_in_the_config() -> None:
    class Thing(Configurable):
        @dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
        class Config(BaseConfig):
            size: int = param(1, help="size")

        def __init__(self, config: Config, **runtime: object) -> None:
            self.config = config

    assert Thing.Config(size=3).build().config.size == 3
    with pytest.raises(TypeError, match="Put these values in the Config"):
        Thing.Config().build(size=4)
    assert Thing.Config.field_help() == {"size": "size"}


def test_over_sampling_below_batch_names_the_fix() -> None:
    with pytest.raises(ConfigError, match="must be >= --rollout-batch-size"):
        RolloutConfig(rollout_batch_size=32, over_sampling_batch_size=16)


def test_refill_accepts_strings_and_rejects_typos() -> None:
    assert RolloutConfig(refill="granular").refill.value == "granular"  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--refill must be one of"):
        RolloutConfig(refill="wavy")  # type: ignore[arg-type]


def test_registry_suggests_close_names() -> None:
    registry: Registry[int] = Registry("thing")
    registry.register("april", 1)
    with pytest.raises(KeyError, match="Did you mean: april"):
        registry.get("aprill")


def test_build_strategy_passes_shared_options_only_where_they_apply() -> None:
    assert set(STRATEGIES.names()) == {"sync", "oversample-discard", "april"}
    sync = build_strategy("sync", over_sampling_batch_size=64, max_version_span=2)
    april = build_strategy("april", over_sampling_batch_size=48, max_version_span=2)
    assert sync.name == "sync"
    assert april.config.over_sampling_batch_size == 48 and april.config.max_version_span == 2
