"""The hf engine: exact resume, log-probs the trainer agrees with, abort semantics, weight updates."""

from __future__ import annotations

import asyncio

import pytest
import torch

from april_bench.engines.hf import HFEngine
from april_bench.engines.hf.cache import SlotKVCache
from april_bench.engines.hf.sampling import position_uniform, sample
from april_bench.engines.protocol import EngineError, GenerateRequest, SamplingParams, WeightUpdate
from april_bench.models.zoo import TINY, build_model
from april_bench.profiles.models import MODELS
from april_bench.trainers.logprobs import token_logprobs
from april_bench.vtime import run_real

VOCAB = 40
GREEDY = SamplingParams(temperature=0.0)


def _engine(**kw: object) -> HFEngine:
    settings = {
        "model": "tiny",
        "dtype": "float64",
        "max_running_requests": 8,
        "max_context_len": 128,
        "eos_token_ids": (2,),
    }
    settings.update(kw)
    return HFEngine.Config(**settings).build(vocab_size=VOCAB)


def _req(
    rid: str, ids: tuple[int, ...], new: int, sampling: SamplingParams = GREEDY, **kw: object
) -> GenerateRequest:
    return GenerateRequest(
        rid, input_len=len(ids), max_new_tokens=new, sampling=sampling, input_ids=ids, **kw
    )


