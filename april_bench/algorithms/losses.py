"""Policy losses of GRPO, Dr. GRPO, DAPO and GSPO, as pure tensor functions.

The formulas follow ``shared/docs/algorithms.md``; section numbers (§) below refer to it.

Conventions shared by every function:

- Per-token tensors are batch-first ``[B, T]`` (B sequences, T response positions).
- ``mask`` is a float or bool ``[B, T]`` tensor; its non-zero entries mark the response tokens that
  count (values are read as 0/1).
- Losses are to be *minimised*: they are the negated objectives of the papers.
- Masked-out positions are inert.  Their log-ratio is replaced by 0 before any ``exp`` and their loss
  by 0, so padding garbage (inf, NaN) reaches neither the loss nor the gradient, and
  ``d loss / d logprobs`` is exactly zero there.

This module imports torch at top level: only trainer code imports it, never ``import april_bench``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from april_bench.algorithms import OFF_POLICY_MODES
from april_bench.config import BaseConfig, ConfigError, param

__all__ = [
    "AGGREGATIONS",
    "ALGORITHM_NAMES",
    "KL_ESTIMATORS",
    "OFF_POLICY_MODES",
    "LossConfig",
    "aggregate",
    "clipped_surrogate",
    "group_advantages",
    "gspo_surrogate",
    "kl_estimate",
    "loss_denominator",
    "offpolicy_mask",
    "overlong_penalty",
    "policy_loss",
    "tis_weights",
]

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3")
ALGORITHM_NAMES = ("grpo", "dapo", "gspo")

# ---------------------------------------------------------------------------------------------------------
# Advantages and reward shaping
# ---------------------------------------------------------------------------------------------------------


def group_advantages(
    rewards: Tensor, group_size: int, *, std_normalize: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages (§1.2), one scalar per sample.

    ``A_i = (R_i - mean_g R) / (std_g R + eps)`` with the unbiased (N-1) std   (``std_normalize``: GRPO)
    ``A_i =  R_i - mean_g R``                                                  (otherwise: Dr. GRPO)

    ``rewards`` is flat ``[N*G]`` in group-contiguous order (the G samples of a prompt are adjacent).
    A group of one sample gets ``A = 0`` (slime forces std normalisation off for n=1, leaving R - R);
    a group whose rewards are all equal gets 0 too.  Returns a float tensor shaped like ``rewards``.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be flat [N*G], got shape {tuple(rewards.shape)}")
    if rewards.numel() % group_size:
        raise ValueError(
            f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}; "
            "pass every sample of every group, in group-contiguous order"
        )
    values = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    if group_size == 1:
        return torch.zeros_like(values)
    groups = values.reshape(-1, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)
    if std_normalize:
        centered = centered / (groups.std(dim=1, correction=1, keepdim=True) + eps)
    return centered.reshape(-1)


def overlong_penalty(lengths: Tensor, max_len: int, buffer_len: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (§2.3 item 4, Eq. 13), to add to the reward before normalising.

    With ``L_max = max_len`` and ``L_cache = buffer_len``:
    ``0`` if ``|y| <= L_max - L_cache``; ``((L_max - L_cache) - |y|) / L_cache * factor`` inside the
    buffer; floored at ``-factor`` (reached at ``|y| = L_max``) beyond it.
    ``lengths`` counts response tokens, EOS included.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    if factor < 0:
        raise ValueError(f"factor must be >= 0 (it scales a penalty), got {factor}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    penalty = ((max_len - buffer_len) - lengths.to(dtype)) / buffer_len * factor
    return penalty.clamp(min=-factor, max=0.0)


# ---------------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------------


def _active(reference: Tensor, mask: Tensor) -> Tensor:
    """``mask`` as a bool ``[B, T]`` tensor, after checking it matches ``reference``."""
    if reference.ndim != 2 or mask.shape != reference.shape:
        raise ValueError(
            f"expected [B, T] tensors of one shape, got {tuple(reference.shape)} and mask {tuple(mask.shape)}"
        )
    return mask != 0


def aggregate(per_token: Tensor, mask: Tensor, mode: str) -> Tensor:
    """Reduce a per-token ``[B, T]`` quantity to a scalar (§1.4); m is the mask, L the values.

    - ``token-mean``:           ``sum_{i,t} m*L / sum_{i,t} m``      (DAPO; verl default)
    - ``seq-mean-token-mean``:  ``(1/B) sum_i (sum_t m*L / sum_t m)`` (GRPO paper; slime default; GSPO)
    - ``seq-mean-token-sum``:   ``(1/B) sum_i sum_t m*L``

    B counts only the sequences with at least one masked-in token; an all-zero mask gives 0.0
    (still attached to the graph, so ``backward`` yields zero gradients rather than NaN).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; expected one of {', '.join(AGGREGATIONS)}")
    active = _active(per_token, mask)
    values = torch.where(active, per_token, 0)
    tokens = active.sum(dim=-1)
    if mode == "token-mean":
        return values.sum() / tokens.sum().clamp(min=1)
    per_seq = values.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / tokens.clamp(min=1)
    return per_seq.sum() / (tokens > 0).sum().clamp(min=1)


