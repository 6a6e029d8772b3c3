"""The driver's options, as an arm carries them (the driver itself: :mod:`april_bench.rollout.driver`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from april_bench.config import BaseConfig, ConfigError, param

__all__ = ["DRIVER_OPTIONS", "DriverConfig", "DriverMode", "WeightUpdateMode"]


class DriverMode(enum.StrEnum):
    SYNC = "sync"
    ONE_STEP_OFF = "one-step-off"
    STALE = "stale"
    LOOKAHEAD = "lookahead"


class WeightUpdateMode(enum.StrEnum):
    INFLIGHT = "inflight"
    DRAIN = "drain"


@dataclass(kw_only=True, slots=True, frozen=True)
class DriverConfig(BaseConfig):
    driver: DriverMode = param(
        DriverMode.SYNC,
        help="sync, one-step-off (verl), stale (AReaL, bounded by max_staleness) or lookahead (Tinker, "
        "prime-rl: at most steps_ahead steps ahead, nothing restarted)",
    )
    max_staleness: int = param(1, help="stale: most policy versions a trained token may lag (AReaL's eta)")
    steps_ahead: int = param(
        1,
        help="lookahead: rollout steps the sampler may run ahead of training (Tinker's sampling_steps_ahead, "
        "prime-rl's max_async_level); no sample is restarted for its age",
    )
    weight_update: WeightUpdateMode | None = param(
        None,
        help="stale, lookahead: inflight (pause, install, continue) or drain (wait for the rollout step in "
        "flight); "
        "default: inflight for strategies that resume partials, drain otherwise",
    )
    train_gpus: int | None = param(
        None, help="simulator, async drivers: GPUs the trainer takes from the node (default: a quarter)"
    )

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "driver", DriverMode(self.driver))
        except ValueError:
            raise ConfigError(
                f"driver must be one of {', '.join(m.value for m in DriverMode)}, got {self.driver!r}"
            ) from None
        if self.weight_update is not None:
            try:
                object.__setattr__(self, "weight_update", WeightUpdateMode(self.weight_update))
            except ValueError:
                raise ConfigError(
                    f"weight_update must be inflight or drain, got {self.weight_update!r}"
                ) from None
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.steps_ahead < 1:
            raise ConfigError(f"steps_ahead must be >= 1, got {self.steps_ahead}")
        if self.train_gpus is not None and self.train_gpus < 1:
            raise ConfigError(f"train_gpus must be >= 1, got {self.train_gpus}")
        if not self.free_running and self.weight_update is not None:
            raise ConfigError(
                "weight_update applies to driver=stale or lookahead only (one-step-off never updates in "
                "flight)"
            )

    @property
    def asynchronous(self) -> bool:
        return self.driver is not DriverMode.SYNC

    @property
    def free_running(self) -> bool:
        """A generator running rollout steps back to back under a bound (``stale``, ``lookahead``)."""
        return self.driver in (DriverMode.STALE, DriverMode.LOOKAHEAD)

    def update_mode(self, partial_rollout: bool) -> WeightUpdateMode:
        if not self.free_running:
            return WeightUpdateMode.DRAIN
        if self.weight_update is not None:
            return self.weight_update
        return WeightUpdateMode.INFLIGHT if partial_rollout else WeightUpdateMode.DRAIN

    def oldest_allowed(self, step: int) -> int | None:
        """The oldest policy version a token launched for ``step`` may carry (``None``: unbounded).
        ``stale`` bounds it by eta; ``one-step-off`` bounds only its own lag (one version), and a
        strategy's resumed partials keep their age unless the strategy caps it (max_version_span);
        ``lookahead`` bounds how far the sampler runs ahead, never a token's age."""
        return step - self.max_staleness if self.driver is DriverMode.STALE else None

    @property
    def lookahead(self) -> int:
        """Rollout steps that may run ahead of training."""
        if self.driver is DriverMode.ONE_STEP_OFF:
            return 1
        return self.steps_ahead if self.driver is DriverMode.LOOKAHEAD else self.max_staleness


#: Arm options that configure the driver, not the strategy.
DRIVER_OPTIONS = frozenset(DriverConfig.field_help())
