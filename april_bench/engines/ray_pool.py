"""``ray`` and ``ray-fake``: engine replicas as Ray actors on one or more nodes, behind one router.

Each replica is an async Ray actor that builds a registered engine from the run's
:class:`EngineSettings` and the ``--engine-arg`` options the pool does not own: for ``ray`` the
``engine`` option chooses it (``hf``, the default; ``vllm``; ``sglang``; ``sglang-fake``), for
``ray-fake`` it is ``fake``.  A ``vllm`` replica is vLLM's OpenAI-compatible server and an
``sglang`` one SGLang's server, each launched by its actor on the actor's node (a child process,
so it sees the GPUs Ray gave the actor's bundle: ``CUDA_VISIBLE_DEVICES``), with ``tp`` GPUs of
tensor parallelism inside it (``--tensor-parallel-size`` / ``--tp-size``).  Server replicas load
the run's starting checkpoint and every later one from a directory the driver writes: on several
machines it must be on storage every node reads.  The pool is the engine the rollout loop sees:

* ``generate`` routes every request with :class:`~april_bench.engines.routing.Router` (the
  simulator's policies) on the driver's count of each replica's outstanding requests, and submits
  each replica's share in one actor call; one pump task per replica long-polls its finished
  completions and delivers them to the caller's stream;
* ``abort``, ``load`` and ``update_weights`` go to every replica; new weights are put in Ray's object
  store once and every replica reads them from there (a broadcast, not one copy per replica);
* replicas are placed with a placement group: ``PACK`` (fill a node first) or ``SPREAD`` (one per
  node where there are several), one bundle of ``num_cpus`` / ``num_gpus`` per replica;
* ``sleep`` / ``wake_up`` (``--colocate``) go to every replica whose engine can release its memory.

Ray is imported only when the pool starts.  Checked against ray 2.60.0: async actors
(``@ray.remote`` on a class with ``async def`` methods), awaiting ``ObjectRef`` in asyncio,
``ray.util.placement_group`` and ``PlacementGroupSchedulingStrategy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.engines.protocol import (
    FAULTS,
    HEALTH,
    KILL,
    PLACEMENT,
    SLEEP,
    STATE,
    Completion,
    Engine,
    EngineError,
    EngineInfo,
    EngineLoad,
    EngineSettings,
    GenerateRequest,
    WeightUpdate,
)
from april_bench.engines.replicas import FaultOptions, ReplicaRouter, RouterFront
from april_bench.engines.routing import ROUTER_POLICIES
from april_bench.engines.stream import CompletionStream
from april_bench.registry import Spec

__all__ = [
    "REPLICA_ENGINES",
    "SERVER_ENGINES",
    "RayEnginePool",
    "build_fake_pool",
    "build_pool",
    "check_pool",
    "pool_config",
    "portable_settings",
]


#: The engines a ``ray`` pool's replicas may run (``--engine-arg engine``); ``ray-fake`` runs ``fake``.
REPLICA_ENGINES = ("hf", "vllm", "sglang", "sglang-fake")
#: Those whose replicas are servers launched by the actor (tensor parallel inside, weights from a path).
SERVER_ENGINES = ("vllm", "sglang")
#: Seconds a server replica's actor gets to stop its server (SIGTERM, then SIGKILL after 30 s) before
#: the actor itself is killed.
SERVER_STOP_S = 45.0


class RayEnginePool(RouterFront, Configurable):
    """``replicas`` engines as Ray actors behind the replica router (:mod:`.replicas`)."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        engine: str = param("hf", help=f"the engine each replica runs: {', '.join(REPLICA_ENGINES)}")
        replicas: int = param(2, help="engine replicas (Ray actors)")
        tp: int = param(1, help="tensor-parallel GPUs inside each vllm or sglang replica (<= num_gpus)")
        router_policy: str = param("cache_aware", help=f"request routing: {', '.join(ROUTER_POLICIES)}")
        address: str | None = param(None, help="Ray cluster address (None: join or start a local one)")
        num_cpus: float = param(0.5, help="CPUs each replica reserves (each arm holds its own replicas)")
        num_gpus: float = param(0.0, help="GPUs each replica reserves (tensor-parallel size on GPU)")
        placement: str = param(
            "PACK", help="placement-group strategy: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD"
        )
        weights: str = param(
            "collective",
            help="how new weights reach the replicas: collective (a gloo broadcast from the trainer's "
            "rank 0 to every replica) or object_store (a state dict put in Ray's object store)",
        )
        placement_timeout_s: float = param(120.0, help="seconds to wait for Ray to place the replicas")
        faults: FaultOptions = param(help="failure handling and chaos", default_factory=FaultOptions)
        engine_args: Mapping[str, Any] = param(help="options of each replica's engine", default_factory=dict)

        def __post_init__(self) -> None:
            if self.replicas < 1:
                raise ConfigError(f"--engine-arg replicas must be >= 1, got {self.replicas}")
            if self.router_policy not in ROUTER_POLICIES:
                raise ConfigError(f"--engine-arg router_policy must be one of {', '.join(ROUTER_POLICIES)}")
            if self.placement not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
                raise ConfigError("--engine-arg placement must be PACK, SPREAD, STRICT_PACK or STRICT_SPREAD")
            if self.weights not in ("collective", "object_store"):
                raise ConfigError("--engine-arg weights must be collective or object_store")
            if self.tp < 1:
                raise ConfigError(f"--engine-arg tp must be >= 1, got {self.tp}")
            if self.tp > 1 and self.engine not in SERVER_ENGINES:
                raise ConfigError(
                    f"--engine-arg tp: only {' and '.join(SERVER_ENGINES)} replicas shard a model"
                )
            if self.tp > 1 and self.num_gpus < self.tp:
                raise ConfigError(
                    f"--engine-arg tp={self.tp} needs num_gpus >= {self.tp} per replica (its bundle's GPUs)"
                )

    def __init__(self, config: Config, *, replica: Spec, settings: EngineSettings, simulated: bool) -> None:
        self.config = config
        self._replica_spec = replica
        self._settings = settings
        self._simulated = simulated
        self._group: Any = None
        info = EngineInfo(
            name=f"ray:{config.engine}",
            simulated=simulated,
            produces_tokens=True,
            virtual_time=False,
            replicas=config.replicas,
            hardware=settings.hardware,
            model=settings.model,
            capabilities=frozenset({FAULTS, PLACEMENT, STATE, SLEEP}),
        )
        self._router = ReplicaRouter(
            make=self._replica,
            replicas=config.replicas,
            policy=config.router_policy,
            faults=config.faults,
            info=info,
        )
        #: Where each replica runs: ``{"replica", "node_id", "node_ip", "bundle"}`` (provenance).
        self.placement: list[dict[str, Any]] = []
        self._actors: dict[int, Any] = {}  # each replica's current actor
        self._weight_group: dict[int, Any] = {}  # the actors that joined the weight group, by replica
        #: Each replica's receiving workers, as its actor reported when it started (none for a replica
        #: whose engine cannot receive over a weight group).
        self._receives: dict[int, tuple[int, bool]] = {}  # (ranks, whether its server's workers)

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        if not ray.is_initialized():
            ray.init(address=self.config.address, include_dashboard=False, log_to_driver=False)
        bundle = {
            "CPU": self.config.num_cpus,
            **({"GPU": self.config.num_gpus} if self.config.num_gpus else {}),
        }
        self._group = placement_group([bundle] * self.config.replicas, strategy=self.config.placement)
        try:
            await asyncio.wait_for(self._group.ready(), timeout=self.config.placement_timeout_s)
        except TimeoutError:
            ray.util.remove_placement_group(self._group)
            self._group = None
            raise EngineError(
                f"Ray cannot place {self.config.replicas} replicas of {bundle} ({self.config.placement}) "
                f"within {self.config.placement_timeout_s:g} s; free now: {ray.available_resources()}. "
                "Every arm holds its own replicas: lower --engine-arg num_cpus / num_gpus or add nodes"
            ) from None
        first = await self._router.start()
        self._router.describe(
            weight_formats=first.weight_formats, version=first.version, simulated=self._simulated
        )

    async def _replica(self, index: int) -> Engine:
        """A started replica actor in bundle ``index`` (a restart takes the dead one's bundle)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor: Any = ray.remote(ReplicaActor)
        handle = actor.options(
            num_cpus=self.config.num_cpus,
            num_gpus=self.config.num_gpus,
            max_restarts=0,  # the router restarts a replica (and gives it the current weights)
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._group, placement_group_bundle_index=index
            ),
        ).remote(index, self._replica_spec, self._settings, dict(self.config.engine_args))
        replica = RayReplica(handle, index, server=self.config.engine in SERVER_ENGINES)
        await replica.start()
        self._actors[index] = handle  # a restart replaces it: the weight group is formed again
        workers: tuple[int, bool] | None = await handle.weight_workers.remote()
        if workers is not None:
            self._receives[index] = workers
        where = await handle.node.remote()
        self.placement = [p for p in self.placement if p["replica"] != index]
        self.placement.append({"replica": index, "bundle": index, **where})
        self.placement.sort(key=lambda p: p["replica"])
        self._router.record("replica_placed", index, f"node {where['node_ip']} {where['node_id']}")
        return replica

    async def close(self) -> None:
        import ray

        await self._router.close()
        if self._group is not None:
            ray.util.remove_placement_group(self._group)
            self._group = None

    # The replicas' states live in their actors; the checkpoint keeps the chaos schedule's progress, so
    # a resumed run does not kill a replica again at a token count it already passed.
    def export_state(self) -> dict[str, Any]:
        return {"chaos": self._router.chaos_state()}

    def restore_state(self, state: dict[str, Any]) -> None:
        self._router.restore_chaos(state.get("chaos"))

    # ------------------------------------------------------------ requests
    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        if self._group is None:
            raise EngineError("ray engine pool not started: call await engine.start() first")
        return self._router.generate(requests)

    async def sleep(self, level: int) -> None:
        """Every replica releases its accelerator memory (``--colocate``)."""
        await self._router.sleep(level)

    async def wake_up(self) -> None:
        await self._router.wake_up()

    async def update_weights(self, update: WeightUpdate) -> None:
        """The same update on every replica; a state dict travels through the object store once (and a
        restarted replica reads it from there too)."""
        import ray

        if update.weights is not None:
            update = dataclasses.replace(update, weights=ray.put(update.weights))
        await self._router.update_weights(update)

    # ------------------------------------------------------------ weights over a process group
    # (april_bench.collective.WeightReceivers: the trainer side broadcasts, each replica is a receiver)
    # A replica's ranks: an hf replica's actor receives itself (one rank); a server replica's workers
    # receive (``collective.EngineWorkers``: tp ranks), and replica 0's actor takes one more rank to keep
    # a copy in the object store, where a replica restarted later reads it (the router remembers it).
    def weight_receivers(self) -> int:
        if self.config.weights != "collective" or len(self._receives) < self.config.replicas:
            return 0  # some replica cannot receive: weights go by the object store or a checkpoint
        return sum(self._ranks(i) for i in range(self.config.replicas))

    def _ranks(self, replica: int) -> int:
        workers, by_server = self._receives.get(replica, (1, False))
        return workers + (1 if replica == 0 and by_server else 0)

    def weight_group_current(self) -> bool:
        return bool(self._weight_group) and self._weight_group == self._actors

    def weight_wire(self) -> str:
        """SGLang servers take SGLang's wire (``collective.weight_wire``); every other replica ours."""
        return "per_tensor" if self.config.engine in ("sglang", "sglang-fake") else "flat"

    async def join_weight_group(self, address: str, first: int, world: int, backend: str) -> None:
        """Every replica's receivers join the weight group at ``address``, replica ``i``'s from rank
        ``first`` + the ranks of replicas ``0..i-1``."""
        actors = dict(self._actors)
        starts = [first + sum(self._ranks(j) for j in range(i)) for i in range(self.config.replicas)]
        await asyncio.gather(
            *(
                a.join_weight_group.remote(address, starts[i], world, backend, i == 0)
                for i, a in sorted(actors.items())
            )
        )
        self._weight_group = actors

    async def receive_weights(self, version: int, header: dict[str, list[Any]] | None = None) -> None:
        """Every replica receives one broadcast and installs it as ``version``; replica 0's actor also
        puts it in the object store, where a replica restarted later reads it."""
        refs = await asyncio.gather(
            *(
                a.receive_weights.remote(version, i == 0, header)
                for i, a in sorted(self._weight_group.items())
            )
        )
        self._router.remember(WeightUpdate(version=version, weights=refs[0]))


