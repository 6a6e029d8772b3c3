"""Chunked log-probs: exact, and their memory grows with the chunk, not with tokens x vocabulary."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from april_bench.config import ConfigError
from april_bench.models.zoo import build_model
from april_bench.trainers.logprobs import ChunkedTokenLogprobs, chunked_token_logprobs, token_logprobs
from april_bench.trainers.memory import activation_bytes_per_token
from april_bench.trainers.torch_trainer import TorchTrainer


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of the tensors that ops allocate while the mode is on (views and in-place ops
    allocate nothing); a storage counts until the last tensor the mode saw on it is collected."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[int, list[int]] = {}  # data_ptr -> [bytes, tensors alive]

    def _release(self, pointer: int) -> None:
        entry = self._storages[pointer]
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= self._storages.pop(pointer)[0]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            pointer = tensor.untyped_storage().data_ptr()
            if pointer == 0 or pointer in inputs:
                continue
            entry = self._storages.setdefault(pointer, [tensor.untyped_storage().nbytes(), 0])
            if entry[1] == 0:
                self.live += entry[0]
                self.peak = max(self.peak, self.live)
            entry[1] += 1
            weakref.finalize(tensor, self._release, pointer)
        return out


def _saved_bytes(fn: Any, exclude: tuple[torch.Tensor, ...] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn`` runs (less ``exclude``)."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    return sum(size for pointer, size in saved.items() if pointer not in skip)


def _naive(model: Any, ids: torch.Tensor, attention: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


HIDDEN, VOCAB = 16, 2048


def _head_and_targets(tokens: int) -> tuple[torch.nn.Linear, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(HIDDEN, VOCAB, bias=False), torch.randint(0, VOCAB, (tokens,))


def _peak_bytes(tokens: int, chunk: int | None) -> int:
    """Peak bytes allocated by forward + backward of the log-probs of ``tokens`` targets."""
    head, targets = _head_and_targets(tokens)
    hidden = torch.randn(tokens, HIDDEN, requires_grad=True)
    with LiveTensorBytes() as mode:
        if chunk is None:
            out = torch.log_softmax(head(hidden), -1).gather(-1, targets[:, None])
        else:
            out = chunked_token_logprobs(hidden, head, targets, chunk_tokens=chunk)[0]
        out.sum().backward()
    return mode.peak


def test_chunked_function_matches_autograd_in_float64_with_bias_and_temperature() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(11, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(9, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 9, (11,))

    def chunked(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ChunkedTokenLogprobs.apply(h, w, b, targets, 1 / 0.7, 5, torch.float64)[0]

    assert torch.autograd.gradcheck(chunked, (hidden, weight, bias), fast_mode=True)
    logp, entropy = ChunkedTokenLogprobs.apply(hidden, weight, bias, targets, 1 / 0.7, 5, torch.float64)
    full = torch.log_softmax((hidden @ weight.T + bias) / 0.7, dim=-1)
    torch.testing.assert_close(logp, full.gather(-1, targets[:, None]).squeeze(-1))
    torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1))


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_model_logprobs_and_gradients_equal_the_full_logits_path(chunk: int) -> None:
    model = build_model("tiny", vocab_size=50).train()
    torch.manual_seed(1)
    ids = torch.randint(3, 50, (3, 11))
    attention = torch.ones_like(ids)
    attention[1, 8:] = 0  # a padded row: its padding targets are not computed (0)
    logp, _ = token_logprobs(model, ids, attention, temperature=0.7, chunk_tokens=chunk)
    logp.sum().backward()
    chunked_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    expected = _naive(model, ids, attention, 0.7) * attention[:, 1:]
    expected.sum().backward()
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
    assert chunked_grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    # A gradient element is a sum over the batch's tokens, accumulated in an order the kernels choose
    # (chunk_tokens=1 sums one token at a time): float32 rounding of that sum is bounded by
    # tokens x eps x the size of the terms, which the tensor's largest element stands for.  A fixed
    # atol ignores that scale (1 of 4,800 elements was 1.3e-6 off with torch 2.13 at chunk 1).
    tokens = int(attention[:, 1:].sum())
    eps = torch.finfo(torch.float32).eps
    for name, grad in chunked_grads.items():
        reference = model.get_parameter(name).grad
        atol = tokens * eps * float(reference.abs().max())
        torch.testing.assert_close(grad, reference, rtol=1e-4, atol=atol)


def test_peak_memory_grows_with_the_chunk_not_with_tokens_times_vocab() -> None:
    full_logits = 512 * VOCAB * 4
    naive = _peak_bytes(512, None)
    small, large = _peak_bytes(512, 16), _peak_bytes(512, 64)
    assert naive >= full_logits  # the unchunked path holds every token's logits
    assert large > 2 * small  # 4x the chunk: the chunk's logits dominate the peak
    chunk_logits = 64 * VOCAB * 4
    assert large < 4 * chunk_logits < full_logits
    # twice the tokens: the unchunked peak doubles, the chunked one stays (up to [tokens, hidden] terms)
    assert _peak_bytes(1024, None) >= 2 * naive * 0.99
    assert _peak_bytes(1024, 16) < small + 1024 * (HIDDEN + 4) * 4


def test_autograd_saves_no_vocabulary_sized_tensor() -> None:
    head, targets = _head_and_targets(512)
    hidden = torch.randn(512, HIDDEN, requires_grad=True)
    saved = _saved_bytes(
        lambda: chunked_token_logprobs(hidden, head, targets, chunk_tokens=64), (head.weight,)
    )
    naive = _saved_bytes(
        lambda: torch.log_softmax(head(hidden), -1).gather(-1, targets[:, None]), (head.weight,)
    )
    assert naive >= 512 * VOCAB * 4
    # hidden states, targets (int64) and one log-sum-exp per token
    assert saved <= 512 * (HIDDEN * 4 + 8 + 4)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_estimate_bounds_what_the_decoder_saves(checkpointing: bool) -> None:
    model = build_model("tiny", vocab_size=64).train()
    if checkpointing:
        model.activation_checkpointing_enable()
    ids = torch.randint(3, 64, (2, 48))
    params = tuple(model.parameters())
    measured = (
        _saved_bytes(lambda: token_logprobs(model, ids, torch.ones_like(ids), chunk_tokens=32), params)
        / ids.numel()
    )
    estimate = activation_bytes_per_token(model.config, checkpointing=checkpointing)
    assert measured <= estimate
    if not checkpointing:  # tight without checkpointing; with it, the estimate adds one layer's recompute
        assert estimate <= 1.25 * measured


def test_memory_check_names_the_knob_to_turn() -> None:
    module = build_model("tiny", vocab_size=64)
    with pytest.raises(ConfigError, match=r"max_tokens_per_micro_batch=\d+ .*activation_checkpointing=true"):
        TorchTrainer.Config(max_tokens_per_micro_batch=100_000, memory_budget_gib=0.05).build(module=module)
    with pytest.raises(ConfigError, match="weights, gradients and AdamW state alone"):
        TorchTrainer.Config(max_tokens_per_micro_batch=1, memory_budget_gib=1e-5).build(module=module)
    fits = TorchTrainer.Config(max_tokens_per_micro_batch=1000, memory_budget_gib=0.05).build(module=module)
    estimate = fits.estimate_memory(1000)
    assert estimate.total < 0.05 * 1024**3
    assert fits.estimate_memory(2000).activations == 2 * estimate.activations
