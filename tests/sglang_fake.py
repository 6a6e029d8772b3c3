"""Engine factories for the sglang adapter: over the fake SGLang server, and over a real one.

``await sglang_fake_engine(**settings)`` returns a *started* engine (the caller
closes it, which also stops its server).  Settings that name a field of
``FakeSGLangServer.Config`` configure the server; those of ``SGLangEngine.Config``
configure the adapter.  The shared engine-conformance suite can add it with one line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from april_bench.engines.sglang import FakeSGLangServer, SGLangEngine

__all__ = ["sglang_fake_engine", "sglang_real_engine"]

_SERVER_FIELDS = {f.name for f in dataclasses.fields(FakeSGLangServer.Config)}
_ENGINE_FIELDS = {f.name for f in dataclasses.fields(SGLangEngine.Config)}


async def sglang_fake_engine(**settings: Any) -> SGLangEngine:
    """The adapter over an in-process fake SGLang server on loopback (fast steps by default)."""
    server_args: dict[str, Any] = {"decode_step_s": 0.005}
    engine_args: dict[str, Any] = {}
    for name, value in settings.items():
        if name in _SERVER_FIELDS:
            server_args[name] = value
        elif name in _ENGINE_FIELDS:
            engine_args[name] = value
        else:
            raise TypeError(f"unknown sglang fake setting {name!r}")
    if "eos_token_id" in server_args:
        engine_args.setdefault("eos_token_ids", (server_args["eos_token_id"],))
    server = FakeSGLangServer.Config(**server_args).build()
    engine = SGLangEngine.Config(**engine_args).build(server=server)
    await engine.start()
    return engine


async def sglang_real_engine(**settings: Any) -> SGLangEngine:
    """The adapter launching a real SGLang server (needs sglang and a GPU).

    ``APRIL_BENCH_SGLANG_MODEL`` names the model (default ``Qwen/Qwen3-0.6B``),
    ``APRIL_BENCH_SGLANG_PYTHON`` an interpreter with sglang (default: this one).
    Fake-only settings (timing) are ignored; ``max_running_requests`` is kept.
    """
    engine_args = {k: v for k, v in settings.items() if k in _ENGINE_FIELDS}
    engine_args.setdefault("model_path", os.environ.get("APRIL_BENCH_SGLANG_MODEL", "Qwen/Qwen3-0.6B"))
    engine_args.setdefault("python", os.environ.get("APRIL_BENCH_SGLANG_PYTHON", sys.executable))
    engine_args.setdefault("deterministic", True)
    engine_args.setdefault("mem_fraction_static", 0.5)
    if "max_running_requests" in settings:
        engine_args["max_running_requests"] = settings["max_running_requests"]
    engine = SGLangEngine.Config(**engine_args).build()
    await engine.start()
    return engine
