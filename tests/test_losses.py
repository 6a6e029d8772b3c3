"""Policy losses (april_bench.algorithms.losses) on small cases computed by hand.

Expected values are worked out in the comments (shared/docs/algorithms.md gives the formulas);
everything runs in float64 so comparisons can be tight.
"""

from __future__ import annotations

import math

import pytest
import torch

from april_bench.algorithms.losses import (
    LossConfig,
    aggregate,
    clipped_surrogate,
    group_advantages,
    gspo_surrogate,
    kl_estimate,
    offpolicy_mask,
    overlong_penalty,
    policy_loss,
    tis_weights,
)
from april_bench.config import ConfigError

F64 = torch.float64
LN = math.log


def t(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def close(actual: torch.Tensor | float, expected: object, tol: float = 1e-12) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=F64), t(expected), rtol=tol, atol=tol)


# --- group advantages -----------------------------------------------------------------------------------


def test_group_advantages_std_normalised_uses_unbiased_std() -> None:
    # group 1: R = [1, 0, 0], mean 1/3, deviations [2/3, -1/3, -1/3],
    #          unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3, std = 1/sqrt(3)
    # group 2: R = [0, 2, 4], mean 2, deviations [-2, 0, 2], var = 8/2 = 4, std = 2
    #          (the population std would be sqrt(8/3) = 1.63, giving +-1.22 instead of +-1)
    adv = group_advantages(t([1, 0, 0, 0, 2, 4]), 3)
    s1 = 1 / math.sqrt(3) + 1e-6
    s2 = 2 + 1e-6
    close(adv, [(2 / 3) / s1, (-1 / 3) / s1, (-1 / 3) / s1, -2 / s2, 0.0, 2 / s2])
    # i.e. about [1.1547, -0.5774, -0.5774, -1, 0, 1]
    close(adv, [2 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1, 0, 1], tol=1e-5)


def test_group_advantages_without_std_is_dr_grpo() -> None:
    # the deviations above, undivided
    adv = group_advantages(t([1, 0, 0, 0, 2, 4]), 3, std_normalize=False)
    close(adv, [2 / 3, -1 / 3, -1 / 3, -2, 0, 2])


def test_group_advantages_of_two_groups_of_two() -> None:
    # [1, 0]: mean 0.5, dev +-0.5, unbiased std = sqrt(0.5) = 0.7071 -> +-0.7071
    # [3, 3]: no spread -> 0 / (0 + eps) = 0
    adv = group_advantages(t([1, 0, 3, 3]), 2)
    half = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(adv, [half, -half, 0, 0])


@pytest.mark.parametrize("std_normalize", [True, False])
def test_singleton_groups_get_zero_advantage(std_normalize: bool) -> None:
    # slime: n_samples_per_prompt == 1 -> R - mean(R) = 0 (not verl's R / (1 + eps))
    adv = group_advantages(t([1.0, 0.0, 3.0]), 1, std_normalize=std_normalize)
    close(adv, [0, 0, 0])


def test_group_advantages_of_integer_rewards_are_float() -> None:
    adv = group_advantages(torch.tensor([1, 0]), 2, std_normalize=False)
    assert adv.dtype == torch.get_default_dtype()
    assert adv.tolist() == [0.5, -0.5]


def test_group_advantages_rejects_partial_groups() -> None:
    with pytest.raises(ValueError, match=r"5 entries, not a multiple of group_size=2"):
        group_advantages(t([1, 0, 1, 0, 1]), 2)
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        group_advantages(t([1, 0]), 0)
    with pytest.raises(ValueError, match="flat"):
        group_advantages(t([[1, 0]]), 2)


# --- aggregation ----------------------------------------------------------------------------------------

