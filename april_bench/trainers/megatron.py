"""Megatron-core layout for the Qwen2/Qwen3 policies: parallel sizes, and weight-name conversion.

This is the config and checkpoint layer of the Megatron-core trainer (:mod:`.megatron_trainer`), and
needs no megatron-core itself:

* :class:`MegatronLayout` checks tensor/pipeline-parallel sizes against the model's shape
  (heads and KV groups divide by ``tp``, layers by ``pp``);
* :func:`hf_to_mcore` / :func:`mcore_to_hf` convert a full Hugging Face state dict to and from
  megatron-core's GPT names (the Transformer-Engine layer spec, whose fused layer norms live on
  ``linear_qkv`` and ``linear_fc1``): QKV fused per query group, gate and up fused as ``linear_fc1``;
* :func:`shard` / :func:`unshard` split a full megatron state dict into the ``tp x pp`` ranks' parts
  (column-parallel: QKV by query group, fc1 gate and up separately; row-parallel: ``linear_proj`` and
  ``linear_fc2`` along their input; embedding and output layer along the vocabulary; norms replicated;
  layers renumbered per pipeline stage) and back - what gathering a trained policy into the engines'
  Hugging Face format needs.

Names follow megatron-core's ``GPTModel`` with ``get_gpt_layer_with_transformer_engine_spec``
(``decoder.layers.N.self_attention.linear_qkv.weight`` ...), as in Megatron-Bridge's Qwen mappings, or,
with ``spec="local"``, ``get_gpt_layer_local_spec`` (``input_layernorm``, ``pre_mlp_layernorm``), which
the trainer builds (the local names checked against megatron-core 0.16.1's ``GPTModel``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from april_bench.config import ConfigError

__all__ = ["MegatronLayout", "ModelShape", "hf_to_mcore", "mcore_to_hf", "shard", "unshard"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        """From a ``transformers`` Qwen2/Qwen3 config."""
        heads = config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            heads=heads,
            kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab=config.vocab_size,
            tied=bool(config.tie_word_embeddings),
        )


@dataclass(frozen=True, slots=True)
class MegatronLayout:
    """Tensor- and pipeline-parallel sizes, checked against a model."""

    tp: int = 1
    pp: int = 1

    def check(self, shape: ModelShape) -> None:
        if self.tp < 1 or self.pp < 1:
            raise ConfigError(f"--trainer-arg tp and pp must be >= 1, got tp={self.tp} pp={self.pp}")
        if shape.heads % self.tp or shape.kv_heads % self.tp:
            raise ConfigError(
                f"tp={self.tp} must divide the {shape.heads} attention heads and {shape.kv_heads} KV heads"
            )
        if shape.layers % self.pp:
            raise ConfigError(f"pp={self.pp} must divide the {shape.layers} layers")
        if shape.vocab % self.tp:
            raise ConfigError(f"tp={self.tp} must divide the vocabulary ({shape.vocab}); pad it first")


_HF_LAYER = "model.layers.{i}."
_MC_LAYER = "decoder.layers.{i}."
# one-to-one renames inside a layer: (hf suffix, megatron suffix)
_LAYER_RENAMES = (
    ("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
    ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
    ("post_attention_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"),
    ("mlp.down_proj.weight", "mlp.linear_fc2.weight"),
)
#: The same renames for the local (pure megatron-core) layer spec, ``get_gpt_layer_local_spec``: separate
#: norm modules instead of norms fused into the next linear (checked on megatron-core 0.16.1).
_LOCAL_LAYER_RENAMES = (
    ("input_layernorm.weight", "input_layernorm.weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
    ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
    ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
    ("mlp.down_proj.weight", "mlp.linear_fc2.weight"),
)
SPECS = ("te", "local")
_TOP_RENAMES = (
    ("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
    ("model.norm.weight", "decoder.final_layernorm.weight"),
    ("lm_head.weight", "output_layer.weight"),
)


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """Megatron's QKV: for each query group, its query heads, then its key, then its value."""
    groups, per = shape.kv_heads, shape.heads // shape.kv_heads
    rest = q.shape[1:]
    q = q.reshape(groups, per * shape.head_dim, *rest)
    k = k.reshape(groups, shape.head_dim, *rest)
    v = v.reshape(groups, shape.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _split_qkv(qkv: torch.Tensor, shape: ModelShape, groups: int) -> tuple[torch.Tensor, ...]:
    per = shape.heads // shape.kv_heads
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per + 2) * shape.head_dim, *rest)
    q, k, v = grouped.split([per * shape.head_dim, shape.head_dim, shape.head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _layer_renames(spec: str) -> tuple[tuple[str, str], ...]:
    if spec not in SPECS:
        raise ValueError(f"unknown megatron layer spec {spec!r}; one of {SPECS}")
    return _LAYER_RENAMES if spec == "te" else _LOCAL_LAYER_RENAMES


def hf_to_mcore(
    state: dict[str, torch.Tensor], shape: ModelShape, *, spec: str = "te"
) -> dict[str, torch.Tensor]:
    """A full Hugging Face state dict in megatron-core's names and fused layouts.

    ``spec``: ``te`` (Transformer-Engine layer spec, norms fused into the linears) or ``local``
    (``get_gpt_layer_local_spec``, what runs without Transformer Engine, e.g. on a CPU).
    """
    renames = _layer_renames(spec)
    out: dict[str, torch.Tensor] = {}
    for hf, mc in _TOP_RENAMES:
        if hf in state and not (shape.tied and hf == "lm_head.weight"):
            out[mc] = state[hf]
    for i in range(shape.layers):
        h, m = _HF_LAYER.format(i=i), _MC_LAYER.format(i=i)
        for hf, mc in renames:
            if h + hf in state:
                out[m + mc] = state[h + hf]
        for kind in ("weight", "bias"):
            parts = [state.get(f"{h}self_attn.{p}_proj.{kind}") for p in "qkv"]
            if all(p is not None for p in parts):
                q, k, v = parts
                assert q is not None and k is not None and v is not None
                out[f"{m}self_attention.linear_qkv.{kind}"] = _fuse_qkv(q, k, v, shape)
        gate, up = state[f"{h}mlp.gate_proj.weight"], state[f"{h}mlp.up_proj.weight"]
        out[f"{m}mlp.linear_fc1.weight"] = torch.cat([gate, up])
    return out


def mcore_to_hf(
    state: dict[str, torch.Tensor], shape: ModelShape, *, spec: str = "te"
) -> dict[str, torch.Tensor]:
    """The inverse of :func:`hf_to_mcore` (what the engines load)."""
    renames = _layer_renames(spec)
    out: dict[str, torch.Tensor] = {}
    for hf, mc in _TOP_RENAMES:
        if mc in state:
            out[hf] = state[mc]
    if shape.tied:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    for i in range(shape.layers):
        h, m = _HF_LAYER.format(i=i), _MC_LAYER.format(i=i)
        for hf, mc in renames:
            if m + mc in state:
                out[h + hf] = state[m + mc]
        for kind in ("weight", "bias"):
            fused = state.get(f"{m}self_attention.linear_qkv.{kind}")
            if fused is not None:
                for p, part in zip("qkv", _split_qkv(fused, shape, shape.kv_heads), strict=True):
                    out[f"{h}self_attn.{p}_proj.{kind}"] = part
        gate, up = state[f"{m}mlp.linear_fc1.weight"].chunk(2)
        out[f"{h}mlp.gate_proj.weight"], out[f"{h}mlp.up_proj.weight"] = gate, up
    return out


_LAYER_KEY = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_COLUMN = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")


def _tp_split(name: str, value: torch.Tensor, tp: int) -> list[torch.Tensor]:
    if name.endswith(_COLUMN):  # by query group: each rank keeps whole groups
        return list(value.chunk(tp, dim=0))
    if name.endswith("mlp.linear_fc1.weight"):  # gate and up split separately, then re-fused
        gate, up = value.chunk(2)
        return [torch.cat([g, u]) for g, u in zip(gate.chunk(tp), up.chunk(tp), strict=True)]
    if name.endswith(_ROW):
        return list(value.chunk(tp, dim=1))
    if name in _VOCAB:
        return list(value.chunk(tp, dim=0))
    return [value] * tp  # norms: replicated


def _tp_merge(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if name.endswith("mlp.linear_fc1.weight"):
        halves = [p.chunk(2) for p in parts]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    if name.endswith(_ROW):
        return torch.cat(parts, dim=1)
    if name.endswith(_COLUMN) or name in _VOCAB:
        return torch.cat(parts, dim=0)
    return parts[0]


def shard(
    state: dict[str, torch.Tensor], shape: ModelShape, layout: MegatronLayout
) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    """Each ``(tp_rank, pp_stage)``'s part of a full megatron state dict, layers renumbered per stage.

    The embedding lives on the first stage, the final norm and output layer on the last.
    """
    layout.check(shape)
    per = shape.layers // layout.pp
    parts: dict[tuple[int, int], dict[str, torch.Tensor]] = {
        (t, s): {} for t in range(layout.tp) for s in range(layout.pp)
    }
    for name, value in state.items():
        match = _LAYER_KEY.match(name)
        if match:
            layer = int(match.group(1))
            stage, local = divmod(layer, per)
            key = f"decoder.layers.{local}.{match.group(2)}"
        else:
            stage = 0 if name.startswith("embedding.") else layout.pp - 1
            key = name
        for t, piece in enumerate(_tp_split(name, value, layout.tp)):
            parts[(t, stage)][key] = piece.clone()
    return parts


def unshard(
    parts: dict[tuple[int, int], dict[str, torch.Tensor]], shape: ModelShape, layout: MegatronLayout
) -> dict[str, torch.Tensor]:
    """The full megatron state dict back from :func:`shard`'s parts (gathering a trained policy)."""
    per = shape.layers // layout.pp
    out: dict[str, torch.Tensor] = {}
    for stage in range(layout.pp):
        for key in parts[(0, stage)]:
            match = _LAYER_KEY.match(key)
            name = f"decoder.layers.{stage * per + int(match.group(1))}.{match.group(2)}" if match else key
            out[name] = _tp_merge(name, [parts[(t, stage)][key] for t in range(layout.tp)])
    return out
