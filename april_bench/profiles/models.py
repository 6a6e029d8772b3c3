"""Model profiles: the architecture numbers a roofline cost model needs.

Architectures are from the models' Hugging Face ``config.json`` as mirrored in
the APRIL repository (``RLsys-Foundation/APRIL@a72b585 scripts/models/*.sh``);
the derived quantities (parameters, bytes per decode step, KV bytes per token)
are computed here from those numbers and checked by a test against figures
computed by hand (Qwen3-4B: 3.63 B non-embedding parameters, 8.04 GB read per
decode step, 144 KiB of KV per token).
"""

from __future__ import annotations

from dataclasses import dataclass

from april_bench.registry import Registry

__all__ = ["MODELS", "ModelProfile"]

BF16_BYTES = 2


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """A dense decoder-only transformer (Qwen-style: GQA, SwiGLU MLP)."""

    name: str
    hf_id: str
    layers: int
    hidden: int
    ffn: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    source: str

    @property
    def layer_params(self) -> int:
        """Attention (q, o, k, v projections) + SwiGLU MLP (gate, up, down) weights per layer."""
        attn = (
            2 * self.hidden * self.q_heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        )
        return attn + 3 * self.hidden * self.ffn

    @property
    def non_embedding_params(self) -> int:
        return self.layers * self.layer_params

    @property
    def total_params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.non_embedding_params + embeddings

    @property
    def decode_weight_bytes(self) -> int:
        """Bytes read per decode step: every non-embedding weight plus the LM head (bf16)."""
        return BF16_BYTES * (self.non_embedding_params + self.vocab * self.hidden)

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs per token, excluding attention scores: 2 x (non-embedding + LM head) params."""
        return 2 * (self.non_embedding_params + self.vocab * self.hidden)

    @property
    def attention_flops_per_context_token(self) -> int:
        """FLOPs per (query token, context token) pair: QK^T and AV over all layers and heads."""
        return 4 * self.layers * self.q_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for one token across all layers (bf16)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16_BYTES


MODELS: Registry[ModelProfile] = Registry("model")

_QWEN3_SRC = "Hugging Face config.json; APRIL@a72b585 scripts/models/{}.sh"

MODELS.register(
    "qwen3-4b",
    ModelProfile(
        name="qwen3-4b",
        hf_id="Qwen/Qwen3-4B",
        layers=36,
        hidden=2560,
        ffn=9728,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=True,
        source=_QWEN3_SRC.format("qwen3-4B"),
    ),
    "Qwen3-4B (36 layers, GQA 32/8, tied embeddings); APRIL's main model",
)
MODELS.register(
    "r1-distill-qwen-1.5b",
    ModelProfile(
        name="r1-distill-qwen-1.5b",
        hf_id="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        layers=28,
        hidden=1536,
        ffn=8960,
        q_heads=12,
        kv_heads=2,
        head_dim=128,
        vocab=151936,
        tied_embeddings=False,
        source=_QWEN3_SRC.format("deepseek-r1-distill-qwen-1.5B"),
    ),
    "DeepSeek-R1-Distill-Qwen-1.5B (28 layers, GQA 12/2); APRIL's second model",
)
MODELS.register(
    "qwen3-8b",
    ModelProfile(
        name="qwen3-8b",
        hf_id="Qwen/Qwen3-8B",
        layers=36,
        hidden=4096,
        ffn=12288,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=False,
        source=_QWEN3_SRC.format("qwen3-8B"),
    ),
    "Qwen3-8B (36 layers, GQA 32/8); in APRIL's scripts",
)
MODELS.register(
    "qwen3-0.6b",
    ModelProfile(
        name="qwen3-0.6b",
        hf_id="Qwen/Qwen3-0.6B",
        layers=28,
        hidden=1024,
        ffn=3072,
        q_heads=16,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=True,
        source="Hugging Face Qwen/Qwen3-0.6B config.json",
    ),
    "Qwen3-0.6B (28 layers, GQA 16/8, tied embeddings): the simulator's default speculative drafter",
)
MODELS.register(
    "tiny",
    ModelProfile(
        name="tiny",
        hf_id="(april_bench.models.zoo.TINY)",
        layers=3,
        hidden=96,
        ffn=288,
        q_heads=4,
        kv_heads=2,
        head_dim=24,
        vocab=17,
        tied_embeddings=True,
        source="april_bench.models.zoo.TINY with the synthetic task's 17-token vocabulary",
    ),
    "the embedded default: a 3-layer Qwen3 with 0.3 M parameters",
)
MODELS.register(
    "tiny32",
    ModelProfile(
        name="tiny32",
        hf_id="(april_bench.models.zoo.TINY32)",
        layers=3,
        hidden=96,
        ffn=288,
        q_heads=4,
        kv_heads=2,
        head_dim=32,
        vocab=17,
        tied_embeddings=True,
        source="april_bench.models.zoo.TINY32: tiny with 32-wide heads (vLLM's CPU attention needs them)",
    ),
    "tiny with 32-wide heads: what --engine vllm trains on a CPU (simcheck predicts it with this profile)",
)