# ---------------------------------------------------------------------------------------------------------
# Surrogates
# ---------------------------------------------------------------------------------------------------------


def _per_token(advantages: Tensor, like: Tensor) -> Tensor:
    """Advantages ``[B]`` (broadcast over tokens, §1.2) or ``[B, T]``, shaped to broadcast to ``like``."""
    if advantages.shape == like.shape:
        return advantages
    if advantages.shape == like.shape[:1]:
        return advantages.unsqueeze(-1)
    raise ValueError(f"advantages must be [B] or [B, T] = {tuple(like.shape)}, got {tuple(advantages.shape)}")


def _clip_loss(
    ratio: Tensor,
    advantages: Tensor,
    active: Tensor,
    eps_low: float,
    eps_high: float,
    weights: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """``max(-A*r, -A*clip(r, 1-eps_low, 1+eps_high)) * w`` on active tokens, and where the clip won."""
    unclipped = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    clipped = (clipped_loss > unclipped) & active
    loss = torch.where(clipped, clipped_loss, unclipped)  # = the max; its gradient is 0 where clipped
    if weights is not None:
        loss = loss * torch.where(active, weights, 0)
    return torch.where(active, loss, 0), clipped


def clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    *,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-level PPO clipped surrogate with decoupled clip (§1.3), as a loss.

    ``r_t = exp(logprobs_t - old_logprobs_t)``
    ``L_t = max(-A_t * r_t, -A_t * clip(r_t, 1 - eps_low, 1 + eps_high)) * w_t``

    ``advantages`` is ``[B]`` (broadcast over tokens) or ``[B, T]``.  Optional per-token ``weights``
    (TIS, §3.2) multiply the loss *after* clipping and should be detached.  Returns the per-token
    loss ``[B, T]`` (0 at masked-out positions) and a bool ``[B, T]`` that is True where the clipped
    branch is strictly larger, i.e. taken (its mean over the mask is ``clipfrac``).
    """
    active = _active(logprobs, mask)
    ratio = torch.exp(torch.where(active, logprobs - old_logprobs, 0))
    return _clip_loss(ratio, _per_token(advantages, logprobs), active, eps_low, eps_high, weights)


def _at_least_fp32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def gspo_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    *,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GSPO sequence-level clipped surrogate in its GSPO-token form (§2.4), as a loss.

    ``s_i     = exp( (1/|o_i|) sum_t m_t (logprobs_t - old_logprobs_t) )``
    ``s_{i,t} = sg(s_i) * exp(logprobs_t - sg(logprobs_t))``   (equal to s_i in value)
    ``L_{i,t} = max(-A * s_{i,t}, -A * clip(s_{i,t}, 1 - eps_low, 1 + eps_high)) * w_t``

    Every token of a sequence shares the value and the clip decision of ``s_i``, and each unclipped
    token gets the gradient ``-A_i * s_i`` through its own log-prob.  **Aggregate it with
    seq-mean-token-mean**: then ``d loss / d logprobs_{i,t} = -A_i * s_i / (|o_i| * B)``, the GSPO
    gradient; token-mean would weight sequences by length, which is not GSPO.  The log-ratio mean is
    taken in at least float32 (clip ranges are ~1e-4).  Returns (per-token loss, clipped) like
    :func:`clipped_surrogate`; ``weights`` are applied the same way.
    """
    active = _active(logprobs, mask)
    logprobs, old_logprobs = _at_least_fp32(logprobs), _at_least_fp32(old_logprobs)
    log_ratio = torch.where(active, logprobs - old_logprobs, 0)
    seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True) / active.sum(dim=-1, keepdim=True).clamp(min=1)
    token_term = torch.where(active, logprobs - logprobs.detach(), 0)  # 0 in value, gradient 1
    ratio = torch.exp(seq_log_ratio.detach() + token_term)
    return _clip_loss(ratio, _per_token(advantages, logprobs), active, eps_low, eps_high, weights)


