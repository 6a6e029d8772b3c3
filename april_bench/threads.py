"""Torch CPU threads: one intra-op thread per engine or trainer process unless the user says otherwise.

Why: on a shared CPU, torch's default (one thread per core) makes every forward wait for the
slowest core; at load average 3.5-4.2 on 2 cores the embedded engine decoded 78 tokens/s with two
threads and 4,384 with one (``benchmarks/cpu_threads.py``, ``results/benchmarks/cpu_threads.md``).
One thread also keeps the embedded run's numerics the same at any load.  The setting is made
around each forward, training step and warm start (:func:`torch_threads`) and undone after, so
nothing else in the process inherits it.  ``--engine-arg threads=N``
and ``--trainer-arg threads=N`` override the choice; provenance records the threads a run used.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

__all__ = ["DEFAULT_CPU_THREADS", "choose_threads", "threads_in_use", "torch_threads"]

#: Intra-op threads of an engine or trainer process on CPU when the user sets none.
DEFAULT_CPU_THREADS = 1


def choose_threads(requested: int | None, device_type: str) -> int | None:
    """Threads to use: ``requested`` when set; one on a CPU; ``None`` (torch's choice) on a GPU,
    where the CPU only launches kernels."""
    if requested is not None:
        if requested < 1:
            from april_bench.config import ConfigError

            raise ConfigError(f"threads must be >= 1, got {requested}")
        return requested
    return DEFAULT_CPU_THREADS if device_type == "cpu" else None


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads (``None``: unchanged), then restore."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    if before == threads:  # the common case inside a run: nothing to switch
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def threads_in_use() -> int | None:
    """Torch's intra-op threads in this process now (``None`` when torch was never imported)."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())
