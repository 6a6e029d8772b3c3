"""Groups as plain JSON data: what a resumed run reads back from its checkpoint.

Every segment keeps its policy version, token ids and log-probs, so a resumed
partial continues exactly where it was cut and its off-policy accounting is
unchanged.  Prompts are not stored: the workload rebuilds prompt ``uid``
deterministically.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from april_bench.types import FinishReason, Group, Prompt, Sample, SampleStatus, Segment

__all__ = ["group_from_dict", "group_to_dict"]


def group_to_dict(group: Group) -> dict[str, Any]:
    return {
        "uid": group.uid,
        "first_step": group.first_step,
        "samples": [_sample_to_dict(s) for s in group.samples],
        **({} if group.keep is None else {"keep": group.keep}),
    }


def group_from_dict(data: dict[str, Any], make_prompt: Callable[[int], Prompt]) -> Group:
    prompt = make_prompt(int(data["uid"]))
    samples = [_sample_from_dict(s, prompt) for s in data["samples"]]
    return Group(prompt=prompt, samples=samples, first_step=data["first_step"], keep=data.get("keep"))


def _sample_to_dict(s: Sample) -> dict[str, Any]:
    return {
        "index": s.index,
        "status": s.status.value,
        "reward": s.reward,
        "start_step": s.start_step,
        "abort_count": s.abort_count,
        "aborts_since_restart": s.aborts_since_restart,
        "loss_mask": s.loss_mask,  # for readers of the file: a loaded sample derives it from its segments
        "discarded_tokens": s.discarded_tokens,
        "segments": [
            {
                "request_id": seg.request_id,
                "policy_version": seg.policy_version,
                "num_tokens": seg.num_tokens,
                "finish_reason": seg.finish_reason.value,
                "step": seg.step,
                "token_ids": None if seg.token_ids is None else list(seg.token_ids),
                "logprobs": None if seg.logprobs is None else list(seg.logprobs),
                **({"observation": True} if seg.observation else {}),
            }
            for seg in s.segments
        ],
        **_episode_to_dict(s),
    }


def _episode_to_dict(s: Sample) -> dict[str, Any]:
    """A multi-turn episode's environment state and call counts (nothing for a plain sample)."""
    if s.env_state is None and not s.env_calls:
        return {}
    return {
        "env_state": s.env_state,
        "env_calls": s.env_calls,
        "env_time_s": s.env_time_s,
        "request_time_s": s.request_time_s,
    }


def _sample_from_dict(data: dict[str, Any], prompt: Prompt) -> Sample:
    segments = [
        Segment(
            request_id=seg["request_id"],
            policy_version=seg["policy_version"],
            num_tokens=seg["num_tokens"],
            finish_reason=FinishReason(seg["finish_reason"]),
            step=seg["step"],
            token_ids=None if seg["token_ids"] is None else tuple(seg["token_ids"]),
            logprobs=None if seg["logprobs"] is None else tuple(seg["logprobs"]),
            observation=seg.get("observation", False),
        )
        for seg in data["segments"]
    ]
    return Sample(
        prompt=prompt,
        index=data["index"],
        segments=segments,
        status=SampleStatus(data["status"]),
        reward=data["reward"],
        start_step=data["start_step"],
        abort_count=data["abort_count"],
        aborts_since_restart=data["aborts_since_restart"],
        discarded_tokens=data["discarded_tokens"],
        response_len=sum(seg.num_tokens for seg in segments),
        env_state=data.get("env_state"),
        env_calls=data.get("env_calls", 0),
        env_time_s=data.get("env_time_s", 0.0),
        request_time_s=data.get("request_time_s", 0.0),
    )
