"""``sim``: a discrete-event model of an SGLang deployment on a virtual clock.

``num_gpus / tp_size`` replicas (APRIL's scripts: 8 GPUs, TP2, so 4 engines)
sit behind a router.  Each replica is a :class:`~april_bench.engines.sim.replica.SimReplica`
priced by the roofline :class:`~april_bench.engines.sim.cost.CostModel`.  The
engine implements the same :class:`~april_bench.engines.protocol.Engine`
protocol as a real one, so the rollout loop and the strategies run unchanged.

Knobs that SGLang has keep SGLang's names (``tp_size``, ``mem_fraction_static``,
``max_running_requests``, ``chunked_prefill_size``, ``cuda_graph_max_bs``,
``schedule_conservativeness``) and can be set with ``--engine-arg name=value``.

The simulator produces lengths, not tokens: completions carry no ids or
log-probs, and every result of a simulated run is labelled simulated.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.compiled import mypyc_attr
from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    FAULTS,
    HISTOGRAM,
    SATURATION,
    STATE,
    VERSIONS,
    Completion,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineSettings,
    EngineWork,
    FaultEvent,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.routing import ROUTER_POLICIES, Router
from april_bench.engines.sim.cost import CostModel
from april_bench.engines.sim.cost_curve import CostCurve, MeasuredCost
from april_bench.engines.sim.failures import FailurePlan, SimFailures, check_failure_options
from april_bench.engines.sim.replica import ReplicaSettings, SimReplica
from april_bench.engines.sim.speculative import SpeculativeCost
from april_bench.engines.stream import CompletionStream
from april_bench.profiles.hardware import HardwareProfile, hardware_names, hardware_profile
from april_bench.profiles.models import MODELS, ModelProfile

__all__ = ["SimEngine", "build"]

RESUME_KV = ("recompute", "keep")


@mypyc_attr(native_class=False)  # its base (BaseConfig) is not compiled
@dataclass(kw_only=True, slots=True, frozen=True)
class SimEngineConfig(BaseConfig):
    """The simulated engine's settings (``SimEngine.Config``; a module-level class: the compiled core
    (``april_bench/compiled.py``) compiles this module, and mypyc takes no nested class)."""

    hardware: str = param("h100", help="hardware profile (ls hardware)")
    model: str = param("qwen3-4b", help="model profile (ls models)")
    num_gpus: int | None = param(None, help="GPUs for rollout (default: one node of the hardware)")
    tp_size: int | None = param(
        None, help="GPUs per engine replica (default: 2 as in APRIL's scripts, capped at the GPU count)"
    )
    mem_fraction_static: float = param(0.6, help="device memory for weights + KV (APRIL scripts: 0.6)")
    max_running_requests: int | None = param(None, help="per replica (default: SGLang's, from the KV pool)")
    chunked_prefill_size: int | None = param(None, help="tokens per extend batch (default: SGLang's)")
    cuda_graph_max_bs: int | None = param(None, help="largest CUDA-graph batch (default: SGLang's)")
    schedule_conservativeness: float = param(1.0, help="scales SGLang's new-token reservation")
    router_policy: str = param(
        "cache_aware", help="cache_aware (a prompt's samples share a replica), round_robin or least_load"
    )
    replan_iterations: int = param(64, help="decode steps between admission checks while requests wait")
    sync_s_per_billion_params: float = param(
        2.5, help="weight update + colocate switch time per 1e9 parameters (Relax#152: ~11 s, 4B, H200)"
    )
    context_length: int = param(40960, help="model context length (Qwen3: 40,960), for SGLang defaults")
    cost_curve: str | None = param(
        None,
        help="simulate a measured engine: its cost-curve JSON (simcheck writes one; "
        "april_bench/engines/sim/cost_curve.py): one replica priced by its measured decode and "
        "prefill costs",
    )
    resume_kv: str = param(
        "recompute",
        help="a resumed request's prompt + partial: recompute (re-prefill; weight updates flush the "
        "cache) or keep (its KV stays cached on its replica across updates, free between steps: an upper "
        "bound)",
    )
    speculative: str | None = param(
        None,
        help="decode speculatively with this draft model profile (e.g. qwen3-0.6b) where it is cheaper "
        "(april_bench/engines/sim/speculative.py); default: no speculation",
    )
    speculative_tokens: int = param(4, help="speculative: draft tokens proposed per step (gamma)")
    speculative_acceptance: float = param(
        0.6, help="speculative: per-token acceptance rate alpha (an assumption: sweep it)"
    )
    speculative_max_batch: int | None = param(
        None,
        help="speculative: never speculate above this many running requests "
        "(vLLM's speculative_disable_by_batch_size)",
    )
    failure_rate_per_hour: float = param(
        0.0,
        help="replica failures per replica-hour of virtual time (a seeded Poisson process; "
        "april_bench/engines/sim/failures.py): each loses its requests' decode and re-prefills them "
        "on survivors",
    )
    failure_at_s: tuple[float, ...] = param(
        (), help="a failure trace: virtual seconds since the run started at which a replica fails"
    )
    failure_seed: int = param(0, help="seed of the failure times (with a rate) and of the replicas hit")
    restart_s: float = param(
        60.0, help="seconds a failed replica is down before it serves again (plus the weight sync time)"
    )

    def __post_init__(self) -> None:
        if self.hardware not in hardware_names():
            raise ConfigError(
                f"unknown hardware {self.hardware!r}; choose from {', '.join(hardware_names())}"
            )
        MODELS.get(self.model)  # raises with did-you-mean
        if self.tp_size is not None and (
            self.tp_size < 1 or (self.num_gpus is not None and self.num_gpus % self.tp_size)
        ):
            raise ConfigError(f"--num-gpus ({self.num_gpus}) must be a multiple of tp_size ({self.tp_size})")
        if not 0 < self.mem_fraction_static < 1:
            raise ConfigError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        if self.router_policy not in ROUTER_POLICIES:
            raise ConfigError(f"router_policy must be one of {', '.join(ROUTER_POLICIES)}")
        if self.replan_iterations < 1:
            raise ConfigError("replan_iterations must be >= 1")
        if self.speculative is not None:
            MODELS.get(self.speculative)  # raises with did-you-mean
            if self.cost_curve is not None:
                raise ConfigError(
                    "--engine-arg speculative prices the roofline profile; drop it or cost_curve"
                )
        if self.speculative_tokens < 1 or not 0.0 <= self.speculative_acceptance <= 1.0:
            raise ConfigError(
                "--engine-arg speculative_tokens must be >= 1 and speculative_acceptance in [0, 1]"
            )
        if self.speculative_max_batch is not None and self.speculative_max_batch < 1:
            raise ConfigError("--engine-arg speculative_max_batch must be >= 1 (or unset)")
        if self.resume_kv not in RESUME_KV:
            raise ConfigError(f"--engine-arg resume_kv must be one of {', '.join(RESUME_KV)}")
        check_failure_options(self.failure_rate_per_hour, self.failure_at_s, self.restart_s)
        for name in ("max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(
                    f"--engine-arg {name} must be >= 1 (or unset for SGLang's default), got {value}"
                )
        if (
            self.context_length < 2
            or self.sync_s_per_billion_params < 0
            or self.schedule_conservativeness <= 0
        ):
            raise ConfigError(
                "--engine-arg context_length must be >= 2, sync_s_per_billion_params >= 0 and "
                "schedule_conservativeness > 0"
            )


@mypyc_attr(native_class=False)  # its base (Configurable) is not compiled
class SimEngine(Configurable):
    """A simulated multi-replica SGLang deployment."""

    Config = SimEngineConfig

    def __init__(self, config: SimEngineConfig) -> None:
        self.config = config
        self.hardware: HardwareProfile = hardware_profile(config.hardware)
        self.model: ModelProfile = MODELS.get(config.model)
        gpus = config.num_gpus or self.hardware.gpus_per_node
        tp = config.tp_size if config.tp_size is not None else min(2, gpus)
        if gpus % tp:
            raise ConfigError(
                f"{gpus} GPUs do not split into engines of tp_size={tp}; set --engine-arg tp_size="
            )
        self.num_replicas = gpus // tp
        self.curve = CostCurve.load_file(config.cost_curve) if config.cost_curve is not None else None
        self.cost: CostModel | MeasuredCost | SpeculativeCost
        if self.curve is not None:  # one measured engine, with its own limits
            self.num_replicas = 1
            self.cost = MeasuredCost(self.curve)
            self.settings = ReplicaSettings(
                kv_capacity=self.curve.kv_capacity_tokens,
                max_running=config.max_running_requests or self.curve.max_running,
                chunk_tokens=config.chunked_prefill_size or self.curve.chunk_tokens,
                schedule_conservativeness=config.schedule_conservativeness,
                replan_iterations=config.replan_iterations,
                abort_extra_steps=self.curve.abort_extra_steps,
                policy="vllm" if self.curve.engine == "vllm" else "sglang",  # the measured engine's scheduler
            )
        else:
            self.cost = CostModel(self.hardware, self.model, tp=tp, graph_max_batch=config.cuda_graph_max_bs)
            if config.speculative is not None:
                self.cost = SpeculativeCost(
                    target=self.cost,
                    draft=CostModel(
                        self.hardware,
                        MODELS.get(config.speculative),
                        tp=tp,
                        graph_max_batch=config.cuda_graph_max_bs,
                    ),
                    draft_tokens=config.speculative_tokens,
                    acceptance=config.speculative_acceptance,
                    max_batch=config.speculative_max_batch,
                )
            kv = self.cost.kv_capacity_tokens(config.mem_fraction_static)
            if kv < 2:
                raise ConfigError(
                    f"{self.model.name} does not fit in {config.mem_fraction_static:.0%} of "
                    f"{self.hardware.name} memory at tp_size={tp}; raise mem_fraction_static or tp_size"
                )
            self.settings = ReplicaSettings(
                kv_capacity=kv,
                max_running=config.max_running_requests or _sglang_max_running(kv, config.context_length),
                chunk_tokens=config.chunked_prefill_size or self.hardware.chunked_prefill_tokens,
                schedule_conservativeness=config.schedule_conservativeness,
                replan_iterations=config.replan_iterations,
            )
        self._version = [0]
        self._updating = False
        self._replicas: list[SimReplica] = []
        self._tasks: list[asyncio.Task[None]] = []
        #: Shortest input seen per routing key: the prompt (a longer input resumes a partial).
        self._prompt_len: dict[str, int] = {}
        self._router = Router(config.router_policy, self.num_replicas)
        plan = FailurePlan(
            self.num_replicas,
            at_s=tuple(config.failure_at_s),
            rate_per_hour=config.failure_rate_per_hour,
            seed=config.failure_seed,
            restart_s=config.restart_s,
        )
        self.failures = SimFailures(self, plan) if plan.active else None
        self._info = EngineInfo(
            name="sim",
            simulated=True,
            produces_tokens=False,
            virtual_time=True,
            replicas=self.num_replicas,
            hardware=self.hardware.name,
            model=self.model.name,
            weight_formats=("none", "state_dict", "path"),  # timed from the model size; contents ignored
            capabilities=frozenset({FAULTS, HISTOGRAM, STATE, SATURATION, VERSIONS}),
        )
        #: Old weight versions held (consistent rollout), and those the loop asked to keep.
        self._held: set[int] = set()
        self._retained: set[int] = set()

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def version(self) -> int:
        return self._version[0]

    # The replicas and their scheduler tasks, for the failure model (april_bench/engines/sim/failures.py).
    @property
    def replicas(self) -> list[SimReplica]:
        return self._replicas

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return self._tasks

    @property
    def version_cell(self) -> list[int]:
        return self._version

    def watch_faults(self, callback: Callable[[FaultEvent], None]) -> None:
        """Simulated replica failures go to ``callback`` (as a replica pool's do:
        :class:`~april_bench.engines.protocol.FaultReport`)."""
        if self.failures is not None:
            self.failures.watch(callback)

    async def start(self) -> None:
        self._replicas = [
            SimReplica(i, self.cost, self.settings, self._version) for i in range(self.num_replicas)
        ]
        self._tasks = [asyncio.ensure_future(r.run()) for r in self._replicas]
        if self.failures is not None:
            self.failures.start()

    async def close(self) -> None:
        if self.failures is not None:
            self.failures.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if not self._tasks:
            raise EngineError("sim engine not started: call await engine.start() first")
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise EngineError("a simulated replica crashed") from task.exception()
        for req in requests:  # validate the whole batch first: nothing is submitted if one is bad
            SimReplica.check(req, self.settings)
            version = req.policy_version
            if version is not None and version != self._version[0] and version not in self._held:
                raise EngineError(
                    f"{req.request_id}: weight version {req.policy_version} is not held (current "
                    f"{self._version[0]}, old {sorted(self._held)}); retain_versions it before the update"
                )
        stream = CompletionStream(len(requests))
        if self.failures is not None:
            self.failures.catch_up()
        for req in requests:
            i = self._route(req) if self.failures is None else self.failures.route(req)
            self._replicas[i].submit(req, stream, self._cached(req))
        if self.failures is not None:
            self.failures.arm()
        return stream

    def _cached(self, req: GenerateRequest) -> int:
        """Input tokens of ``req`` whose KV is kept (``resume_kv=keep`` and a resumed partial, or a
        partial resumed on the version that computed its KV)."""
        if req.policy_version is not None and req.prefix_len > 0:
            return req.input_len - 1  # its own weights' KV, kept with them: only the last token is computed
        if self.config.resume_kv != "keep" or req.routing_key is None:
            return 0
        prompt = self._prompt_len.setdefault(req.routing_key, req.input_len)
        if req.input_len <= prompt:
            self._prompt_len[req.routing_key] = req.input_len
            return 0
        return req.input_len - 1  # prompt + partial are cached; the last token is computed to sample

    def _route(self, req: GenerateRequest) -> int:
        return self._router.route(req.routing_key, [r.outstanding for r in self._replicas])

    def route(self, req: GenerateRequest, alive: Sequence[bool]) -> int:
        """The replica for ``req`` among those ``alive`` (the failure model's re-queue)."""
        return self._router.route(req.routing_key, [r.outstanding for r in self._replicas], alive)

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        wanted = None if request_ids is None else set(request_ids)
        for replica in self._replicas:
            replica.request_abort(wanted)

    async def load(self) -> EngineLoad:
        running = waiting = used = 0
        for r in self._replicas:
            run, wait = r.load()
            running, waiting, used = running + run, waiting + wait, used + r.kv_used
        return EngineLoad(running, waiting, used, self.settings.kv_capacity * self.num_replicas)

    async def update_weights(self, update: WeightUpdate) -> None:
        """With requests in flight: every replica stops after its forward pass in progress, the
        update takes :meth:`weight_sync_time`, and in-flight requests continue with their KV kept
        (as SGLang's pause/continue generation does); their later tokens carry the new version."""
        paused = [r for r in self._replicas if r.outstanding]
        if paused:
            if self._updating:
                raise EngineError("update_weights while another update is in progress")
            self._updating = True
            # an idle replica must not start a new request meanwhile; a down one has no scheduler yet
            alive = self.failures.alive() if self.failures is not None else [True] * self.num_replicas
            paused = [r for r, up in zip(self._replicas, alive, strict=True) if up]
            await asyncio.gather(*(r.pause() for r in paused))
            for replica in paused:
                replica.stamp(self._version[0])
        try:
            await asyncio.sleep(self.weight_sync_time())
            if self.config.resume_kv == "recompute":
                self._router.forget_prefixes()  # the update flushes every prefix cache
            self._held.add(self._version[0])
            self._version[0] = update.version
            self._prune_versions()
        finally:
            for replica in paused:
                replica.resume()
            self._updating = False

    def retain_versions(self, versions: Collection[int]) -> None:
        """Keep ``versions``' weights for buffered partials; each old version held takes one weight copy
        out of every replica's KV pool (the weights are replicated per replica, like the current ones)."""
        self._retained = set(versions)
        self._prune_versions()

    def held_versions(self) -> tuple[int, ...]:
        return tuple(sorted(self._held))

    def _prune_versions(self) -> None:
        live = {
            r.request.policy_version
            for replica in self._replicas
            for r in replica._live()
            if r.request.policy_version is not None
        }
        current = self._version[0]
        self._held = {v for v in self._held if v != current and (v in self._retained or v in live)}
        copy = math.ceil(2 * self.model.total_params / self.model.kv_bytes_per_token)  # one replica's weights
        capacity = self.settings.kv_capacity - len(self._held) * copy
        if self._held and capacity < 2:
            raise EngineError(
                f"holding {len(self._held)} old weight versions of {self.model.name} leaves no KV pool on a "
                f"replica; raise mem_fraction_static or bound the partials' age (max_version_span)"
            )
        for replica in self._replicas:
            replica.kv_capacity = capacity

    #: Replica attributes that carry over from one step to the next (SGLang's adaptive new-token
    #: ratio, the decode-iteration counter, the heap's tie-break sequence).
    _REPLICA_STATE = ("ratio", "D", "_seq", "kv_used", "ctx_base")

    def simulated_work(self) -> EngineWork:
        """The work the modelled scheduler did, in the units a real engine's accounting counts
        (:class:`~april_bench.engines.protocol.EngineWork`), summed over the live replicas: what
        ``simcheck`` compares with the measured engine.  Not the ``EngineAccounting`` capability (a
        simulated run's rows stay as they were); a failed replica's passes count in
        ``engine_iterations`` only."""
        retired = self.failures.retired_passes if self.failures is not None else 0
        replicas = self._replicas
        steps = retired + sum(r.D + r.extends - r.mixed for r in replicas)
        if self.settings.policy == "vllm":  # as vLLM's stat logger counts: every step, every sampled token
            return EngineWork(
                engine_iterations=steps,
                decode_iterations=steps,
                decode_tokens=sum(r.decode_tokens + r.first_tokens for r in replicas),
                prefill_tokens=sum(r.prefill_tokens for r in replicas),
                reprefill_tokens=sum(r.reprefill_tokens for r in replicas),
            )
        return EngineWork(
            engine_iterations=steps,
            decode_iterations=sum(r.D for r in replicas),
            decode_tokens=sum(r.decode_tokens for r in replicas),
            prefill_tokens=sum(r.prefill_tokens for r in replicas),
            reprefill_tokens=sum(r.reprefill_tokens for r in replicas),
        )

    def preemptions(self) -> int:
        """Requests the replicas retracted (preempted) when their KV pool ran out."""
        return sum(r.retractions for r in self._replicas)

    def decode_histogram(self) -> dict[int, int]:
        """Decode iterations by batch size (running requests), over every replica."""
        out: dict[int, int] = {}
        for replica in self._replicas:
            for batch, n in replica.decode_batches.items():
                out[batch] = out.get(batch, 0) + n
        return out

    def forward_passes(self) -> int:
        """Forward passes run so far, over every replica: decode iterations plus extend batches."""
        retired = self.failures.retired_passes if self.failures is not None else 0
        return retired + sum(r.D + r.extends - r.mixed for r in self._replicas)

    def export_state(self) -> dict[str, Any]:
        if any(r.outstanding for r in self._replicas):
            raise EngineError("export_state while requests are in flight: it is taken between steps")
        return {
            "version": self._version[0],
            **self._router.export_state(),  # "rr" and "affinity"
            "prompt_len": dict(self._prompt_len),
            **(
                {"held_versions": sorted(self._held), "retained_versions": sorted(self._retained)}
                if self._held or self._retained
                else {}
            ),
            "replicas": [{k: getattr(r, k) for k in self._REPLICA_STATE} for r in self._replicas],
            **({} if self.failures is None else {"failures": self.failures.export_state()}),
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        self._version[0] = state["version"]
        self._router.restore_state(state)
        self._prompt_len = dict(state.get("prompt_len", {}))
        self._held = set(state.get("held_versions", ()))
        self._retained = set(state.get("retained_versions", ()))
        for replica, saved in zip(self._replicas, state["replicas"], strict=True):
            for key, value in saved.items():
                setattr(replica, key, value)
        if self.failures is not None and "failures" in state:
            self.failures.restore_state(state["failures"])
        if self._held:
            self._prune_versions()  # the pools shrink by the weight copies held

    def weight_sync_time(self) -> float:
        return self.config.sync_s_per_billion_params * self.model.total_params / 1e9

    def saturated_tokens_per_s(self, concurrency: int, mean_context: float) -> float | None:
        if concurrency <= 0:
            return None
        per_replica = math.ceil(concurrency / self.num_replicas)
        by_kv = int(self.settings.kv_capacity // max(mean_context, 1.0))
        batch = max(1, min(per_replica, self.settings.max_running, by_kv))
        return self.num_replicas * self.cost.saturated_tokens_per_s(batch, mean_context)


def build(config: SimEngineConfig, settings: EngineSettings) -> SimEngine:
    """The simulated deployment of ``config`` (``settings``' model on its hardware, SGLang's knobs
    from ``--engine-arg``), refused when the run's prompts and responses outgrow its context."""
    if settings.max_context_len > config.context_length:
        raise ConfigError(
            f"prompt + response need up to {settings.max_context_len} tokens but {config.model}'s context "
            f"holds {config.context_length}; lower --max-response-len"
        )
    return config.build()


def _sglang_max_running(kv_tokens: int, context_length: int) -> int:
    """SGLang 0.5.2 ``tp_worker``: min(pool // 2, min(max(pool / context_len * 512, 2048), 4096))."""
    pool = min(max(int(kv_tokens / context_length * 512), 2048), 4096)
    return max(1, min(kv_tokens // 2, pool))
