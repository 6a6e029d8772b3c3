"""Reading a file a user (or anyone) handed us, bounded: size, line length, nesting depth, YAML aliases.

Every reader of a config file, a run file or a trace goes through these, so a hostile or damaged file
is one ``ConfigError`` line naming it, never a hang, an exhausted memory or a traceback: a 438-byte
YAML file of nested aliases expands to gigabytes when walked, ``/dev/zero`` has no end and no line
break, ``[[[[...]]]]`` overflows the parser's stack, ``NaN`` and ``1e999`` are not numbers a run can
use.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from april_bench.config import ConfigError

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_LINE_BYTES",
    "MAX_YAML_ALIASES",
    "check_values",
    "json_loads",
    "read_bytes",
    "read_line",
    "yaml_load",
]

#: A config file larger than this is not one a person wrote.
MAX_CONFIG_BYTES = 1 << 20
#: One JSON line of a trace or a run's table (a row is a few hundred bytes; a sample's text a few MB).
MAX_LINE_BYTES = 16 << 20
#: Nesting deeper than this is not a configuration, a row or a trace header.
MAX_DEPTH = 32
#: Anchors and aliases are rare in a config; this many is an expansion bomb.
MAX_YAML_ALIASES = 64


def read_bytes(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (``/dev/zero`` and a FIFO are
    refused, not read forever)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigError(f"{path}: the {what} cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: the {what} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{path}: the {what} is larger than {limit:,} bytes; not a file april-bench reads")
    return data


def read_line(f: IO[str], where: str) -> str:
    """The next line of ``f`` (``""`` at the end), refused when longer than :data:`MAX_LINE_BYTES`."""
    line = f.readline(MAX_LINE_BYTES + 1)
    if len(line) > MAX_LINE_BYTES:
        raise ConfigError(
            f"{where}: a line longer than {MAX_LINE_BYTES:,} characters; not a file april-bench reads"
        )
    return line


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number april-bench accepts (give a finite number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows to infinity (give a finite number)")
    return value


def json_loads(text: str, where: str) -> Any:
    """Strict JSON: ``NaN``, ``Infinity`` and numbers that overflow refused, nesting bounded; a bad
    text is one ``ConfigError`` naming ``where`` and the line."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}, line {exc.lineno}: not valid JSON ({exc.msg})") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    check_values(data, where)
    return data


def yaml_load(text: str, where: str) -> Any:
    """``yaml.safe_load`` with at most :data:`MAX_YAML_ALIASES` aliases and bounded nesting."""
    import yaml

    class Loader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                Loader.aliases += 1
                if Loader.aliases > MAX_YAML_ALIASES:
                    raise ConfigError(
                        f"{where}: more than {MAX_YAML_ALIASES} YAML aliases (an expansion bomb?); write the "
                        "values out"
                    )
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=Loader)
    except RecursionError:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None


def check_values(data: Any, where: str, *, string_keys: bool = False) -> None:
    """Refuse NaN and infinities, nesting deeper than :data:`MAX_DEPTH`, a mapping seen twice (a
    YAML alias of a container: walked, it multiplies) and, with ``string_keys``, keys that are not
    strings; each a ``ConfigError`` naming ``where`` and the field."""
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, name, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels (at {name or 'the top'})")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: {name or 'the value'} is {value}; give a finite number")
        if isinstance(value, Mapping | list | tuple):
            if id(value) in seen:
                raise ConfigError(f"{where}: {name or 'the value'} repeats a YAML alias of a table or list")
            seen.add(id(value))
        if isinstance(value, Mapping):
            for key, item in value.items():
                if string_keys and not isinstance(key, str):
                    raise ConfigError(
                        f"{where}: key {key!r} of {name or 'the top'} must be a string (quote it)"
                    )
                stack.append((item, f"{name}.{key}" if name else str(key), depth + 1))
        elif isinstance(value, list | tuple):
            stack.extend((item, f"{name}[{i}]", depth + 1) for i, item in enumerate(value))