PER_TOKEN = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
MASK = [[1, 1, 0], [1, 1, 1], [0, 0, 0]]  # the third sequence has no token


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 3.6),  # (1 + 2 + 4 + 5 + 6) / 5 = 18 / 5
        ("seq-mean-token-mean", 3.25),  # B = 2: ((1 + 2) / 2 + (4 + 5 + 6) / 3) / 2 = (1.5 + 5) / 2
        ("seq-mean-token-sum", 9.0),  # B = 2: (3 + 15) / 2
    ],
)
def test_aggregation_modes(mode: str, expected: float) -> None:
    close(aggregate(t(PER_TOKEN), t(MASK), mode), expected)
    close(aggregate(t(PER_TOKEN), torch.tensor(MASK, dtype=torch.bool), mode), expected)
    # garbage in masked-out positions never reaches the result
    garbage = t(PER_TOKEN)
    garbage[0, 2], garbage[2, 0] = float("nan"), float("inf")
    close(aggregate(garbage, t(MASK), mode), expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregation_of_an_empty_mask_is_zero_with_zero_gradient(mode: str) -> None:
    values = t(PER_TOKEN).requires_grad_()
    out = aggregate(values, torch.zeros(3, 3, dtype=F64), mode)
    assert out.item() == 0.0
    out.backward()
    assert values.grad is not None
    assert torch.equal(values.grad, torch.zeros(3, 3, dtype=F64))


def test_aggregation_errors() -> None:
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum"):
        aggregate(t(PER_TOKEN), t(MASK), "seq-mean")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        aggregate(t(PER_TOKEN), t([1, 1, 1]), "token-mean")


# --- clipped surrogate ----------------------------------------------------------------------------------


def test_clipped_surrogate_in_all_four_regions_with_asymmetric_clip() -> None:
    # eps_low 0.2, eps_high 0.28: clip range [0.8, 1.28]; old = 0 so r = exp(logprobs).
    # A = +2:  r = 1.5  above -> max(-3.0, -2.56)  = -2.56  clipped
    #          r = 0.5  below -> max(-1.0, -1.6)   = -1.0   not clipped
    #          r = 1.25 inside the asymmetric range (would clip at 1.2) -> -2.5, not clipped
    # A = -1:  r = 1.5  above -> max(1.5, 1.28)    = 1.5    not clipped
    #          r = 0.5  below -> max(0.5, 0.8)     = 0.8    clipped
    #          r = 1.0         -> 1.0
    logprobs = t([[LN(1.5), LN(0.5), LN(1.25)], [LN(1.5), LN(0.5), 0.0]]).requires_grad_()
    loss, clipped = clipped_surrogate(
        logprobs, torch.zeros(2, 3, dtype=F64), t([2, -1]), t([[1] * 3] * 2), 0.2, 0.28
    )
    close(loss, [[-2.56, -1.0, -2.5], [1.5, 0.8, 1.0]])
    assert clipped.tolist() == [[True, False, False], [False, True, False]]
    # d(-A r)/d logprob = -A r where unclipped; 0 where the clip won
    loss.sum().backward()
    assert logprobs.grad is not None
    close(logprobs.grad, [[0.0, -1.0, -2.5], [1.5, 0.0, 1.0]])


def test_clipped_surrogate_weights_multiply_after_clipping_and_advantages_may_be_per_token() -> None:
    logprobs = t([[LN(1.5), LN(0.5), LN(1.25)], [LN(1.5), LN(0.5), 0.0]])
    old, mask = torch.zeros(2, 3, dtype=F64), t([[1, 1, 0], [1, 1, 1]])
    weights = t([[0.5, 2.0, 7.0], [1.0, 1.0, 3.0]])
    loss, clipped = clipped_surrogate(logprobs, old, t([[2] * 3, [-1] * 3]), mask, 0.2, 0.28, weights=weights)
    # -2.56 * 0.5 = -1.28, -1.0 * 2 = -2.0, masked -> 0;  1.5, 0.8, 1.0 * 3 = 3.0
    close(loss, [[-1.28, -2.0, 0.0], [1.5, 0.8, 3.0]])
    assert clipped.tolist() == [[True, False, False], [False, True, False]]


def test_clipped_surrogate_rejects_misshaped_advantages() -> None:
    with pytest.raises(ValueError, match=r"advantages must be \[B\] or \[B, T\]"):
        clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3), 0.2, 0.2)


