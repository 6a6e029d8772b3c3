"""The hf engine's static decode path and chunked prefill: the eager path's tokens and log-probs for the
same seeds, abort and resume, weight updates; CUDA graphs (``gpu``) and their fallback."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from april_bench.config import ConfigError
from april_bench.engines.hf import HFEngine
from april_bench.engines.hf.sampling import (
    position_uniform,
    position_uniforms,
    sample,
    sample_banning,
    seed_bits,
)
from april_bench.engines.hf.static import batch_buckets, kv_buckets
from april_bench.engines.protocol import Completion, GenerateRequest, SamplingParams, WeightUpdate
from april_bench.vtime import run_real

VOCAB = 40
EOS = 2
PROMPTS = [(1, 5, 6, 7), (1, 9), (1, 3, 3, 3, 3, 8), (1, 4, 4)]


def _engine(**kw: Any) -> HFEngine:
    settings: dict[str, Any] = {
        "model": "tiny",
        "dtype": "float64",
        "max_running_requests": 8,
        "max_context_len": 128,
        "eos_token_ids": (EOS,),
    }
    settings.update(kw)
    return HFEngine.Config(**settings).build(vocab_size=VOCAB)


def _mixed_requests(tag: str = "") -> list[GenerateRequest]:
    """Greedy and sampled, with and without top-p, replayed lengths and an extra stop id."""
    out = []
    for i, p in enumerate(PROMPTS):
        greedy = SamplingParams(temperature=0.0, stop_token_ids=(7,) if i == 3 else ())
        sampled = SamplingParams(temperature=1.0, top_p=0.9 if i % 2 else 1.0, seed=100 + i)
        out.append(
            GenerateRequest(f"{tag}g{i}", len(p), 24, greedy, input_ids=p, replay_len=24 if i % 2 else None)
        )
        out.append(
            GenerateRequest(f"{tag}s{i}", len(p), 24, sampled, input_ids=p, replay_len=16 if i % 2 else None)
        )
    return out


def _generate(
    engine: HFEngine, requests: Sequence[GenerateRequest], pad: bool = False
) -> dict[str, Completion]:
    async def main() -> dict[str, Completion]:
        await engine.start()
        if pad:  # the buckets CUDA graphs use, exercised on the CPU: padding rows and longer KV views
            assert engine.static_decoder is not None
            engine.static_decoder.pad_to_buckets = True
        out = {c.request_id: c async for c in engine.generate(requests)}
        await engine.close()
        return out

    return run_real(main())


def _same(a: dict[str, Completion], b: dict[str, Completion]) -> None:
    assert a.keys() == b.keys()
    for rid, c in a.items():
        assert (c.output_ids, c.finish_reason) == (b[rid].output_ids, b[rid].finish_reason), rid
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(b[rid].logprobs), atol=1e-6), rid


def test_device_uniforms_are_the_host_uniforms() -> None:
    seeds = [0, 1, 7, 2**31, 2**63 - 1, 2**63 + 5, 2**64 - 1, -3, 123456789012345]
    positions = [0, 1, 2, 17, 1023, 40959]
    pairs = [(s, p) for s in seeds for p in positions]
    device = position_uniforms(
        torch.tensor([seed_bits(s) for s, _ in pairs]), torch.tensor([p for _, p in pairs])
    )
    assert device.tolist() == [position_uniform(s, p) for s, p in pairs]


def test_sampling_on_the_device_matches_the_host_sampler() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen) * 3
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.0, 1.0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 1.0, 0.95])
    uniforms = torch.rand(6, generator=gen)
    eos = torch.zeros(50, dtype=torch.bool)
    eos[[2, int(logits[0].argmax())]] = True  # ban the greedy row's favourite
    none = torch.zeros(6, dtype=torch.bool)
    some = torch.tensor([True, False, True, False, False, True])
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            sample(logits, temperature, top_p, uniforms),
            sample_banning(logits, temperature, top_p, uniforms, none, eos),
            strict=True,
        )
    )
    banned = some[:, None] & eos[None, :]
    host = sample(logits, temperature, top_p, uniforms, banned)
    assert all(
        torch.equal(a, b)
        for a, b in zip(host, sample_banning(logits, temperature, top_p, uniforms, some, eos), strict=True)
    )
    assert host[0][0] != int(logits[0].argmax())  # the ban applied


def test_buckets_cover_every_batch_and_length() -> None:
    assert batch_buckets(256) == (
        1,
        2,
        4,
        8,
        16,
        32,
        48,
        64,
        80,
        96,
        112,
        128,
        144,
        160,
        176,
        192,
        208,
        224,
        240,
        256,
    )
    assert batch_buckets(5) == (1, 2, 4, 5)
    assert kv_buckets(1000) == (128, 256, 512, 1000)
    assert kv_buckets(100) == (100,)


@pytest.mark.parametrize("pad", [False, True], ids=["exact", "bucketed"])
def test_static_decoding_gives_the_eager_paths_tokens_and_logprobs(pad: bool) -> None:
    eager = _generate(_engine(decode_path="eager"), _mixed_requests())
    static = _generate(_engine(decode_path="static"), _mixed_requests(), pad=pad)
    _same(eager, static)
    assert {c.finish_reason.value for c in eager.values()} == {"stop", "length"}  # both kinds exercised


def test_chunked_prefill_equals_one_extend() -> None:
    whole = _generate(_engine(decode_path="eager"), _mixed_requests())
    for path in ("eager", "static"):
        # 8 requests, 8 slots: one extend of 8 rows, split into 1-column chunks, then into 3-column ones
        _same(whole, _generate(_engine(decode_path=path, prefill_chunk_tokens=8), _mixed_requests()))
        _same(whole, _generate(_engine(decode_path=path, prefill_chunk_tokens=24), _mixed_requests()))


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_static_abort_returns_partials_and_a_resume_continues_exactly(temperature: float) -> None:
    sp = SamplingParams(temperature=temperature, seed=11)

    def req(rid: str, ids: tuple[int, ...], new: int) -> GenerateRequest:
        return GenerateRequest(rid, len(ids), new, sp, input_ids=ids, replay_len=new)

    total = 30

    async def main() -> tuple[dict[str, Completion], dict[str, Completion], dict[str, Completion], list[int]]:
        engine = _engine(decode_path="static")
        await engine.start()
        full = {
            c.request_id[1:]: c
            async for c in engine.generate([req(f"f{i}", p, total) for i, p in enumerate(PROMPTS)])
        }
        await engine.update_weights(WeightUpdate(4, engine.model.state_dict()))
        stream = engine.generate([req(f"p{i}", p, total) for i, p in enumerate(PROMPTS)])
        start = engine.metrics()["decode_steps"]
        while engine.metrics()["decode_steps"] < start + 5:
            await asyncio.sleep(0)
        await engine.abort()
        parts = {c.request_id[1:]: c async for c in stream}
        rest = {
            c.request_id[1:]: c
            async for c in engine.generate(
                [
                    req(f"r{i}", p + parts[str(i)].output_ids, total - parts[str(i)].num_tokens)
                    for i, p in enumerate(PROMPTS)
                ]
            )
        }
        await engine.close()
        return full, parts, rest, [c.policy_version for c in parts.values()]

    full, parts, rest, versions = run_real(main())
    assert versions == [4] * len(PROMPTS)
    for key, whole in full.items():
        part = parts[key]
        assert part.finish_reason.value == "abort" and 0 < part.num_tokens < total
        assert len(part.logprobs) == part.num_tokens
        assert part.output_ids + rest[key].output_ids == whole.output_ids
        joined = torch.tensor(part.logprobs + rest[key].logprobs)
        assert torch.allclose(joined, torch.tensor(whole.logprobs), atol=1e-6)


def test_a_weight_update_reaches_the_static_path() -> None:
    other = _engine(decode_path="eager", seed=5).model.state_dict()
    requests = _mixed_requests()
    reference = _generate(_engine(decode_path="eager", seed=5), requests)

    async def main() -> tuple[dict[str, Completion], dict[str, Completion]]:
        engine = _engine(decode_path="static")
        await engine.start()
        before = {c.request_id: c async for c in engine.generate(_mixed_requests("b"))}
        await engine.update_weights(WeightUpdate(2, {k: v.clone() for k, v in other.items()}))
        after = {c.request_id: c async for c in engine.generate(requests)}
        await engine.close()
        return before, after

    before, after = run_real(main())
    _same(reference, after)
    assert {c.policy_version for c in after.values()} == {2}
    assert [c.output_ids for c in before.values()] != [c.output_ids for c in after.values()]


def test_a_failed_graph_capture_falls_back_to_eager_steps() -> None:
    """On a CPU the capture itself fails (no CUDA): the step runs eagerly, with the same results."""
    reference = _generate(_engine(decode_path="eager"), _mixed_requests())

    async def main() -> tuple[dict[str, Completion], str | None]:
        engine = _engine(decode_path="static")
        await engine.start()
        decoder = engine.static_decoder
        assert decoder is not None
        decoder.use_graphs = decoder.pad_to_buckets = True
        out = {c.request_id: c async for c in engine.generate(_mixed_requests())}
        await engine.close()
        return out, decoder.graph_error

    out, error = run_real(main())
    assert error is not None
    _same(reference, out)


def test_bad_static_settings_fail_clearly() -> None:
    with pytest.raises(ConfigError, match="decode_path must be"):
        HFEngine.Config(decode_path="fast")
    with pytest.raises(ConfigError, match="must be positive"):
        HFEngine.Config(prefill_chunk_tokens=0)


# ------------------------------------------------------------------ CUDA graphs (gpu)
def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")


@pytest.mark.gpu
def test_cuda_graph_replays_give_the_eager_steps_results() -> None:
    _cuda()
    settings = {"device": "cuda", "dtype": "float32", "decode_path": "static"}
    graphs = _engine(**settings)
    no_graphs = _engine(**settings, cuda_graphs=False)
    with_graphs = _generate(graphs, _mixed_requests())
    decoder = graphs.static_decoder
    assert decoder is not None and decoder.graph_error is None and decoder.graphs_captured > 0
    _same(with_graphs, _generate(no_graphs, _mixed_requests(), pad=True))  # same buckets, same kernels


@pytest.mark.gpu
def test_cuda_graphs_see_a_weight_update() -> None:
    _cuda()
    other = _engine(seed=5).model.state_dict()
    reference = _generate(
        _engine(device="cuda", dtype="float32", decode_path="static", seed=5), _mixed_requests()
    )

    async def main() -> dict[str, Completion]:
        engine = _engine(device="cuda", dtype="float32", decode_path="static")
        await engine.start()
        [c async for c in engine.generate(_mixed_requests("b"))]  # captures graphs with the first weights
        await engine.update_weights(WeightUpdate(1, other))
        out = {c.request_id: c async for c in engine.generate(_mixed_requests())}
        await engine.close()
        return out

    _same(reference, run_real(main()))


@pytest.mark.gpu
def test_cuda_static_path_agrees_with_the_eager_path() -> None:
    """On the GPU the two paths' kernels differ (padding, KV views), so log-probs agree closely."""
    _cuda()
    greedy = [r for r in _mixed_requests() if r.request_id.startswith("g")]
    eager = _generate(_engine(device="cuda", dtype="float32", decode_path="eager"), greedy)
    static = _generate(_engine(device="cuda", dtype="float32", decode_path="static"), greedy)
    for rid, c in eager.items():
        n = 8  # a near-tie can flip a later greedy token; the first few agree
        assert c.output_ids[:n] == static[rid].output_ids[:n]
        assert torch.allclose(torch.tensor(c.logprobs[:n]), torch.tensor(static[rid].logprobs[:n]), atol=1e-3)


def test_a_cuda_warm_start_without_cuda_fails_clearly() -> None:
    from april_bench.tasks.warmstart import WarmStart

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(ConfigError, match="use device=cpu"):
        WarmStart.Config(device="cuda")
    with pytest.raises(ConfigError, match="use device=cpu"):
        HFEngine.Config(device="cuda").build(vocab_size=VOCAB)
