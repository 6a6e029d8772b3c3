"""The engine protocol's promises, checked on every engine: fakes, embedded hf, vLLM, SGLang.

One started engine per kind serves the module (see ``conftest.py``); the last
claim closes it.  Requests that must run long replay a length (``replay_len``)
so a random model's EOS cannot end them early; two requests run at once and
the rest queue.
"""

from __future__ import annotations

import asyncio
import math
import os
import time

from conformance_engines import MAX_RUNNING, EngineHost, descendants

from april_bench.engines.protocol import (
    CAPABILITIES,
    METRICS,
    Completion,
    Engine,
    GenerateRequest,
    SamplingParams,
    WeightUpdate,
)
from april_bench.results.recorder import RunRecorder
from april_bench.rollout.loop import RolloutConfig
from april_bench.types import FinishReason
from april_bench.workload import ScriptedWorkload
from april_impl import AprilStrategy

PROMPT = (5, 6, 7, 8)


def request(
    rid: str, budget: int, *, seed: int | None = 1, ids: tuple[int, ...] = PROMPT, replay: int | None = None
) -> GenerateRequest:
    return GenerateRequest(rid, len(ids), budget, SamplingParams(seed=seed), input_ids=ids, replay_len=replay)


async def collect(engine: Engine, requests: list[GenerateRequest]) -> dict[str, Completion]:
    done: dict[str, Completion] = {}
    async for completion in engine.generate(requests):
        assert completion.request_id not in done, f"{completion.request_id} returned twice"
        done[completion.request_id] = completion
    assert set(done) == {r.request_id for r in requests}
    return done


def well_formed(c: Completion) -> None:
    assert c.output_ids is not None and c.logprobs is not None
    assert c.num_tokens == len(c.output_ids) == len(c.logprobs)
    assert all(isinstance(t, int) and t >= 0 for t in c.output_ids)
    assert all(lp <= 0 and math.isfinite(lp) for lp in c.logprobs)


async def current_version(engine: Engine) -> int:
    """The policy version the engine stamps now (earlier claims may have moved it)."""
    done = await collect(engine, [request("version-probe", 1)])
    return done["version-probe"].policy_version