# --- GSPO -----------------------------------------------------------------------------------------------

# seq 1: log-ratios [0.1, 0.3, (masked 5.0)] -> mean 0.2  -> s1 = e^0.2   = 1.221403
# seq 2: log-ratios [-0.2, 0.0, 0.05]       -> mean -0.05 -> s2 = e^-0.05 = 0.951229
GSPO_LOGPROBS = [[-1.0 + 0.1, -2.0 + 0.3, 5.0], [-1.0 - 0.2, -0.5, -3.0 + 0.05]]
GSPO_OLD = [[-1.0, -2.0, 0.0], [-1.0, -0.5, -3.0]]
GSPO_MASK = [[1, 1, 0], [1, 1, 1]]
S1, S2 = math.exp(0.2), math.exp(-0.05)


def test_gspo_sequence_ratio_and_gradient_under_seq_mean_token_mean() -> None:
    logprobs = t(GSPO_LOGPROBS).requires_grad_()
    adv = t([2.0, -1.0])
    # eps 0.5 / 0.5: range [0.5, 1.5] holds both s1 and s2, so nothing is clipped;
    # every token carries -A_i * s_i: seq 1 -> -2 * 1.221403, seq 2 -> +0.951229
    per_token, clipped = gspo_surrogate(logprobs, t(GSPO_OLD), adv, t(GSPO_MASK), 0.5, 0.5)
    close(per_token, [[-2 * S1, -2 * S1, 0.0], [S2, S2, S2]])
    assert not clipped.any()
    loss = aggregate(per_token, t(GSPO_MASK), "seq-mean-token-mean")
    close(loss, (-2 * S1 + S2) / 2)
    loss.backward()
    # d loss / d logprob_{i,t} = -A_i * s_i / (|o_i| * B), B = 2:
    # seq 1: -2 * 1.221403 / (2 * 2) = -0.610701; seq 2: +1 * 0.951229 / (3 * 2) = 0.158538
    assert logprobs.grad is not None
    close(logprobs.grad, [[-2 * S1 / 4, -2 * S1 / 4, 0.0], [S2 / 6, S2 / 6, S2 / 6]])


def test_gspo_token_form_matches_the_sequence_form_gradient() -> None:
    # the paper's sequence objective, with the gradient through the mean log-ratio
    direct_lp = t(GSPO_LOGPROBS).requires_grad_()
    mask, adv = t(GSPO_MASK), t([2.0, -1.0])
    s = torch.exp(((direct_lp - t(GSPO_OLD)) * mask).sum(-1) / mask.sum(-1))
    (-(adv * s).mean()).backward()
    token_lp = t(GSPO_LOGPROBS).requires_grad_()
    per_token, _ = gspo_surrogate(token_lp, t(GSPO_OLD), adv, mask, 0.5, 0.5)
    aggregate(per_token, mask, "seq-mean-token-mean").backward()
    assert direct_lp.grad is not None and token_lp.grad is not None
    close(token_lp.grad, direct_lp.grad.tolist())


def test_gspo_clips_whole_sequences_at_the_paper_ranges() -> None:
    # eps 3e-4 / 4e-4: range [0.9997, 1.0004]
    # seq 1: A = +2, s1 = 1.2214 above -> -2 * 1.0004 = -2.0008 on every token, clipped, no gradient
    # seq 2: A = -1, s2 = 0.9512 below -> +0.9997 on every token, clipped, no gradient
    logprobs = t(GSPO_LOGPROBS).requires_grad_()
    per_token, clipped = gspo_surrogate(logprobs, t(GSPO_OLD), t([2.0, -1.0]), t(GSPO_MASK), 3e-4, 4e-4)
    close(per_token, [[-2.0008, -2.0008, 0.0], [0.9997, 0.9997, 0.9997]])
    assert clipped.tolist() == [[True, True, False], [True, True, True]]
    per_token.sum().backward()
    assert logprobs.grad is not None
    assert torch.equal(logprobs.grad, torch.zeros(2, 3, dtype=F64))


