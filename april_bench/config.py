"""Typed configs that build their component.

Every swappable component (engine, strategy, trainer, length model) is a
:class:`Configurable` with a nested ``Config`` dataclass.  The config holds
every choice a user can make; ``Config.build(**runtime)`` constructs the owner
from the config plus the runtime objects it needs (an engine, a clock), and
nothing else.  Cross-field checks live in ``__post_init__`` and raise
:class:`ConfigError` with a message that names the fix.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["BaseConfig", "ConfigError", "Configurable", "param", "to_jsonable"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message says how to fix it."""


def param(default: Any = dataclasses.MISSING, *, help: str, **kwargs: Any) -> Any:
    """A config field with a one-line help text (shown by ``--help`` and ``ls``)."""
    metadata = {"help": help}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=metadata, **kwargs)
    if isinstance(default, (list, dict, set)):
        raise TypeError("use default_factory for mutable defaults")
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class BaseConfig:
    """Base of every component config.  Subclasses are kw-only, slotted and frozen."""

    _owner: ClassVar[type | None] = None

    def build(self, **runtime: Any) -> Any:
        """Construct the component this config belongs to."""
        owner = type(self)._owner
        if owner is None:
            raise TypeError(f"{type(self).__qualname__} is not attached to a Configurable class")
        overlap = sorted(set(runtime) & {f.name for f in dataclasses.fields(self)})
        if overlap:
            raise TypeError(f"Put these values in the Config, not in build() kwargs: {', '.join(overlap)}")
        return owner(self, **runtime)

    def replace(self, **changes: Any) -> Any:
        """A copy with some fields changed (validation runs again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field, recursively."""
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """Field name -> help text, for CLI help and ``april_bench ls``."""
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


class Configurable:
    """A component with a nested ``Config`` (a :class:`BaseConfig` subclass)."""

    Config: ClassVar[type[BaseConfig]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        config = cls.__dict__.get("Config")
        if config is None:
            raise TypeError(f"{cls.__name__} must define a nested Config(BaseConfig) dataclass")
        if not (isinstance(config, type) and issubclass(config, BaseConfig)):
            raise TypeError(f"{cls.__name__}.Config must subclass april_bench.config.BaseConfig")
        params = getattr(config, "__dataclass_params__", None)
        if params is None or not params.frozen or "__slots__" not in config.__dict__:
            raise TypeError(
                f"{cls.__name__}.Config must be declared with "
                "@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)"
            )
        config._owner = cls


def to_jsonable(value: Any) -> Any:
    """Convert configs, enums, paths and containers into plain JSON values."""
    if isinstance(value, BaseConfig):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value