# ---------------------------------------------------------------------------------------------------------
# KL and off-policy corrections
# ---------------------------------------------------------------------------------------------------------


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token KL estimators (§1.5) with ``d = logprobs - ref_logprobs``; no clamping.

    ``k1 = d``;  ``k2 = d^2 / 2``;  ``k3 = exp(-d) - 1 + d``  (verl's ``low_var_kl``, unclamped; >= 0).
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; expected one of {', '.join(KL_ESTIMATORS)}")
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    return torch.expm1(-d) + d


def tis_weights(
    old_logprobs: Tensor, behaviour_logprobs: Tensor, cap: float = 2.0, floor: float = 0.0
) -> Tensor:
    """Truncated importance-sampling weights (§3.2 item 4), detached.

    ``w_t = clamp(exp(old_logprobs_t - behaviour_logprobs_t), floor, cap)``: the ratio of the trainer's
    recomputed policy to the engine's behaviour policy; for partial-rollout tokens it also absorbs
    policy-version staleness.  slime defaults: ``cap = 2.0``, ``floor = 0``.
    """
    if not 0 <= floor <= cap:
        raise ValueError(f"need 0 <= floor <= cap, got floor={floor}, cap={cap}")
    log_ratio = old_logprobs.detach() - behaviour_logprobs.detach()
    return torch.exp(log_ratio).clamp(floor, cap)


def offpolicy_mask(token_versions: Tensor, current_version: int) -> Tensor:
    """1.0 where a token was generated by ``current_version`` of the policy, else 0.0.

    Per-token form of slime's ``--mask-offpolicy-in-partial-rollout`` (§3.2 item 2): segments
    generated by older weights before an abort/resume are dropped from the loss.  Returns a float
    tensor of the default dtype, shaped like ``token_versions``.
    """
    return (token_versions == current_version).to(torch.get_default_dtype())


# ---------------------------------------------------------------------------------------------------------
# Config and entry point
# ---------------------------------------------------------------------------------------------------------

_PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"eps_clip_low": 0.2, "eps_clip_high": 0.28, "aggregation": "seq-mean-token-mean"},
    "dapo": {"eps_clip_low": 0.2, "eps_clip_high": 0.28, "aggregation": "token-mean"},
    "gspo": {"eps_clip_low": 3e-4, "eps_clip_high": 4e-4, "aggregation": "seq-mean-token-mean"},
}


def _check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"--{flag} must be one of {', '.join(choices)}, got {value!r}")


