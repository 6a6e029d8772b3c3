"""The engines the conformance suite runs on, and a thread that hosts one per module.

Real engines start slowly (vLLM on two CPU cores takes about a minute), so one
engine of each kind serves every claim: :class:`EngineHost` runs an event loop
in a thread, starts the engine there, and runs each test's coroutine on that
loop.  An :class:`EngineKind` says what the claims may expect of an engine:
whether it honours per-request seeds and whether a weight update changes what
it computes (the fakes only move their policy version).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from april_bench.engines.protocol import Engine

__all__ = ["KINDS", "EngineHost", "EngineKind", "descendants", "make_checkpoints"]

T = TypeVar("T")

#: Small enough that a two-request engine shows running and queued requests; ids stay below it.
VOCAB = 64
MAX_RUNNING = 2
MAX_CONTEXT = 1024  # tiny32 holds 1024 positions
EOS = 2


@dataclass(frozen=True)
class EngineKind:
    name: str
    #: ``async build(checkpoints) -> started engine``; ``checkpoints`` are two weight sets of one model.
    build: Callable[[tuple[str, str]], Awaitable[Engine]]
    #: Same ids and seed give the same tokens, different seeds (almost surely) different ones.
    seeded: bool
    #: A weight update changes the log-probs (a model stands behind the tokens).
    real_weights: bool
    #: Computes in float32, the trainer's dtype: its log-probs are the trainer's to float precision.
    float32: bool = False
    #: ``metrics()["generation_tokens"]`` counts tokens as they are decoded (not when a request ends):
    #: a test can wait for decoding progress instead of sleeping a guess.
    live_token_count: bool = False
    #: ``abort(None)`` stops every request at once.  vLLM's server adapter hangs up each request's
    #: stream in turn and the server aborts each as it sees its client go, so a slot an aborted request
    #: frees can go to a queued request for a few steps before that one's own hang-up lands.
    atomic_abort: bool = True
    #: The registry entry (``ENGINES``) and ``--engine-arg`` options that build this engine: what the
    #: registry says of it (``updates_in_flight``) is checked on it.
    spec: str = ""
    args: tuple[tuple[str, Any], ...] = ()

    def updates_in_flight(self) -> bool:
        from april_bench.engines import ENGINES

        return ENGINES.get(self.spec or self.name).updates_in_flight(dict(self.args))


async def _fake(checkpoints: tuple[str, str]) -> Engine:
    from april_bench.engines.fake import FakeEngine

    engine = FakeEngine.Config(token_time_s=0.01, max_running=MAX_RUNNING, default_len=1000).build()
    await engine.start()
    return engine


async def _hf(checkpoints: tuple[str, str]) -> Engine:
    from april_bench.engines.hf.engine import HFEngine

    config = HFEngine.Config(
        model=checkpoints[0],
        device="cpu",
        max_running_requests=MAX_RUNNING,
        max_context_len=MAX_CONTEXT,
        eos_token_ids=(EOS,),
    )
    engine = config.build()
    await engine.start()
    return engine


async def _vllm(checkpoints: tuple[str, str]) -> Engine:
    from april_bench.engines.vllm.engine import VLLMEngine

    config = VLLMEngine.Config(
        model_path=checkpoints[0],
        max_num_seqs=MAX_RUNNING,
        max_model_len=MAX_CONTEXT,
        eos_token_ids=(EOS,),
        kv_cache_space_gib=1,
    )
    engine = config.build()
    await engine.start()
    return engine


async def _vllm_server(checkpoints: tuple[str, str]) -> Engine:
    from april_bench.engines.vllm.server import VLLMServerEngine

    config = VLLMServerEngine.Config(
        model_path=checkpoints[0], max_num_seqs=MAX_RUNNING, max_model_len=MAX_CONTEXT, eos_token_ids=(EOS,)
    )
    engine = config.build()
    await engine.start()
    return engine


async def _sglang_fake(checkpoints: tuple[str, str]) -> Engine:
    from sglang_fake import sglang_fake_engine

    return await sglang_fake_engine(
        max_running_requests=MAX_RUNNING, vocab_size=VOCAB, eos_token_id=EOS, decode_step_s=0.005
    )


async def _sglang(checkpoints: tuple[str, str]) -> Engine:
    from sglang_fake import sglang_real_engine

    return await sglang_real_engine(model_path=checkpoints[0], max_running_requests=MAX_RUNNING)


KINDS = {
    "fake": EngineKind("fake", _fake, seeded=False, real_weights=False),
    "hf": EngineKind("hf", _hf, seeded=True, real_weights=True, float32=True, live_token_count=True),
    "vllm": EngineKind(
        "vllm", _vllm, seeded=True, real_weights=True, float32=True, live_token_count=True
    ),  # dtype float32
    "vllm-server": EngineKind(
        "vllm-server",
        _vllm_server,
        seeded=True,
        real_weights=True,
        float32=True,
        live_token_count=True,
        atomic_abort=False,
        spec="vllm",
        args=(("server", True),),
    ),
    "sglang-fake": EngineKind("sglang-fake", _sglang_fake, seeded=True, real_weights=False),
    # SGLang honours per-request seeds only with deterministic inference, which sglang_real_engine sets.
    "sglang": EngineKind("sglang", _sglang, seeded=True, real_weights=True),
}


def make_checkpoints(directory: Path) -> tuple[str, str]:
    """Two random-weight ``tiny32`` checkpoints (seeds 0 and 1): starting weights and an update."""
    from april_bench.models.checkpoint import save_state_dict
    from april_bench.models.zoo import build_model

    paths = []
    for seed in (0, 1):
        model = build_model("tiny32", vocab_size=VOCAB, seed=seed)
        model.config.eos_token_id = EOS
        paths.append(str(save_state_dict(model, directory / f"tiny32-seed{seed}")))
    return paths[0], paths[1]


class EngineHost:
    """An event loop in a thread, holding one started engine; tests run coroutines on it."""

    def __init__(self, kind: EngineKind, checkpoints: tuple[str, str]) -> None:
        self.kind = kind
        self.checkpoints = checkpoints
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"engine-{kind.name}", daemon=True)
        self._thread.start()
        self.children_before = descendants(os.getpid())
        self.engine: Engine | None = None
        self.engine = self.run(lambda: kind.build(checkpoints), timeout=900)

    def run(self, body: Callable[[], Coroutine[Any, Any, T] | Awaitable[T]], timeout: float = 120) -> T:
        async def wrapped() -> T:
            return await asyncio.wait_for(body(), timeout)

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result()

    def close_engine(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            self.run(engine.close, timeout=120)

    def stop(self) -> None:
        self.close_engine()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from ``/proc``; empty where there is no ``/proc``)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":  # a zombie has exited; its parent only has not reaped it yet
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent and child not in found]
        found.update(children)
        frontier += children
    return found
