"""``torch``: one-process policy-gradient trainer (CPU or CUDA) for GRPO, DAPO and GSPO.

Per rollout step (slime's recipe):

1. flatten the accepted groups into prompt + response token rows; the loss
   mask covers response tokens;
2. rewards -> (DAPO: +-1 plus the overlong penalty) -> group advantages;
3. recompute the old-policy log-probs with the current weights (no grad) -
   unless the step is one optimizer step over one epoch, where the old policy
   *is* the current one: its log-probs are then taken, detached, from the
   training forward itself (the same numbers, a third less work);
4. for each epoch and mini-batch: log-probs with grad (rows of advantage 0,
   whose loss has no gradient, are not computed: ``zero_advantage``), the algorithm's loss
   (:func:`april_bench.algorithms.losses.policy_loss`) with the chosen
   off-policy treatment of tokens from older policies (``as-is`` as in the
   paper, ``mask``, or ``tis`` against the engine's behaviour log-probs),
   backward, clip, step;
5. hand the new weights to the engine (``weights()``).

Rows are packed end to end (:mod:`april_bench.models.packing`) rather than
padded to the longest: the same log-probs, without the padding's work (four
fifths of the embedded default's training batch).  A group's samples share
their prompt, which is computed once per lane and attended to by each of the
group's responses (``share_prompts``): the same log-probs and gradients, for a
fifth fewer tokens on the embedded default.

Memory (docs/trainer.md): a mini-batch runs as micro-batches of at most
``max_tokens_per_micro_batch`` padded tokens (samples packed by length), each
micro-batch's loss scaled by its share of the mini-batch's aggregation units
(tokens for token-mean, sequences for the seq-mean modes) so that the
accumulated gradient is the mini-batch's exactly; log-probs go through
``lm_head`` ``logprob_chunk_tokens`` at a time (:mod:`.logprobs`); the step's
memory is estimated before the first step (:mod:`.memory`).

With one mini-batch and one epoch the ratio is exactly 1 and clipping never
binds - as in slime and verl's on-policy shortcut; off-policy tokens are then
trained as if on-policy unless ``mask`` or ``tis`` is chosen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from april_bench.algorithms.losses import (
    LossConfig,
    group_advantages,
    offpolicy_mask,
    overlong_penalty,
    policy_loss,
)
from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.threads import choose_threads, torch_threads
from april_bench.trainers.logprobs import DEFAULT_CHUNK_TOKENS, packed_token_logprobs, token_logprobs
from april_bench.trainers.memory import GiB, MemoryEstimate, device_memory_bytes, estimate_step_memory
from april_bench.trainers.microbatch import pack_by_length, padded_tokens
from april_bench.trainers.protocol import TrainResult
from april_bench.types import Group, Sample

__all__ = ["TorchTrainer"]


@dataclass(slots=True)
class _Rows:
    ids: torch.Tensor  # [S, L]
    attention: torch.Tensor  # [S, L]
    mask: torch.Tensor  # [S, L-1]: response tokens (targets)
    behaviour: torch.Tensor  # [S, L-1]: engine log-probs at response tokens (0 elsewhere)
    versions: torch.Tensor  # [S, L-1]: policy version of each response token (-1 elsewhere)
    advantages: torch.Tensor  # [S]
    lengths: list[int]  # prompt + response tokens of each row
    prompts: list[int]  # prompt tokens of each row (shared by its group's rows)
    groups: list[int]  # the group of each row (its index in the batch)


#: What the trainer does with the rows of advantage 0 (``TorchTrainer.Config.zero_advantage``).
ZERO_ADVANTAGE = ("skip", "forward", "train")
#: Share of the device's memory the estimate may fill (the rest: CUDA context, fragmentation).
USABLE_MEMORY_FRACTION = 0.9
#: Metrics summed with each micro-batch's loss share; the others are averaged over its tokens.
_SCALED_METRICS = ("loss", "pg_loss", "kl")


class TorchTrainer(Configurable):
    """Updates its own copy of the policy; the engine gets the weights after every step."""

    #: Whether ``zero_advantage`` may take rows out of a micro-batch: not on a rank whose forward and
    #: backward passes are collectives every rank must join in step (FSDP, megatron-core).
    _splits_rows = True

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(BaseConfig):
        algorithm: str = param("grpo", help="loss preset: grpo, dapo or gspo")
        lr: float = param(1e-4, help="AdamW learning rate")
        betas: tuple[float, float] = param((0.9, 0.98), help="AdamW betas (APRIL scripts)")
        weight_decay: float = param(0.0, help="AdamW weight decay")
        grad_clip: float = param(1.0, help="gradient-norm clip")
        mini_batches: int = param(1, help="optimizer steps per rollout step")
        epochs: int = param(1, help="passes over each rollout batch")
        off_policy: str = param("as-is", help="tokens of older policies: as-is (paper), mask, or tis")
        kl_coef: float = param(0.0, help="KL-to-initial-policy loss coefficient (APRIL: 0)")
        temperature: float = param(1.0, help="sampling temperature (log-probs are computed at it)")
        max_response_len: int = param(256, help="response limit, for DAPO's overlong penalty")
        overlong_buffer: int | None = param(
            None, help="DAPO overlong buffer (default: a quarter of the limit)"
        )
        device: str = param("auto", help="cpu, cuda or auto")
        threads: int | None = param(
            None, help="torch intra-op threads while training (default: 1 on a CPU; torch's choice on cuda)"
        )
        pad_token_id: int = param(0, help="padding id for batched rows")
        max_tokens_per_micro_batch: int | None = param(
            None,
            help="padded tokens per forward/backward; samples are packed by length and gradients "
            "accumulate (default: the whole mini-batch at once)",
        )
        logprob_chunk_tokens: int = param(
            DEFAULT_CHUNK_TOKENS, help="tokens per lm_head chunk: the logits held at once are chunk x vocab"
        )
        pack: bool = param(
            True,
            help="pack rows end to end (position ids restart per row) instead of padding each to the "
            "longest: the same log-probs for less work",
        )
        share_prompts: bool = param(
            True,
            help="with pack: compute each group's prompt once per lane for all its samples (each "
            "response attends to it and to itself): the same log-probs and gradients for fewer tokens",
        )
        zero_advantage: str = param(
            "skip",
            help="rows of advantage 0, whose loss has no gradient (without a KL term or entropy bonus): "
            "skip (not computed: the same gradients, the metrics over the trained rows), forward "
            "(forward only, without autograd: the same gradients and metrics) or train (as any row)",
        )
        bf16: bool = param(False, help="bf16 autocast of forward and backward (weights and AdamW stay fp32)")
        activation_checkpointing: bool = param(
            False, help="recompute each decoder layer in the backward pass instead of keeping its activations"
        )
        memory_budget_gib: float | None = param(
            None, help="GiB a step may use (default: 90 percent of the device memory); 0 skips the check"
        )

        def __post_init__(self) -> None:
            LossConfig.for_algorithm(self.algorithm, off_policy=self.off_policy, kl_coef=self.kl_coef)
            if self.mini_batches < 1 or self.epochs < 1 or self.lr <= 0:
                raise ConfigError("mini_batches and epochs must be >= 1 and lr > 0")
            if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
                raise ConfigError("max_tokens_per_micro_batch must be >= 1 (or unset: the whole mini-batch)")
            if self.zero_advantage not in ZERO_ADVANTAGE:
                raise ConfigError(
                    f"zero_advantage must be one of {', '.join(ZERO_ADVANTAGE)}, got {self.zero_advantage!r}"
                )
            if self.logprob_chunk_tokens < 1:
                raise ConfigError("logprob_chunk_tokens must be >= 1")
            if self.memory_budget_gib is not None and self.memory_budget_gib < 0:
                raise ConfigError("memory_budget_gib must be >= 0 (0 skips the memory check)")

    def __init__(self, config: Config, *, module: torch.nn.Module) -> None:
        self.config = config
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.threads = choose_threads(config.threads, self.device.type)
        self.model = module.to(self.device).train()
        self.loss_config = LossConfig.for_algorithm(
            config.algorithm, off_policy=config.off_policy, kl_coef=config.kl_coef
        )
        self.reference = None
        if config.kl_coef > 0:
            import copy

            self.reference = copy.deepcopy(module).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        if config.activation_checkpointing:
            if not getattr(self.model, "supports_gradient_checkpointing", False):
                raise ConfigError(
                    f"{type(self.model).__name__} does not support activation checkpointing; "
                    "drop --trainer-arg activation_checkpointing=true"
                )
            enable: Any = self.model.activation_checkpointing_enable  # transformers 5.23 (HF models)
            enable()  # non-reentrant torch.utils.checkpoint per decoder layer
        self._memory_checked = False
        if config.max_tokens_per_micro_batch is not None:
            self.check_memory(config.max_tokens_per_micro_batch)

    def weights(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def save(self, path: str) -> str:
        """The policy as a Hugging Face checkpoint directory (written atomically), for an engine in
        another process (vLLM, SGLang) to load."""
        from april_bench.models.checkpoint import save_state_dict

        return str(save_state_dict(self.model, path))

    def save_state(self, path: str) -> None:
        """Weights and AdamW moments, written atomically (what a resumed run continues from)."""
        from april_bench.trainers.state_file import save_atomic

        save_atomic({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, path)

    def load_state(self, path: str) -> None:
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    async def train(self, batch: Sequence[Group], *, step: int, policy_version: int) -> TrainResult:
        with torch_threads(self.threads):  # nothing below awaits: the engine never runs inside
            return self._train(batch, policy_version)

    def _train(self, batch: Sequence[Group], policy_version: int) -> TrainResult:
        rows = self._rows(batch)
        cfg = self.config
        if not self._memory_checked:  # the first batch's largest micro-batch (a sample may exceed the budget)
            self._memory_checked = True
            everything = list(range(len(rows.lengths)))
            self.check_memory(
                max(padded_tokens(rows.lengths, m) for m in self._micro_batches(rows, everything))
            )
        # one optimizer step over one epoch: the weights before the step are the old policy, so the
        # training forward's own log-probs (detached) are the old ones; no separate pass
        on_policy = cfg.mini_batches == 1 and cfg.epochs == 1
        old = None if on_policy else self._recompute(self.model, rows)
        ref = None if self.reference is None else self._recompute(self.reference, rows)
        seen = _Seen.empty(rows) if on_policy else None
        gap = {} if old is None else _engine_logprob_gap(old, rows, policy_version)
        order = torch.arange(rows.ids.shape[0])
        metrics: dict[str, list[float]] = {}
        for _ in range(cfg.epochs):
            for part in order.chunk(cfg.mini_batches):
                stats = self._step(rows, part.tolist(), old, ref, policy_version, seen)
                for key, value in stats.items():
                    metrics.setdefault(key, []).append(value)
        if seen is not None:  # the rows this process computed, before the update
            gap = _engine_logprob_gap(seen.logprobs, rows, policy_version, rows_computed=seen.rows)
        summary = {k: sum(v) / len(v) for k, v in metrics.items()} | gap
        summary["reward_mean"] = float(
            torch.tensor([s.reward or 0.0 for g in batch for s in g.samples]).mean()
        )
        return TrainResult(metrics=summary)

    def _step(
        self,
        rows: _Rows,
        part: list[int],
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        policy_version: int,
        seen: _Seen | None = None,
    ) -> dict[str, float]:
        """One optimizer step on the rows ``part``, accumulated over its micro-batches.  ``old``
        ``None``: the step is on-policy, the old log-probs are this forward's (kept in ``seen``)."""
        units = self._loss_units(rows, part, policy_version)
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        weights: dict[str, float] = {}
        scale = self._gradient_scale()
        backward = False
        for micro, grad in self._with_gradient(rows, self._micro_batches(rows, self._local(part)), part):
            index = torch.tensor(micro, device=self.device)
            width = max(rows.lengths[i] for i in micro) - 1  # targets of the longest row
            mask = rows.mask[index, :width]
            with self._autocast(), torch.set_grad_enabled(grad):
                logp, entropy = self._logprobs(self.model, rows, index, width)
            if old is None:
                current = logp.detach()
                if seen is not None:
                    seen.record(index, current)
            loss, stats = policy_loss(
                self.loss_config,
                logprobs=logp,
                old_logprobs=current if old is None else old[index, :width],
                advantages=rows.advantages[index],
                mask=mask,
                behaviour_logprobs=rows.behaviour[index, :width],
                token_versions=rows.versions[index, :width],
                current_version=policy_version,
                ref_logprobs=None if ref is None else ref[index, :width],
            )
            # exact accumulation: this micro-batch's aggregate times its share of the units
            share = self._loss_units(rows, micro, policy_version) / max(units, 1)
            if grad:
                (loss * (share * scale)).backward()
                backward = True
            tokens = float((mask != 0).sum())
            kept = float((self._loss_mask(mask, rows.versions[index, :width], policy_version) != 0).sum())
            stats = {**stats, "loss": float(loss.detach())}
            with torch.no_grad():
                stats["entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1))  # type: ignore[operator]
            for key, value in stats.items():
                weight = share if key in _SCALED_METRICS else (kept if key == "clipfrac" else tokens)
                totals[key] = totals.get(key, 0.0) + value * weight
                weights[key] = weights.get(key, 0.0) + weight
        if not backward:  # no row had a gradient: the zeros a backward would have left
            for p in self.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        norm = self._clip_gradients()
        self.optimizer.step()
        totals, weights = self._reduce(totals, weights)
        summary = {
            k: v if k in _SCALED_METRICS else (v / weights[k] if weights[k] else 0.0)
            for k, v in totals.items()
        }
        return {**summary, "grad_norm": _as_float(norm)}

    # ------------------------------------------------------------ log-probs and memory
    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        if not self.config.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _with_gradient(
        self, rows: _Rows, micro_batches: Iterator[list[int]], part: list[int]
    ) -> Iterator[tuple[list[int], bool]]:
        """Each micro-batch to compute and whether it needs a backward pass.  A row of advantage 0 (a
        GRPO group whose rewards are all equal) has loss terms ``0 * ratio``, without gradient when
        there is no KL term or entropy bonus; ``zero_advantage`` says what becomes of it: ``train``,
        computed as any row; ``forward``, computed in a micro-batch of its own without autograd (no
        backward pass; its forward still counts in every metric); ``skip``, not computed at all (it
        still counts in the loss's denominator, so the gradient is the same; the metrics cover the
        trained rows).  A mini-batch whose every row has advantage 0 runs them forward only, so its
        metrics are there."""
        mode = self.config.zero_advantage
        if (
            mode == "train"
            or not self._splits_rows
            or self.reference is not None
            or self.loss_config.kl_coef != 0
            or self.loss_config.entropy_coef != 0  # an entropy bonus has a gradient at advantage 0
        ):
            for micro in micro_batches:
                yield micro, True
            return
        advantages = rows.advantages[torch.tensor(part, device=self.device)].tolist()
        zero = {i for i, a in zip(part, advantages, strict=True) if a == 0}
        if mode == "skip" and len(zero) < len(part):
            for micro in micro_batches:
                live = [i for i in micro if i not in zero]
                if live:
                    yield live, True
            return
        for micro in micro_batches:
            live = [i for i in micro if i not in zero]
            idle = [i for i in micro if i in zero]
            if live:
                yield live, True
            if idle:
                yield idle, False

    def _micro_batches(self, rows: _Rows, indices: list[int]) -> Iterator[list[int]]:
        """Micro-batches of ``indices`` (row numbers) within ``max_tokens_per_micro_batch``."""
        lengths = [rows.lengths[i] for i in indices]
        for micro in pack_by_length(lengths, self.config.max_tokens_per_micro_batch):
            yield [indices[i] for i in micro]

    def _logprobs(
        self, model: torch.nn.Module, rows: _Rows, index: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs and entropies ``[n, width]`` of rows ``index`` at their loss-mask targets."""
        cfg = self.config
        if cfg.pack:
            return packed_token_logprobs(
                model,
                rows.ids[index, : width + 1],
                [rows.lengths[i] for i in index.tolist()],
                rows.mask[index, :width] != 0,
                pad_token_id=cfg.pad_token_id,
                temperature=cfg.temperature,
                with_entropy=True,
                chunk_tokens=cfg.logprob_chunk_tokens,
                matmul_dtype=torch.bfloat16 if cfg.bf16 else None,
                prefixes=[rows.prompts[i] for i in index.tolist()] if cfg.share_prompts else None,
                groups=[rows.groups[i] for i in index.tolist()] if cfg.share_prompts else None,
            )
        return token_logprobs(
            model,
            rows.ids[index, : width + 1],
            rows.attention[index, : width + 1],
            temperature=cfg.temperature,
            with_entropy=True,
            chunk_tokens=cfg.logprob_chunk_tokens,
            positions=rows.mask[index, :width] != 0,
            matmul_dtype=torch.bfloat16 if cfg.bf16 else None,
        )

    @torch.no_grad()
    def _recompute(self, model: torch.nn.Module, rows: _Rows) -> torch.Tensor:
        """Log-probs ``[S, L-1]`` of every row under ``model`` (old policy or reference), no grad."""
        out = torch.zeros_like(rows.mask)
        for micro in self._micro_batches(rows, list(range(len(rows.lengths)))):
            index = torch.tensor(micro, device=self.device)
            width = max(rows.lengths[i] for i in micro) - 1
            with self._autocast():
                logp, _ = self._logprobs(model, rows, index, width)
            out[index, :width] = logp.to(out.dtype)
        return out

    def _loss_mask(self, mask: torch.Tensor, versions: torch.Tensor, policy_version: int) -> torch.Tensor:
        """The mask the loss aggregates over (policy_loss's): ``mask`` less stale tokens in mask mode."""
        if self.loss_config.off_policy == "mask":
            return mask * offpolicy_mask(versions, policy_version).to(mask.dtype)
        return mask

    def _loss_units(self, rows: _Rows, indices: list[int], policy_version: int) -> int:
        """The aggregation's denominator over ``indices``: loss tokens (token-mean) or sequences with any."""
        index = torch.tensor(indices, device=self.device)
        active = self._loss_mask(rows.mask[index], rows.versions[index], policy_version) != 0
        if self.loss_config.aggregation == "token-mean":
            return int(active.sum())
        return int(active.any(dim=-1).sum())

    def estimate_memory(self, micro_batch_tokens: int) -> MemoryEstimate:
        """The memory of one step whose largest micro-batch has ``micro_batch_tokens`` padded tokens."""
        return estimate_step_memory(
            self.model,
            micro_batch_tokens=micro_batch_tokens,
            chunk_tokens=self.config.logprob_chunk_tokens,
            checkpointing=self.config.activation_checkpointing,
            with_reference=self.reference is not None,
        )

    def check_memory(self, micro_batch_tokens: int) -> None:
        """Raise ``ConfigError`` naming the knob to turn when a step would not fit the device."""
        cfg = self.config
        if cfg.memory_budget_gib is not None:
            budget = int(cfg.memory_budget_gib * GiB)
        else:
            total = device_memory_bytes(self.device)
            budget = 0 if total is None else int(total * USABLE_MEMORY_FRACTION)
        if budget <= 0:
            return
        need = self.estimate_memory(micro_batch_tokens)
        if need.total <= budget:
            return
        where = f"{budget / GiB:.1f} GiB of {self.device}"
        head = (
            f"the torch trainer needs ~{need.total / GiB:.1f} GiB per step ({need.describe()} GiB) "
            f"but has {where}"
        )
        fixed = need.params + need.grads + need.optimizer
        if fixed + max(need.logits_chunk + need.head_grad, need.optimizer_step) > budget:
            raise ConfigError(
                f"{head}; the weights, gradients and AdamW state alone do not fit: use a smaller --model, "
                "more device memory, or lower --trainer-arg logprob_chunk_tokens"
            )
        per_token = need.activations / max(need.micro_batch_tokens, 1)
        room = budget - fixed - need.logits_chunk - need.head_grad
        fits = int(room / per_token) if per_token else need.micro_batch_tokens
        now = cfg.max_tokens_per_micro_batch
        hint = f"set --trainer-arg max_tokens_per_micro_batch={max(fits, 1)} (now {now})"
        if not cfg.activation_checkpointing:
            hint += " or activation_checkpointing=true"
        raise ConfigError(f"{head}; {hint}")

    # ------------------------------------------------------------ data-parallel hooks
    # One process trains on every row; a data-parallel rank (trainers/fsdp.py) overrides the first three.
    def _local(self, part: list[int]) -> list[int]:
        """The rows of mini-batch ``part`` this process computes."""
        return part

    def _gradient_scale(self) -> float:
        """The factor on this process's loss that makes the ranks' averaged gradients the batch's
        (the number of ranks under FSDP, whose gradients are averaged)."""
        return 1.0

    def _reduce(
        self, totals: dict[str, float], weights: dict[str, float]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Weighted metric sums of the whole mini-batch from this process's part of it."""
        return totals, weights

    def _clip_gradients(self) -> torch.Tensor | float:
        """Clip the accumulated gradients to ``grad_clip`` and return their total norm (before
        clipping).  A tensor-parallel rank (trainers/megatron_trainer.py) reduces the norm over the
        ranks that each hold a part of the model."""
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)

    # ------------------------------------------------------------ batching
    def _rewards(self, samples: list[Sample]) -> torch.Tensor:
        rewards = torch.tensor([float(s.reward or 0.0) for s in samples], dtype=torch.float64)
        if self.config.algorithm == "dapo":  # DAPO: +-1 correctness plus the soft overlong penalty
            limit = self.config.max_response_len
            buffer = self.config.overlong_buffer or max(1, limit // 4)
            lengths = torch.tensor([s.response_len for s in samples], dtype=torch.float64)
            rewards = torch.where(rewards > 0, 1.0, -1.0) + overlong_penalty(lengths, limit, buffer)
        return rewards

    def _rows(self, batch: Sequence[Group]) -> _Rows:
        samples = [s for g in batch for s in g.samples]
        if not samples:
            raise ValueError("empty training batch")
        sizes = [len(g.samples) for g in batch]
        rewards, normalize = self._rewards(samples), self.loss_config.std_normalize
        if len(set(sizes)) == 1:
            advantages = group_advantages(rewards, sizes[0], std_normalize=normalize)
        else:  # groups of several sizes (sagc adapts n): each group's advantages from its own samples
            advantages = torch.cat(
                [
                    group_advantages(part, size, std_normalize=normalize)
                    for part, size in zip(rewards.split(sizes), sizes, strict=True)
                ]
            )
        prompts = [s.prompt.length for s in samples]
        if min(prompts) < 1:
            raise ValueError("the torch trainer needs a prompt of at least one token before each response")
        responses = [s.response_len for s in samples]
        width = max(p + r for p, r in zip(prompts, responses, strict=True))
        tokens: list[int] = []
        targets: list[float] = []  # the loss mask of each response token
        logprobs: list[float] = []
        versions_of: list[int] = []
        for s in samples:
            if s.prompt.token_ids is None:
                raise ValueError(
                    "the torch trainer needs token ids; this sample came from a token-free engine"
                )
            tokens += s.prompt.token_ids
            tokens += s.response_ids()
            targets += [1.0] * s.response_len if s.loss_mask is None else s.loss_mask
            if s.response_len:
                logprobs += s.response_logprobs()
                versions_of += s.token_versions()
        # every row's tokens at once: row r's token j at r * width + j, its response's targets
        # (shifted by one) at r * (width - 1) + prompt - 1 + j
        count = len(samples)
        length = torch.tensor([p + r for p, r in zip(prompts, responses, strict=True)])
        response = torch.tensor(responses)
        at = torch.arange(count).repeat_interleave(length) * width + _within(length)
        span = (torch.arange(count) * (width - 1) + torch.tensor(prompts) - 1).repeat_interleave(
            response
        ) + _within(response)
        ids = torch.full((count * width,), self.config.pad_token_id, dtype=torch.long)
        ids[at] = torch.tensor(tokens, dtype=torch.long)
        attention = torch.zeros(count * width, dtype=torch.long)
        attention[at] = 1
        mask = torch.zeros(count * (width - 1))
        mask[span] = torch.tensor(targets, dtype=torch.float)
        behaviour = torch.zeros(count * (width - 1))
        behaviour[span] = torch.tensor(logprobs, dtype=torch.float)
        versions = torch.full((count * (width - 1),), -1, dtype=torch.long)
        versions[span] = torch.tensor(versions_of, dtype=torch.long)
        ids, attention = ids.view(count, width), attention.view(count, width)
        mask, behaviour = mask.view(count, width - 1), behaviour.view(count, width - 1)
        versions = versions.view(count, width - 1)
        return _Rows(
            ids=ids.to(self.device),
            attention=attention.to(self.device),
            mask=mask.to(self.device),
            behaviour=behaviour.to(self.device),
            versions=versions.to(self.device),
            advantages=advantages.to(self.device, torch.float32),
            lengths=length.tolist(),
            prompts=prompts,
            groups=[g for g, size in enumerate(sizes) for _ in range(size)],
        )


def _within(sizes: torch.Tensor) -> torch.Tensor:
    """``0 .. sizes[i] - 1`` for each ``i``, concatenated."""
    starts = sizes.cumsum(0) - sizes
    return torch.arange(int(sizes.sum())) - starts.repeat_interleave(sizes)


def _as_float(value: torch.Tensor | float) -> float:
    """A scalar tensor as a float; a sharded (DTensor) norm is gathered first."""
    full = getattr(value, "full_tensor", None)
    return float(full() if full is not None else value)


@dataclass(slots=True)
class _Seen:
    """The training forward's detached log-probs ``[S, L-1]`` and which rows it computed (a
    data-parallel rank computes only its own): the old policy's, in an on-policy step."""

    logprobs: torch.Tensor
    rows: torch.Tensor  # [S] bool

    @classmethod
    def empty(cls, rows: _Rows) -> _Seen:
        return cls(torch.zeros_like(rows.mask), torch.zeros(rows.mask.shape[0], dtype=torch.bool))

    def record(self, index: torch.Tensor, logprobs: torch.Tensor) -> None:
        self.logprobs[index, : logprobs.shape[1]] = logprobs.to(self.logprobs.dtype)
        self.rows[index.cpu()] = True


def _engine_logprob_gap(
    trainer_logprobs: torch.Tensor,
    rows: _Rows,
    policy_version: int,
    *,
    rows_computed: torch.Tensor | None = None,
) -> dict[str, float]:
    """How far the engine's log-probs are from the trainer's for the same tokens under the same weights.

    Only tokens the engine sampled with ``policy_version`` (the weights the trainer holds before this
    step's update) are compared, so the gap is numerics (kernels, dtype, batching), not staleness.
    ``rows_computed`` (bool ``[S]``): only these rows have trainer log-probs (default: all).  Empty when
    no such token exists.
    """
    same = (rows.mask > 0) & (rows.versions == policy_version)
    if rows_computed is not None:
        same &= rows_computed.to(same.device)[:, None]
    count = int(same.sum())
    if not count:
        return {}
    diff = (trainer_logprobs - rows.behaviour).abs()[same]
    return {
        "engine_logprob_gap_mean": float(diff.mean()),
        "engine_logprob_gap_max": float(diff.max()),
        "engine_logprob_tokens": float(count),
    }