@dataclass(kw_only=True, slots=True, frozen=True)
class LossConfig(BaseConfig):
    """Settings of :func:`policy_loss`.

    Direct construction uses the GRPO/APRIL-script values for every algorithm, as slime's flags do
    not depend on the estimator; :meth:`for_algorithm` applies each algorithm's own preset
    (grpo 0.2/0.28 seq-mean-token-mean, dapo 0.2/0.28 token-mean, gspo 3e-4/4e-4 seq-mean-token-mean).
    """

    algorithm: str = param("grpo", help="grpo | dapo | gspo (gspo uses the sequence-level ratio)")
    eps_clip_low: float = param(0.2, help="clip range below: r >= 1 - eps_clip_low")
    eps_clip_high: float = param(0.28, help="clip range above: r <= 1 + eps_clip_high (DAPO clip-higher)")
    aggregation: str = param("seq-mean-token-mean", help=f"loss aggregation: {' | '.join(AGGREGATIONS)}")
    std_normalize: bool = param(True, help="divide group advantages by the group std (off: Dr. GRPO)")
    kl_coef: float = param(0.0, help="KL loss coefficient beta (> 0 needs reference log-probs)")
    kl_estimator: str = param("k3", help=f"KL estimator: {' | '.join(KL_ESTIMATORS)}")
    off_policy: str = param("as-is", help="stale tokens: as-is | mask (drop them) | tis (truncated IS)")
    tis_cap: float = param(2.0, help="TIS cap C on exp(old - behaviour log-prob)")
    entropy_coef: float = param(0.0, help="entropy bonus coefficient (subtracted from the loss)")

    def __post_init__(self) -> None:
        _check_choice("algorithm", self.algorithm, ALGORITHM_NAMES)
        _check_choice("aggregation", self.aggregation, AGGREGATIONS)
        _check_choice("kl-estimator", self.kl_estimator, KL_ESTIMATORS)
        _check_choice("off-policy", self.off_policy, OFF_POLICY_MODES)
        if self.algorithm == "gspo" and self.aggregation != "seq-mean-token-mean":
            raise ConfigError(
                "GSPO is defined with seq-mean-token-mean aggregation; "
                "drop --aggregation or set it to seq-mean-token-mean"
            )
        self._check_ranges()

    def _check_ranges(self) -> None:
        if not 0 <= self.eps_clip_low < 1:
            raise ConfigError(
                f"--eps-clip-low must be in [0, 1) so that 1 - eps_clip_low > 0, got {self.eps_clip_low}"
            )
        if not self.eps_clip_high >= 0:
            raise ConfigError(f"--eps-clip-high must be >= 0, got {self.eps_clip_high}")
        if not self.kl_coef >= 0:
            raise ConfigError(f"--kl-coef must be >= 0 (0 turns the KL term off), got {self.kl_coef}")
        if not self.tis_cap > 0:
            raise ConfigError(f"--tis-cap must be > 0 (slime's default is 2.0), got {self.tis_cap}")
        if not self.entropy_coef >= 0:
            raise ConfigError(
                f"--entropy-coef must be >= 0 (the bonus is subtracted), got {self.entropy_coef}"
            )

    @classmethod
    def for_algorithm(cls, name: str, **overrides: Any) -> LossConfig:
        """The preset of ``name`` (clip range and aggregation), with ``overrides`` applied on top."""
        _check_choice("algorithm", name, ALGORITHM_NAMES)
        if "algorithm" in overrides:
            raise TypeError("pass the algorithm as for_algorithm's first argument, not as an override")
        return cls(algorithm=name, **{**_PRESETS[name], **overrides})


def _off_policy(
    config: LossConfig,
    mask: Tensor,
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor | None,
    token_versions: Tensor | None,
    current_version: int | None,
) -> tuple[Tensor, Tensor | None]:
    """The loss mask and per-token weights of ``config.off_policy`` (§3.2)."""
    if config.off_policy == "mask":
        if token_versions is None or current_version is None:
            raise ValueError('off_policy="mask" needs token_versions and current_version')
        if token_versions.shape != mask.shape:
            raise ValueError(
                f"token_versions must be shaped like mask {tuple(mask.shape)}, "
                f"got {tuple(token_versions.shape)}"
            )
        return mask * offpolicy_mask(token_versions, current_version), None
    if config.off_policy == "tis":
        if behaviour_logprobs is None:
            raise ValueError('off_policy="tis" needs behaviour_logprobs (the inference engine\'s log-probs)')
        return mask, tis_weights(old_logprobs, behaviour_logprobs, cap=config.tis_cap)
    return mask, None


def _kl_term(
    config: LossConfig, logprobs: Tensor, ref_logprobs: Tensor | None, mask: Tensor
) -> Tensor | None:
    """``aggregate(kl_estimate(logprobs, ref))``, or None without reference log-probs."""
    if ref_logprobs is None:
        if config.kl_coef > 0:
            raise ValueError(
                "kl_coef > 0 needs ref_logprobs (the reference model's); pass them or set kl_coef=0"
            )
        return None
    active = _active(logprobs, mask)
    kl = kl_estimate(
        torch.where(active, logprobs, 0), torch.where(active, ref_logprobs, 0), config.kl_estimator
    )
    return aggregate(kl, mask, config.aggregation)