async def until(engine: Engine, running: int, waiting: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        load = await engine.load()
        if (load.running, load.waiting) == (running, waiting):
            return
        assert time.monotonic() < deadline, f"load stayed {load}, wanted {running} running, {waiting} waiting"
        await asyncio.sleep(0.02)


async def generated_tokens(engine: Engine) -> float | None:
    """The engine's own count of tokens it decoded (``None`` where it reports none)."""
    await engine.load()  # a server's metrics are read with its load
    reporting = METRICS.of(engine)
    return None if reporting is None else reporting.metrics().get("generation_tokens")


async def until_decoded(engine: Engine, before: float | None, tokens: int, timeout: float = 120) -> None:
    """Until the engine's own count shows ``tokens`` more decoded than ``before`` (a fixed sleep is a
    race on a loaded machine, where a step can take longer than the sleep); a short pause where the
    engine counts nothing."""
    if before is None:
        await asyncio.sleep(0.3)
        return
    deadline = time.monotonic() + timeout
    while (await generated_tokens(engine) or 0) < before + tokens:
        assert time.monotonic() < deadline, f"the engine decoded fewer than {tokens} tokens in {timeout} s"
        await asyncio.sleep(0.02)


async def until_steady(engine: Engine, quiet: float = 0.5, timeout: float = 60) -> float | None:
    """The engine's decoded-token count once it stays the same for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last = await generated_tokens(engine)
    while True:
        await asyncio.sleep(quiet)
        now = await generated_tokens(engine)
        if now == last:
            return now
        assert time.monotonic() < deadline, f"the engine kept decoding after the abort ({last} -> {now})"
        last = now


async def until_idle(engine: Engine, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (await engine.load()).idle:
        assert time.monotonic() < deadline, "the engine did not become idle"
        await asyncio.sleep(0.02)


# ----------------------------------------------------------------------------- capabilities
def test_the_engine_declares_exactly_the_optional_protocols_it_implements(host: EngineHost) -> None:
    # Callers read capabilities from EngineInfo, never probe the object: a missing declaration would
    # silently drop a feature (no work counters, no resume state), a false one would crash a caller.
    engine = host.engine
    assert engine is not None
    implemented = {c.name for c in CAPABILITIES if isinstance(engine, c.protocol)}
    assert {c.name for c in engine.info.capabilities} == implemented


# ----------------------------------------------------------------------------- ids, seeds, budgets
def test_every_request_returns_once_under_its_id_with_its_seeds_tokens(host: EngineHost) -> None:
    async def body() -> None:
        engine = host.engine
        assert engine is not None
        done = await collect(
            engine,
            [request("same-a", 12, seed=7), request("same-b", 12, seed=7), request("other", 12, seed=8)],
        )
        for c in done.values():
            well_formed(c)
        if host.kind.seeded:
            assert done["same-a"].output_ids == done["same-b"].output_ids
            again = await collect(engine, [request("again", 12, seed=8)])
            assert again["again"].output_ids == done["other"].output_ids
            assert done["other"].output_ids != done["same-a"].output_ids

    host.run(body)


def test_budgets_and_replayed_lengths_are_honoured(host: EngineHost) -> None:
    async def body() -> None:
        engine = host.engine
        assert engine is not None
        done = await collect(engine, [request("budget", 5), request("replay", 20, replay=3)])
        budget, replay = done["budget"], done["replay"]
        assert budget.num_tokens <= 5
        if budget.finish_reason is FinishReason.LENGTH:
            assert budget.num_tokens == 5
        else:  # an EOS came first
            assert budget.finish_reason is FinishReason.STOP
        assert (replay.num_tokens, replay.finish_reason) == (3, FinishReason.STOP)

    host.run(body)


#: Longer than vLLM's 128-token CPU KV block: its prefix cache holds whole blocks of such a prompt.
LONG_PROMPT = tuple(5 + (7 * j) % 50 for j in range(200))


def trainer_gaps(
    checkpoint: str, requests: list[GenerateRequest], done: dict[str, Completion]
) -> list[float]:
    """``|engine - trainer|`` log-prob per generated token: the trainer's float32 ``token_logprobs``
    of ``checkpoint`` at each request's temperature."""
    import torch

    from april_bench.models.zoo import build_model
    from april_bench.trainers.logprobs import token_logprobs

    model = build_model(checkpoint)
    gaps = []
    for r in requests:
        c = done[r.request_id]
        assert r.input_ids is not None and c.output_ids is not None and c.logprobs is not None
        ids = torch.tensor([[*r.input_ids, *c.output_ids]])
        with torch.no_grad():
            ours, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=r.sampling.temperature)
        gaps += [
            abs(a - b) for a, b in zip(ours[0, len(r.input_ids) - 1 :].tolist(), c.logprobs, strict=True)
        ]
    assert len(gaps) == sum(done[r.request_id].num_tokens for r in requests) > 0
    return gaps


def test_logprobs_are_the_trainers_when_the_engine_computes_in_its_dtype(host: EngineHost) -> None:
    # The engine-trainer log-prob gap of a run is numerics only when the dtypes match: vLLM in
    # bfloat16 is ~1e-3 off (benchmarks/vllm_logprob_gap.py), in float32 ~1e-7.
    if not host.kind.float32:
        return
    temperature = 0.8  # the rollout default: log-probs are of the tempered distribution
    prompts = [(5, 6, 7, 8, 9, 10), (11, 12, 13, 14, 15, 16), LONG_PROMPT]
    requests = [
        GenerateRequest(
            f"lp-{i}",
            len(ids),
            24,
            SamplingParams(temperature=temperature, seed=i),
            input_ids=ids,
            replay_len=24,
        )
        for i, ids in enumerate(prompts)
    ]

    async def body() -> dict[str, Completion]:
        assert host.engine is not None
        return await collect(host.engine, requests)

    # the weights the engine serves until the weight claim
    gaps = trainer_gaps(host.checkpoints[0], requests, host.run(body))
    assert sum(gaps) / len(gaps) < 1e-5 and max(gaps) < 1e-4, (sum(gaps) / len(gaps), max(gaps))


# ----------------------------------------------------------------------------- abort
#: As long as tiny32 allows (1,024 positions); vLLM's server still decodes it in ~1 s at load 5.
LONG = 1000