class RayReplica:
    """One replica actor as an engine (the router's view of it): a pump long-polls its finished
    completions; a dead actor fails every stream it holds; ``health()`` asks the actor to answer."""

    def __init__(self, actor: Any, index: int, *, server: bool = False) -> None:
        self.actor = actor
        self.index = index
        #: Its engine is a server process the actor launched, in a session of its own: killing the
        #: actor would leave it running (and holding its GPUs), so a kill asks the actor to stop it first.
        self.server = server
        self._streams: dict[str, CompletionStream] = {}
        self._pump: asyncio.Task[None] | None = None
        self._info: EngineInfo | None = None

    @property
    def info(self) -> EngineInfo:
        assert self._info is not None, "start() first"
        return self._info

    async def start(self) -> None:
        info: EngineInfo = await self.actor.start.remote()
        # the replica's own capabilities, not its engine's: the actor answers probes and can be killed;
        # it sleeps when its engine does
        sleeps = info.capabilities & {SLEEP}
        self._info = dataclasses.replace(info, capabilities=frozenset({HEALTH, KILL, *sleeps}))
        self._pump = asyncio.ensure_future(self._poll())

    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        stream = CompletionStream(len(requests))
        for req in requests:
            self._streams[req.request_id] = stream
        self.actor.submit.remote(list(requests))  # Ray runs one caller's calls to an actor in order
        return stream

    async def _poll(self) -> None:
        while True:
            try:
                finished: list[Completion] = await self.actor.poll.remote()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the actor died or its engine failed: fail its callers
                error = EngineError(f"ray replica {self.index} failed: {exc}")
                for stream in set(self._streams.values()):
                    stream.fail(error)
                self._streams.clear()
                return
            for completion in finished:
                if completion.request_id in self._streams:
                    self._streams.pop(completion.request_id).deliver(completion)

    async def health(self) -> None:
        await self.actor.load.remote()  # a dead actor raises; a hung one never answers (the caller's timeout)

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        await self.actor.abort.remote(None if request_ids is None else list(request_ids))

    async def load(self) -> EngineLoad:
        load: EngineLoad = await self.actor.load.remote()
        return load

    async def update_weights(self, update: WeightUpdate) -> None:
        # the state dict's ObjectRef travels as a top-level argument: Ray resolves it in the actor
        await self.actor.update_weights.remote(dataclasses.replace(update, weights=None), update.weights)

    async def sleep(self, level: int) -> None:
        await self.actor.sleep.remote(level)

    async def wake_up(self) -> None:
        await self.actor.wake_up.remote()

    async def close(self) -> None:
        import ray

        if self._pump is not None:
            self._pump.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.actor.close.remote(), 30.0)
        ray.kill(self.actor, no_restart=True)

    async def kill(self) -> None:
        """Fault injection, and the end of a dead replica: the actor process is killed (its pending calls
        raise ``RayActorError``); a server replica's actor first stops its server, if it still answers."""
        import ray

        if self.server:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.actor.close.remote(), SERVER_STOP_S)
        ray.kill(self.actor, no_restart=True)

    async def hang(self) -> None:
        """Fault injection: the actor's event loop blocks, so nothing it is asked returns."""
        self.actor.hang.remote()