def test_gspo_log_ratio_mean_runs_in_at_least_float32() -> None:
    # log-ratios [0.5, 2^-9], both exact in bfloat16; their sum 0.501953125 is not (bf16 spacing at 0.5
    # is 2^-8, so it would round to 0.5).  In float32: mean = 0.2509765625, s = exp(0.2509765625) = 1.285283
    logprobs = torch.tensor([[-0.5, -(2**-8)]], dtype=torch.bfloat16)
    old = torch.tensor([[-1.0, -1.5 * 2**-8]], dtype=torch.bfloat16)
    per_token, _ = gspo_surrogate(logprobs, old, torch.ones(1), torch.ones(1, 2), 0.5, 0.5)
    assert per_token.dtype == torch.float32
    close(per_token.to(F64), [[-math.exp(0.2509765625)] * 2], tol=1e-6)


# --- KL, overlong penalty, TIS, off-policy mask ---------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # d = [0.5, -0.5, 0]
        ("k1", [0.5, -0.5, 0.0]),
        ("k2", [0.125, 0.125, 0.0]),  # d^2 / 2
        # exp(-0.5) - 1 + 0.5 = 0.606531 - 0.5 = 0.106531;  exp(0.5) - 1 - 0.5 = 1.648721 - 1.5 = 0.148721
        ("k3", [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, 0.0]),
    ],
)
def test_kl_estimators(kind: str, expected: list[float]) -> None:
    close(kl_estimate(t([[0.0, -1.0, -2.0]]), t([[-0.5, -0.5, -2.0]]), kind), [expected])


def test_kl_estimate_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="expected one of k1, k2, k3"):
        kl_estimate(t([0.0]), t([0.0]), "low_var_kl")


def test_overlong_penalty_at_inside_and_beyond_the_buffer() -> None:
    # max_len 20, buffer 4: free up to 16, then (16 - len) / 4, floored at -1 from 20 on
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    close(overlong_penalty(lengths, 20, 4).to(F64), [0, 0, -0.25, -0.5, -1, -1], tol=1e-7)
    close(overlong_penalty(lengths.to(F64), 20, 4, factor=0.5), [0, 0, -0.125, -0.25, -0.5, -0.5])


def test_overlong_penalty_rejects_bad_buffer() -> None:
    with pytest.raises(ValueError, match="0 < buffer_len <= max_len"):
        overlong_penalty(torch.tensor([1]), 20, 0)
    with pytest.raises(ValueError, match="0 < buffer_len <= max_len"):
        overlong_penalty(torch.tensor([1]), 20, 21)


def test_tis_weights_clamp_and_are_detached() -> None:
    # rho = exp(old - behaviour) = [1, 3, 0.5, 1.5] -> cap 2: [1, 2, 0.5, 1.5]; floor 0.8: [1, 2, 0.8, 1.5]
    old = torch.zeros(4, dtype=F64, requires_grad=True)
    behaviour = t([0.0, -LN(3), LN(2), -LN(1.5)]).requires_grad_()
    weights = tis_weights(old, behaviour)
    close(weights, [1.0, 2.0, 0.5, 1.5])
    assert not weights.requires_grad and weights.grad_fn is None
    close(tis_weights(old, behaviour, cap=2.0, floor=0.8), [1.0, 2.0, 0.8, 1.5])
    with pytest.raises(ValueError, match="0 <= floor <= cap"):
        tis_weights(old, behaviour, cap=0.5, floor=0.8)


