"""Hand-written fakes of vendor modules (``pynvml``, ``amdsmi``, ``torch.cuda``), faithful to the
names, return shapes and units of the real packages (nvidia-ml-py 13.615, amdsmi 7.0.2), so the
telemetry code runs on CPU against exact, hand-chosen values."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType


def loader_for(modules: Mapping[str, ModuleType | BaseException]) -> Callable[[str], ModuleType]:
    """An ``import_module`` stand-in: returns the fake for a name, raises the given error, or ImportError."""

    def load(name: str) -> ModuleType:
        found = modules.get(name)
        if found is None:
            raise ModuleNotFoundError(f"No module named {name!r}")
        if isinstance(found, BaseException):
            raise found
        return found

    return load


class Script:
    """Values returned one per call; the last one repeats.  An exception instance is raised instead."""

    def __init__(self, *values: object) -> None:
        if not values:
            raise ValueError("a Script needs at least one value")
        self._values = list(values)
        self.calls = 0

    def next(self) -> object:
        value = self._values[min(self.calls, len(self._values) - 1)]
        self.calls += 1
        if isinstance(value, BaseException):
            raise value
        return value
