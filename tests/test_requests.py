"""The protocol's request and completion types (``april_bench/engines/requests.py``, re-exported by the
protocol): frozen, checked when built, and pickled or copied by their fields (engines in other
processes receive them; compiled, the default pickling would meet the frozen ``__setattr__``)."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from april_bench.engines.protocol import Completion, GenerateRequest, SamplingParams
from april_bench.types import FinishReason


def examples() -> list[object]:
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=3, stop_token_ids=(2,))
    return [
        sampling,
        GenerateRequest(
            "r", input_len=3, max_new_tokens=4, sampling=sampling, input_ids=(1, 2, 3), priority=-1
        ),
        GenerateRequest(
            "s", input_len=9, max_new_tokens=8, sampling=sampling, replay_len=5, policy_version=2
        ),
        Completion("r", 4, FinishReason.LENGTH, 1, 2.5, version_runs=((0, 1), (1, 3)), replica=1),
    ]


def check_round_trips() -> None:
    for value in examples():
        for again in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
            assert again == value and type(again) is type(value) and hash(again) == hash(value)


def test_they_pickle_and_copy_by_their_fields() -> None:
    check_round_trips()


def test_they_are_frozen_and_checked_when_built() -> None:
    request = examples()[1]
    assert isinstance(request, GenerateRequest)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.priority = 3  # type: ignore[misc]
    assert dataclasses.replace(request, priority=3).priority == 3
    with pytest.raises(ValueError, match="max_new_tokens"):
        dataclasses.replace(request, max_new_tokens=0)
    with pytest.raises(ValueError, match="do not sum"):
        Completion("r", 4, FinishReason.STOP, 1, 2.5, version_runs=((0, 1),))
