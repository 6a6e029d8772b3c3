"""The GPU sampler: a background thread that writes one :class:`TelemetryRecord` per device
per tick into a sink, on the harness's clock.

Contract with the harness:

* **One clock.**  Rows are stamped with ``clock()``; the harness must pass the
  function it stamps its event rows with (in the driver: ``loop.time() - run_origin``;
  ``loop.time()`` of a real asyncio loop is ``time.monotonic()``, so it is safe to
  call from the sampler's thread).  The tick schedule runs on ``timer``
  (monotonic), independent of ``clock``.
* **One sampler per run**, not per arm: sessions interleave on the same GPUs, and
  rows are attributed to arms by the event windows that contain them.
* **No drift.**  Tick ``k`` is due at ``origin + k / rate_hz``; a slow read never
  shifts later ticks, and ticks missed while a read overran are skipped, not
  bunched.
* **Exact energy.**  ``energy_j`` is the driver's energy counter minus its first
  reading, so energy over any interval is a difference of counters, not an
  integral of sampled power.
* **Never fatal.**  A failing query is ``None`` in its field (see
  :meth:`field_errors`); a machine without a backend gives a sampler that records
  nothing and says why in :attr:`reason`.  Only an explicitly requested backend
  that cannot start raises :class:`ConfigError` (at :meth:`start`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.telemetry.devices import DeviceReader, FieldErrors, ModuleLoader, TelemetryUnavailable
from april_bench.telemetry.records import TelemetryRecord, TelemetrySink

__all__ = ["BACKENDS", "TelemetryConfig", "TelemetrySampler", "check_backend", "next_tick", "open_reader"]

#: ``--telemetry`` choices.
BACKENDS = ("auto", "nvml", "amdsmi", "off")
#: NVML refreshes utilisation every 1/6 s to 1 s; faster sampling only repeats values and costs CPU.
MAX_RATE_HZ = 100.0


class TelemetrySampler(Configurable):
    """Samples GPU utilisation, clocks, memory, power and energy in a thread (see the module docstring)."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        backend: str = param(
            "auto", help="GPU telemetry: auto (NVML, else AMD SMI, else none), nvml, amdsmi, off"
        )
        rate_hz: float = param(10.0, help="GPU samples per second (per device)")
        devices: tuple[int, ...] | None = param(
            None,
            help="physical GPU indices to sample (default: those CUDA/HIP_VISIBLE_DEVICES list, else all)",
        )

        def __post_init__(self) -> None:
            if self.backend not in BACKENDS:
                raise ConfigError(f"--telemetry must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
            if not 0 < self.rate_hz <= MAX_RATE_HZ:
                raise ConfigError(
                    f"--telemetry-rate must be in (0, {MAX_RATE_HZ:g}] Hz, got {self.rate_hz:g}"
                )
            devices = self.devices
            if devices is not None and (any(d < 0 for d in devices) or len(set(devices)) != len(devices)):
                raise ConfigError(f"--telemetry-devices must list distinct indices >= 0, got {list(devices)}")

    def __init__(
        self,
        config: Config,
        *,
        sink: TelemetrySink[TelemetryRecord],
        clock: Callable[[], float] = time.monotonic,
        env: Mapping[str, str] | None = None,
        loader: ModuleLoader | None = None,
        timer: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        """``env`` (default ``os.environ``) and ``loader`` (default ``importlib.import_module``) choose the
        devices and the vendor module; ``timer`` and ``wait`` (default: a stop event's ``wait``) drive the
        tick schedule.  Tests replace them; the harness passes ``sink`` and ``clock`` only."""
        self.config = config
        self._sink = sink
        self._clock = clock
        self._env = os.environ if env is None else env
        self._loader = loader
        self._timer = timer
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one sample at a time (the thread, or a caller of sample_once)
        self._wait = wait or self._stop.wait
        self._reader: DeviceReader | None = None
        self._thread: threading.Thread | None = None
        self._state = "new"  # new -> running -> stopped
        self._failure: BaseException | None = None
        self._last_counter: dict[int, float] = {}
        self._energy: dict[int, float] = {}
        self._errors: FieldErrors | None = None
        #: One line: what is sampled, or why nothing is.
        self.reason = "not started"
        #: The backend that sampled (``"nvml"``, ``"amdsmi"``), ``None`` if none could.
        self.backend: str | None = None
        #: ``(physical index, name)`` of the devices sampled.
        self.devices: list[tuple[int, str]] = []
        #: Ticks taken so far (each writes one row per device).
        self.samples = 0

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> TelemetrySampler:
        """Open the backend, take the first sample now, and start the thread.  Once per sampler."""
        if self._state != "new":
            raise RuntimeError("a TelemetrySampler starts once; build a new one to sample again")
        self._reader, self.reason = open_reader(
            self.config.backend, devices=self.config.devices, env=self._env, loader=self._loader
        )
        self._state = "running"
        if self._reader is None:
            return self
        self.backend, self.devices = self._reader.backend, list(self._reader.devices)
        self._errors = self._reader.errors
        origin = self._timer()
        try:
            self.sample_once()
        except BaseException:  # the sink refused the first rows: release the library, no thread
            self._state = "stopped"
            self._reader.close()
            self._reader = None
            raise
        self._thread = threading.Thread(target=self._run, args=(origin,), name="april-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and join the thread, take a last sample (so energy covers up to now), release the
        backend.  Idempotent.  Re-raises an error that stopped the thread (a failing sink)."""
        if self._state != "running":
            return
        self._state = "stopped"
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        reader, self._reader = self._reader, None
        if reader is None:
            return
        try:
            if self._failure is None:
                self._sample(reader)
        finally:
            reader.close()
        if self._failure is not None:
            raise RuntimeError(f"the telemetry sampler stopped early: {self._failure}") from self._failure

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- state -----------------------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """Whether a backend is sampling (or sampled, once stopped)."""
        return self.backend is not None

    def field_errors(self) -> list[str]:
        """One line per (device, field) that failed at least once."""
        return self._errors.summary() if self._errors is not None else []

    # -- sampling --------------------------------------------------------------------------------------

    def sample_once(self) -> None:
        """Append one row per device to the sink (the thread calls this every tick)."""
        if self._reader is None:
            raise RuntimeError("sample_once() needs a started sampler with a backend")
        self._sample(self._reader)

    def _sample(self, reader: DeviceReader) -> None:
        with self._lock:
            self._sample_locked(reader)

    def _sample_locked(self, reader: DeviceReader) -> None:
        for index, name in reader.devices:
            t = self._clock()
            r = reader.read(index)
            self._sink.append(
                TelemetryRecord(
                    t=t,
                    device=index,
                    name=name,
                    util_gpu=r.util_gpu,
                    util_mem=r.util_mem,
                    sm_clock_mhz=r.sm_clock_mhz,
                    mem_used_bytes=r.mem_used_bytes,
                    mem_total_bytes=r.mem_total_bytes,
                    power_w=r.power_w,
                    energy_j=self._accumulate(reader, index, r.energy_counter_j),
                    sm_active_pct=r.sm_active_pct,
                    sm_occupancy_pct=r.sm_occupancy_pct,
                    dram_bw_pct=r.dram_bw_pct,
                )
            )
        self.samples += 1

    def _accumulate(self, reader: DeviceReader, device: int, counter_j: float | None) -> float | None:
        """Energy since the first counter reading.  A counter that goes backwards (driver reload, wrap)
        contributes nothing for that interval and is reported as a field error."""
        if counter_j is None:
            return None
        last = self._last_counter.get(device)
        self._last_counter[device] = counter_j
        if last is None:
            self._energy[device] = 0.0
        elif counter_j >= last:
            self._energy[device] += counter_j - last
        else:
            reader.errors.call(device, "energy_counter", _raise_backwards)
        return self._energy[device]

    def _run(self, origin: float) -> None:
        period = 1.0 / self.config.rate_hz
        tick = 1
        try:
            while not self._wait(max(0.0, origin + tick * period - self._timer())):
                if self._reader is None:
                    return
                self.sample_once()
                tick = next_tick(tick, origin, period, self._timer())
        except BaseException as exc:  # a sink that raises: surface it from stop()
            self._failure = exc


TelemetryConfig = TelemetrySampler.Config


def next_tick(tick: int, origin: float, period: float, now: float) -> int:
    """The next tick to wait for after tick ``tick`` was sampled at ``now``: the following one, or, if
    the read overran, the first tick still in the future (missed ticks are skipped, never bunched)."""
    return max(tick + 1, math.floor((now - origin) / period) + 1)


def open_reader(
    backend: str,
    *,
    devices: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
    loader: ModuleLoader | None = None,
) -> tuple[DeviceReader | None, str]:
    """Open ``backend`` (``auto`` tries NVML, then AMD SMI) and return ``(reader, reason)``; the reader is
    ``None`` when nothing can sample, and ``reason`` is one line saying what was opened or why not.

    An explicitly named backend that cannot start raises :class:`ConfigError` naming the fix."""
    from april_bench.telemetry.amd_smi import AmdSmiReader
    from april_bench.telemetry.nvml import NvmlReader

    if backend == "off":
        return None, "GPU telemetry off (--telemetry off)"
    openers: dict[str, Callable[..., DeviceReader]] = {"nvml": NvmlReader.open, "amdsmi": AmdSmiReader.open}
    if backend not in openers and backend != "auto":
        raise ConfigError(f"--telemetry must be one of {', '.join(BACKENDS)}, got {backend!r}")
    reasons = []
    for name, opener in openers.items():
        if backend not in ("auto", name):
            continue
        try:
            reader = opener(devices=devices, env=env, loader=loader)
        except TelemetryUnavailable as exc:
            if backend == name:
                raise ConfigError(f"--telemetry {name}: {exc} (or use --telemetry auto or off)") from None
            reasons.append(f"{name}: {exc}")
            continue
        listed = ", ".join(f"{i}:{n}" for i, n in reader.devices)
        return reader, f"GPU telemetry via {name} on {listed}"
    return None, "no GPU telemetry (" + "; ".join(reasons) + ")"


def _raise_backwards() -> None:
    raise ValueError("energy counter went backwards (driver reload or wrap); interval skipped")


def check_backend(
    config: TelemetryConfig,
    *,
    env: Mapping[str, str] | None = None,
    loader: ModuleLoader | None = None,
) -> str:
    """Open and release ``config``'s backend now, for an early, one-line failure (``validate``, CLI
    start-up): raises :class:`ConfigError` where :meth:`TelemetrySampler.start` would; else returns
    the line saying what will be sampled (or why nothing will).  ``auto`` on a machine without a GPU
    device node says nothing (an empty line): the hint to install a GPU library is for a machine that
    has a GPU and lacks the library, not for every CPU run."""
    if config.backend == "auto" and env is None and loader is None:
        from april_bench.machine import detect_accelerators

        if not detect_accelerators().any:
            return ""
    reader, reason = open_reader(
        config.backend, devices=config.devices, env=os.environ if env is None else env, loader=loader
    )
    if reader is not None:
        reader.close()
    return reason