class ReplicaActor:
    """One replica (runs inside a Ray actor): a registered engine (its spec) and a queue of its
    completions."""

    def __init__(self, index: int, engine: Spec, settings: EngineSettings, args: dict[str, Any]) -> None:
        self.index = index
        self.engine: Engine = engine.build(settings, args)
        self._finished: list[Completion] = []
        self._ready: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._consumers: set[asyncio.Task[None]] = set()
        self._weights: Any = None  # the weight group, once joined (april_bench.collective.WeightGroup)

    async def start(self) -> EngineInfo:
        """Start the engine; its info, with ``state_dict`` among its weight formats when this actor can
        install a state dict on its workers (:meth:`update_weights`)."""
        from april_bench.collective import EngineWorkers

        self._ready = asyncio.Event()
        await self.engine.start()
        info = self.engine.info
        if isinstance(self.engine, EngineWorkers) and "state_dict" not in info.weight_formats:
            info = dataclasses.replace(info, weight_formats=("state_dict", *info.weight_formats))
        return info

    async def weight_workers(self) -> tuple[int, bool] | None:
        """How many ranks this replica's engine receives on, and whether they are its server's
        workers (else this actor receives: an engine in it that takes a state dict); None when it
        cannot receive."""
        from april_bench.collective import EngineWorkers

        if isinstance(self.engine, EngineWorkers):
            return self.engine.weight_workers(), True
        return (1, False) if "state_dict" in self.engine.info.weight_formats else None

    async def submit(self, requests: list[GenerateRequest]) -> None:
        stream = self.engine.generate(requests)
        task = asyncio.ensure_future(self._consume(stream))
        self._consumers.add(task)
        task.add_done_callback(self._consumers.discard)

    async def _consume(self, stream: AsyncIterator[Completion]) -> None:
        assert self._ready is not None
        try:
            async for completion in stream:
                self._finished.append(completion)
                self._ready.set()
        except Exception as exc:
            self._error = exc
            self._ready.set()

    async def poll(self) -> list[Completion]:
        """Completions finished since the last poll (waits for at least one)."""
        assert self._ready is not None
        await self._ready.wait()
        self._ready.clear()
        if self._error is not None:
            raise EngineError(f"replica {self.index}: {self._error}") from self._error
        finished, self._finished = self._finished, []
        return finished

    async def abort(self, request_ids: list[str] | None) -> None:
        await self.engine.abort(request_ids)

    async def load(self) -> EngineLoad:
        return await self.engine.load()

    async def update_weights(self, update: WeightUpdate, weights: Any) -> None:
        # ``weights`` came in as a top-level argument: Ray resolved it from the object store
        from april_bench.collective import EngineWorkers

        engine = self.engine
        if (
            weights is not None
            and isinstance(engine, EngineWorkers)
            and "state_dict" not in engine.info.weight_formats
        ):
            await self._install(engine, update.version, weights)
            return
        await self.engine.update_weights(dataclasses.replace(update, weights=weights))

    async def _install(self, engine: Any, version: int, state: Any) -> None:
        """A state dict onto a server's workers: a weight group of this actor (rank 0, on this node)
        and the workers, one broadcast (the object-store path, and a restarted replica's weights)."""
        from april_bench.collective import WeightGroup, header, host_address, weight_wire

        address = host_address()
        world = 1 + engine.weight_workers()
        sender, _ = await asyncio.gather(
            asyncio.to_thread(WeightGroup, address, 0, world),
            engine.join_weight_group(address, 1, world, "gloo"),
        )
        if weight_wire(engine) == "per_tensor":  # SGLang's wire
            await asyncio.gather(
                asyncio.to_thread(sender.send_each, state), engine.receive_weights(version, header(state))
            )
        else:
            await asyncio.gather(asyncio.to_thread(sender.send, state), engine.receive_weights(version))
        sender.close()
        self._weights = None  # the workers left the pool's weight group for this one

    async def join_weight_group(self, address: str, first: int, world: int, backend: str, keep: bool) -> None:
        """This replica's receivers join from rank ``first``: its engine's workers (a server's), and
        with ``keep`` this actor after them (it keeps a copy); an engine in this actor: the actor."""
        from april_bench.collective import EngineWorkers, WeightGroup

        if isinstance(self.engine, EngineWorkers):
            mine = first + self.engine.weight_workers()
            joins: list[Awaitable[Any]] = [self.engine.join_weight_group(address, first, world, backend)]
            if keep:
                joins.append(asyncio.to_thread(WeightGroup, address, mine, world, backend=backend))
            joined = await asyncio.gather(*joins)
            self._weights = joined[1] if keep else None
            return
        self._weights = await asyncio.to_thread(WeightGroup, address, first, world, backend=backend)

    async def receive_weights(self, version: int, keep: bool, header: dict[str, list[Any]] | None) -> Any:
        """One broadcast received (in a thread: the engine keeps generating meanwhile) and installed;
        with ``keep``, its object-store reference for a replica restarted later.  ``header``: SGLang's
        wire (one broadcast per tensor, these names, dtypes and shapes)."""
        import ray

        from april_bench.collective import EngineWorkers

        def receive() -> Any:
            return self._weights.receive_each(**header) if header is not None else self._weights.receive()

        if isinstance(self.engine, EngineWorkers):
            got = await asyncio.gather(
                self.engine.receive_weights(version, header),
                *([asyncio.to_thread(receive)] if keep else []),
            )
            return ray.put(got[1]) if keep else None
        state = await asyncio.to_thread(self._weights.receive)
        await self.engine.update_weights(WeightUpdate(version=version, weights=state))
        return ray.put(state) if keep else None

    async def sleep(self, level: int) -> None:
        await self._sleeper().sleep(level)

    async def wake_up(self) -> None:
        await self._sleeper().wake_up()

    def _sleeper(self) -> Any:
        sleeper = SLEEP.of(self.engine)
        if sleeper is None:
            raise EngineError(
                f"replica {self.index}: engine {self.engine.info.name} cannot release its memory"
            )
        return sleeper

    async def node(self) -> dict[str, Any]:
        """Where this actor runs (the placement written into provenance)."""
        import ray

        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address()}

    async def hang(self) -> None:
        """Fault injection: block this actor's event loop, so it answers nothing (a hung engine)."""
        import time

        while True:
            time.sleep(3600)

    async def close(self) -> None:
        for task in list(self._consumers):
            task.cancel()
        await self.engine.close()


