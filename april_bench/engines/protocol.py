"""The engine protocol: the only thing a rollout strategy knows about inference.

Five async methods and one synchronous submit are enough for every strategy in
april-bench, on the simulator and on real engines alike:

* ``generate(requests)`` submits a batch of token-id requests *before it
  returns* and gives back an async iterator that yields one final
  :class:`Completion` per request, in completion order;
* ``abort(request_ids)`` (``None`` = all) makes running requests return their
  partial tokens with ``finish_reason == "abort"``; queued requests return what
  they have (possibly nothing).  Abort may be asynchronous: a request that
  lands after the abort keeps running until it is aborted again, which is why
  the rollout loop re-aborts until the engine reports idle;
* ``update_weights(update)`` installs new weights and sets the policy version
  stamped on every token generated afterwards.  With requests in flight it
  pauses generation (between forward passes), installs, and continues: the
  in-flight requests keep their KV cache (computed by the old weights, as
  vLLM's ``pause_generation``/``resume_generation`` and SGLang's
  ``/pause_generation``/``/continue_generation`` keep it by default) and go on
  decoding with the new weights.  Their completions then report
  ``version_runs``: the policy version of every token, run-length encoded.
  An engine that cannot do this raises :class:`EngineError` instead (whether
  it can is stated once, in its registry entry: ``EngineSpec.updates_in_flight``,
  known before the engine is built);
* ``load()`` reports running and queued requests;
* ``start()`` / ``close()``.

Optional capabilities: an engine declares which of these protocols it implements in
:attr:`EngineInfo.capabilities`, and callers read them from there (``ACCOUNTING.of(engine)`` is the
engine as :class:`EngineAccounting`, or ``None``), never by probing the object.  A wrapper (a
replica, a pool) declares its own, which need not be those of what it wraps.  The conformance suite
checks that every engine declares exactly what it implements.

* :class:`SaturationModel` - ``saturated_tokens_per_s(concurrency, context)``,
  the rate a rollout would reach with no tail (the simulator knows it from its
  cost model, the embedded engine from its own measured decode steps; a real
  server engine cannot know it and does not implement it);
* :class:`EngineMetrics` - ``metrics()``, a snapshot of the engine's own
  counters and gauges (KV usage, running and waiting requests, preemptions,
  prefix-cache hits, decode steps), recorded as rows at step boundaries;
* :class:`EngineState` - ``export_state()`` / ``restore_state()``, so a resumed
  run continues an engine exactly where the interrupted one stood;
* :class:`EngineAccounting` - ``work()``, the engine's exact work counters
  (:class:`EngineWork`: forward passes, decode tokens, prefill and re-prefill
  tokens), which the rollout loop differences into every step row;
* :class:`HealthCheck` - ``health()``, a liveness probe (a server's ``/health``, a Ray actor's
  answer); the replica router (:mod:`april_bench.engines.replicas`) calls it with a timeout and
  probes an engine without it with ``load()``;
* :class:`FaultReport` - ``watch_faults(callback)``: replica failures (a pool's, the simulator's)
  reported as :class:`FaultEvent` as they happen (the arm session writes them to the events table);
* :class:`Placed` - ``placement``: where a pool's replicas run (the Ray pools), for provenance;
* :class:`Killable` - ``kill()`` / ``hang()``: a replica fault injection can stop;
* :class:`DecodeHistogram` - ``decode_histogram()``: decode steps by batch size since the engine
  started (the simulator, the embedded and vLLM engines), which ``simcheck`` compares;
* :class:`WeightVersions` - ``retain_versions(versions)``: an engine that holds more than one
  weight version, so a request may name the version it generates with
  (:attr:`GenerateRequest.policy_version`: consistent rollout finishes a partial on the version
  that began it).
* :class:`Sleepable` - ``sleep(level)`` / ``wake_up()``: an engine that releases its accelerator
  memory while a colocated trainer steps (``--colocate``: vLLM's sleep mode, SGLang's
  ``release_memory_occupation``) and refuses to generate until it wakes.

Weights reach an engine as a :class:`WeightUpdate`: an in-process state dict
(``weights``), or a checkpoint directory (``path``) for an engine in another
process.  :attr:`EngineInfo.weight_formats` says which an engine accepts.

Native engine arguments are not flattened into this interface: each engine's
``Config`` has an ``engine_args`` mapping passed unchanged to the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast, runtime_checkable

from april_bench.engines.requests import Completion, GenerateRequest, SamplingParams

__all__ = [
    "ACCOUNTING",
    "CAPABILITIES",
    "FAULTS",
    "HEALTH",
    "HISTOGRAM",
    "ITERATIONS",
    "KILL",
    "METRICS",
    "PLACEMENT",
    "SATURATION",
    "SLEEP",
    "STATE",
    "VERSIONS",
    "Capability",
    "Completion",
    "Consumable",
    "DecodeHistogram",
    "Engine",
    "EngineAccounting",
    "EngineError",
    "EngineInfo",
    "EngineLoad",
    "EngineLost",
    "EngineMetrics",
    "EngineSettings",
    "EngineState",
    "EngineWork",
    "FaultEvent",
    "FaultReport",
    "GenerateRequest",
    "HealthCheck",
    "IterationLog",
    "Killable",
    "Placed",
    "SamplingParams",
    "SaturationModel",
    "Sleepable",
    "WeightUpdate",
    "WeightVersions",
]

P = TypeVar("P")


class EngineError(RuntimeError):
    """The engine failed or broke its contract."""


class EngineLost(EngineError):
    """Every replica of the engine is gone (and none can be restarted): the run cannot go on, but what
    it completed is saved, so it ends as interrupted and ``run --resume`` continues it."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int
    waiting: int
    kv_tokens_used: int | None = None
    kv_tokens_capacity: int | None = None

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """New policy weights, stamped on every token generated afterwards.

    ``weights``: an in-process state dict (name -> tensor); ``path``: a
    checkpoint directory in Hugging Face format, for an engine in another
    process.  Both ``None``: only the version moves (the simulator, the fake).
    """

    version: int
    weights: Any = None
    path: str | None = None

    @property
    def format(self) -> str:
        """``"state_dict"``, ``"path"`` or ``"none"``: what :attr:`EngineInfo.weight_formats` lists."""
        if self.weights is not None:
            return "state_dict"
        return "path" if self.path is not None else "none"


