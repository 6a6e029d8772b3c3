"""The torch trainer: batch layout, reward shaping, off-policy treatments, exact micro-batching,
and what one policy-gradient step guarantees."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from april_bench.models.zoo import build_model
from april_bench.tasks.synthetic import SyntheticTask
from april_bench.tasks.warmstart import WarmStart
from april_bench.trainers.torch_trainer import TorchTrainer
from april_bench.types import FinishReason, Group, Prompt, Segment

VOCAB = 17


def _group(uid: int, responses: list[list[tuple[int, list[int]]]], rewards: list[float]) -> Group:
    """``responses[i]`` is a list of (policy version, token ids) segments for sample i."""
    prompt = Prompt(uid=uid, source_id=f"p{uid}", length=3, token_ids=(1, 5, 6))
    group = Group.fresh(prompt, len(responses))
    for sample, segments, reward in zip(group.samples, responses, rewards, strict=True):
        for version, ids in segments:
            sample.append(
                Segment(
                    f"r{uid}",
                    version,
                    len(ids),
                    FinishReason.STOP,
                    version,
                    tuple(ids),
                    tuple(-1.0 for _ in ids),
                )
            )
        sample.reward = reward
    return group


def _trainer(**kw: object) -> TorchTrainer:
    torch.manual_seed(0)
    return TorchTrainer.Config(**kw).build(module=build_model("tiny", vocab_size=VOCAB))


def test_rows_align_tokens_masks_versions_and_advantages() -> None:
    batch = [_group(0, [[(0, [7, 8]), (1, [9])], [(1, [7, 2])]], [1.0, 0.0])]
    rows = _trainer()._rows(batch)
    assert rows.ids.tolist() == [[1, 5, 6, 7, 8, 9], [1, 5, 6, 7, 2, 0]]
    # targets are shifted by one: response tokens start at target index prompt_len - 1 = 2
    assert rows.mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 0]]
    assert rows.versions.tolist() == [[-1, -1, 0, 0, 1], [-1, -1, 1, 1, -1]]
    assert rows.behaviour[0, 2:].tolist() == [-1.0, -1.0, -1.0]
    assert rows.advantages.tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)


def test_groups_of_several_sizes_get_their_own_advantages() -> None:
    # sagc trains groups of the sizes they were launched with: 2 and 3 samples in one batch
    two = _group(0, [[(0, [7])], [(0, [8])]], [1.0, 0.0])
    three = _group(1, [[(0, [7])], [(0, [8])], [(0, [9])]], [1.0, 1.0, 0.0])
    rows = _trainer()._rows([two, three])
    # (R - mean) / (unbiased std + eps): [1, 0] -> +-0.7071; [1, 1, 0] -> mean 2/3, std 0.5774
    assert rows.advantages.tolist() == pytest.approx([0.7071, -0.7071, 0.5774, 0.5774, -1.1547], abs=1e-4)


def test_dapo_rewards_are_plus_minus_one_with_the_overlong_penalty() -> None:
    trainer = _trainer(algorithm="dapo", max_response_len=8, overlong_buffer=4)
    batch = [_group(0, [[(0, [7] * 2)], [(0, [7] * 6)], [(0, [7] * 8)]], [1.0, 1.0, 0.0])]
    rewards = trainer._rewards(batch[0].samples)
    # lengths 2, 6, 8 against a limit of 8 with a 4-token buffer: penalties 0, -0.5, -1
    assert rewards.tolist() == pytest.approx([1.0, 0.5, -2.0])


@pytest.mark.parametrize("mode", ["as-is", "mask", "tis"])
def test_off_policy_treatments_see_per_token_versions(mode: str) -> None:
    trainer = _trainer(off_policy=mode)
    batch = [_group(0, [[(0, [7, 8]), (1, [9, 2])], [(1, [7, 2])]], [1.0, 0.0])]
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = asyncio.run(trainer.train(batch, step=1, policy_version=1))
    metrics = result.metrics
    changed = max((v - before[k]).abs().max().item() for k, v in trainer.model.state_dict().items())
    assert changed > 0
    # 2 of the 6 response tokens come from version 0: masked out only in "mask" mode
    assert metrics["masked_token_fraction"] == pytest.approx(2 / 6 if mode == "mask" else 0.0)
    # behaviour log-probs are -1.0 everywhere, unlike the model's: TIS weights differ from 1
    assert (metrics["tis_weight_mean"] != pytest.approx(1.0)) == (mode == "tis")


def test_warm_start_is_cached_and_keyed_by_its_settings(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("APRIL_BENCH_CACHE", str(tmp_path))
    task = SyntheticTask.Config().build()
    first = WarmStart.Config(steps=3).build(task=task)
    weights = first.weights(progress=False)
    assert first.path.exists() and first.path.is_relative_to(tmp_path)
    again = WarmStart.Config(steps=3).build(task=task).weights(progress=False)
    assert all(torch.equal(weights[k], again[k]) for k in weights)
    assert WarmStart.Config(steps=4).build(task=task).path != first.path


def _mixed_batch() -> list[Group]:
    """Three groups of four with response lengths 1 to 6, two policy versions and mixed rewards."""
    groups = []
    for uid in range(3):
        responses = [
            [(0, [7 + (uid + i) % 5] * (1 + (uid + i) % 3)), (1, [9, 3 + i][: 1 + (i + uid) % 2])]
            for i in range(4)
        ]
        groups.append(_group(uid, responses, [float(uid % 2), 1.0, 0.0, float(uid == 1)]))
    return groups


def _gradients(trainer: TorchTrainer, batch: list[Group]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The gradient of one optimizer step (the weights it was taken at are the seeded ones)."""
    metrics = asyncio.run(trainer.train(batch, step=1, policy_version=1)).metrics
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return grads, metrics


