"""``torch``: one-process policy-gradient trainer (CPU or CUDA) for GRPO, DAPO and GSPO.

Per rollout step (slime's recipe):

1. flatten the accepted groups into prompt + response token rows; the loss
   mask covers response tokens;
2. rewards -> (DAPO: +-1 plus the overlong penalty) -> group advantages;
3. recompute the old-policy log-probs with the current weights (no grad);
4. for each epoch and mini-batch: log-probs with grad, the algorithm's loss
   (:func:`april_bench.algorithms.losses.policy_loss`) with the chosen
   off-policy treatment of tokens from older policies (``as-is`` as in the
   paper, ``mask``, or ``tis`` against the engine's behaviour log-probs),
   backward, clip, step;
5. hand the new weights to the engine (``weights()``).

With one mini-batch and one epoch the ratio is exactly 1 and clipping never
binds - as in slime and verl's on-policy shortcut; off-policy tokens are then
trained as if on-policy unless ``mask`` or ``tis`` is chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from april_bench.algorithms.losses import LossConfig, group_advantages, overlong_penalty, policy_loss
from april_bench.config import BaseConfig, ConfigError, Configurable, param
from april_bench.trainers.logprobs import token_logprobs
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


class TorchTrainer(Configurable):
    """Updates its own copy of the policy; the engine gets the weights after every step."""

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
        pad_token_id: int = param(0, help="padding id for batched rows")

        def __post_init__(self) -> None:
            LossConfig.for_algorithm(self.algorithm, off_policy=self.off_policy, kl_coef=self.kl_coef)
            if self.mini_batches < 1 or self.epochs < 1 or self.lr <= 0:
                raise ConfigError("mini_batches and epochs must be >= 1 and lr > 0")

    def __init__(self, config: Config, *, module: torch.nn.Module) -> None:
        self.config = config
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
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

    def weights(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def save(self, path: str) -> str:
        """The policy as a Hugging Face checkpoint directory (written atomically), for an engine in
        another process (vLLM, SGLang) to load."""
        from april_bench.engines.hf.checkpoint import save_state_dict

        return str(save_state_dict(self.model, path))

    def save_state(self, path: str) -> None:
        """Weights and AdamW moments, written atomically (what a resumed run continues from)."""
        import os

        tmp = f"{path}.tmp"
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, tmp)
        os.replace(tmp, path)

    def load_state(self, path: str) -> None:
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    async def train(self, batch: Sequence[Group], *, step: int, policy_version: int) -> TrainResult:
        rows = self._rows(batch)
        cfg = self.config
        with torch.no_grad():
            old, _ = token_logprobs(self.model, rows.ids, rows.attention, temperature=cfg.temperature)
            ref = None
            if self.reference is not None:
                ref, _ = token_logprobs(self.reference, rows.ids, rows.attention, temperature=cfg.temperature)
        gap = _engine_logprob_gap(old, rows, policy_version)
        metrics: dict[str, list[float]] = {}
        order = torch.arange(rows.ids.shape[0])
        for _ in range(cfg.epochs):
            for part in order.chunk(cfg.mini_batches):
                logp, entropy = token_logprobs(
                    self.model,
                    rows.ids[part],
                    rows.attention[part],
                    temperature=cfg.temperature,
                    with_entropy=True,
                )
                loss, stats = policy_loss(
                    self.loss_config,
                    logprobs=logp,
                    old_logprobs=old[part],
                    advantages=rows.advantages[part],
                    mask=rows.mask[part],
                    behaviour_logprobs=rows.behaviour[part],
                    token_versions=rows.versions[part],
                    current_version=policy_version,
                    ref_logprobs=None if ref is None else ref[part],
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                self.optimizer.step()
                stats = {**stats, "loss": float(loss.detach()), "grad_norm": float(norm)}
                with torch.no_grad():
                    m = rows.mask[part]
                    stats["entropy"] = float((entropy * m).sum() / m.sum().clamp(min=1))  # type: ignore[operator]
                for key, value in stats.items():
                    metrics.setdefault(key, []).append(value)
        summary = {k: sum(v) / len(v) for k, v in metrics.items()} | gap
        summary["reward_mean"] = float(
            torch.tensor([s.reward or 0.0 for g in batch for s in g.samples]).mean()
        )
        return TrainResult(metrics=summary)

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
        n = len(batch[0].samples)
        advantages = group_advantages(self._rewards(samples), n, std_normalize=self.loss_config.std_normalize)
        width = max(s.prompt.length + s.response_len for s in samples)
        size = (len(samples), width)
        ids = torch.full(size, self.config.pad_token_id, dtype=torch.long)
        attention = torch.zeros(size, dtype=torch.long)
        mask = torch.zeros(len(samples), width - 1)
        behaviour = torch.zeros(len(samples), width - 1)
        versions = torch.full((len(samples), width - 1), -1, dtype=torch.long)
        for row, s in enumerate(samples):
            if s.prompt.token_ids is None:
                raise ValueError(
                    "the torch trainer needs token ids; this sample came from a token-free engine"
                )
            prompt, response = s.prompt.length, s.response_len
            ids[row, : prompt + response] = torch.tensor([*s.prompt.token_ids, *s.response_ids()])
            attention[row, : prompt + response] = 1
            span = slice(prompt - 1, prompt - 1 + response)  # targets are shifted by one
            mask[row, span] = 1.0 if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=torch.float)
            if response:
                behaviour[row, span] = torch.tensor(s.response_logprobs())
                versions[row, span] = torch.tensor(s.token_versions())
        return _Rows(
            ids=ids.to(self.device),
            attention=attention.to(self.device),
            mask=mask.to(self.device),
            behaviour=behaviour.to(self.device),
            versions=versions.to(self.device),
            advantages=advantages.to(self.device, torch.float32),
        )


def _engine_logprob_gap(trainer_logprobs: torch.Tensor, rows: _Rows, policy_version: int) -> dict[str, float]:
    """How far the engine's log-probs are from the trainer's for the same tokens under the same weights.

    Only tokens the engine sampled with ``policy_version`` (the weights the trainer holds before this
    step's update) are compared, so the gap is numerics (kernels, dtype, batching), not staleness.
    Empty when no such token exists.
    """
    same = (rows.mask > 0) & (rows.versions == policy_version)
    count = int(same.sum())
    if not count:
        return {}
    diff = (trainer_logprobs - rows.behaviour).abs()[same]
    return {
        "engine_logprob_gap_mean": float(diff.mean()),
        "engine_logprob_gap_max": float(diff.max()),
        "engine_logprob_tokens": float(count),
    }