@torch.no_grad()
def _metrics(
    pg_loss: Tensor,
    clipped: Tensor,
    kl: Tensor | None,
    weights: Tensor | None,
    mask: Tensor,
    loss_mask: Tensor,
) -> dict[str, float]:
    """Python-float metrics; ``masked_token_fraction``: share of response tokens the off-policy mask drops."""
    tokens = int((mask != 0).sum())
    kept = int((loss_mask != 0).sum())
    return {
        "pg_loss": float(pg_loss),
        "clipfrac": float(aggregate(clipped.to(pg_loss.dtype), loss_mask, "token-mean")),
        "kl": 0.0 if kl is None else float(kl),
        "tis_weight_mean": 1.0 if weights is None else float(aggregate(weights, mask, "token-mean")),
        "masked_token_fraction": (tokens - kept) / tokens if tokens else 0.0,
    }


def policy_loss(
    config: LossConfig,
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    behaviour_logprobs: Tensor | None = None,
    token_versions: Tensor | None = None,
    current_version: int | None = None,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The scalar training loss of ``config`` and its metrics.

    ``loss = agg(w * L_surrogate) + kl_coef * agg(KL) - entropy_coef * agg(H)``, with agg the
    configured aggregation over the loss mask and L the GSPO surrogate for gspo, the token clipped
    surrogate otherwise.  Off-policy treatment (``config.off_policy``):

    - ``as-is``: none; stale tokens count as if on-policy (slime default).
    - ``mask``: tokens whose version is not ``current_version`` leave the loss *and* the denominators.
    - ``tis``: ``w = tis_weights(old, behaviour, cap=tis_cap)``; denominators keep the original mask totals.

    The KL is taken against ``ref_logprobs`` when given (needed when ``kl_coef > 0``) and is logged
    even when ``kl_coef == 0``.  Metrics: ``pg_loss``, ``clipfrac``, ``kl``, ``tis_weight_mean`` and
    ``masked_token_fraction``, as Python floats.
    """
    loss_mask, weights = _off_policy(
        config, mask, old_logprobs, behaviour_logprobs, token_versions, current_version
    )
    surrogate = gspo_surrogate if config.algorithm == "gspo" else clipped_surrogate
    per_token, clipped = surrogate(
        logprobs,
        old_logprobs,
        advantages,
        loss_mask,
        config.eps_clip_low,
        config.eps_clip_high,
        weights=weights,
    )
    pg_loss = aggregate(per_token, loss_mask, config.aggregation)
    kl = _kl_term(config, logprobs, ref_logprobs, loss_mask)
    loss = pg_loss
    if kl is not None and config.kl_coef > 0:
        loss = loss + config.kl_coef * kl
    if entropy is not None and config.entropy_coef > 0:
        loss = loss - config.entropy_coef * aggregate(entropy, loss_mask, config.aggregation)
    return loss, _metrics(pg_loss, clipped, kl, weights, mask, loss_mask)


def loss_denominator(
    config: LossConfig,
    mask: Tensor,
    token_versions: Tensor | None = None,
    current_version: int | None = None,
) -> Tensor:
    """What :func:`policy_loss` divides by: masked-in tokens (``token-mean``) or sequences with one.

    Every term of the loss is a sum over rows divided by this count, so a batch split across
    data-parallel ranks reproduces the one-process loss when each rank weights its own loss by
    ``its denominator / the whole batch's`` (the FSDP trainer does).  ``mask`` mode drops stale
    tokens from the count, as it does from the loss.
    """
    loss_mask = mask
    if config.off_policy == "mask":
        if token_versions is None or current_version is None:
            raise ValueError('off_policy="mask" needs token_versions and current_version')
        loss_mask = mask * offpolicy_mask(token_versions, current_version)
    tokens = (_active(loss_mask, loss_mask)).sum(dim=-1)
    if config.aggregation == "token-mean":
        return tokens.sum()
    return (tokens > 0).sum()