@pytest.mark.parametrize(
    ("algorithm", "off_policy"),
    [
        ("grpo", "as-is"),
        ("dapo", "as-is"),
        ("gspo", "as-is"),
        ("grpo", "mask"),
        ("dapo", "mask"),
        ("dapo", "tis"),
    ],
)
def test_micro_batches_accumulate_the_full_batch_gradient(algorithm: str, off_policy: str) -> None:
    """token-mean (dapo) and seq-mean-token-mean (grpo, gspo) split exactly, stale tokens masked or not."""
    batch = _mixed_batch()
    settings = {"algorithm": algorithm, "off_policy": off_policy, "grad_clip": 1e9}
    full, full_metrics = _gradients(_trainer(**settings), batch)
    micro, micro_metrics = _gradients(
        _trainer(**settings, max_tokens_per_micro_batch=14, logprob_chunk_tokens=3), batch
    )
    assert full.keys() == micro.keys()
    for name, grad in full.items():
        torch.testing.assert_close(micro[name], grad, rtol=1e-4, atol=1e-7)
    for key in ("loss", "pg_loss", "clipfrac", "masked_token_fraction", "entropy", "grad_norm"):
        assert micro_metrics[key] == pytest.approx(full_metrics[key], rel=1e-4, abs=1e-6), key


def test_micro_batches_pack_by_length_within_the_budget() -> None:
    from april_bench.trainers.microbatch import pack_by_length, padded_tokens

    lengths = [3, 9, 4, 9, 2, 20]
    batches = pack_by_length(lengths, 18)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches == [[5], [1, 3], [2, 0, 4]]  # longest first; the 20-token sample alone
    assert all(padded_tokens(lengths, b) <= 18 for b in batches if len(b) > 1)
    assert pack_by_length(lengths, None) == [list(range(6))]