# ---------------------------------------------------------------- wiring
@dataclass(frozen=True, slots=True)
class _Value:
    """A picklable stand-in for a settings callable: returns what the callable returned."""

    value: Any

    def __call__(self) -> Any:
        return self.value


def portable_settings(settings: EngineSettings, *, weights: bool, checkpoint: bool = False) -> EngineSettings:
    """``settings`` as they pickle to the actors: the starting weights evaluated once here (when the
    replicas' engine loads them: ``weights``), the checkpoint directory written once here when the
    replicas' servers load it (``checkpoint``: vllm, sglang) and dropped otherwise (hf and fake never
    read it; evaluating it may write a random multi-GB checkpoint)."""
    start = settings.initial_weights if weights else None
    directory = settings.checkpoint if checkpoint else None
    return dataclasses.replace(
        settings,
        initial_weights=None if start is None else _Value(start()),
        checkpoint=None if directory is None else _Value(directory()),
    )


def _replica_spec(wanted: str, parts: Sequence[Spec]) -> Spec:
    """The part the pool's ``engine`` option names."""
    names = [p.name for p in parts]
    if wanted not in names:
        if len(names) == 1:
            raise ConfigError(f"--engine-arg engine: this pool always runs {names[0]!r} replicas")
        raise ConfigError(f"--engine-arg engine must be one of {', '.join(names)}, got {wanted!r}")
    return parts[names.index(wanted)]


