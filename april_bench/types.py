"""Records that carry a rollout across steps: prompts, samples and groups.

A :class:`Sample` is one response to one prompt.  Its response is a list of
:class:`Segment` s: each segment is what one engine request added, and every
token of a segment was produced by one policy version.  A sample that was
aborted and resumed twice therefore has three segments, and its per-token
policy versions are exact (run-length encoded by segment).

Token ids and log-probs are optional per segment: a simulator produces lengths,
not tokens, and says so by leaving them ``None`` instead of inventing ids.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FinishReason", "Group", "Prompt", "Sample", "SampleStatus", "Segment"]


class SampleStatus(enum.StrEnum):
    """Where a sample stands.  COMPLETED and TRUNCATED are final."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    #: Stopped at a segment boundary (a strategy capped the request's budget): resumable, not aborted.
    PARTIAL = "partial"

    @property
    def is_finished(self) -> bool:
        return self in (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)


class FinishReason(enum.StrEnum):
    """Why an engine request returned (SGLang and vLLM spellings)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"

    def to_status(self) -> SampleStatus:
        return _STATUS_OF[self]


_STATUS_OF = {
    FinishReason.STOP: SampleStatus.COMPLETED,
    FinishReason.LENGTH: SampleStatus.TRUNCATED,
    FinishReason.ABORT: SampleStatus.ABORTED,
}


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt drawn from a data set.  ``uid`` is unique per draw (epochs repeat ``source_id``)."""

    uid: int
    source_id: str
    length: int
    token_ids: tuple[int, ...] | None = None
    text: str | None = None
    answer: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.token_ids is not None and len(self.token_ids) != self.length:
            raise ValueError(f"prompt {self.source_id}: length {self.length} != {len(self.token_ids)} ids")


@dataclass(frozen=True, slots=True)
class Segment:
    """The tokens that one engine request appended to a response."""

    request_id: str
    policy_version: int
    num_tokens: int
    finish_reason: FinishReason
    step: int
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    #: Tokens an environment appended to a multi-turn episode (a tool's result): prefilled, not
    #: generated, and masked from the loss (:mod:`april_bench.envs`).
    observation: bool = False

    def __post_init__(self) -> None:
        for name, values in (("token_ids", self.token_ids), ("logprobs", self.logprobs)):
            if values is not None and len(values) != self.num_tokens:
                raise ValueError(
                    f"segment {self.request_id}: {len(values)} {name} for {self.num_tokens} tokens"
                )


