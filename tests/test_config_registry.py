from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.registry import Registry, Spec
from april_bench.rollout.loop import RolloutConfig
from april_bench.strategies import STRATEGIES, ArmSpec, build_strategy


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


def _composite(settings: object, args: object, *, parts: tuple[Spec, ...]) -> tuple[object, ...]:
    return (settings, args, parts)


def test_a_composite_spec_gets_its_parts_from_the_registry() -> None:
    """A composite (the Ray pools) is handed the specs it builds from, so it never looks up the
    registry that names it (an import circle, tests/test_layers.py)."""
    from april_bench.engines import ENGINES
    from april_bench.trainers.registry import TRAINERS

    assert ENGINES.get("ray").parts == tuple(ENGINES.get(n) for n in ("hf", "vllm", "sglang", "sglang-fake"))
    assert ENGINES.get("ray-fake").parts == (ENGINES.get("fake"),)
    assert [p.name for p in TRAINERS.get("ray").parts] == ["torch", "fsdp", "megatron"]
    inner = Spec("inner", f"{__name__}:_composite")
    spec = Spec("outer", f"{__name__}:_composite", parts=(inner,))
    assert spec.build("s", "a") == ("s", "a", (inner,))


def test_build_strategy_takes_run_options_then_the_arms_own() -> None:
    assert set(STRATEGIES.names()) == {
        "sync",
        "oversample-discard",
        "april",
        "tail-batching",
        "segment",
        "adaptive",
        "length-aware",
        "consistent",
        "sagc",
        "response-oversample",
    }
    defaults = {"april": {"max_version_span": 2}}
    sync = build_strategy("sync", defaults)
    april = build_strategy("april[over_sampling_batch_size=48]", defaults)
    assert sync.name == "sync"
    assert april.config.over_sampling_batch_size == 48 and april.config.max_version_span == 2
    assert build_strategy("april[max_version_span=5]", defaults).config.max_version_span == 5


def test_an_option_a_strategy_lacks_is_an_error_that_lists_its_options() -> None:
    with pytest.raises(ConfigError, match=r"strategy 'sync'.*max_version_span; known: none"):
        build_strategy("sync[max_version_span=2]")
    with pytest.raises(ConfigError, match="max_version_span='x': expected an integer"):
        build_strategy("april[max_version_span=x]")


def test_arm_labels_keep_the_text_and_parse_typed_options() -> None:
    arm = ArmSpec.parse("april[max_version_span=2,over_sampling_batch_size=48]")
    assert arm.label == "april[max_version_span=2,over_sampling_batch_size=48]"
    assert arm.strategy == "april" and dict(arm.options) == {
        "max_version_span": 2,
        "over_sampling_batch_size": 48,
    }
    with pytest.raises(ConfigError, match="Did you mean: april"):
        ArmSpec.parse("aprill")


def test_a_pool_spec_groups_flat_options_into_its_sections_and_passes_the_rest_on() -> None:
    """A pool's entry parses its own options, a nested section's fields given flat (or the section
    whole, as a file gives it) and hands every other option to its replicas' engine; a preset sits
    between what the run decides and what the user says."""
    from april_bench.engines import ENGINES, EngineSettings

    settings = EngineSettings(model="tiny", hardware="cpu", max_context_len=64)
    pool = ENGINES.get("fake-pool")
    config = pool.configure(
        settings,
        {"replicas": "3", "max_restarts": "1", "tick_s": 0.5, "engine_args": {"tick_s": 0.1, "x": 1}},
    )
    assert config.replicas == 3 and config.faults.max_restarts == 1
    assert config.engine_args == {"tick_s": 0.5, "x": 1}  # a flat option wins over the mapping's
    whole = pool.configure(settings, {"faults": {"max_restarts": 2}, "chaos_seed": 4})
    assert (whole.faults.max_restarts, whole.faults.chaos_seed, whole.engine_args) == (2, 4, {})
    with pytest.raises(ConfigError, match="--engine-arg max_restarts='x': expected an integer"):
        pool.configure(settings, {"max_restarts": "x"})
    with pytest.raises(ConfigError, match="unknown --engine-arg"):
        ENGINES.get("fake-pool").check(settings, {"no_such_option": 1})
    ray_fake = ENGINES.get("ray-fake")
    assert ray_fake.configure(settings, {}).engine == "fake"
    assert ray_fake.configure(settings, {"engine": "hf"}).engine == "hf"  # refused by the check, not here
    # what an experiment stores: the options flat and typed, as given (a section's defaults not added)
    given = {"replicas": "3", "faults": {"max_restarts": "2"}, "engine_args": {"x": 1}}
    assert pool.parse_options(given) == {"replicas": 3, "max_restarts": 2, "x": 1}
    with pytest.raises(ConfigError, match="faults: expected a mapping"):
        pool.parse_options({"faults": 3})


def test_the_fake_sglang_entry_gives_a_name_both_have_to_its_server() -> None:
    """``sglang-fake``'s options are the adapter's and, flat beside them, its fake server's; a name
    both Configs have goes to the server, as the adapter would pass it to a real one at launch."""
    from april_bench.engines import ENGINES, EngineSettings

    settings = EngineSettings(model="tiny", hardware="cpu", max_context_len=64, seed=3, eos_token_ids=(2,))
    config: Any = ENGINES.get("sglang-fake").configure(
        settings, {"decode_step_s": 0.01, "max_running_requests": "5", "control_timeout_s": 3}
    )
    assert (config.server.decode_step_s, config.server.max_running_requests) == (0.01, 5)
    assert (config.max_running_requests, config.control_timeout_s, config.seed) == (None, 3.0, 3)
    help_text = ENGINES.get("sglang-fake").option_help()
    assert "decode_step_s" in help_text and "server" not in help_text