def pool_config(
    config: RayEnginePool.Config, settings: EngineSettings, *, parts: Sequence[Spec]
) -> RayEnginePool.Config:
    """The pool's Config (its own options; every other ``--engine-arg`` in ``engine_args``, for each
    replica's engine: the registered engine in ``parts`` that ``engine`` names) made ready for its
    replicas: server replicas launch their own servers, with the pool's ``tp``; the replicas' options
    are checked by their engine's entry before any actor starts."""
    replica = _replica_spec(config.engine, parts)
    inner = dict(config.engine_args)
    if replica.name in SERVER_ENGINES:
        if "url" in inner:
            raise ConfigError("--engine-arg url: Ray replicas launch their own servers (drop url)")
        inner = {**inner, **({"server": True} if replica.name == "vllm" else {})}
        if config.tp > 1:
            inner[{"vllm": "tensor_parallel_size", "sglang": "tp_size"}[replica.name]] = config.tp
        config = config.replace(engine_args=inner)
    if settings.colocate and not getattr(replica, "sleeps", False):
        raise ConfigError(
            f"--colocate: {replica.name} replicas cannot release their memory; use engine=vllm or sglang"
        )
    replica.check(settings, inner)
    return config


def build_pool(
    config: RayEnginePool.Config, settings: EngineSettings, *, parts: Sequence[Spec]
) -> RayEnginePool:
    """Replicas of the engine ``--engine-arg engine`` names among ``parts`` (``hf`` by default)."""
    config = pool_config(config, settings, parts=parts)
    replica = _replica_spec(config.engine, parts)
    portable = portable_settings(
        settings, weights=replica.name == "hf", checkpoint=replica.name in SERVER_ENGINES
    )
    pool: RayEnginePool = config.build(
        replica=replica, settings=portable, simulated=bool(getattr(replica, "simulated", False))
    )
    return pool


def build_fake_pool(
    config: RayEnginePool.Config, settings: EngineSettings, *, parts: Sequence[Spec]
) -> RayEnginePool:
    """Replicas of the ``fake`` engine (``parts``: its spec), on the real clock (each replica's own
    loop)."""
    pool: RayEnginePool = pool_config(config, settings, parts=parts).build(
        replica=parts[0], settings=portable_settings(settings, weights=False), simulated=True
    )
    return pool


def check_pool(config: RayEnginePool.Config, settings: EngineSettings, *, parts: Sequence[Spec]) -> None:
    pool_config(config, settings, parts=parts)
