"""glibc's allocator set at the start of a run (april_bench/allocator.py): what it asks glibc for, when
it leaves the allocator alone, and that the setting does keep large buffers mapped (page faults,
counted, not timed)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

import pytest

from april_bench import allocator

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


class _FakeLibc:
    glibc_version = "2.99"

    def __init__(self, answer: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "_state", None)  # each test sees a process that never tuned


def test_a_run_sets_the_mmap_and_trim_thresholds_once() -> None:
    libc = _FakeLibc()
    state = allocator.tune_allocator({}, libc=libc)
    assert libc.calls == [(-3, 256 << 20), (-1, 512 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    assert state["tuned"] and state["glibc"] == "2.99"
    assert allocator.tune_allocator({}, libc=libc) is state and len(libc.calls) == 2
    assert allocator.allocator_state() is state


@pytest.mark.parametrize(
    ("environ", "why"),
    [
        ({"APRIL_BENCH_MALLOC": "default"}, "APRIL_BENCH_MALLOC=default"),
        ({"MALLOC_TRIM_THRESHOLD_": "1"}, "set by the user: MALLOC_TRIM_THRESHOLD_"),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4096"}, "set by the user: GLIBC_TUNABLES"),
    ],
)
def test_the_opt_out_and_the_users_own_settings_leave_the_allocator_alone(
    environ: dict[str, str], why: str
) -> None:
    libc = _FakeLibc()
    assert allocator.tune_allocator(environ, libc=libc) == {"tuned": False, "why": why}
    assert libc.calls == []


def test_a_refusal_is_reported() -> None:
    state = allocator.tune_allocator({}, libc=_FakeLibc(answer=0))
    assert not state["tuned"] and state["why"] == "glibc refused mallopt"


_PROBE = """
import json, resource, sys
from april_bench.allocator import tune_allocator
state = tune_allocator() if sys.argv[1] == "tune" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):  # 40 MiB: above glibc's largest adaptive mmap threshold (32 MiB)
    block = bytearray(40 << 20)
    block[::4096] = bytes(len(block[::4096]))
    del block
print(json.dumps({"state": state, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _probe(mode: str, **env: str) -> dict[str, Any]:
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "APRIL_BENCH_MALLOC"
    }
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        env={**environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_on_glibc_freed_large_buffers_stay_mapped() -> None:
    """20 blocks of 40 MiB, each freed before the next: glibc's default maps and faults in each one
    afresh (about 10,000 faults apiece); tuned, the heap keeps the first one's pages."""
    plain = _probe("plain")
    tuned = _probe("tune")
    opted_out = _probe("tune", APRIL_BENCH_MALLOC="default")
    assert tuned["state"]["tuned"] and not opted_out["state"]["tuned"]
    assert plain["faults"] > 100_000
    assert tuned["faults"] < plain["faults"] / 5
    assert opted_out["faults"] > plain["faults"] / 2
