"""What every telemetry backend shares: the reading of one device, the reader contract,
loading a vendor module without its side effects, and which devices are visible.

A backend (:mod:`.nvml`, :mod:`.amd_smi`) turns a vendor library into a
:class:`DeviceReader`: a fixed list of devices and one :meth:`~DeviceReader.read`
per device per sample, in SI-ish units (bytes, W, J, MHz, %), with ``None`` for
each query that failed.  The sampler never sees a vendor exception.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar

from april_bench.config import ConfigError

ReaderT = TypeVar("ReaderT", bound="VendorReader")

__all__ = [
    "DeviceReader",
    "DeviceReading",
    "FieldErrors",
    "ModuleLoader",
    "TelemetryUnavailable",
    "Visible",
    "as_number",
    "check_requested",
    "import_quietly",
    "import_vendor",
    "parse_visible",
]

#: Imports a vendor module by name (``importlib.import_module``; tests pass fakes).
ModuleLoader = Callable[[str], ModuleType]

T = TypeVar("T")


class TelemetryUnavailable(RuntimeError):
    """A backend cannot sample on this machine; the message says why (one line)."""


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """One device's values at one instant, converted to the telemetry row's units."""

    util_gpu: float | None = None
    util_mem: float | None = None
    sm_clock_mhz: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    #: The driver's cumulative energy counter, in J, on the driver's own origin (not reset by us).
    energy_counter_j: float | None = None
    #: GPM (NVIDIA Hopper and newer, :mod:`.gpm`) over the interval since the previous reading: share of
    #: SMs busy, active warps over the maximum, DRAM bandwidth over the peak (%).  None elsewhere.
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    dram_bw_pct: float | None = None


class DeviceReader(Protocol):
    """An open vendor library sampling a fixed set of devices."""

    #: ``"nvml"`` or ``"amdsmi"``.
    backend: str
    #: ``(physical index, name)`` of every device sampled, in order.
    devices: Sequence[tuple[int, str]]
    #: Failed queries so far (the sampler reports them; they never raise).
    errors: FieldErrors

    def read(self, device: int) -> DeviceReading:
        """Query every field of ``device`` (a physical index); a failing field is ``None``.  Never raises."""
        ...

    def close(self) -> None:
        """Release the library (``nvmlShutdown`` / ``amdsmi_shut_down``).  Never raises."""
        ...


class VendorReader(abc.ABC):
    """What the NVML and AMD SMI readers share: the open library, the handles of the devices sampled
    and their names, the field errors, :meth:`open` (the library shut down again when picking the
    devices fails) and :meth:`close`.  A subclass says how its library starts (:meth:`_start`), which
    devices it samples (:meth:`_select`), what they are called (:meth:`_name`), how it shuts down
    (:meth:`shutdown`) and what a reading is (``read``)."""

    backend: str = ""

    def __init__(self, lib: ModuleType, handles: Mapping[int, Any], names: Mapping[int, str]) -> None:
        self._lib = lib
        self._handles = dict(handles)
        self.devices: Sequence[tuple[int, str]] = [(index, names[index]) for index in self._handles]
        self.errors = FieldErrors()

    @classmethod
    def open(
        cls: type[ReaderT],
        *,
        devices: Sequence[int] | None = None,
        env: Mapping[str, str] | None = None,
        loader: ModuleLoader | None = None,
    ) -> ReaderT:
        """Start the library and pick the devices: ``devices`` (physical indices) if given, else the
        ones the visibility variables list, else all.  Raises :class:`TelemetryUnavailable` (no
        library, driver or visible GPU) or :class:`ConfigError` (an explicit device that does not
        exist); the library is shut down again when picking fails."""
        lib, found = cls._start(loader)
        try:
            handles = cls._select(lib, found, devices, env or {})
            names = {index: cls._name(lib, handle, index) for index, handle in handles.items()}
        except BaseException:
            cls.shutdown(lib)
            raise
        return cls(lib, handles, names)

    @classmethod
    @abc.abstractmethod
    def _start(cls, loader: ModuleLoader | None) -> tuple[ModuleType, Any]:
        """The started library, and what it found at the start (passed on to :meth:`_select`)."""
        ...

    @classmethod
    @abc.abstractmethod
    def _select(
        cls, lib: ModuleType, found: Any, devices: Sequence[int] | None, env: Mapping[str, str]
    ) -> dict[int, Any]:
        """The handle of every device to sample, by physical index."""
        ...

    @staticmethod
    @abc.abstractmethod
    def _name(lib: ModuleType, handle: Any, index: int) -> str: ...

    @staticmethod
    @abc.abstractmethod
    def shutdown(lib: ModuleType) -> None:
        """Release ``lib``; never raises."""
        ...

    def close(self) -> None:
        self.shutdown(self._lib)


class FieldErrors:
    """Runs one query, turning a failure into ``None`` and remembering the first message per field.

    One failing query (``NVML_ERROR_NOT_SUPPORTED`` on a consumer card, a
    transient ``GPU_IS_LOST``) must cost that field of that row, never the sampler.
    """

    def __init__(self) -> None:
        self.first: dict[tuple[int, str], str] = {}
        self.count: dict[tuple[int, str], int] = {}

    def call(self, device: int, field: str, query: Callable[[], T]) -> T | None:
        try:
            return query()
        except Exception as exc:  # vendor errors, ctypes errors, a function missing from an old binding
            key = (device, field)
            self.first.setdefault(key, f"{type(exc).__name__}: {exc}")
            self.count[key] = self.count.get(key, 0) + 1
            return None

    def summary(self) -> list[str]:
        """One line per failing (device, field): how often, and the first error."""
        return [
            f"GPU {device} {field}: {self.count[(device, field)]} failed reads ({message})"
            for (device, field), message in sorted(self.first.items())
        ]


def import_quietly(name: str, loader: ModuleLoader | None = None) -> ModuleType:
    """Import a vendor module, swallowing what it prints (``amdsmi`` prints to stdout when
    ``libamd_smi.so`` is missing, then raises ``KeyError``).  Any failure becomes ``ImportError``."""
    load = loader or importlib.import_module
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return load(name)
    except Exception as exc:  # KeyError / OSError from amdsmi's library lookup, ImportError
        raise ImportError(f"{type(exc).__name__}: {exc}") from exc


def import_vendor(name: str, loader: ModuleLoader | None, install: str) -> ModuleType:
    """:func:`import_quietly`, with the one line :class:`TelemetryUnavailable` says when it fails
    (``name`` is not installed, or failed to import), naming ``install``."""
    try:
        return import_quietly(name, loader)
    except ImportError as exc:
        missing = isinstance(exc.__cause__, ModuleNotFoundError)
        why = "is not installed" if missing else f"failed to import ({exc})"
        raise TelemetryUnavailable(f"{name} {why}: {install}") from None


def check_requested(devices: Sequence[int], count: int) -> list[int]:
    """The ``--telemetry-devices`` asked for, each one of this machine's ``count`` GPUs."""
    missing = [d for d in devices if not 0 <= d < count]
    if missing:
        raise ConfigError(
            f"--telemetry-devices {','.join(map(str, missing))}: this machine has GPUs 0-{count - 1}"
        )
    return list(devices)


@dataclass(frozen=True, slots=True)
class Visible:
    """The devices a process may use, as an environment variable lists them."""

    #: Integer ordinals or UUID strings, in the order listed; ``None`` = the variable is unset (all devices).
    entries: tuple[int | str, ...] | None
    #: The variable the entries came from, for messages.
    source: str


def parse_visible(env: Mapping[str, str], names: Sequence[str]) -> Visible:
    """The first set variable of ``names`` (e.g. ``CUDA_VISIBLE_DEVICES``), parsed as the CUDA runtime does:
    comma-separated ordinals or ``GPU-``/``MIG-`` UUIDs, read up to the first invalid entry (so ``-1``
    or ``""`` hides every device)."""
    for name in names:
        raw = env.get(name)
        if raw is None:
            continue
        entries: list[int | str] = []
        for item in raw.split(","):
            item = item.strip()
            if item.isdigit():
                entries.append(int(item))
            elif item.startswith(("GPU-", "MIG-")):
                entries.append(item)
            else:
                break
        return Visible(entries=tuple(entries), source=f"{name}={raw!r}")
    return Visible(entries=None, source="all devices")


def as_number(value: Any) -> float | None:
    """A vendor value as a float: ``"N/A"`` strings and other non-numbers become ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
