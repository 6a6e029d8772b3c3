"""A small lazy registry: names map to ``"module:Attr"`` placeholders, or to :class:`Spec` entries
whose ``factory`` and ``checker`` are such strings (engines, trainers).

Importing :mod:`april_bench` never imports an engine SDK: a registered engine
is only imported when somebody asks for it by name.  Unknown names raise an
:class:`UnknownNameError` (a ``ConfigError`` and a ``KeyError``) that suggests the
closest registered names.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from april_bench.config import BaseConfig, ConfigError, coerce_options, config_from

T = TypeVar("T")

__all__ = ["Registry", "Spec", "UnknownNameError", "load"]


def load(target: str) -> Any:
    """``"module:Attr"`` (or ``"module:Class.Attr"``) -> the object (the module imported now): the one lazy
    loader."""
    module_name, _, attr = target.partition(":")
    return functools.reduce(getattr, attr.split("."), importlib.import_module(module_name))


@dataclass(frozen=True, slots=True)
class Spec:
    """A registered component that builds from ``(settings, args)`` without being imported until then.

    With ``config`` (the component's typed ``Config``), the user's options are parsed once, generically,
    from that Config's fields: :meth:`parse_options` when the experiment config is built,
    :meth:`configure` with what the experiment decided (``settings``) when the component is built;
    ``factory(config, settings)`` then builds it (none: ``config.build()``) and ``checker(config,
    settings)`` checks what only the machine can say (a device, a package).  Without ``config`` (a
    composite whose options nest another entry's), ``factory(settings, args)`` and ``checker(settings,
    args)`` parse them.

    Subclasses (:class:`april_bench.engines.EngineSpec`, :class:`april_bench.trainers.registry.TrainerSpec`)
    add what the component is, so it can be checked before it is imported.
    """

    name: str
    #: ``"module:function"``: builds the component (above); ``None`` with ``config``: ``config.build()``.
    factory: str | None
    #: ``"module:function"`` that checks without building (loading weights, starting servers); ``None``:
    #: with ``config``, parsing is the check; without, building is cheap, so :meth:`check` builds.
    checker: str | None = field(default=None, kw_only=True)
    #: The registered entries a composite builds from (a Ray pool's replica engine, the Ray actor's
    #: trainers), handed to ``factory`` and ``checker`` as ``parts=``: the registry that names the
    #: composite gives it its parts, so the composite never looks that registry up (an import circle).
    parts: tuple[Spec, ...] = field(default=(), kw_only=True)
    #: ``"module:Class.Config"``: the component's typed Config, whose fields are its options.
    config: str | None = field(default=None, kw_only=True)
    #: ``(Config field, settings attribute)``: what the experiment decides for it (context length,
    #: stop tokens, seed ...); an option of the same name overrides it.
    decided: tuple[tuple[str, str], ...] = field(default=(), kw_only=True)
    #: ``(Config field, flag)``: fields only another flag sets (``--hw``); refused as options.
    fixed: tuple[tuple[str, str], ...] = field(default=(), kw_only=True)
    #: ``(Config field, value)``: what this entry gives a field unless an option does (the fake Ray
    #: pool's replicas run the fake engine); between what the run decides and the options.
    presets: tuple[tuple[str, Any], ...] = field(default=(), kw_only=True)
    #: The Config's mapping field that takes every option not among its own fields (a pool's replicas'
    #: engine options, checked by that engine's entry); ``None``: such an option is an error.
    rest: str | None = field(default=None, kw_only=True)
    #: ``(option, "module:Class.Config")``: another Config the entry builds when that option is given
    #: and true (vLLM's ``url`` or ``server``: its OpenAI-server adapter); the first given wins.  An
    #: option that is not a field of that Config only chooses it.
    variants: tuple[tuple[str, str], ...] = field(default=(), kw_only=True)
    #: What errors call it ("the simulator"); default "the NAME KIND".
    owner: str = field(default="", kw_only=True)
    #: ``"module:Class.Config"`` targets whose fields a composite (no ``config``) takes as options, in
    #: the order ``ls`` lists them (a pool's own, its fault options; an adapter's two variants).
    option_configs: tuple[str, ...] = field(default=(), kw_only=True)
    #: A line ``ls`` prints under the options (where the rest of a composite's options go).
    options_note: str = field(default="", kw_only=True)

    #: The flag its options come from (``--engine-arg``), named by errors.
    option_flag: ClassVar[str] = "--option"
    kind: ClassVar[str] = "component"

    def load(self, target: str) -> Any:
        """``factory`` or ``checker`` loaded, with :attr:`parts` bound when there are any."""
        function = load(target)
        return functools.partial(function, parts=self.parts) if self.parts else function

    def parse_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The user's options checked against the Config's fields and converted to their types, before
        anything is decided or built: unknown names, wrong types and fixed fields are a ``ConfigError``
        naming the flag.  Unchanged without ``config``."""
        if self.config is None:
            return dict(options)
        fixed = {name: flag for name, flag in self.fixed if name in options}
        if fixed:
            raise ConfigError(
                f"{self.option_flag} {', '.join(fixed)} is set by {', '.join(dict(self.fixed).values())}"
            )
        config, chooser = self._variant(options)
        where, owner = self.option_flag, self._owner()
        own, nested, rest = self._split(config, self._without_switches(config, options))
        parsed = coerce_options(config, own, where=where, owner=owner, fixed=self._fixed())
        sections = _sections(config)
        for section, values in nested.items():
            parsed.update(coerce_options(sections[section], values, where=where, owner=owner))
        return {**parsed, **rest, **({chooser: True} if chooser else {})}

    def _without_switches(self, config: type[BaseConfig], options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` less the :attr:`variants` options that only choose a Config (not its fields)."""
        switches = {option for option, _ in self.variants} - _field_names(config)
        return {name: value for name, value in options.items() if name not in switches}

    def _variant(self, options: Mapping[str, Any]) -> tuple[type[BaseConfig], str | None]:
        """The Config the options choose (:attr:`variants`), and the option that chose it when that
        option only chooses (not one of its fields)."""
        assert self.config is not None
        for option, target in self.variants:
            if _true(options.get(option)):
                config = load(target)
                return config, None if option in _field_names(config) else option
        return load(self.config), None

    def _split(
        self, config: type[BaseConfig], options: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
        """Flat options as (the Config's own, each nested Config's fields (a pool's ``faults``, given
        flat or whole), the rest): with :attr:`rest`, every other name (and that field's own mapping)
        is for the component's parts; without, an unknown name stays in the first, for its error."""
        sections = _sections(config)
        section_of = {name: section for section, kind in sections.items() for name in _field_names(kind)}
        own: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        rest: dict[str, Any] = {}
        for name, value in options.items():
            if name in sections:  # a section given whole (a config file, a Python caller)
                whole = value.to_dict() if isinstance(value, BaseConfig) else value
                if not isinstance(whole, Mapping):
                    raise ConfigError(f"{self.option_flag} {name}: expected a mapping of its options")
                nested[name] = {**whole, **nested.get(name, {})}
            elif name in section_of:
                nested.setdefault(section_of[name], {})[name] = value
            elif self.rest is not None and name == self.rest:
                rest = {**dict(value), **rest}
            elif self.rest is not None and name not in _field_names(config):
                rest[name] = value
            else:
                own[name] = value
        return own, nested, rest

    def configure(self, settings: Any, options: Mapping[str, Any]) -> BaseConfig:
        """The component's Config: what the experiment decided (``settings``), the options on top."""
        if self.config is None:
            raise TypeError(f"{self.kind} {self.name!r} names no Config")
        config, _ = self._variant(options)
        own, nested, rest = self._split(config, self._without_switches(config, self.parse_options(options)))
        decided = {name: getattr(settings, attr) for name, attr in (*self.decided, *self.fixed_from())}
        values = {**decided, **dict(self.presets), **own}
        sections = _sections(config)
        for section, given in nested.items():
            values[section] = config_from(
                sections[section], given, where=self.option_flag, owner=self._owner()
            )
        if self.rest is not None:
            values[self.rest] = rest
        return config_from(
            config,
            values,
            where=self.option_flag,
            owner=self._owner(),
            fixed=self._fixed(),
        )

    def option_help(self) -> dict[str, str]:
        """Option name -> its help, read from the Config fields it parses (``ls engines`` prints them):
        fields another flag sets are left out, what the run decides says so, a nested Config (a
        pool's ``faults``) is listed through its own entry in :attr:`option_configs`.  Imports the
        component's module, not its engine package."""
        targets = (self.config, *self.option_configs) if self.config is not None else self.option_configs
        decided, presets = dict(self.decided), dict(self.presets)
        fixed = set(self._fixed())
        options: dict[str, str] = {}
        for target in targets:
            config = load(target)
            # a name a section also has is the section's (given flat, it goes there): listed with it
            taken = {name for kind in _sections(config).values() for name in _field_names(kind)}
            for item in dataclasses.fields(config):
                if item.name in fixed or item.name in options or item.name in taken or _is_section(item):
                    continue
                text = item.metadata.get("help", "")
                if item.name in decided:
                    text += f"; unless given, the run's {decided[item.name]}"
                if item.name in presets:
                    text += f"; here {presets[item.name]}"
                options[item.name] = text
        return options

    def fixed_from(self) -> tuple[tuple[str, str], ...]:
        """``(Config field, settings attribute)`` of the fixed fields: the same names."""
        return tuple((name, name) for name, _ in self.fixed)

    def build(self, settings: Any, args: Any) -> Any:
        if self.config is None:
            return self.load(self._factory())(settings, args)
        config = self.configure(settings, args)
        return config.build() if self.factory is None else self.load(self.factory)(config, settings)

    def check(self, settings: Any, args: Any) -> None:
        """Raise ``ConfigError`` for anything :meth:`build` would reject, without the heavy work."""
        if self.config is not None:
            config = self.configure(settings, args)
            if self.checker is not None:
                self.load(self.checker)(config, settings)
        elif self.checker is None:
            self.build(settings, args)
        else:
            self.load(self.checker)(settings, args)

    def _factory(self) -> str:
        if self.factory is None:
            raise TypeError(f"{self.kind} {self.name!r} has neither a factory nor a Config")
        return self.factory

    def _owner(self) -> str:
        return self.owner or f"the {self.name} {self.kind}"

    def _fixed(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.fixed)


def _field_names(config: type[BaseConfig]) -> set[str]:
    return {item.name for item in dataclasses.fields(config)}


def _true(value: Any) -> bool:
    """An option's value read as a switch (``server=true`` on the command line is a bool already; a
    file may say ``"false"``)."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "0", "no")
    return bool(value)


def _sections(config: type[BaseConfig]) -> dict[str, type[BaseConfig]]:
    """Field name -> Config class of the fields holding a nested Config (a pool's ``faults``)."""
    sections = {}
    for item in dataclasses.fields(config):
        if _is_section(item):
            assert item.default_factory is not dataclasses.MISSING
            sections[item.name] = type(item.default_factory())
    return sections


def _is_section(item: dataclasses.Field[Any]) -> bool:
    """A field holding a nested Config (a pool's ``faults``), whose fields are given flat and listed
    through that Config."""
    if item.default_factory is dataclasses.MISSING:
        return False
    return isinstance(item.default_factory(), BaseConfig)


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