def test_abort_returns_partials_of_running_and_nothing_of_queued_requests(host: EngineHost) -> None:
    """Four requests on an engine with two slots, aborted together once the engine has decoded a
    quarter of one budget.  Every claim holds for any timing, so nothing polls for a passing load: a
    fast engine on a loaded machine may finish a running request before the abort lands (vLLM's server
    decodes ~1,000 tokens/s of ``tiny32``), and then a queued request takes its slot and returns a
    partial of its own.  What may never happen: tokens of a request that got no slot (more requests
    with tokens than slots plus finished requests), a partial as long as its budget, an engine that
    goes on decoding, or tokens the engine did not decode."""
    budget = LONG
    queued = 2

    async def body() -> None:
        engine = host.engine
        assert engine is not None
        # a cold server's first requests are slow to report (vLLM's /metrics answered only once four
        # tiny32 requests were decoded in full): warm it, so the abort lands on requests in flight
        await collect(engine, [request("abort-warmup", 8)])
        requests = [request(f"long-{i}", budget, seed=i, replay=budget) for i in range(MAX_RUNNING + queued)]
        before = await generated_tokens(engine)
        stream = engine.generate(requests)
        # the running ones decode: the engine's own count only grows, so a late answer only delays the
        # abort (far more tokens than the few a server has decoded but not yet streamed at a hang-up)
        await until_decoded(engine, before if host.kind.live_token_count else None, budget // 4)
        await engine.abort(None)
        done = {c.request_id: c async for c in stream}
        await until_idle(engine)
        generated = await until_steady(engine)
        assert set(done) == {r.request_id for r in requests}
        for c in done.values():
            well_formed(c)
        finished = [c for c in done.values() if c.finish_reason is not FinishReason.ABORT]
        aborted = [c for c in done.values() if c.finish_reason is FinishReason.ABORT]
        # finished before the abort landed: the whole replayed length
        assert all((c.finish_reason, c.num_tokens) == (FinishReason.STOP, budget) for c in finished)
        assert all(0 <= c.num_tokens < budget for c in aborted)  # a partial, or nothing
        started = [c for c in done.values() if c.num_tokens > 0]
        assert started, "no request returned a token"  # the running ones returned their partials
        # a queued request decodes only in a slot a finished one left: the others return nothing (where
        # the abort is not atomic, a queued request may take an aborted one's slot before its own
        # hang-up lands: vLLM's server, EngineKind.atomic_abort)
        if host.kind.atomic_abort:
            lengths = sorted(c.num_tokens for c in done.values())
            assert len(started) <= MAX_RUNNING + len(finished), lengths
            if not finished:
                assert lengths[:queued] == [0] * queued
        if not aborted:  # every request finished before the hang-ups landed: nothing was aborted
            print(f"{host.kind.name}: all {len(requests)} requests finished before the abort landed")
        if before is not None and generated is not None:
            # the engine's count holds every token the client returned (a server drops what it had
            # decoded but not streamed at the hang-up), and settled (until_steady): it stopped decoding
            assert sum(c.num_tokens for c in done.values()) <= generated - before
            if aborted:  # not only the client stopped listening: the engine left the rest undecoded
                assert generated - before < len(requests) * budget

    host.run(body)


def test_abort_of_one_request_leaves_the_others_running(host: EngineHost) -> None:
    async def body() -> None:
        engine = host.engine
        assert engine is not None
        before = await generated_tokens(engine)
        stream = engine.generate([request("stop-me", LONG, replay=LONG), request("finish-me", 30, replay=30)])
        # "finish-me" may be done before both are seen running, and a load poll can come back after the
        # engine decoded both (a server's /metrics can answer late): stop once its own count shows both done
        while (await engine.load()).running < 1:
            if before is not None and (await generated_tokens(engine) or 0) >= before + LONG + 30:
                break
            await asyncio.sleep(0.01)
        await engine.abort(["stop-me"])
        done = {c.request_id: c async for c in stream}
        if done["stop-me"].finish_reason is FinishReason.STOP:
            # a fast engine on an idle core can finish all LONG tokens before the abort lands (seen
            # with vLLM under load, whose load() lags a scheduler step); then the abort was a no-op
            assert done["stop-me"].num_tokens == LONG
        else:
            assert done["stop-me"].finish_reason is FinishReason.ABORT
        assert (done["finish-me"].finish_reason, done["finish-me"].num_tokens) == (FinishReason.STOP, 30)

    host.run(body)


# ----------------------------------------------------------------------------- abort and resume
def test_april_loses_and_doubles_nothing_across_abort_and_resume(host: EngineHost) -> None:
    # APRIL, N=2 groups of 2, N'=4, three steps; every 4th prompt wants 100 tokens (limit 40), so
    # those are aborted and resumed from their token ids under a newer policy version each step.
    length = lambda uid, i: 100 if uid % 4 == 0 else 6 + 2 * i + uid % 3  # noqa: E731
    config = RolloutConfig(
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        over_sampling_batch_size=4,
        max_response_len=40,
        replay_lengths=True,
        reabort_interval_s=0.05,
        seed=3,
    )
    workload = ScriptedWorkload(length)
    recorder = RunRecorder()
    strategy = AprilStrategy.Config(over_sampling_batch_size=4).build()

    async def body() -> None:
        engine = host.engine
        assert engine is not None
        start = await current_version(engine)
        loop = config.build(
            arm="april", engine=engine, strategy=strategy, workload=workload,
            prompts=workload.prompt_stream(), recorder=recorder,
        )  # fmt: skip
        trained = []
        for step in range(3):
            outcome = await loop.run_step(step, start + step)
            r = outcome.record
            assert (
                r.launched_groups
                == r.accepted_groups + r.rejected_groups + r.buffered_groups + r.dropped_groups
            )
            trained += outcome.batch
            await engine.update_weights(WeightUpdate(start + step + 1))
        await until_idle(engine)
        ids = [r.request_id for r in recorder["requests"]]
        assert len(ids) == len(set(ids))  # every request returned exactly once
        samples = [s for g in [*trained, *loop.buffer] for s in g.samples]
        assert any(len(s.segments) > 1 for s in samples)  # something was resumed
        for s in samples:
            assert s.response_len == sum(seg.num_tokens for seg in s.segments) <= 40
            # every token carries the version of the weights that produced it
            assert s.token_versions() == [
                start + seg.step for seg in s.segments for _ in range(seg.num_tokens)
            ]
            assert len(s.response_ids()) == len(s.response_logprobs()) == s.response_len

    host.run(body, timeout=300)


# ----------------------------------------------------------------------------- weights
def test_a_weight_update_is_visible_in_the_next_generation(host: EngineHost) -> None:
    first, second = host.checkpoints

    async def body() -> None:
        engine = host.engine
        assert engine is not None
        probe = lambda rid: request(rid, 8, seed=3, replay=8)  # noqa: E731
        before = (await collect(engine, [probe("before")]))["before"]
        start = before.policy_version
        path_updates = "path" in engine.info.weight_formats
        await engine.update_weights(WeightUpdate(start + 1, path=second if path_updates else None))
        after = (await collect(engine, [probe("after")]))["after"]
        await engine.update_weights(WeightUpdate(start + 2, path=first if path_updates else None))
        restored = (await collect(engine, [probe("restored")]))["restored"]
        assert [c.policy_version for c in (before, after, restored)] == [start, start + 1, start + 2]
        if host.kind.real_weights:
            assert after.logprobs != before.logprobs  # the new weights computed them
            assert restored.output_ids == before.output_ids  # reloading the old weights reproduces
            assert restored.logprobs is not None and before.logprobs is not None
            assert max(abs(a - b) for a, b in zip(restored.logprobs, before.logprobs, strict=True)) < 1e-4

    host.run(body)


def test_weights_over_a_process_group_are_the_ones_the_engine_samples_with_next(host: EngineHost) -> None:
    """An engine whose workers receive a broadcast (collective.EngineWorkers: vLLM in process and
    served, SGLang) joins a gloo group with this process, takes the second checkpoint's state dict
    over it, and the next generation carries the new version and, for real float32 weights, the
    second checkpoint's log-probs exactly."""
    from april_bench.collective import EngineWorkers, WeightGroup, header, host_address, weight_wire

    engine = host.engine
    if not isinstance(engine, EngineWorkers):
        return
    first, second = host.checkpoints
    probe = lambda rid: request(rid, 8, seed=3, replay=8)  # noqa: E731

    async def body() -> tuple[int, dict[str, Completion]]:
        from april_bench.models.zoo import build_model

        state = {k: v.detach().clone() for k, v in build_model(second).state_dict().items()}
        start = await current_version(engine)
        address, world = host_address(), 1 + engine.weight_workers()
        sender, _ = await asyncio.gather(
            asyncio.to_thread(WeightGroup, address, 0, world, timeout_s=120),
            engine.join_weight_group(address, 1, world, "gloo"),
        )
        try:
            if weight_wire(engine) == "per_tensor":
                await asyncio.gather(
                    asyncio.to_thread(sender.send_each, state),
                    engine.receive_weights(start + 1, header(state)),
                )
            else:
                await asyncio.gather(asyncio.to_thread(sender.send, state), engine.receive_weights(start + 1))
            return start, await collect(engine, [probe("over-group")])
        finally:
            sender.close()
            await engine.update_weights(WeightUpdate(start + 2, path=first))  # back to the first

    start, done = host.run(body)
    assert done["over-group"].policy_version == start + 1
    if host.kind.real_weights and host.kind.float32:
        assert max(trainer_gaps(second, [probe("over-group")], done)) < 1e-4


def test_after_a_reload_no_cached_prefix_of_the_old_weights_is_reused(host: EngineHost) -> None:
    # A long prompt fills whole prefix-cache blocks under the first weights; after a reload of the
    # second, the same prompt must be computed afresh: the log-probs are the second weights' exactly.
    if not (host.kind.float32 and "path" in (host.engine.info.weight_formats if host.engine else ())):
        return
    first, second = host.checkpoints
    probe = lambda rid: request(rid, 16, seed=5, ids=LONG_PROMPT, replay=16)  # noqa: E731

    async def body() -> dict[str, Completion]:
        engine = host.engine
        assert engine is not None
        start = await current_version(engine)
        await collect(engine, [probe("cached-first"), probe("cached-first-again")])
        await engine.update_weights(WeightUpdate(start + 1, path=second))
        try:
            return await collect(engine, [probe("after-reload")])
        finally:
            await engine.update_weights(WeightUpdate(start + 2, path=first))

    done = host.run(body)
    gaps = trainer_gaps(second, [probe("after-reload")], done)
    assert max(gaps) < 1e-4, max(gaps)


def kept_kv_logprobs(
    old: str, new: str, request: GenerateRequest, completion: Completion, n_old: int
) -> list[float]:
    """The log-probs an engine that keeps KV across an update computes: the ``old`` checkpoint over
    every position up to the last token it sampled (whose KV the new weights compute, as they
    sample the next), the ``new`` one from there on, attending to the old KV.  float32."""
    import torch

    from april_bench.models.zoo import build_model

    assert request.input_ids is not None and completion.output_ids is not None
    prompt = len(request.input_ids)
    ids = torch.tensor([[*request.input_ids, *completion.output_ids]])
    cut = prompt + n_old - 1 if n_old else 0  # positions whose KV the old weights computed
    with torch.no_grad():
        parts, cache = [], None
        if cut:
            head = build_model(old)(input_ids=ids[:, :cut], use_cache=True)
            parts.append(head.logits)
            cache = head.past_key_values
        parts.append(build_model(new)(input_ids=ids[:, cut:], past_key_values=cache, use_cache=True).logits)
        logits = torch.cat(parts, dim=1)[0, :-1].float() / request.sampling.temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return logp[prompt - 1 :].tolist()


def test_an_update_in_flight_stamps_every_token_with_the_weights_that_sampled_it(host: EngineHost) -> None:
    # Two requests run long; the update lands while both decode.  Each completion's version_runs
    # cover its tokens, old version first; with real weights, the tokens before the boundary have
    # the old weights' log-probs and those after the new weights' (over the KV the old ones kept).
    engine = host.engine
    if engine is None or not host.kind.updates_in_flight():
        return
    first, second = host.checkpoints
    budget = 200
    requests = [
        GenerateRequest(
            f"inflight-{i}",
            len(PROMPT),
            budget,
            SamplingParams(temperature=0.8, seed=20 + i),
            input_ids=PROMPT,
            replay_len=budget,
        )
        for i in range(MAX_RUNNING)
    ]
    path_updates = "path" in engine.info.weight_formats

    async def body() -> tuple[int, dict[str, Completion]]:
        start = await current_version(engine)
        stream = engine.generate(requests)
        await until(engine, MAX_RUNNING, 0)
        before = await generated_tokens(engine)
        deadline = time.monotonic() + 30
        while before is not None and (await generated_tokens(engine) or 0) < before + 4 * MAX_RUNNING:
            assert time.monotonic() < deadline, "the requests did not decode"
            await asyncio.sleep(0.005)
        if before is None:
            await asyncio.sleep(0.1)
        await engine.update_weights(WeightUpdate(start + 1, path=second if path_updates else None))
        done: dict[str, Completion] = {}
        async for completion in stream:
            done[completion.request_id] = completion
        # back to the first weights, nothing in flight, for the claims after this one
        await engine.update_weights(WeightUpdate(start + 2, path=first if path_updates else None))
        return start, done

    start, done = host.run(body, timeout=300)
    assert set(done) == {r.request_id for r in requests}
    spanned = 0
    for r in requests:
        c = done[r.request_id]
        well_formed(c)
        assert c.num_tokens == budget
        runs = c.runs()
        assert sum(n for _, n in runs) == c.num_tokens
        assert [v for v, _ in runs] in ([start, start + 1], [start + 1]), runs
        assert c.policy_version == start + 1
        n_old = runs[0][1] if runs[0][0] == start else 0
        spanned += 0 < n_old < c.num_tokens
        if host.kind.real_weights and host.kind.float32 and path_updates:
            assert c.logprobs is not None
            expected = kept_kv_logprobs(first, second, r, c, n_old)
            gaps = [abs(a - b) for a, b in zip(expected, c.logprobs, strict=True)]
            assert max(gaps[:n_old], default=0.0) < 1e-4, (n_old, max(gaps[:n_old]))
            assert max(gaps[n_old:]) < 1e-4, (n_old, max(gaps[n_old:]))
            # and the new weights alone (recomputed KV) would not give them: the check has teeth
            if n_old:
                fresh = kept_kv_logprobs(second, second, r, c, 0)
                assert max(abs(a - b) for a, b in zip(fresh[:n_old], c.logprobs[:n_old], strict=True)) > 1e-3
    assert spanned == MAX_RUNNING, {rid: c.runs() for rid, c in done.items()}


# ----------------------------------------------------------------------------- multi-turn episodes
#: Observation tokens an environment appends between turns (ids below VOCAB, no EOS).
OBSERVATION = (20, 21, 22)
#: Turn 2's replayed length: long enough to abort mid-turn; the episode stays inside tiny32's 1,024.
TURN2 = 600


def episode_logprobs(
    checkpoint: str, ids: tuple[int, ...], start: int, n: int, temperature: float
) -> list[float]:
    """The trainer's float32 log-probs of ``ids[start:start + n]`` given every id before them."""
    import torch

    from april_bench.models.zoo import build_model
    from april_bench.trainers.logprobs import token_logprobs

    tensor = torch.tensor([ids])
    with torch.no_grad():
        ours, _ = token_logprobs(
            build_model(checkpoint), tensor, torch.ones_like(tensor), temperature=temperature
        )
    return ours[0, start - 1 : start - 1 + n].tolist()


def test_an_episode_continues_by_token_ids_across_turns_versions_and_an_abort(host: EngineHost) -> None:
    """A multi-turn episode as the rollout loop runs one (issue 25): turn 1 is generated; observation
    tokens are appended; turn 2 is a request whose ``input_ids`` are the whole episode so far
    (``prefix_len``: the response part), under a newer policy version; it is aborted mid-turn and
    keeps its partial; the rest of the turn resumes from the episode's ids plus the partial, under a
    third version.  Every generated token keeps the version that sampled it, and with real float32
    weights its log-prob is the trainer's for that version's weights over the whole episode,
    observations included (a cached prefix of other weights, or a context missing the observation,
    would show)."""
    engine = host.engine
    assert engine is not None
    first, second = host.checkpoints
    path_updates = "path" in engine.info.weight_formats
    sampling = SamplingParams(temperature=0.8, seed=31)

    async def body() -> tuple[int, list[Completion], list[tuple[int, ...]]]:
        start = await current_version(engine)
        turn1 = (
            await collect(
                engine, [GenerateRequest("ep-t1", len(PROMPT), 8, sampling, input_ids=PROMPT, replay_len=8)]
            )
        )["ep-t1"]
        assert turn1.output_ids is not None
        await engine.update_weights(WeightUpdate(start + 1, path=second if path_updates else None))
        ids2 = (*PROMPT, *turn1.output_ids, *OBSERVATION)
        response = len(ids2) - len(PROMPT)
        before = await generated_tokens(engine)
        stream = engine.generate(
            [
                GenerateRequest(
                    "ep-t2", len(ids2), TURN2, sampling, input_ids=ids2, replay_len=TURN2, prefix_len=response
                )
            ]
        )
        await until_decoded(engine, before if host.kind.live_token_count else None, 16)
        await engine.abort(["ep-t2"])
        (partial,) = [c async for c in stream]
        assert partial.output_ids is not None
        await engine.update_weights(WeightUpdate(start + 2, path=first if path_updates else None))
        ids3 = (*ids2, *partial.output_ids)
        rest = TURN2 - partial.num_tokens
        done = [turn1, partial]
        if rest > 0:  # a fast engine may finish the turn before the abort lands (then nothing resumes)
            request3 = GenerateRequest(
                "ep-t2-resumed", len(ids3), rest, sampling, input_ids=ids3, replay_len=rest,
                prefix_len=response + partial.num_tokens,
            )  # fmt: skip
            done.append((await collect(engine, [request3]))["ep-t2-resumed"])
        return start, done, [PROMPT, ids2, ids3]

    start, done, contexts = host.run(body, timeout=300)
    turn1, partial, *resumed = done
    for c in done:
        well_formed(c)
    assert (turn1.finish_reason, turn1.num_tokens) == (FinishReason.STOP, 8)
    if partial.finish_reason is FinishReason.ABORT:
        assert 0 < partial.num_tokens < TURN2  # the partial turn is kept
        (third,) = resumed
        assert (third.finish_reason, third.num_tokens) == (FinishReason.STOP, TURN2 - partial.num_tokens)
    else:
        assert (partial.finish_reason, partial.num_tokens, resumed) == (FinishReason.STOP, TURN2, [])
    # every generated token keeps its version: turn 1 the first, the partial turn the second, the
    # rest of the turn the third
    for c, version in zip(done, (start, start + 1, start + 2), strict=False):
        assert c.runs() == ((version, c.num_tokens),), (version, c.runs())
    if host.kind.real_weights and host.kind.float32 and path_updates:
        for c, context, weights in zip(done, contexts, (first, second, first), strict=False):
            assert c.output_ids is not None and c.logprobs is not None
            ours = episode_logprobs(weights, (*context, *c.output_ids), len(context), c.num_tokens, 0.8)
            gaps = [abs(a - b) for a, b in zip(ours, c.logprobs, strict=True)]
            assert max(gaps) < 1e-4, (c.request_id, max(gaps))
        # the observation is in turn 2's context: without it the log-probs differ
        without = (*PROMPT, *turn1.output_ids, *partial.output_ids)  # type: ignore[misc]
        skipped = episode_logprobs(
            second, without, len(without) - partial.num_tokens, partial.num_tokens, 0.8
        )
        assert partial.logprobs is not None
        assert max(abs(a - b) for a, b in zip(skipped, partial.logprobs, strict=True)) > 1e-3


# ----------------------------------------------------------------------------- shutdown (last)
def test_close_leaves_no_process_behind(host: EngineHost) -> None:
    host.close_engine()
    deadline = time.monotonic() + 60
    while (left := _engine_processes(host)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left after close: {[_command(pid) for pid in sorted(left)]}"


def _engine_processes(host: EngineHost) -> set[int]:
    """Processes started since the engine was built, less multiprocessing's resource tracker: one per
    interpreter, started by the first engine that spawns, exiting with the interpreter by design."""
    started = descendants(os.getpid()) - host.children_before
    return {pid for pid in started if "multiprocessing.resource_tracker" not in _command(pid)}


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return str(pid)
    return f"{pid}: {b' '.join(words).decode(errors='replace').strip()}"
