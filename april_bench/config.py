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
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

__all__ = [
    "BaseConfig",
    "ConfigError",
    "Configurable",
    "coerce_options",
    "config_from",
    "param",
    "to_jsonable",
]

C = TypeVar("C", bound="BaseConfig")


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


def config_from(
    cls: type[C], options: Mapping[str, Any], *, where: str, owner: str = "", fixed: tuple[str, ...] = ()
) -> C:
    """``cls(**options)`` for options a user typed: unknown names and values of the wrong type are
    a :class:`ConfigError` that names the option (``where``, e.g. ``--engine-arg``, of ``owner``, e.g.
    "the simulator") and the fix; ``fixed`` fields are set by other flags and not listed as known.

    Values are checked against the field annotations and converted where the conversion is
    lossless (``"3"`` to 3 for an int, 3 to 3.0 for a float, a list to a tuple, a string to a Path).
    """
    converted = coerce_options(cls, options, where=where, owner=owner, fixed=fixed)
    try:
        return cls(**converted)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def coerce_options(
    cls: type[BaseConfig],
    options: Mapping[str, Any],
    *,
    where: str,
    owner: str = "",
    fixed: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``options`` checked against ``cls``'s fields and converted to their types, without building
    ``cls`` (its other fields may be decided later): :func:`config_from`'s errors, naming ``where``."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        known = ", ".join(sorted(set(fields) - set(fixed))) or "none"
        of = f" for {owner}" if owner else ""
        raise ConfigError(f"unknown {where} {', '.join(unknown)}{of}; known: {known}")
    hints = typing.get_type_hints(cls)
    converted = {}
    for name, value in options.items():
        try:
            converted[name] = _coerce(value, hints[name])
        except (TypeError, ValueError, OverflowError):
            what = f"{_type_name(hints[name])} ({fields[name].metadata.get('help', '')})"
            if _non_finite(value) and what.startswith(("a number", "an integer")):
                what = "a finite " + what.removeprefix("a ").removeprefix("an ")
            raise ConfigError(f"{where} {name}={_short_repr(value)}: expected {what}") from None
    return converted


def _coerce(value: Any, hint: Any) -> Any:
    """``value`` as an instance of ``hint``, or TypeError/ValueError."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, BaseConfig):
        if isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(value)
        return config_from(hint, value, where=hint.__name__)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option)
            except (TypeError, ValueError):
                continue
        raise TypeError(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0]) for v in value)
        if len(args) != len(value):
            raise ValueError(value)
        return tuple(_coerce(v, a) for v, a in zip(value, args, strict=True))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise TypeError(value)
        return dict(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise TypeError(value)
    if hint is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise TypeError(value)  # NaN and infinities are not integers either
        return int(value) if isinstance(value, (int, float, str)) else _fail(value)
    if hint is float:
        if isinstance(value, bool):
            raise TypeError(value)
        number = float(value) if isinstance(value, (int, float, str)) else _fail(value)
        if not math.isfinite(number):
            raise ValueError(value)  # NaN and infinities fail closed: no setting means them
        return number
    if hint is str:
        return value if isinstance(value, str) else _fail(value)
    if hint is Path:
        return Path(value) if isinstance(value, (str, Path)) else _fail(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    return value


def _non_finite(value: Any) -> bool:
    """``NaN``, ``inf``, ``1e999`` (as a number or as the text a user typed)."""
    try:
        return isinstance(value, float | str) and not math.isfinite(float(value))
    except (ValueError, OverflowError):
        return False


def _short_repr(value: Any) -> str:
    """``repr(value)`` bounded in depth and length: a value read from a hostile file may be huge."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, 60, 60
    return short.repr(value)


def _fail(value: Any) -> Any:
    raise TypeError(value)


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in typing.get_args(hint) if a is not type(None)]
        optional = type(None) in typing.get_args(hint)
        return " or ".join(names) + (" (or null)" if optional else "")
    if origin is tuple:
        return "a list"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in hint)
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string", Path: "a path"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )
