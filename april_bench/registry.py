"""A small lazy registry: names map to ``"module:Attr"`` placeholders, or to :class:`Spec` entries
whose ``factory`` and ``checker`` are such strings (engines, trainers).

Importing :mod:`april_bench` never imports an engine SDK: a registered engine
is only imported when somebody asks for it by name.  Unknown names raise an
:class:`UnknownNameError` (a ``ConfigError`` and a ``KeyError``) that suggests the
closest registered names.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from april_bench.config import ConfigError

T = TypeVar("T")

__all__ = ["Registry", "Spec", "UnknownNameError", "load"]


def load(target: str) -> Any:
    """``"module:Attr"`` -> the object (the module imported now): the one lazy loader."""
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


@dataclass(frozen=True, slots=True)
class Spec:
    """A registered component that builds from ``(settings, args)`` without being imported until then.

    Subclasses (:class:`april_bench.engines.EngineSpec`, :class:`april_bench.trainers.registry.TrainerSpec`)
    add what the component is, so it can be checked before it is imported.
    """

    name: str
    #: ``"module:function"``: ``function(settings, args) -> component``.
    factory: str
    #: ``"module:function"`` that checks ``(settings, args)`` without building (loading weights,
    #: starting servers); ``None``: building is cheap, so :meth:`check` builds.
    checker: str | None = field(default=None, kw_only=True)
    #: The registered entries a composite builds from (a Ray pool's replica engine, the Ray actor's
    #: trainers), handed to ``factory`` and ``checker`` as ``parts=``: the registry that names the
    #: composite gives it its parts, so the composite never looks that registry up (an import circle).
    parts: tuple[Spec, ...] = field(default=(), kw_only=True)

    def load(self, target: str) -> Any:
        """``factory`` or ``checker`` loaded, with :attr:`parts` bound when there are any."""
        function = load(target)
        return functools.partial(function, parts=self.parts) if self.parts else function

    def build(self, settings: Any, args: Any) -> Any:
        return self.load(self.factory)(settings, args)

    def check(self, settings: Any, args: Any) -> None:
        """Raise ``ConfigError`` for anything :meth:`build` would reject, without the heavy work."""
        if self.checker is None:
            self.build(settings, args)
        else:
            self.load(self.checker)(settings, args)


class UnknownNameError(ConfigError, KeyError):
    """A name no registry entry has; the message lists the close and the available names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Name -> object, materialised from a ``"module:Attr"`` string on first use."""

    def __init__(self, kind: str, base_cls: type | None = None) -> None:
        self.kind = kind
        self._base_cls = base_cls
        self._entries: dict[str, str | T] = {}
        self._descriptions: dict[str, str] = {}

    def register(self, name: str, target: str | T, description: str = "") -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = target
        self._descriptions[name] = description

    def get(self, name: str) -> T:
        try:
            target = self._entries[name]
        except KeyError:
            raise UnknownNameError(self._unknown_message(name)) from None
        if isinstance(target, str):
            obj = load(target)
            if self._base_cls is not None and not (isinstance(obj, type) and issubclass(obj, self._base_cls)):
                raise TypeError(f"{self.kind} {name!r} -> {target} is not a {self._base_cls.__name__}")
            self._entries[name] = obj
            target = obj
        return target

    def describe(self, name: str) -> str:
        return self._descriptions.get(name, "")

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def _unknown_message(self, name: str) -> str:
        folded = [key for key in self._entries if key.lower() == name.lower()]  # APRIL -> april
        close = folded or difflib.get_close_matches(name, self._entries, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Available: {', '.join(self._entries)}"