@dataclass(slots=True)
class Sample:
    """One response to a prompt, possibly stitched from several policy versions."""

    prompt: Prompt
    index: int
    segments: list[Segment] = field(default_factory=list)
    status: SampleStatus = SampleStatus.PENDING
    reward: float | None = None
    start_step: int | None = None
    #: Aborts over the sample's life (restarts included), for the records.
    abort_count: int = 0
    #: Aborts since the sample last (re)started from its prompt: what staleness caps look at.
    aborts_since_restart: int = 0
    #: Tokens generated for this sample and thrown away by a restart (never trained).
    discarded_tokens: int = 0
    response_len: int = 0
    #: A multi-turn episode's environment state (JSON data; ``None``: not an episode, or not begun).
    env_state: dict[str, Any] | None = None
    #: Environment calls this episode made, and the seconds they took (loop clock).
    env_calls: int = 0
    env_time_s: float = 0.0
    #: Seconds its engine requests took (submit to return, queueing included): an episode's time
    #: outside the environment.
    request_time_s: float = 0.0

    def append(self, segment: Segment) -> None:
        """Add what one engine request (or, for an observation, the environment) returned and update
        the status.  An observation's tokens get loss-mask 0, every generated token 1
        (:attr:`loss_mask`, derived from the segments when read)."""
        if segment.num_tokens or not self.segments or segment.observation:  # an observation marks a turn
            self.segments.append(segment)
        self.response_len += segment.num_tokens
        self.status = segment.finish_reason.to_status()
        if segment.finish_reason is FinishReason.ABORT:
            self.abort_count += 1
            self.aborts_since_restart += 1

    def restart(self) -> int:
        """Throw the partial response away and start over; returns the discarded (generated) token count."""
        dropped = self.response_len - self.observation_tokens
        self.discarded_tokens += dropped
        self.segments.clear()
        self.response_len = 0
        self.status = SampleStatus.PENDING
        self.reward = None
        self.start_step = None
        self.aborts_since_restart = 0
        self.env_state = None  # the episode starts over: the environment is reset at the next launch
        return dropped

    @property
    def loss_mask(self) -> list[int] | None:
        """Per-response-token loss mask: 0 on an environment's tokens, 1 on generated ones; ``None``
        when every response token is trained (no observation).  Derived from the segments (every
        token of the response is in one), not kept: a simulated episode appends a turn per request,
        and a list kept token by token cost more than the rest of the append."""
        if not any(s.observation for s in self.segments):
            return None
        mask: list[int] = []
        for s in self.segments:
            mask += [0 if s.observation else 1] * s.num_tokens
        return mask

    @property
    def has_tokens(self) -> bool:
        """True when every segment carries token ids (a real engine produced them)."""
        return all(s.token_ids is not None for s in self.segments)

    def response_ids(self) -> list[int]:
        if not self.has_tokens:
            raise ValueError(
                "this sample was produced by a token-free engine (the simulator): it has lengths only"
            )
        return [t for s in self.segments for t in s.token_ids or ()]

    def response_logprobs(self) -> list[float]:
        if any(s.logprobs is None for s in self.segments):
            raise ValueError("some segments of this sample carry no log-probs")
        return [x for s in self.segments for x in s.logprobs or ()]

    def version_runs(self) -> list[tuple[int, int]]:
        """Per-token policy versions, run-length encoded: ``[(version, n_tokens), ...]``."""
        if len(self.segments) == 1:  # the common case: one request produced the whole response
            s = self.segments[0]
            return [(s.policy_version, s.num_tokens)] if s.num_tokens else []
        runs: list[tuple[int, int]] = []
        for s in self.segments:
            if not s.num_tokens:
                continue
            if runs and runs[-1][0] == s.policy_version:
                runs[-1] = (s.policy_version, runs[-1][1] + s.num_tokens)
            else:
                runs.append((s.policy_version, s.num_tokens))
        return runs

    def token_versions(self) -> list[int]:
        """The policy version that produced each response token."""
        return [v for v, n in self.version_runs() for _ in range(n)]

    def off_policy_tokens(self, train_version: int) -> int:
        """Generated response tokens produced by a policy older than ``train_version`` (an episode's
        observation tokens are not generated and never count)."""
        if any(s.observation for s in self.segments):
            return sum(
                s.num_tokens for s in self.segments if not s.observation and s.policy_version < train_version
            )
        return sum(n for v, n in self.version_runs() if v < train_version)

    @property
    def observation_tokens(self) -> int:
        """Tokens an environment appended (0 unless the sample is a multi-turn episode)."""
        return sum(s.num_tokens for s in self.segments if s.observation)

    def version_span(self) -> int:
        """Newest minus oldest policy version among this sample's tokens (0 for one version)."""
        versions = [v for v, _ in self.version_runs()]
        return max(versions) - min(versions) if versions else 0

    def oldest_version(self) -> int | None:
        runs = self.version_runs()
        return min(v for v, _ in runs) if runs else None


@dataclass(slots=True)
class Group:
    """The ``n`` samples of one prompt.  A group is done only when all of them are (or, with
    ``keep``, when that many are: the rest are surplus, aborted and dropped)."""

    prompt: Prompt
    samples: list[Sample]
    #: Step in which the group was first launched (``None`` before that).
    first_step: int | None = None
    #: Finished samples that complete the group (``None``: all of them): a group launched with more
    #: responses than it keeps (RollPacker's response over-sampling).
    keep: int | None = None

    @classmethod
    def fresh(cls, prompt: Prompt, n: int, keep: int | None = None) -> Group:
        samples = [Sample(prompt=prompt, index=i) for i in range(n)]
        return cls(prompt=prompt, samples=samples, keep=keep if keep is not None and keep < n else None)

    @property
    def uid(self) -> int:
        return self.prompt.uid

    @property
    def is_finished(self) -> bool:
        if self.keep is not None:
            return sum(1 for s in self.samples if s.status.is_finished) >= self.keep
        return all(s.status.is_finished for s in self.samples)

    @property
    def response_tokens(self) -> int:
        """Generated response tokens (an episode's observation tokens are not generated)."""
        return sum(s.response_len - s.observation_tokens for s in self.samples)

    def rewards(self) -> list[float]:
        missing = [s.index for s in self.samples if s.reward is None]
        if missing:
            raise ValueError(f"group {self.uid}: samples {missing} have no reward yet")
        return [float(s.reward) for s in self.samples]  # type: ignore[arg-type]


def concat_ids(*parts: Sequence[int] | None) -> tuple[int, ...] | None:
    """Concatenate token-id sequences, or ``None`` if any part is missing."""
    if any(p is None for p in parts):
        return None
    return tuple(t for p in parts for t in p)  # type: ignore[union-attr]