def test_offpolicy_mask_keeps_only_current_version_tokens() -> None:
    versions = torch.tensor([[3, 3, 2], [1, 3, 3]])
    assert offpolicy_mask(versions, 3).tolist() == [[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]
    assert offpolicy_mask(versions, 3).dtype.is_floating_point


# --- policy_loss ----------------------------------------------------------------------------------------

# Shared batch: old = 0, A = [+1, -1], mask [[1, 1, 0], [1, 1, 1]]
# ratios: seq 1 [1.5, 1.0, (masked)], seq 2 [0.5, 1.0, 1.2]
# with the 0.2 / 0.28 clip ([0.8, 1.28]) the per-token losses are
#   seq 1: r=1.5 clipped -> -1.28; r=1.0 -> -1.0
#   seq 2: r=0.5 clipped ->  0.8;  r=1.0 ->  1.0; r=1.2 -> 1.2
LOGPROBS = [[LN(1.5), 0.0, 0.0], [LN(0.5), 0.0, LN(1.2)]]
ADV = [1.0, -1.0]
PL_MASK = [[1, 1, 0], [1, 1, 1]]


def batch(**extra: torch.Tensor | int) -> dict[str, torch.Tensor | int]:
    return {
        "logprobs": t(LOGPROBS),
        "old_logprobs": torch.zeros(2, 3, dtype=F64),
        "advantages": t(ADV),
        "mask": t(PL_MASK),
        **extra,
    }


def test_policy_loss_grpo_preset() -> None:
    # seq-mean-token-mean: seq 1 (-1.28 - 1.0) / 2 = -1.14; seq 2 (0.8 + 1.0 + 1.2) / 3 = 1.0
    # loss = (-1.14 + 1.0) / 2 = -0.07; clipfrac = 2 of 5 tokens
    loss, metrics = policy_loss(LossConfig.for_algorithm("grpo"), **batch())
    close(loss, -0.07)
    assert metrics == pytest.approx(
        {"pg_loss": -0.07, "clipfrac": 0.4, "kl": 0.0, "tis_weight_mean": 1.0, "masked_token_fraction": 0.0}
    )
    assert all(type(v) is float for v in metrics.values())


def test_policy_loss_dapo_preset_is_token_mean() -> None:
    # (-1.28 - 1.0 + 0.8 + 1.0 + 1.2) / 5 = 0.72 / 5 = 0.144
    loss, metrics = policy_loss(LossConfig.for_algorithm("dapo"), **batch())
    close(loss, 0.144)
    assert metrics["clipfrac"] == pytest.approx(0.4)


def test_policy_loss_gspo_preset() -> None:
    # s1 = exp((ln 1.5 + 0) / 2) = sqrt(1.5) = 1.2247 > 1.0004, A = +1 -> -1.0004 per token (clipped)
    # s2 = exp((ln 0.5 + 0 + ln 1.2) / 3) = 0.6^(1/3) = 0.8434 < 0.9997, A = -1 -> +0.9997 (clipped)
    # loss = (-1.0004 + 0.9997) / 2 = -0.00035, every token clipped
    loss, metrics = policy_loss(LossConfig.for_algorithm("gspo"), **batch())
    close(loss, -0.00035)
    assert metrics["clipfrac"] == 1.0


def test_policy_loss_adds_kl_and_subtracts_entropy() -> None:
    # ref = logprobs - 0.1 -> k1 = 0.1 on every token; aggregated 0.1; loss = -0.07 + 0.5 * 0.1 = -0.02
    config = LossConfig.for_algorithm("grpo", kl_coef=0.5, kl_estimator="k1")
    loss, metrics = policy_loss(config, **batch(ref_logprobs=t(LOGPROBS) - 0.1))
    close(loss, -0.02)
    assert metrics["kl"] == pytest.approx(0.1)
    assert metrics["pg_loss"] == pytest.approx(-0.07)
    # entropy 2.0 everywhere, coef 0.01: loss = -0.02 - 0.01 * 2 = -0.04
    config = config.replace(entropy_coef=0.01)
    loss, _ = policy_loss(
        config, **batch(ref_logprobs=t(LOGPROBS) - 0.1, entropy=torch.full((2, 3), 2.0, dtype=F64))
    )
    close(loss, -0.04)


def test_policy_loss_logs_kl_with_zero_coefficient() -> None:
    loss, metrics = policy_loss(LossConfig(kl_estimator="k1"), **batch(ref_logprobs=t(LOGPROBS) - 0.1))
    close(loss, -0.07)
    assert metrics["kl"] == pytest.approx(0.1)


def test_policy_loss_tis_keeps_original_denominators() -> None:
    # rho = exp(0 - behaviour): seq 1 [3 -> cap 2, 0.5, (masked)], seq 2 [1, 1, 1]
    # dapo token-mean: (-1.28 * 2 - 1.0 * 0.5 + 0.8 + 1.0 + 1.2) / 5 = (-3.06 + 3.0) / 5 = -0.012
    # (dividing by the weight sum 5.5 instead would give -0.0109)
    # tis_weight_mean = (2 + 0.5 + 1 + 1 + 1) / 5 = 1.1
    behaviour = t([[-LN(3), LN(2), 99.0], [0.0, 0.0, 0.0]])
    config = LossConfig.for_algorithm("dapo", off_policy="tis")
    loss, metrics = policy_loss(config, **batch(behaviour_logprobs=behaviour))
    close(loss, -0.012)
    assert metrics["tis_weight_mean"] == pytest.approx(1.1)


def test_policy_loss_mask_drops_stale_tokens_from_loss_and_denominator() -> None:
    # version 2 is stale at seq 1 token 0 -> kept tokens: seq 1 [-1.0], seq 2 [0.8, 1.0, 1.2]
    # dapo token-mean: (-1.0 + 3.0) / 4 = 0.5;  1 of 5 response tokens masked
    versions = torch.tensor([[2, 3, 3], [3, 3, 3]])
    config = LossConfig.for_algorithm("dapo", off_policy="mask")
    loss, metrics = policy_loss(config, **batch(token_versions=versions, current_version=3))
    close(loss, 0.5)
    assert metrics["masked_token_fraction"] == pytest.approx(0.2)
    assert metrics["clipfrac"] == pytest.approx(0.25)  # only seq 2's r=0.5 is clipped
    # a fully stale sequence leaves B: grpo seq-mean over seq 2 alone = 1.0
    versions = torch.tensor([[2, 2, 3], [3, 3, 3]])
    loss, metrics = policy_loss(
        config.replace(aggregation="seq-mean-token-mean"), **batch(token_versions=versions, current_version=3)
    )
    close(loss, 1.0)
    assert metrics["masked_token_fraction"] == pytest.approx(0.4)


PADDING_GARBAGE = [(0, 2), (1, 0)]


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "gspo"])
@pytest.mark.parametrize("off_policy", ["as-is", "mask", "tis"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_gradient_flows_only_through_counted_tokens(algorithm: str, off_policy: str, kl_coef: float) -> None:
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(2, 4, generator=gen, dtype=F64) * 3
    logprobs = (old + 0.05 * torch.randn(2, 4, generator=gen, dtype=F64)).requires_grad_()
    mask = t([[1, 1, 0, 1], [0, 1, 1, 1]])
    versions = torch.tensor([[5, 4, 5, 5], [5, 5, 5, 4]])  # stale tokens at (0, 1) and (1, 3)
    counted = mask.bool() & (versions == 5) if off_policy == "mask" else mask.bool()
    ref = old - 0.1
    behaviour = old + 0.2
    for i, j in PADDING_GARBAGE:  # masked-out positions hold garbage that must stay inert
        old[i, j], ref[i, j], behaviour[i, j] = float("nan"), float("-inf"), float("inf")
    config = LossConfig.for_algorithm(
        algorithm, off_policy=off_policy, kl_coef=kl_coef, eps_clip_low=0.5, eps_clip_high=0.5
    )
    loss, metrics = policy_loss(
        config,
        logprobs=logprobs,
        old_logprobs=old,
        advantages=t([1.0, -0.5]),
        mask=mask,
        behaviour_logprobs=behaviour,
        token_versions=versions,
        current_version=5,
        ref_logprobs=ref,
    )
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values())
    loss.backward()
    grad = logprobs.grad
    assert grad is not None
    assert torch.equal(grad[~counted], torch.zeros_like(grad[~counted]))
    assert (grad[counted] != 0).all()


# --- config ---------------------------------------------------------------------------------------------


def test_presets() -> None:
    grpo, dapo, gspo = (LossConfig.for_algorithm(n) for n in ("grpo", "dapo", "gspo"))
    assert (grpo.eps_clip_low, grpo.eps_clip_high, grpo.aggregation) == (0.2, 0.28, "seq-mean-token-mean")
    assert (dapo.eps_clip_low, dapo.eps_clip_high, dapo.aggregation) == (0.2, 0.28, "token-mean")
    assert (gspo.eps_clip_low, gspo.eps_clip_high, gspo.aggregation) == (3e-4, 4e-4, "seq-mean-token-mean")
    assert LossConfig() == grpo
    assert LossConfig.for_algorithm("dapo", eps_clip_high=0.3).eps_clip_high == 0.3
    assert grpo.std_normalize and grpo.kl_coef == 0.0 and grpo.kl_estimator == "k3"
    assert (grpo.off_policy, grpo.tis_cap, grpo.entropy_coef) == ("as-is", 2.0, 0.0)
    assert set(LossConfig.field_help()) >= {"algorithm", "aggregation", "off_policy"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"algorithm": "gspo", "aggregation": "token-mean"},
            "drop --aggregation or set it to seq-mean-token-mean",
        ),
        ({"algorithm": "ppo"}, "--algorithm must be one of grpo, dapo, gspo, got 'ppo'"),
        ({"aggregation": "sum"}, "--aggregation must be one of token-mean, seq-mean-token-mean"),
        ({"kl_estimator": "k4"}, "--kl-estimator must be one of k1, k2, k3"),
        ({"off_policy": "drop"}, "--off-policy must be one of as-is, mask, tis"),
        ({"eps_clip_low": 1.0}, r"--eps-clip-low must be in \[0, 1\)"),
        ({"eps_clip_high": -0.1}, "--eps-clip-high must be >= 0"),
        ({"kl_coef": -0.01}, "--kl-coef must be >= 0"),
        ({"tis_cap": 0.0}, "--tis-cap must be > 0"),
        ({"entropy_coef": -1.0}, "--entropy-coef must be >= 0"),
    ],
)
def test_config_errors_name_the_fix(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LossConfig(**kwargs)  # type: ignore[arg-type]


def test_gspo_preset_rejects_other_aggregations() -> None:
    with pytest.raises(ConfigError, match="GSPO is defined with seq-mean-token-mean aggregation"):
        LossConfig.for_algorithm("gspo", aggregation="token-mean")
    with pytest.raises(ConfigError, match="--algorithm must be one of"):
        LossConfig.for_algorithm("ppo")
    with pytest.raises(ConfigError, match="GSPO"):
        LossConfig.for_algorithm("grpo").replace(algorithm="gspo", aggregation="seq-mean-token-sum")


def test_policy_loss_errors_for_missing_inputs() -> None:
    with pytest.raises(ValueError, match="token_versions and current_version"):
        policy_loss(LossConfig(off_policy="mask"), **batch())
    with pytest.raises(ValueError, match="token_versions and current_version"):
        policy_loss(LossConfig(off_policy="mask"), **batch(token_versions=torch.zeros(2, 3)))
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        policy_loss(LossConfig(off_policy="tis"), **batch())
    with pytest.raises(ValueError, match="kl_coef > 0 needs ref_logprobs"):
        policy_loss(LossConfig(kl_coef=0.1), **batch())
    with pytest.raises(ValueError, match="token_versions must be shaped like mask"):
        policy_loss(
            LossConfig(off_policy="mask"), **batch(token_versions=torch.zeros(2, 1), current_version=0)
        )