def _response_logprobs(trainer: TorchTrainer, batch: list[Group]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs [S, L-1] of the batch under the trainer's current weights, and the mask."""
    rows = trainer._rows(batch)
    return trainer._recompute(trainer.model, rows), rows.mask


def test_a_policy_gradient_step_lowers_the_loss_of_its_batch_and_favours_positive_advantages() -> None:
    from april_bench.algorithms.losses import policy_loss

    trainer = _trainer(lr=1e-3)
    batch = [_group(0, [[(0, [7, 8, 9])], [(0, [10, 11, 12])]], [1.0, 0.0])]
    before, mask = _response_logprobs(trainer, batch)
    asyncio.run(trainer.train(batch, step=1, policy_version=0))
    after, _ = _response_logprobs(trainer, batch)
    rows = trainer._rows(batch)

    def loss(logprobs: torch.Tensor) -> float:
        value, _ = policy_loss(
            trainer.loss_config, logprobs=logprobs, old_logprobs=before, advantages=rows.advantages, mask=mask
        )
        return float(value)

    assert loss(after) < loss(before)
    sequence = (after - before).mul(mask).sum(-1)  # change of each response's log-probability
    assert sequence[0] > 0 > sequence[1]  # reward 1 (advantage > 0) up, reward 0 down


def test_state_round_trip_continues_bit_identically(tmp_path: Path) -> None:
    batch = _mixed_batch()
    straight = _trainer()
    for step in range(2):
        asyncio.run(straight.train(batch, step=step, policy_version=step))
    first = _trainer()
    asyncio.run(first.train(batch, step=0, policy_version=0))
    first.save_state(str(tmp_path / "state.pt"))
    resumed = _trainer()
    resumed.load_state(str(tmp_path / "state.pt"))
    asyncio.run(resumed.train(batch, step=1, policy_version=1))
    for name, value in straight.weights().items():
        assert torch.equal(value, resumed.weights()[name]), name


def test_a_seeded_trainer_is_deterministic() -> None:
    batch = _mixed_batch()
    runs = []
    for _ in range(2):
        trainer = _trainer(max_tokens_per_micro_batch=14)
        metrics = [asyncio.run(trainer.train(batch, step=s, policy_version=s)).metrics for s in range(2)]
        runs.append((metrics, trainer.weights()))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(v, runs[1][1][k]) for k, v in runs[0][1].items())


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warmstart-cache")


@pytest.mark.slow
def test_a_seeded_short_rl_run_is_deterministic(warm_cache: Path, monkeypatch) -> None:
    """The embedded recipe (sync arm, real engine and trainer) twice with one seed: the same
    tokens, rewards and train metrics (on one machine: kernels may differ across CPUs)."""
    from april_bench.experiment import run
    from april_bench.recipes import embedded
    from april_bench.rollout.loop import RolloutConfig

    monkeypatch.setenv("APRIL_BENCH_CACHE", str(warm_cache))
    rollout = RolloutConfig(
        rollout_batch_size=2, n_samples_per_prompt=4, over_sampling_batch_size=4, max_response_len=16
    )
    config = embedded(
        strategies=("sync",), steps=2, eval_every=None, warmstart_args={"steps": 5}, rollout=rollout
    )
    steps = [
        [(r.generated_tokens, r.train_metrics) for r in run(config, progress=False).recorder["steps"]]
        for _ in range(2)
    ]
    assert steps[0] == steps[1] and len(steps[0]) == 2


def test_activation_checkpointing_and_bf16_keep_the_gradient() -> None:
    batch = _mixed_batch()
    full, _ = _gradients(_trainer(grad_clip=1e9), batch)
    checkpointed, _ = _gradients(_trainer(grad_clip=1e9, activation_checkpointing=True), batch)
    for name, grad in full.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-4, atol=1e-7)
    bf16, metrics = _gradients(_trainer(grad_clip=1e9, bf16=True), batch)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    cosine = torch.nn.functional.cosine_similarity(
        torch.cat([g.flatten() for g in bf16.values()]),
        torch.cat([g.flatten() for g in full.values()]),
        dim=0,
    )
    assert cosine > 0.9  # bf16 rounding moves the gradient, not its direction


def _with_unanimous_groups() -> list[Group]:
    """The mixed batch and two groups whose rewards are all equal (advantage 0 for every sample)."""
    same = [[(1, [7, 8, 9][: 1 + i % 3])] for i in range(4)]
    return [*_mixed_batch(), _group(3, same, [1.0] * 4), _group(4, same[::-1], [0.0] * 4)]


