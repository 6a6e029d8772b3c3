"""Megatron-core layout on CPU (no megatron-core needed): parallel sizes, names, fused and sharded tensors."""

from __future__ import annotations

import pytest
import torch

from april_bench.config import ConfigError
from april_bench.models.zoo import build_model
from april_bench.trainers.megatron import MegatronLayout, ModelShape, hf_to_mcore, mcore_to_hf, shard, unshard


def _tiny() -> tuple[dict[str, torch.Tensor], ModelShape]:
    model = build_model("tiny", vocab_size=32, seed=1)  # 4 heads, 2 KV heads, head_dim 24, 3 layers
    return model.state_dict(), ModelShape.of(model.config)


def test_hf_names_round_trip_through_megatron() -> None:
    state, shape = _tiny()
    mcore = hf_to_mcore(state, shape)
    assert "decoder.layers.2.self_attention.linear_qkv.weight" in mcore
    assert "output_layer.weight" not in mcore  # tied to the embedding
    back = mcore_to_hf(mcore, shape)
    assert back.keys() == state.keys()
    for name, value in state.items():
        assert torch.equal(back[name], value), name


def test_qkv_is_fused_per_query_group() -> None:
    state, shape = _tiny()
    fused = hf_to_mcore(state, shape)["decoder.layers.0.self_attention.linear_qkv.weight"]
    q, k, v = (state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    d, per = shape.head_dim, shape.heads // shape.kv_heads
    block = (per + 2) * d
    for g in range(shape.kv_heads):  # group g: its query heads, then its key head, then its value head
        rows = fused[g * block : (g + 1) * block]
        assert torch.equal(rows[: per * d], q[g * per * d : (g + 1) * per * d])
        assert torch.equal(rows[per * d : per * d + d], k[g * d : (g + 1) * d])
        assert torch.equal(rows[per * d + d :], v[g * d : (g + 1) * d])


def test_tp_and_pp_shards_gather_back_and_compute_the_same_mlp() -> None:
    state, shape = _tiny()
    mcore = hf_to_mcore(state, shape)
    layout = MegatronLayout(tp=2, pp=3)
    parts = shard(mcore, shape, layout)
    assert set(parts) == {(t, s) for t in range(2) for s in range(3)}
    assert (
        "embedding.word_embeddings.weight" in parts[(0, 0)]
        and "decoder.final_layernorm.weight" in parts[(1, 2)]
    )
    assert all(k.startswith(("decoder.layers.0.", "embedding", "decoder.final")) for k in parts[(0, 1)])
    qkv = parts[(1, 1)]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape[0] == mcore["decoder.layers.1.self_attention.linear_qkv.weight"].shape[0] // 2
    full = unshard(parts, shape, layout)
    assert full.keys() == mcore.keys()
    for name, value in mcore.items():
        assert torch.equal(full[name], value), name
    # column-parallel fc1 then row-parallel fc2: the ranks' partial outputs sum to the full MLP's
    x = torch.randn(5, shape.hidden)

    def mlp(fc1: torch.Tensor, fc2: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ fc1.T).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ fc2.T

    whole = mlp(
        mcore["decoder.layers.0.mlp.linear_fc1.weight"], mcore["decoder.layers.0.mlp.linear_fc2.weight"]
    )
    summed = sum(
        mlp(
            parts[(t, 0)]["decoder.layers.0.mlp.linear_fc1.weight"],
            parts[(t, 0)]["decoder.layers.0.mlp.linear_fc2.weight"],
        )
        for t in range(2)
    )
    torch.testing.assert_close(summed, whole)


def test_parallel_sizes_are_checked_against_the_model() -> None:
    _, shape = _tiny()
    MegatronLayout(tp=2, pp=1).check(shape)
    with pytest.raises(ConfigError, match="KV heads"):
        MegatronLayout(tp=4).check(shape)  # 2 KV heads
    with pytest.raises(ConfigError, match="layers"):
        MegatronLayout(pp=2).check(shape)  # 3 layers
    with pytest.raises(ConfigError, match=">= 1"):
        MegatronLayout(tp=0).check(shape)


def test_local_spec_names_round_trip() -> None:
    """The names of ``get_gpt_layer_local_spec`` (what the megatron trainer builds without Transformer
    Engine): separate norm modules instead of norms fused into the linears."""
    state, shape = _tiny()
    local = hf_to_mcore(state, shape, spec="local")
    assert "decoder.layers.0.input_layernorm.weight" in local
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in local
    assert not any("layer_norm_weight" in name for name in local)
    back = mcore_to_hf(local, shape, spec="local")
    assert back.keys() == state.keys()
    assert all(torch.equal(back[name], value) for name, value in state.items())
    with pytest.raises(ValueError, match="layer spec"):
        hf_to_mcore(state, shape, spec="fused")
