"""The torch trainer: batch layout, reward shaping, off-policy treatments, and that RL learns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from april_bench.engines.hf.models import build_model
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


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("warmstart-cache")


def test_a_short_rl_run_raises_held_out_accuracy(warm_cache: Path, monkeypatch) -> None:
    """The embedded recipe with DAPO, sync arm, 30 steps, fixed seed: real evaluations of the
    trained policy on held-out problems, before and after."""
    from april_bench.experiment import run
    from april_bench.recipes import embedded

    monkeypatch.setenv("APRIL_BENCH_CACHE", str(warm_cache))
    result = run(embedded(algorithm="dapo", strategies=("sync",), steps=30, eval_every=None), progress=False)
    start, end = (e.accuracy for e in result.recorder["evals"])
    assert end > start + 0.01, (start, end)
