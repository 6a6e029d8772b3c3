"""The GPU sampler against fake NVML and AMD SMI modules: exact rows, failures, devices, the thread."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from fakes import Script, fake_amdsmi, fake_pynvml, loader_for
from fakes.fake_amdsmi import FakeAmdGpu
from fakes.fake_pynvml import NOT_SUPPORTED, FakeNvidiaGpu

from april_bench.config import ConfigError
from april_bench.telemetry import (
    ListSink,
    TelemetryConfig,
    TelemetryRecord,
    TelemetrySampler,
    check_backend,
)
from april_bench.telemetry.sampler import next_tick

H100_BYTES = 85_520_809_984


def nvml_sampler(
    gpus: list[FakeNvidiaGpu], times: list[float], *, env: dict[str, str] | None = None, **config: object
) -> tuple[TelemetrySampler, ListSink[TelemetryRecord], object]:
    nvml = fake_pynvml.make(gpus)
    sink: ListSink[TelemetryRecord] = ListSink()
    clock = iter(times)
    sampler = TelemetryConfig(**config).build(  # type: ignore[arg-type]
        sink=sink,
        clock=lambda: next(clock),
        env=env or {},
        loader=loader_for({"pynvml": nvml}),
        wait=lambda _delay: True,  # no ticks: rows come from start() and stop() only
    )
    return sampler, sink, nvml


def test_nvml_rows_carry_exact_values_in_row_units_and_energy_from_the_counter() -> None:
    gpu = FakeNvidiaGpu(
        util=Script((10, 5), (90, 40)),
        sm_clock_mhz=Script(1410, 1980),
        mem_used=Script(1_000, 2_000),
        power_mw=Script(350_500, 699_000),
        energy_mj=Script(5_000_000, 5_000_250),
    )
    sampler, sink, nvml = nvml_sampler([gpu], [100.0, 100.5])
    with sampler:
        assert sampler.reason == "GPU telemetry via nvml on 0:NVIDIA H100 80GB HBM3"
    name = "NVIDIA H100 80GB HBM3"
    assert list(sink) == [
        TelemetryRecord(100.0, 0, name, 10, 5, 1410, 1_000, H100_BYTES, 350.5, 0.0),
        TelemetryRecord(100.5, 0, name, 90, 40, 1980, 2_000, H100_BYTES, 699.0, 0.25),
    ]
    assert nvml.state.shutdowns == 1 and nvml.state.initialised == 0  # type: ignore[attr-defined]
    assert dataclasses.asdict(sink[0])["energy_j"] == 0.0


def test_an_unsupported_query_is_none_in_its_field_and_sampling_goes_on() -> None:
    old_card = FakeNvidiaGpu(name="Tesla P4", util=NOT_SUPPORTED, energy_mj=NOT_SUPPORTED, power_mw=52_000)
    sampler, sink, _ = nvml_sampler([old_card], [1.0, 2.0])
    with sampler:
        pass
    assert [(r.util_gpu, r.util_mem, r.power_w, r.energy_j, r.sm_clock_mhz) for r in sink] == [
        (None, None, 52.0, None, 1980),
        (None, None, 52.0, None, 1980),
    ]
    assert sampler.field_errors() == [
        "GPU 0 energy: 2 failed reads (NVMLError_NotSupported: Not Supported)",
        "GPU 0 utilization: 2 failed reads (NVMLError_NotSupported: Not Supported)",
    ]


def test_energy_counter_gaps_are_bridged_exactly_and_a_backwards_counter_adds_nothing() -> None:
    energy = Script(1_000_000, NOT_SUPPORTED, 1_003_000, 500, 1_500)
    sampler, sink, _ = nvml_sampler([FakeNvidiaGpu(energy_mj=energy)], [0.0, 1.0, 2.0, 3.0, 4.0])
    sampler.start()
    for _ in range(3):
        sampler.sample_once()
    sampler.stop()
    # 0 J; missing; +3 J across the gap; reset to 0.5 J: skipped; +1 J
    assert [r.energy_j for r in sink] == [0.0, None, 3.0, 3.0, 4.0]
    assert sampler.field_errors() == [
        "GPU 0 energy: 1 failed reads (NVMLError_NotSupported: Not Supported)",
        "GPU 0 energy_counter: 1 failed reads (ValueError: energy counter went backwards "
        "(driver reload or wrap); interval skipped)",
    ]


def test_amdsmi_rows_convert_mib_and_energy_ticks_and_fall_back_to_average_power() -> None:
    gpu = FakeAmdGpu(
        activity=Script((70, 30), ("N/A", 31)),
        gfx_clock_mhz=Script(2100, 1900),
        vram_used_mib=Script(1024, 2048),
        current_socket_power=Script(650, "N/A"),
        average_socket_power=Script(600, 610),
        energy_ticks=Script(1_000_000, 1_065_532),  # 65_532 ticks x 15.259 uJ = 0.99995... J
        counter_resolution=15.259,
    )
    smi = fake_amdsmi.make([gpu])
    sink: ListSink[TelemetryRecord] = ListSink()
    clock = iter([5.0, 6.0])
    sampler = TelemetryConfig(backend="amdsmi").build(
        sink=sink, clock=lambda: next(clock), env={}, loader=loader_for({"amdsmi": smi}), wait=lambda _d: True
    )
    with sampler:
        pass
    first, second = sink
    assert (first.util_gpu, first.util_mem, first.sm_clock_mhz, first.power_w) == (70, 30, 2100, 650)
    assert (second.util_gpu, second.util_mem, second.sm_clock_mhz, second.power_w) == (None, 31, 1900, 610)
    assert (first.mem_used_bytes, second.mem_used_bytes) == (1024 * 2**20, 2048 * 2**20)
    assert first.mem_total_bytes == 196_592 * 2**20
    assert first.energy_j == 0.0
    assert second.energy_j == pytest.approx(65_532 * 15.259 / 1e6, rel=1e-12)
    assert first.name == "AMD Instinct MI300X"
    assert smi.state.shutdowns == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, [2, 0]),
        ({"CUDA_VISIBLE_DEVICES": "1,7,2"}, [1]),  # CUDA stops at the first invalid ordinal
        ({"CUDA_VISIBLE_DEVICES": "GPU-3,1"}, [3, 1]),
        ({"CUDA_VISIBLE_DEVICES": "MIG-on-2"}, [2]),  # a MIG slice samples its parent GPU
    ],
)
def test_nvml_samples_the_devices_cuda_visible_devices_lists(
    env: dict[str, str], expected: list[int]
) -> None:
    gpus = [FakeNvidiaGpu(uuid=f"GPU-{i}") for i in range(4)]
    gpus[2].mig_children["MIG-on-2"] = object()
    sampler, sink, _ = nvml_sampler(gpus, [float(i) for i in range(20)], env=env)
    with sampler:
        pass
    assert [i for i, _ in sampler.devices] == expected
    assert [r.device for r in sink] == expected * 2


@pytest.mark.parametrize("value", ["", "-1", "none"])
def test_nvml_with_every_device_hidden_records_nothing_and_says_why(value: str) -> None:
    sampler, sink, nvml = nvml_sampler([FakeNvidiaGpu()], [0.0], env={"CUDA_VISIBLE_DEVICES": value})
    with sampler:
        pass
    assert list(sink) == [] and not sampler.available
    assert f"nvml: no visible GPU (CUDA_VISIBLE_DEVICES={value!r})" in sampler.reason
    assert nvml.state.initialised == 0  # type: ignore[attr-defined]


def test_explicit_devices_override_the_environment_and_must_exist() -> None:
    sampler, _, _ = nvml_sampler(
        [FakeNvidiaGpu(), FakeNvidiaGpu()], [0.0, 1.0], env={"CUDA_VISIBLE_DEVICES": "0"}, devices=(1,)
    )
    with sampler:
        pass
    assert [i for i, _ in sampler.devices] == [1]
    missing, _, nvml = nvml_sampler([FakeNvidiaGpu()], [0.0], devices=(0, 3))
    with pytest.raises(ConfigError, match=r"^--telemetry-devices 3: this machine has GPUs 0-0$"):
        missing.start()
    assert nvml.state.initialised == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, [0, 1, 2]),
        ({"HIP_VISIBLE_DEVICES": "2"}, [2]),
        ({"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "1"}, [2]),  # HIP indexes into ROCR's list
        ({"CUDA_VISIBLE_DEVICES": "0,2"}, [0, 2]),  # HIP honours CUDA_VISIBLE_DEVICES
    ],
)
def test_amdsmi_samples_the_devices_rocr_and_hip_visible_devices_list(
    env: dict[str, str], expected: list[int]
) -> None:
    smi = fake_amdsmi.make([FakeAmdGpu(), FakeAmdGpu(), FakeAmdGpu()])
    sampler = TelemetryConfig(backend="amdsmi").build(
        sink=[], env=env, loader=loader_for({"amdsmi": smi}), wait=lambda _d: True
    )
    with sampler:
        pass
    assert [i for i, _ in sampler.devices] == expected


def test_auto_prefers_nvml_then_amdsmi_and_otherwise_records_nothing_with_a_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nvml, smi = fake_pynvml.make([FakeNvidiaGpu()]), fake_amdsmi.make([FakeAmdGpu()])
    no_driver = fake_pynvml.make([], init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    def backend(modules: dict[str, object]) -> tuple[str | None, str]:
        sampler = TelemetryConfig().build(sink=[], env={}, loader=loader_for(modules), wait=lambda _d: True)
        with sampler:
            return sampler.backend, sampler.reason

    assert backend({"pynvml": nvml, "amdsmi": smi})[0] == "nvml"
    assert backend({"pynvml": no_driver, "amdsmi": smi})[0] == "amdsmi"

    def noisy_import(name: str) -> object:
        print("Unable to find libamd_smi.so library try installing amd-smi-lib")  # what amdsmi does
        raise fake_amdsmi.LIBRARY_MISSING

    sampler = TelemetryConfig().build(
        sink=[], env={}, loader=lambda name: noisy_import(name) if name == "amdsmi" else no_driver
    )
    with sampler:
        pass
    assert sampler.backend is None
    assert sampler.reason == (
        "no GPU telemetry (nvml: NVML could not start (Driver Not Loaded); check that nvidia-smi works; "
        "amdsmi: amdsmi failed to import (KeyError: 'libamd_smi.so'): pip install 'april-bench[amd]' "
        "(or, to match your ROCm, pip install /opt/rocm/share/amd_smi))"
    )
    assert capsys.readouterr().out == ""


def test_an_explicit_backend_that_cannot_start_is_a_config_error_naming_the_install() -> None:
    config = TelemetryConfig(backend="nvml")
    with pytest.raises(ConfigError) as err:
        check_backend(config, env={}, loader=loader_for({}))
    assert str(err.value) == (
        "--telemetry nvml: pynvml is not installed: pip install 'april-bench[nvidia]' "
        "(or use --telemetry auto or off)"
    )
    with pytest.raises(ConfigError, match=r"^--telemetry amdsmi: amdsmi is not installed: pip install"):
        TelemetryConfig(backend="amdsmi").build(sink=[], env={}, loader=loader_for({})).start()


def test_off_never_imports_a_vendor_module() -> None:
    def refuse(name: str) -> object:
        raise AssertionError(f"imported {name}")

    assert (
        check_backend(TelemetryConfig(backend="off"), loader=refuse) == "GPU telemetry off (--telemetry off)"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "nvidia"}, "--telemetry must be one of auto, nvml, amdsmi, off, got 'nvidia'"),
        ({"rate_hz": 0.0}, "--telemetry-rate must be in (0, 100] Hz, got 0"),
        ({"rate_hz": 250.0}, "--telemetry-rate must be in (0, 100] Hz, got 250"),
        ({"devices": (0, 0)}, "--telemetry-devices must list distinct indices >= 0, got [0, 0]"),
        ({"devices": (-1,)}, "--telemetry-devices must list distinct indices >= 0, got [-1]"),
    ],
    ids=["backend", "rate-zero", "rate-high", "devices-repeated", "devices-negative"],
)
def test_config_validation_names_the_flag_and_the_allowed_values(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        TelemetryConfig(**fields)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_config_round_trips_through_to_dict() -> None:
    config = TelemetryConfig(backend="nvml", rate_hz=4.0, devices=(1, 0))
    assert config.to_dict() == {"backend": "nvml", "rate_hz": 4.0, "devices": [1, 0]}


class FakeTime:
    """A monotonic timer that moves only when the sampler waits or a row costs time."""

    def __init__(self, waits: int) -> None:
        self.now = 0.0
        self.waits_left = waits
        self.cost: list[float] = []

    def wait(self, delay: float) -> bool:
        if self.waits_left == 0:
            return True  # stop requested
        self.waits_left -= 1
        self.now += delay
        return False


def test_ticks_stay_on_the_grid_and_an_overrun_skips_missed_ticks_instead_of_bunching() -> None:
    time = FakeTime(waits=4)
    costs = iter([0.03, 0.03, 0.03, 0.25, 0.03, 0.03, 0.03])
    stamps: list[float] = []

    class CostlySink(list[TelemetryRecord]):
        def append(self, row: TelemetryRecord, /) -> None:
            stamps.append(row.t)
            time.now += next(costs)

    sampler = TelemetryConfig(backend="nvml", rate_hz=10.0).build(
        sink=CostlySink(),
        clock=lambda: time.now,
        env={},
        loader=loader_for({"pynvml": fake_pynvml.make([FakeNvidiaGpu()])}),
        timer=lambda: time.now,
        wait=time.wait,
    )
    sampler.start()
    assert sampler._thread is not None
    sampler._thread.join(timeout=10)
    sampler.stop()
    # start at 0; ticks at 0.1, 0.2, 0.3; the 0.3 read takes 0.25 s, so 0.4 and 0.5 are skipped; 0.6;
    # then stop() samples at 0.63
    assert stamps == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.6, 0.63])


@pytest.mark.parametrize(
    ("tick", "now", "expected"),
    [(1, 0.13, 2), (3, 0.55, 6), (3, 0.31, 4), (7, 0.2, 8)],
)
def test_next_tick_is_the_following_tick_or_the_first_one_still_ahead(
    tick: int, now: float, expected: int
) -> None:
    assert next_tick(tick, 0.0, 0.1, now) == expected


def test_the_thread_samples_on_its_own_and_stop_joins_it_and_is_idempotent() -> None:
    sink: ListSink[TelemetryRecord] = ListSink()
    enough = threading.Event()

    class Watching(ListSink[TelemetryRecord]):
        def append(self, row: TelemetryRecord, /) -> None:
            sink.append(row)
            if len(sink) >= 4:
                enough.set()

    sampler = TelemetryConfig(backend="nvml", rate_hz=100.0).build(
        sink=Watching(), env={}, loader=loader_for({"pynvml": fake_pynvml.make([FakeNvidiaGpu()])})
    )
    sampler.start()
    assert enough.wait(timeout=30), "the sampler thread wrote no rows"
    sampler.stop()
    assert sampler._thread is not None and not sampler._thread.is_alive()
    written = len(sink)
    sampler.stop()
    assert len(sink) == written
    times = [r.t for r in sink.snapshot()]
    assert times == sorted(times)
    with pytest.raises(RuntimeError, match="starts once"):
        sampler.start()


def test_a_sink_that_raises_stops_the_thread_and_the_error_surfaces_at_stop() -> None:
    calls = []

    class Broken(list[TelemetryRecord]):
        def append(self, row: TelemetryRecord, /) -> None:
            calls.append(row)
            if len(calls) > 1:
                raise OSError("disk full")

    sampler = TelemetryConfig(backend="nvml", rate_hz=100.0).build(
        sink=Broken(), env={}, loader=loader_for({"pynvml": fake_pynvml.make([FakeNvidiaGpu()])})
    )
    sampler.start()
    assert sampler._thread is not None
    sampler._thread.join(timeout=30)
    with pytest.raises(RuntimeError, match="stopped early: disk full"):
        sampler.stop()
    assert len(calls) == 2


def test_list_sink_drain_hands_over_every_row_once() -> None:
    sink: ListSink[int] = ListSink()
    for i in range(3):
        sink.append(i)
    assert (sink.snapshot(), sink.drain(), sink.drain(), list(sink)) == ([0, 1, 2], [0, 1, 2], [], [])


def test_a_sink_that_fails_on_the_first_row_fails_start_and_releases_the_library() -> None:
    class Refusing(list[TelemetryRecord]):
        def append(self, row: TelemetryRecord, /) -> None:
            raise PermissionError("read-only store")

    nvml = fake_pynvml.make([FakeNvidiaGpu()])
    sampler = TelemetryConfig(backend="nvml").build(
        sink=Refusing(), env={}, loader=loader_for({"pynvml": nvml})
    )
    with pytest.raises(PermissionError, match="read-only store"):
        sampler.start()
    assert sampler._thread is None
    assert nvml.state.initialised == 0  # type: ignore[attr-defined]
    sampler.stop()  # still idempotent


def test_importing_the_telemetry_package_loads_no_vendor_module_or_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, april_bench.telemetry, april_bench.telemetry.metrics, april_bench.telemetry.gpu_facts\n"
        "heavy = {'torch', 'pynvml', 'amdsmi', 'numpy'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_gpm_metrics_cover_the_interval_since_the_previous_sample_and_free_their_buffers() -> None:
    # Hopper: SM activity, occupancy and DRAM bandwidth per interval; the first sample has no interval.
    gpu = FakeNvidiaGpu(gpm=Script((12.5, 3.0, 20.0), (97.0, 41.0, 88.5)))
    sampler, sink, nvml = nvml_sampler([gpu], [0.0, 1.0, 2.0])
    sampler.start()
    sampler.sample_once()
    sampler.stop()
    assert [(r.sm_active_pct, r.sm_occupancy_pct, r.dram_bw_pct) for r in sink] == [
        (None, None, None),
        (12.5, 3.0, 20.0),
        (97.0, 41.0, 88.5),
    ]
    assert nvml.state.gpm_samples == 0  # type: ignore[attr-defined]


def test_a_gpu_without_gpm_reads_none_and_reports_no_field_error() -> None:
    sampler, sink, nvml = nvml_sampler([FakeNvidiaGpu(name="NVIDIA A100-SXM4-80GB")], [0.0, 1.0])
    with sampler:
        pass
    assert {(r.sm_active_pct, r.sm_occupancy_pct, r.dram_bw_pct) for r in sink} == {(None, None, None)}
    assert sampler.field_errors() == [] and nvml.state.gpm_samples == 0  # type: ignore[attr-defined]


def test_a_failed_gpm_sample_loses_only_its_interval() -> None:
    gpu = FakeNvidiaGpu(gpm=Script((50.0, 10.0, 30.0), (60.0, 11.0, 31.0)))
    sampler, sink, nvml = nvml_sampler([gpu], [0.0, 1.0, 2.0, 3.0])
    sampler.start()
    fail = nvml.nvmlGpmSampleGet  # type: ignore[attr-defined]
    nvml.nvmlGpmSampleGet = lambda h, s: (_ for _ in ()).throw(RuntimeError("lost"))  # type: ignore[attr-defined]
    sampler.sample_once()
    nvml.nvmlGpmSampleGet = fail  # type: ignore[attr-defined]
    sampler.sample_once()
    sampler.stop()
    assert [r.sm_active_pct for r in sink] == [None, None, None, 50.0]
    assert nvml.state.gpm_samples == 0  # type: ignore[attr-defined]
