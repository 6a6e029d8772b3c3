"""glibc's allocator told to keep a run's large buffers in its heap instead of returning them after each step.

Why: a training step of the embedded default allocates and frees buffers of 0.1-3 MB by the
hundred (activations, their gradients, attention scratch).  glibc serves blocks above its mmap
threshold (128 KiB at first, adapting upwards to at most 32 MiB) with fresh ``mmap`` pages and gives
heap memory above its trim threshold back to the kernel, so the next step faults the same pages in
again, zeroed: hundreds of thousands of page faults in a run, paid inside the ops that first touch
the memory.  With the mmap threshold at 256 MiB and the trim threshold at 512 MiB the buffers stay
mapped and are reused; the process keeps what its largest step needed.  docs/benchmarks.md ("The
cold main job") has the measurements, the engine's side included.

It is process-wide and set once, at the start of a ``run`` (:func:`tune_allocator`; importing
april-bench changes nothing).  It changes no result: the same arithmetic on the same numbers, in
memory that was mapped before.  Opt out with ``APRIL_BENCH_MALLOC=default``; a
``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` of your own (glibc reads them at start)
also leaves the allocator as you set it.  Elsewhere than glibc (musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["MMAP_THRESHOLD", "OPT_OUT", "TRIM_THRESHOLD", "allocator_state", "tune_allocator"]

#: Blocks at least this large still get their own mapping (256 MiB: none of a small model's step).
MMAP_THRESHOLD = 256 << 20
#: Free memory at the heap's top beyond this goes back to the kernel (512 MiB).
TRIM_THRESHOLD = 512 << 20
#: The environment variable that turns the setting off (``default``).
OPT_OUT = "APRIL_BENCH_MALLOC"
#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_state: dict[str, Any] | None = None


class _Glibc:
    """The process's C library, when it is glibc: its ``mallopt`` and version."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version  # AttributeError: not glibc
        version.restype = ctypes.c_char_p
        self.glibc_version = version().decode()
        self.mallopt = libc.mallopt


def _glibc() -> _Glibc | None:
    try:
        return _Glibc()
    except (OSError, AttributeError):
        return None


def tune_allocator(environ: Mapping[str, str] | None = None, *, libc: Any = None) -> dict[str, Any]:
    """Set glibc's mmap and trim thresholds for this process (once; later calls return the first
    call's state).  Returns what was done: ``{"tuned": bool, "why": str, ...}`` (provenance records it)."""
    global _state
    if _state is not None:
        return _state
    env = os.environ if environ is None else environ
    own = [
        name
        for name in _USER_VARIABLES
        if name in env and (name != "GLIBC_TUNABLES" or "malloc" in env[name])
    ]
    if env.get(OPT_OUT, "").strip().lower() == "default":
        _state = {"tuned": False, "why": f"{OPT_OUT}=default"}
    elif own:
        _state = {"tuned": False, "why": f"set by the user: {', '.join(own)}"}
    else:
        lib = libc if libc is not None else _glibc()
        if lib is None:
            _state = {"tuned": False, "why": "not glibc"}
        else:
            done = lib.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            done = lib.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
            _state = {
                "tuned": done,
                "why": "april-bench (glibc mallopt)" if done else "glibc refused mallopt",
                "mmap_threshold": MMAP_THRESHOLD,
                "trim_threshold": TRIM_THRESHOLD,
                "glibc": getattr(lib, "glibc_version", None),
            }
    return _state


def allocator_state() -> dict[str, Any] | None:
    """What :func:`tune_allocator` did in this process (``None``: it was not called)."""
    return _state