def test_slot_cache_decoding_equals_a_full_forward() -> None:
    torch.manual_seed(0)
    model = build_model("tiny", vocab_size=VOCAB, dtype=torch.float64)
    cache = SlotKVCache.for_model(
        model.config, slots=4, max_len=64, dtype=torch.float64, device=torch.device("cpu")
    )
    prompts = [[1, 5, 6, 7, 8, 3], [1, 9, 10], [1, 2]]
    seqs, lens, steps = [], [], []
    for slot, p in enumerate(prompts):  # prefill each prompt into its own slot
        cache.bind_prefill(slot, 1, len(p))
        n = len(p)
        mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        out = model(
            input_ids=torch.tensor([p]),
            position_ids=torch.arange(n)[None],
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        seqs.append([*p, int(out.logits[0, -1].argmax())])
        lens.append(n)
        steps.append([out.logits[0, -1]])
    for _ in range(8):  # decode all three together, each at its own position
        pos = torch.tensor(lens)
        cache.bind_decode(len(prompts), pos)
        mask = (torch.arange(cache.kv_len)[None, :] <= pos[:, None])[:, None, None, :]
        out = model(
            input_ids=torch.tensor([[s[-1]] for s in seqs]),
            position_ids=pos[:, None],
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        for b, seq in enumerate(seqs):
            steps[b].append(out.logits[b, -1])
            seq.append((int(out.logits[b, -1].argmax()) + b) % VOCAB)  # vary the tokens
            lens[b] += 1
    for b, p in enumerate(prompts):
        full = model(input_ids=torch.tensor([seqs[b][:-1]])).logits[0, len(p) - 1 :]
        assert torch.allclose(full, torch.stack(steps[b]), atol=1e-12)


def test_greedy_abort_and_resume_reproduces_an_uninterrupted_generation() -> None:
    prompts = [(1, 5, 6, 7), (1, 9), (1, 3, 3, 3, 3, 8)]

    async def main() -> list[bool]:
        engine = _engine()
        await engine.start()
        full = {
            c.request_id: c
            async for c in engine.generate(
                [_req(f"f{i}", p, 60, replay_len=60) for i, p in enumerate(prompts)]
            )
        }
        stream = engine.generate([_req(f"p{i}", p, 60, replay_len=60) for i, p in enumerate(prompts)])
        while not any(len(s.tokens) >= 5 for s in engine._active):
            await asyncio.sleep(0)
        await engine.abort()
        parts = {c.request_id: c async for c in stream}
        assert all(c.finish_reason == "abort" and 0 < c.num_tokens < 60 for c in parts.values())
        rest = {
            c.request_id: c
            async for c in engine.generate(
                [
                    _req(
                        f"r{i}",
                        p + parts[f"p{i}"].output_ids,
                        60 - parts[f"p{i}"].num_tokens,
                        replay_len=60 - parts[f"p{i}"].num_tokens,
                    )
                    for i, p in enumerate(prompts)
                ]
            )
        }
        await engine.close()
        return [
            parts[f"p{i}"].output_ids + rest[f"r{i}"].output_ids == full[f"f{i}"].output_ids
            for i in range(len(prompts))
        ]

    assert run_real(main()) == [True, True, True]


def test_engine_logprobs_match_the_trainers_recomputation() -> None:
    """Engine log-probs (incremental, batched) vs the trainer's full forward: within 1e-5 (float32)."""
    engine = _engine(dtype="float32")
    temperature = 0.7
    prompts = [(1, 5, 6, 7), (1, 9, 9), (1, 4)]

    async def main() -> list:
        await engine.start()
        reqs = [
            _req(f"s{i}", p, 30, SamplingParams(temperature=temperature, seed=i), replay_len=30)
            for i, p in enumerate(prompts)
        ]
        out = sorted([c async for c in engine.generate(reqs)], key=lambda c: c.request_id)
        await engine.close()
        return out

    for p, c in zip(prompts, run_real(main()), strict=True):
        ids = torch.tensor([[*p, *c.output_ids]])
        with torch.no_grad():
            recomputed, _ = token_logprobs(engine.model, ids, torch.ones_like(ids), temperature=temperature)
        assert torch.allclose(recomputed[0, len(p) - 1 :], torch.tensor(c.logprobs), atol=1e-5)


def test_eos_stops_unless_a_length_is_replayed() -> None:
    async def main() -> tuple[list, list]:
        engine = _engine()
        await engine.start()
        # make EOS (id 2) overwhelmingly likely: a hook adds a large bias to its logit
        bias = torch.zeros(VOCAB, dtype=torch.float64)
        bias[2] = 100.0
        engine.model.get_output_embeddings().register_forward_hook(lambda module, args, out: out + bias)
        stop = [(c.num_tokens, c.finish_reason.value) async for c in engine.generate([_req("a", (1, 5), 20)])]
        replay = [
            (c.num_tokens, c.finish_reason.value)
            async for c in engine.generate([_req("b", (1, 5), 20, replay_len=7)])
        ]
        await engine.close()
        return stop, replay

    stop, replay = run_real(main())
    assert stop == [(1, "stop")]  # the EOS token is part of the response, for training
    assert replay == [(7, "stop")]


def test_queued_requests_abort_empty() -> None:
    async def main() -> list:
        engine = _engine(max_running_requests=1)
        await engine.start()
        stream = engine.generate([_req(f"q{i}", (1, 5), 100, replay_len=100) for i in range(3)])
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await engine.abort()
        out = [(c.request_id, c.finish_reason.value, c.num_tokens > 0) async for c in stream]
        await engine.update_weights(WeightUpdate(3, engine.model.state_dict()))
        version = [c.policy_version async for c in engine.generate([_req("v", (1,), 2, replay_len=2)])]
        await engine.close()
        return [out, version]

    out, version = run_real(main())
    assert sorted(out) == [("q0", "abort", True), ("q1", "abort", False), ("q2", "abort", False)]
    assert version == [3]


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_an_update_in_flight_installs_between_decode_steps_and_keeps_the_kv(static: bool) -> None:
    """The same weights installed mid-generation: the tokens are those of an uninterrupted run (the
    KV is kept), and each request reports which of them came before and after the update."""

    async def generate(update_after: int | None) -> list:
        engine = _engine(decode_path="static" if static else "eager")
        await engine.start()
        reqs = [_req(f"r{i}", (1, 5 + i), 12, replay_len=12) for i in range(3)]
        reqs.append(_req("short", (1, 9), 2, replay_len=2))  # done before the update
        stream = engine.generate(reqs)
        if update_after is not None:
            for _ in range(update_after):
                await asyncio.sleep(0)  # the scheduler yields after every forward pass
            await engine.update_weights(WeightUpdate(1, engine.model.state_dict()))
        out = sorted([(c.request_id, c.output_ids, c.runs()) async for c in stream])
        await engine.close()
        return out

    plain = run_real(generate(None))
    updated = run_real(generate(4))
    assert [o[1] for o in updated] == [o[1] for o in plain]  # same tokens: KV and position kept
    for rid, ids, runs in updated:
        assert sum(n for _, n in runs) == len(ids), rid
        assert [v for v, _ in runs] in ([0], [1], [0, 1]), rid
    spans = {rid: [v for v, _ in runs] for rid, _, runs in updated}
    assert spans["short"] == [0] and spans["r0"] == [0, 1]  # r0 spans the update


def test_requests_without_a_seed_still_differ() -> None:
    async def main() -> set:
        engine = _engine(dtype="float32")
        await engine.start()
        out = {
            c.output_ids
            async for c in engine.generate(
                [_req(f"u{i}", (1, 5), 12, SamplingParams(temperature=1.0), replay_len=12) for i in range(6)]
            )
        }
        await engine.close()
        return out

    assert len(run_real(main())) > 1


def test_sampling_follows_the_tempered_distribution_and_top_p() -> None:
    n = 20_000
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(n, 1)
    uniforms = torch.tensor([position_uniform(3, i) for i in range(n)])
    tokens, logprobs = sample(logits, torch.full((n,), 0.7), torch.ones(n), uniforms)
    freq = torch.bincount(tokens, minlength=4).double() / n
    assert torch.allclose(freq, torch.softmax(logits[0].double() / 0.7, -1), atol=0.01)
    assert torch.allclose(
        logprobs, torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[:, None]).squeeze(-1)
    )
    nucleus, _ = sample(logits, torch.full((n,), 0.7), torch.full((n,), 0.6), uniforms)
    assert set(nucleus.tolist()) == {0}  # token 0 alone holds 76% of the mass


def test_bad_requests_fail_clearly() -> None:
    async def main() -> None:
        engine = _engine()
        await engine.start()
        with pytest.raises(EngineError, match="needs input_ids"):
            engine.generate([GenerateRequest("x", input_len=3, max_new_tokens=5, sampling=GREEDY)])
        with pytest.raises(EngineError, match="raise --engine-arg max_context_len"):
            engine.generate([_req("y", (1,) * 100, 100)])
        await engine.close()

    run_real(main())


def test_the_simulators_tiny_profile_is_the_hf_tiny_model() -> None:
    p = MODELS.get("tiny")
    assert (p.layers, p.hidden, p.ffn, p.q_heads, p.kv_heads, p.head_dim) == (
        TINY["num_hidden_layers"],
        TINY["hidden_size"],
        TINY["intermediate_size"],
        TINY["num_attention_heads"],
        TINY["num_key_value_heads"],
        TINY["head_dim"],
    )
    model = build_model("tiny", vocab_size=p.vocab)
    assert (
        sum(x.numel() for x in model.parameters())
        == p.total_params
        + 2 * TINY["num_hidden_layers"] * (TINY["hidden_size"])
        + TINY["hidden_size"]
        + 2 * TINY["num_hidden_layers"] * TINY["head_dim"]  # norms: 2 per layer + final, q_norm and k_norm
    )


def test_two_weight_versions_decode_side_by_side_each_with_its_own_weights() -> None:
    """Consistent rollout on the hf engine: after an update, a request naming the old version gets the
    very tokens and log-probs an engine still on the old weights gives; one on the new weights differs;
    in one batch each decode step is one forward per version, and the old copy is freed once unused."""
    reqs = [
        _req("old", (1, 5, 6), 10, replay_len=10, policy_version=0),
        _req("new", (1, 5, 6), 10, replay_len=10),
    ]

    async def before() -> list:
        engine = _engine()
        await engine.start()
        out = [(c.output_ids, c.logprobs) async for c in engine.generate([reqs[1]])]
        await engine.close()
        return out

    async def after() -> tuple[dict, int, tuple[int, ...], tuple[int, ...]]:
        engine = _engine()
        await engine.start()
        engine.retain_versions([0])
        weights = {k: v + 0.05 * torch.randn_like(v) for k, v in engine.model.state_dict().items()}
        await engine.update_weights(WeightUpdate(1, weights))
        held = engine.held_versions()
        steps = engine.work().decode_iterations
        out = {c.request_id: c async for c in engine.generate(reqs)}
        steps = engine.work().decode_iterations - steps
        engine.retain_versions([])
        await engine.close()
        return out, steps, held, engine.held_versions()

    torch.manual_seed(0)
    ((old_ids, old_logprobs),) = run_real(before())
    torch.manual_seed(0)
    out, steps, held, freed = run_real(after())
    assert held == (0,) and freed == ()
    assert (
        out["old"].output_ids == old_ids
        and out["old"].policy_version == 0
        and out["old"].version_runs is None
    )
    assert out["old"].logprobs == pytest.approx(old_logprobs, abs=1e-12)
    assert out["new"].policy_version == 1 and out["new"].logprobs != pytest.approx(old_logprobs, abs=1e-6)
    assert steps == 2 * 9  # nine decode steps after the prefill's first token, two forwards each


def test_an_old_version_the_engine_does_not_hold_is_refused() -> None:
    async def main() -> None:
        engine = _engine()
        await engine.start()
        await engine.update_weights(WeightUpdate(1, engine.model.state_dict()))
        with pytest.raises(EngineError, match="weight version 0 is not held"):
            engine.generate([_req("x", (1, 5), 4, replay_len=4, policy_version=0)])
        await engine.close()

    run_real(main())