@dataclass(frozen=True, slots=True)
class EngineInfo:
    name: str
    #: True when time and tokens come from a model of an engine, not from an engine.
    simulated: bool
    #: True when completions carry token ids and log-probs.
    produces_tokens: bool
    #: True when the engine runs on a virtual clock (the harness then uses a virtual-time loop).
    virtual_time: bool
    replicas: int = 1
    hardware: str = ""
    model: str = ""
    #: The engine package's version (``None`` for april-bench's own engines).
    version: str | None = None
    #: What ``update_weights`` accepts: ``"state_dict"``, ``"path"``, ``"none"`` (version only).
    weight_formats: tuple[str, ...] = ("state_dict", "none")
    #: The dtype the model computes in (``"float32"``, ``"bfloat16"``); ``None``: not known.  Log-probs
    #: match the trainer's only when this is the trainer's dtype.
    dtype: str | None = None
    #: The optional protocols this engine implements (:data:`CAPABILITIES`): what callers read, once.
    capabilities: frozenset[Capability[Any]] = frozenset()


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What an experiment decided for its engine; native options come separately (``--engine-arg``)."""

    #: A named architecture (``ls models``) or a checkpoint directory.
    model: str
    #: Hardware profile name (``cpu``, ``h100``, ...).
    hardware: str
    #: Prompt + response tokens one sequence may hold: the longest prompt + the response limit.
    max_context_len: int
    seed: int = 0
    #: Tokens that end a response (empty: the model's own EOS).
    eos_token_ids: tuple[int, ...] = ()
    #: Vocabulary of a named architecture built here (``None``: the architecture's own).
    vocab_size: int | None = None
    #: GPUs for rollout (``None``: one node of the hardware).
    num_gpus: int | None = None
    #: The starting weights as an in-process state dict (``None``: the model's own).
    initial_weights: Callable[[], Any] | None = None
    #: A checkpoint directory holding the starting weights, for engines in another process.
    checkpoint: Callable[[], str] | None = None
    #: The trainer shares the engine's accelerators (``--colocate``): the engine must be able to
    #: release its memory before each train step (vLLM ``--enable-sleep-mode``, SGLang
    #: ``--enable-memory-saver``) and take it back after.
    colocate: bool = False


class Consumable(Protocol):
    """What an engine's ``generate`` may return beside being an async iterator (the engines'
    :class:`~april_bench.engines.stream.CompletionStream`): ``consume`` hands every completion to
    ``on_item`` in the loop passes a task iterating the stream would, without the task (the
    simulator's hot path); the future resolves when all were handed over or at the error given to
    ``on_error``.  The rollout loop uses it when the stream has it, and ``async for`` otherwise."""

    def consume(
        self, on_item: Callable[[Completion], None], on_error: Callable[[BaseException], None]
    ) -> Any: ...


@runtime_checkable
class Engine(Protocol):
    """What the rollout loop needs from an inference engine."""

    @property
    def info(self) -> EngineInfo: ...

    async def start(self) -> None:
        """Bring the engine up (load weights, spawn servers)."""

    def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        """Submit ``requests`` now; yield one final :class:`Completion` per request as they finish."""
        ...

    async def abort(self, request_ids: Collection[str] | None = None) -> None:
        """Abort the given in-flight requests, or all of them when ``None``."""

    async def load(self) -> EngineLoad:
        """Running and queued requests right now."""
        ...

    async def update_weights(self, update: WeightUpdate) -> None:
        """Install new weights; tokens generated afterwards carry ``update.version``.  With requests
        in flight: pause, install, continue (KV kept), when the engine can
        (``EngineSpec.updates_in_flight``); otherwise raise :class:`EngineError`."""

    async def close(self) -> None:
        """Release the engine (and every process it started)."""


@runtime_checkable
class SaturationModel(Protocol):
    """Optional: an engine that knows its no-tail decode rate."""

    def saturated_tokens_per_s(self, concurrency: int, mean_context: float) -> float | None:
        """Decode tokens/s with ``concurrency`` requests always running at ``mean_context`` tokens
        of context: the rate a rollout would reach with no tail.  ``None`` when unknown."""
        ...


@runtime_checkable
class EngineMetrics(Protocol):
    """Optional: an engine that reports its own counters and gauges."""

    def metrics(self) -> dict[str, float]:
        """A snapshot: gauges (``kv_usage``, ``running``, ``waiting``) and monotonic counters
        (``preemptions``, ``prefix_cache_hits``, ``prefix_cache_queries``, ``prompt_tokens``,
        ``generation_tokens``, ``decode_steps`` ...).  Names are the engine's; cheap to call."""
        ...


@runtime_checkable
class IterationLog(Protocol):
    """Optional: an engine that logs its scheduler rounds (the hf engine), bounded, since it started.

    A round is ``(kind, batch, tokens, context, cpu_s, t, wall_s, steps)``: ``prefill`` (its forwards)
    or ``decode`` (``steps`` steps over ``batch`` requests on average, holding ``context`` tokens of
    KV), the scheduler thread's CPU seconds, the event loop's time at the round's start, the round's
    wall seconds and the decode steps it read (1 for a prefill)."""

    def iteration_count(self) -> int:
        """Rounds logged so far (the index the next round gets)."""
        ...

    def iteration_log(self, start: int = 0) -> list[tuple[Any, ...]]:
        """The rounds logged from index ``start`` on."""
        ...


@dataclass(frozen=True, slots=True)
class EngineWork:
    """Monotonic counters of the work an engine did since it started (differences give a step's).

    ``engine_iterations``: forward passes (a decode step, or one prefill forward: a chunk of an
    extend batch counts once).  ``decode_iterations`` of them decoded; ``decode_tokens``: tokens
    those decode forwards sampled (their sum of batch sizes, so ``decode_tokens /
    decode_iterations`` is the mean batch occupancy).  ``prefill_tokens``: input tokens prefilled
    (padding excluded); ``reprefill_tokens``: of them, those of resumed requests
    (:attr:`GenerateRequest.prefix_len` > 0): prompt and partial response computed once before and
    computed again.  ``deterministic``: the counts are a function of the requests and seeds alone
    (april-bench's own engines); ``False`` when they come from an engine whose schedule depends on
    timing (vLLM: its scheduler batches whatever has arrived when it steps)."""

    engine_iterations: int = 0
    decode_iterations: int = 0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    reprefill_tokens: int = 0
    deterministic: bool = True

    def minus(self, before: EngineWork) -> EngineWork:
        """The work done since ``before`` (an earlier snapshot of the same engine)."""
        return EngineWork(
            engine_iterations=self.engine_iterations - before.engine_iterations,
            decode_iterations=self.decode_iterations - before.decode_iterations,
            decode_tokens=self.decode_tokens - before.decode_tokens,
            prefill_tokens=self.prefill_tokens - before.prefill_tokens,
            reprefill_tokens=self.reprefill_tokens - before.reprefill_tokens,
            deterministic=self.deterministic and before.deterministic,
        )


@runtime_checkable
class EngineAccounting(Protocol):
    """Optional: an engine that counts its own forward passes and tokens exactly."""

    def work(self) -> EngineWork:
        """The counters now (cheap; called at step boundaries)."""
        ...


@runtime_checkable
class EngineState(Protocol):
    """Optional: an engine whose between-step state a resumed run restores (its policy version, and
    for the simulator its scheduler's adaptive state), so a resumed run continues exactly."""

    def export_state(self) -> dict[str, Any]:
        """JSON-ready state of an idle engine (called between steps)."""
        ...

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`export_state` (called after ``start()``)."""
        ...


@runtime_checkable
class HealthCheck(Protocol):
    """Optional: an engine with its own liveness probe."""

    async def health(self) -> None:
        """Return when the engine answers and is healthy; raise :class:`EngineError` when it is not.
        The caller bounds the wait: an engine that does not answer in time counts as dead."""


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """A failure-handling moment: ``t`` on the engine's loop clock."""

    kind: str
    t: float
    replica: int
    requests: int | None = None
    tokens: int | None = None
    detail: str | None = None


@runtime_checkable
class FaultReport(Protocol):
    """Optional: an engine that reports its failure handling as it happens (the replica pools, the
    simulator's replica failures)."""

    def watch_faults(self, callback: Callable[[FaultEvent], None]) -> None: ...


@runtime_checkable
class Placed(Protocol):
    """Optional: a pool that knows where its replicas run (the Ray pools): one dict per replica,
    written into the run's provenance."""

    placement: list[dict[str, Any]]


@runtime_checkable
class Killable(Protocol):
    """Optional: a replica fault injection can stop: ``kill()`` (it dies: its calls fail) or ``hang()``
    (it stops answering: only a timeout finds it)."""

    async def kill(self) -> None: ...

    async def hang(self) -> None: ...


@runtime_checkable
class WeightVersions(Protocol):
    """Optional: an engine that holds several weight versions at once (consistent rollout).

    ``update_weights`` installs a new current version; the one it replaces is kept while a request
    in flight names it or it is among the versions last passed here, and freed otherwise."""

    def retain_versions(self, versions: Collection[int]) -> None:
        """Keep these old versions' weights for requests still to come (buffered partials); free any
        other old version no request in flight uses."""

    def held_versions(self) -> tuple[int, ...]:
        """The old versions whose weights it holds now, besides the current one."""
        ...


@runtime_checkable
class DecodeHistogram(Protocol):
    """Optional: an engine that counts its decode steps by batch size (running requests)."""

    def decode_histogram(self) -> dict[int, int]:
        """Decode steps by batch size since the engine started."""
        ...


@runtime_checkable
class Sleepable(Protocol):
    """Optional: an engine that gives its accelerator memory to a colocated trainer between rollouts.

    ``sleep(level)`` releases it with nothing in flight (level 1: weights moved to host memory and
    the KV cache dropped; level 2: both dropped, the next weight update brings the weights back);
    until ``wake_up()`` the engine refuses to generate (:class:`EngineError`).  ``wake_up()`` takes
    the memory back; the session then pushes the trainer's new weights."""

    async def sleep(self, level: int) -> None: ...

    async def wake_up(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Capability(Generic[P]):
    """One optional protocol, as an engine declares it in :attr:`EngineInfo.capabilities`."""

    name: str
    #: The protocol an engine declaring this implements (the conformance suite checks it).
    protocol: type = field(compare=False, repr=False)

    def of(self, engine: Engine) -> P | None:
        """``engine`` as this protocol when its info declares it, else ``None``."""
        return cast("P", engine) if self in engine.info.capabilities else None


SATURATION: Capability[SaturationModel] = Capability("saturation", SaturationModel)
METRICS: Capability[EngineMetrics] = Capability("metrics", EngineMetrics)
STATE: Capability[EngineState] = Capability("state", EngineState)
ACCOUNTING: Capability[EngineAccounting] = Capability("accounting", EngineAccounting)
HEALTH: Capability[HealthCheck] = Capability("health", HealthCheck)
FAULTS: Capability[FaultReport] = Capability("faults", FaultReport)
PLACEMENT: Capability[Placed] = Capability("placement", Placed)
KILL: Capability[Killable] = Capability("kill", Killable)
ITERATIONS: Capability[IterationLog] = Capability("iterations", IterationLog)
VERSIONS: Capability[WeightVersions] = Capability("versions", WeightVersions)
HISTOGRAM: Capability[DecodeHistogram] = Capability("histogram", DecodeHistogram)
SLEEP: Capability[Sleepable] = Capability("sleep", Sleepable)
#: Every optional protocol an engine may declare.
CAPABILITIES: tuple[Capability[Any], ...] = (
    SATURATION,
    METRICS,
    STATE,
    ACCOUNTING,
    HEALTH,
    FAULTS,
    PLACEMENT,
    KILL,
    ITERATIONS,
    VERSIONS,
    HISTOGRAM,
    SLEEP,
)