_ZERO_CASES = [
    ("grpo", "as-is", None),
    ("dapo", "as-is", None),
    ("gspo", "as-is", None),
    ("grpo", "mask", 14),
    ("dapo", "tis", None),
    ("dapo", "as-is", 14),
]


def _spied(trainer: TorchTrainer) -> list[tuple[list[float], bool]]:
    """The advantages of the rows of each forward the trainer runs, and whether autograd was on."""
    calls: list[tuple[list[float], bool]] = []
    logprobs = trainer._logprobs

    def spy(model: torch.nn.Module, rows, index: torch.Tensor, width: int):  # type: ignore[no-untyped-def]
        calls.append((rows.advantages[index].tolist(), torch.is_grad_enabled()))
        return logprobs(model, rows, index, width)

    trainer._logprobs = spy  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("mode", ["forward", "skip"])
@pytest.mark.parametrize(("algorithm", "off_policy", "micro"), _ZERO_CASES)
def test_zero_advantage_rows_leave_the_gradient_as_it_was(
    mode: str, algorithm: str, off_policy: str, micro: int | None
) -> None:
    """Their loss is 0 times a ratio: computing them forward only, or not at all, leaves the gradient
    as it was (float sums in another order).  Forward only, they still count in every metric;
    skipped, the metrics cover the trained rows (the engine gap fewer tokens)."""
    batch = _with_unanimous_groups()
    settings = {
        "algorithm": algorithm,
        "off_policy": off_policy,
        "grad_clip": 1e9,
        "max_tokens_per_micro_batch": micro,
    }
    full, full_metrics = _gradients(_trainer(**settings, zero_advantage="train"), batch)
    trainer = _trainer(**settings, zero_advantage=mode)
    calls = _spied(trainer)
    split, split_metrics = _gradients(trainer, batch)
    assert any(a == 0 for advantages, _ in calls for a in advantages) == (mode == "forward")
    for advantages, grad in calls:  # rows of advantage 0, and only they, ran without autograd
        assert all((a == 0) != grad for a in advantages)
    assert full.keys() == split.keys()
    for name, grad in full.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-4, atol=1e-7)
    assert split_metrics.keys() == full_metrics.keys()
    same = full_metrics.keys() if mode == "forward" else {"loss", "pg_loss", "kl", "grad_norm", "reward_mean"}
    for key in same:
        assert split_metrics[key] == pytest.approx(full_metrics[key], rel=1e-4, abs=1e-6), key
    if mode == "skip":  # the unanimous groups' 8 rows: 1, 2, 3 and 1 tokens each of version 1, 14 fewer
        assert split_metrics["engine_logprob_tokens"] == full_metrics["engine_logprob_tokens"] - 14


@pytest.mark.parametrize("mode", ["forward", "skip"])
def test_a_mini_batch_of_zero_advantages_still_steps_the_optimizer(mode: str) -> None:
    """No row has a gradient: they run forward only (so the step has its metrics), the gradients are
    the zeros a backward would have left, and AdamW still moves the weights along its momentum."""
    unanimous = _with_unanimous_groups()[3:]
    weights = []
    metrics = []
    for setting in ("train", mode):
        trainer = _trainer(zero_advantage=setting)
        asyncio.run(trainer.train(_mixed_batch(), step=0, policy_version=0))
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        calls = _spied(trainer)
        metrics.append(asyncio.run(trainer.train(unanimous, step=1, policy_version=1)).metrics)
        assert calls and all(grad == (setting == "train") for _, grad in calls)
        assert metrics[-1]["grad_norm"] == 0.0
        assert all(float(p.grad.abs().max()) == 0 for p in trainer.model.parameters() if p.grad is not None)
        moved = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        assert any(not torch.equal(moved[n], before[n]) for n in moved)
        weights.append(moved)
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=0, atol=0)
    assert metrics[1] == pytest.approx(metrics[0], rel=1e-5, abs=1e-7)


def test_zero_advantage_takes_one_of_its_modes() -> None:
    from april_bench.config import ConfigError

    with pytest.raises(ConfigError, match="skip, forward, train"):
        TorchTrainer.Config(zero_advantage="drop")
