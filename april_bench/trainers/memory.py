"""What one training step of the torch trainer needs in device memory, checked before the first step.

``params + grads + AdamW moments + max(activations of one micro-batch + one lm_head chunk + a
second lm_head gradient, optimizer-step temporaries)``: the activations are freed before
``optimizer.step()``, whose temporaries (AdamW's denominators; for all parameters at once with
CUDA's ``foreach`` path) are counted as one more copy of the trainable parameters.  The
activation term counts the tensors autograd saves per token and decoder layer of a Llama/Qwen
layer (norms, q/k/v, attention output, the SwiGLU MLP's four ``ffn``-wide tensors) with a fused
attention kernel (SDPA flash or memory-efficient: no ``L x L`` score matrix), in float32.  On the
``tiny`` shape it is at most 25 % above what ``saved_tensors_hooks`` counts (tests/test_trainer_memory.py).
bf16 autocast barely shrinks it (RMSNorm and the residual stream stay float32; 0.87x measured on
CPU), so the estimate ignores it.  Allocator fragmentation and CUDA context are not counted: the
check leaves ``headroom`` of the device free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryEstimate", "activation_bytes_per_token", "device_memory_bytes", "estimate_step_memory"]

GiB = 1024**3
#: float32, the trainer's parameter, gradient, optimizer and activation dtype.
F32 = 4
#: Live ``[chunk, vocab]`` float32 tensors in the log-prob function's backward: logits, their
#: exp (the gradient, in place) and the float32 temporary of the matmul cast.
LOGIT_COPIES = 3


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes per term of one training step; ``total`` is what must fit."""

    params: int
    grads: int
    optimizer: int
    activations: int
    logits_chunk: int
    #: The ``[vocab, hidden]`` gradient the log-prob backward returns before autograd adds it to
    #: ``lm_head``'s (tied embeddings, or a later micro-batch): a second head-sized gradient.
    head_grad: int
    optimizer_step: int
    micro_batch_tokens: int

    @property
    def transient(self) -> int:
        """The larger of the two phases: forward/backward of a micro-batch, or the optimizer step."""
        return max(self.activations + self.logits_chunk + self.head_grad, self.optimizer_step)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.transient

    def describe(self) -> str:
        parts = {
            "params": self.params,
            "grads": self.grads,
            "AdamW": self.optimizer,
            f"activations of {self.micro_batch_tokens} tokens": self.activations,
            "logits chunk": self.logits_chunk,
            "head gradient": self.head_grad,
            "optimizer step (instead)": self.optimizer_step,
        }
        return ", ".join(f"{name} {size / GiB:.2f}" for name, size in parts.items())


def _layer_elements(config: Any) -> tuple[int, int]:
    """(saved elements per token of one decoder layer, hidden size) from a HF config."""
    hidden = int(config.hidden_size)
    ffn = int(getattr(config, "intermediate_size", 4 * hidden))
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads) * head_dim
    return 4 * ffn + 8 * hidden + 4 * heads * head_dim + 4 * kv, hidden


def activation_bytes_per_token(config: Any, *, checkpointing: bool) -> int:
    """Autograd-saved bytes per token of the decoder (plus embeddings, final norm and head input).

    With activation checkpointing each layer keeps its input (and the recompute its output: 2 x
    hidden) and one layer at a time holds its full activations during the backward pass.
    """
    per_layer, hidden = _layer_elements(config)
    layers = int(config.num_hidden_layers)
    kept = layers * 2 * hidden + per_layer if checkpointing else layers * per_layer
    return (kept + 4 * hidden) * F32


def estimate_step_memory(
    model: Any,
    *,
    micro_batch_tokens: int,
    chunk_tokens: int,
    checkpointing: bool,
    with_reference: bool = False,
) -> MemoryEstimate:
    """The estimate for ``model`` (a HF causal LM) trained with AdamW in float32."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    config = model.config
    vocab = int(config.vocab_size)
    return MemoryEstimate(
        params=params * (2 if with_reference else 1),
        grads=trainable,
        optimizer=2 * trainable,
        activations=micro_batch_tokens * activation_bytes_per_token(config, checkpointing=checkpointing),
        logits_chunk=LOGIT_COPIES * min(chunk_tokens, micro_batch_tokens) * vocab * F32,
        head_grad=vocab * int(config.hidden_size) * F32,
        optimizer_step=trainable,
        micro_batch_tokens=micro_batch_tokens,
    )


def device_memory_bytes(device: Any) -> int | None:
    """Total memory of a CUDA device, or the host's physical memory for the CPU; None if unknown."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[1])
    if device.type == "cpu":
        import os

        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            return None
    return None
