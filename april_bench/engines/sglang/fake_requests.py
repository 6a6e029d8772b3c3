"""Requests of the fake SGLang server: the token rule, settings, parsing and version spans."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FakeRequest",
    "FakeSettings",
    "RequestError",
    "fake_sglang_token",
    "parse_generate_body",
    "weight_version_spans",
]

_MASK = (1 << 64) - 1


class RequestError(ValueError):
    """A request SGLang would reject with HTTP 400."""


def _mix(z: int) -> int:
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
    return z ^ (z >> 31)


def fake_sglang_token(
    first_id: int, seed: int, position: int, *, vocab_size: int, eos_token_id: int, eos_probability: float
) -> tuple[int, float]:
    """The (token, logprob) the fake emits at absolute ``position`` of a sequence starting with ``first_id``.

    EOS comes with probability ``eos_probability`` per position (geometric
    response lengths); other tokens are never EOS.
    """
    h = _mix((first_id * 0x9E3779B97F4A7C15 + seed * 0xD6E8FEB86659FD93 + position) & _MASK)
    if eos_probability > 0 and (h >> 11) / (1 << 53) < eos_probability:
        return eos_token_id, -0.05
    token = h % (vocab_size - 1)
    if token >= eos_token_id:
        token += 1
    return token, -0.1 * (1 + (h >> 7) % 7)


@dataclass(frozen=True, slots=True)
class FakeSettings:
    """What the scheduler needs from the server config (see ``FakeSGLangServer.Config``)."""

    decode_step_s: float
    decode_step_per_request_s: float
    prefill_s_per_token: float
    http_latency_s: float
    max_running_requests: int
    max_total_tokens: int | None
    context_length: int
    vocab_size: int
    eos_token_id: int
    eos_probability: float
    force_stream_interval: int
    weight_load_s: float
    random_seed: int
    enable_metrics: bool


@dataclass(eq=False, slots=True)
class FakeRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    temperature: float
    stop_ids: frozenset[int]
    ignore_eos: bool
    seed: int
    return_logprob: bool
    future: asyncio.Future[dict[str, Any]]
    t_received: float
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    forwarded: int = 0  # tokens already flushed to the tokenizer (what a waiting abort returns)
    to_finish: bool = False
    abort_sent: bool = False
    retractions: int = 0
    t_first: float | None = None
    version_events: list[tuple[str, int]] = field(default_factory=list)  # (old version, tokens then)

    @property
    def context(self) -> int:
        return len(self.input_ids) + len(self.output_ids)


def parse_generate_body(body: dict[str, Any], s: FakeSettings) -> FakeRequest:
    """A ``/generate`` body -> a request, with SGLang's 400 checks (context length, KV pool)."""
    if "text" in body and body.get("input_ids") is None:
        raise RequestError("the fake SGLang server has no tokenizer: send input_ids")
    ids = body.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
        raise RequestError("input_ids must be a non-empty list of ints (one request per call)")
    sp = body.get("sampling_params") or {}
    max_new = int(sp.get("max_new_tokens", 128))
    if len(ids) >= s.context_length:
        raise RequestError(
            f"The input ({len(ids)} tokens) is longer than the model's context length "
            f"({s.context_length} tokens)."
        )
    if len(ids) + max_new > s.context_length:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of "
            f"{s.context_length} tokens. You requested a total of {len(ids) + max_new} tokens."
        )
    if s.max_total_tokens is not None and len(ids) + 1 > s.max_total_tokens:
        raise RequestError(f"input of {len(ids)} tokens does not fit the KV pool")
    temperature = float(sp.get("temperature", 1.0))
    seed = sp.get("sampling_seed")
    loop = asyncio.get_running_loop()
    return FakeRequest(
        rid=str(body.get("rid") or uuid.uuid4().hex),
        input_ids=list(ids),
        max_new_tokens=max_new,
        temperature=temperature,
        stop_ids=frozenset(int(t) for t in sp.get("stop_token_ids") or ()),
        ignore_eos=bool(sp.get("ignore_eos", False)),
        seed=0 if temperature < 1e-6 else int(seed if seed is not None else s.random_seed),
        return_logprob=bool(body.get("return_logprob", False)),
        future=loop.create_future(),
        t_received=loop.time(),
    )


def weight_version_spans(events: list[tuple[str, int]], current: str, n: int) -> list[dict[str, Any]]:
    """SGLang 0.5.23's ``compute_weight_version_spans`` + ``add_weight_versions_to_meta_info``:
    ``events`` are (old version, output tokens at the change); spans cover the first ``n`` tokens."""
    spans: list[dict[str, Any]] = []
    for version, end in [*events, (current, n)]:
        end = min(end, n)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and version == spans[-1]["version"]:
            spans[-1]["end"] = end
            continue
        spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
    return [s for s in spans if s["start"] < n or s["start"] == 0]
