from __future__ import annotations

import pytest

from april_bench.types import FinishReason, Group, Prompt, Sample, SampleStatus, Segment


def _seg(version: int, n: int, reason: FinishReason = FinishReason.ABORT, ids: bool = True) -> Segment:
    return Segment(
        request_id=f"r{version}",
        policy_version=version,
        num_tokens=n,
        finish_reason=reason,
        step=version,
        token_ids=tuple(range(n)) if ids else None,
        logprobs=tuple([-0.5] * n) if ids else None,
    )


def test_sample_resumed_twice_keeps_exact_per_token_versions() -> None:
    sample = Sample(prompt=Prompt(uid=0, source_id="p", length=3), index=0)
    sample.append(_seg(0, 5))
    sample.append(_seg(1, 3))
    sample.append(_seg(3, 2, FinishReason.STOP))
    assert sample.response_len == 10
    assert sample.status is SampleStatus.COMPLETED
    assert sample.abort_count == 2
    assert sample.version_runs() == [(0, 5), (1, 3), (3, 2)]
    assert sample.token_versions() == [0] * 5 + [1] * 3 + [3] * 2
    # Trained at version 3: the 8 tokens of versions 0 and 1 are off-policy (the reference code
    # counted only the last segment's 3).
    assert sample.off_policy_tokens(3) == 8
    assert sample.version_span() == 3
    assert len(sample.response_ids()) == 10


def test_segments_of_one_version_merge_into_one_run() -> None:
    sample = Sample(prompt=Prompt(uid=0, source_id="p", length=1), index=0)
    sample.append(_seg(2, 4))
    sample.append(_seg(2, 1, FinishReason.LENGTH))
    assert sample.version_runs() == [(2, 5)]
    assert sample.status is SampleStatus.TRUNCATED


def test_empty_abort_counts_but_adds_no_segment() -> None:
    sample = Sample(prompt=Prompt(uid=0, source_id="p", length=1), index=0)
    sample.append(_seg(0, 3))
    sample.append(_seg(1, 0))
    assert len(sample.segments) == 1 and sample.abort_count == 2


def test_restart_discards_and_counts_tokens() -> None:
    sample = Sample(prompt=Prompt(uid=0, source_id="p", length=1), index=0, reward=1.0, start_step=2)
    sample.append(_seg(0, 7))
    assert sample.restart() == 7
    assert sample.response_len == 0 and sample.discarded_tokens == 7
    assert sample.status is SampleStatus.PENDING and sample.reward is None and sample.start_step is None


def test_token_free_sample_says_why_it_has_no_ids() -> None:
    sample = Sample(prompt=Prompt(uid=0, source_id="p", length=1), index=0)
    sample.append(_seg(0, 4, ids=False))
    with pytest.raises(ValueError, match="token-free engine"):
        sample.response_ids()


def test_group_rewards_require_every_sample() -> None:
    group = Group.fresh(Prompt(uid=1, source_id="p", length=1), 2)
    group.samples[0].reward = 1.0
    with pytest.raises(ValueError, match=r"samples \[1\]"):
        group.rewards()


def test_segment_and_prompt_validate_lengths() -> None:
    with pytest.raises(ValueError):
        Segment(
            request_id="r",
            policy_version=0,
            num_tokens=2,
            finish_reason=FinishReason.STOP,
            step=0,
            token_ids=(1,),
        )
    with pytest.raises(ValueError):
        Prompt(uid=0, source_id="p", length=2, token_ids=(1, 2, 3))


def test_loss_mask_masks_observations_across_empty_aborts_and_restarts() -> None:
    sample = Sample(prompt=Prompt(uid=0, source_id="p", length=1), index=0)
    sample.append(_seg(0, 3))
    assert sample.loss_mask is None  # no observation: every response token is trained
    observation = Segment("obs-1", 0, 2, FinishReason.STOP, 0, (7, 8), (0.0, 0.0), observation=True)
    sample.append(observation)
    sample.append(_seg(1, 0))  # an abort with no tokens: no segment, no mask entry
    sample.append(_seg(1, 2, FinishReason.STOP))
    assert sample.loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert len(sample.loss_mask) == sample.response_len
    sample.restart()
    assert sample.loss_mask is None
    sample.append(observation)
    assert sample.loss_mask == [0, 0]
