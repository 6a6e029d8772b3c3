"""Inference engines behind one protocol, registered lazily by name."""

from april_bench.engines.protocol import (
    Completion,
    Engine,
    EngineError,
    EngineInfo,
    EngineLoad,
    GenerateRequest,
    SamplingParams,
    WeightUpdate,
)
from april_bench.registry import Registry

__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "EngineError",
    "EngineInfo",
    "EngineLoad",
    "GenerateRequest",
    "SamplingParams",
    "WeightUpdate",
]

ENGINES: Registry[type] = Registry("engine")
ENGINES.register("sim", "april_bench.sim.engine:SimEngine", "discrete-event model of an SGLang deployment")
ENGINES.register(
    "hf",
    "april_bench.engines.hf:HFEngine",
    "continuous batching over any transformers causal LM (CPU or CUDA); the embedded default",
)
ENGINES.register(
    "fake", "april_bench.engines.fake:FakeEngine", "deterministic fake: one token per tick per request"
)
