"""SGLang's native HTTP wire format: request payloads and output parsing (pure functions).

Checked against the ``sglang`` 0.5.23 wheel (``srt/entrypoints/http_server.py``,
``srt/managers/io_struct.py``, ``tokenizer_manager.py``, ``schedule_batch.py``)
and 0.5.9 for the oldest version the adapter supports.

The things that matter for partial rollouts:

* ``/generate`` returns one JSON object per request: ``output_ids`` and
  ``meta_info`` with ``finish_reason`` = ``{"type": "stop", "matched": id}``,
  ``{"type": "length", "length": n}`` or ``{"type": "abort", "message": ...}``;
  with ``return_logprob`` also ``meta_info.output_token_logprobs`` as
  ``[logprob, token_id, text-or-None]`` triples (temperature-scaled unless the
  server runs with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``);
* a request aborted while *running* comes back normally (HTTP 200) with every
  token it decoded, including the one decoded in the step after the abort;
  ``update_finish_state`` applies the pending abort before the EOS and length
  checks, so a request aborted in the step that would have ended it still says
  ``abort`` - :func:`classify_finish` reads the tokens to tell;
* ``meta_info.weight_version`` (a string) is the server's version when the
  output was built; 0.5.2x adds ``weight_versions`` spans
  (``{"version", "start", "end"}``) when the version changed mid-request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from april_bench.engines.protocol import EngineError, GenerateRequest
from april_bench.types import FinishReason

__all__ = [
    "ParsedOutput",
    "VersionMap",
    "classify_finish",
    "error_message",
    "generate_payload",
    "parse_generate_output",
]


def generate_payload(
    request: GenerateRequest, rid: str, eos_token_ids: tuple[int, ...] = ()
) -> dict[str, Any]:
    """The ``/generate`` body for one request: token ids in, token ids and log-probs out.

    A replayed length (``replay_len``) is sent as ``ignore_eos`` with
    ``max_new_tokens = min(replay_len, budget)``: the engine generates exactly
    that many tokens and :func:`classify_finish` reports the end as a stop.
    """
    if request.input_ids is None:
        raise EngineError(
            f"{request.request_id}: the sglang engine needs token ids; use a workload with tokenized prompts"
        )
    sampling = request.sampling
    replaying = request.replay_len is not None
    replay = request.replay_len
    max_new = min(replay, request.max_new_tokens) if replay is not None else request.max_new_tokens
    params: dict[str, Any] = {
        "max_new_tokens": max_new,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "ignore_eos": replaying,
    }
    stop_ids = sorted(set(sampling.stop_token_ids) | set(eos_token_ids))
    if stop_ids and not replaying:
        params["stop_token_ids"] = stop_ids
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return {
        "input_ids": list(request.input_ids),
        "sampling_params": params,
        "rid": rid,
        "return_logprob": True,
        "stream": False,
    }


class VersionMap:
    """SGLang weight-version strings <-> our integer policy versions.

    We set versions as ``str(version)``.  The server's initial version (e.g.
    ``"default"``) maps to ``initial``; any other string that is not an integer
    means somebody else changed the weights, which we refuse to guess about.
    """

    def __init__(self, initial_label: str, initial: int = 0) -> None:
        self._labels = {initial_label: initial}

    def parse(self, label: object) -> int:
        text = str(label)
        if text in self._labels:
            return self._labels[text]
        try:
            return int(text)
        except ValueError:
            raise EngineError(
                f"sglang reports weight version {text!r}, which this engine did not set: another client "
                "updated the weights; give each run its own server"
            ) from None


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: FinishReason
    policy_version: int
    num_retractions: int
    #: Seconds from the server receiving the request to its first token (needs ``--enable-metrics``).
    first_token_latency: float | None


def parse_generate_output(
    out: Mapping[str, Any],
    request: GenerateRequest,
    *,
    versions: VersionMap,
    eos_token_ids: tuple[int, ...] = (),
) -> ParsedOutput:
    """Turn one ``/generate`` response into our fields; a malformed one raises :class:`EngineError`."""
    rid = request.request_id
    try:
        meta = out["meta_info"]
        output_ids = tuple(int(t) for t in out["output_ids"])
        finish = meta["finish_reason"]
        kind = finish["type"]
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(
            f"{rid}: malformed sglang output (missing {exc}); is this an SGLang server?"
        ) from None
    logprobs = _logprobs(meta.get("output_token_logprobs"), output_ids, rid)
    reason = classify_finish(kind, output_ids, request, eos_token_ids)
    latency = meta.get("first_token_latency")
    return ParsedOutput(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_reason=reason,
        policy_version=_policy_version(meta, versions, rid),
        num_retractions=int(meta.get("num_retractions") or 0),
        first_token_latency=float(latency) if latency is not None else None,
    )


def classify_finish(
    kind: str, output_ids: tuple[int, ...], request: GenerateRequest, eos_token_ids: tuple[int, ...] = ()
) -> FinishReason:
    """Our finish reason from SGLang's ``finish_reason.type`` and the tokens.

    A replayed request ends as a stop once it reaches its replayed length.  An
    ``abort`` that landed in the step a request would have finished anyway
    (its last token is EOS or a stop id, or it used its whole budget) is that
    finish, not an abort: resuming it would generate past its end.
    """
    n = len(output_ids)
    if kind not in ("stop", "length", "abort"):
        raise EngineError(f"{request.request_id}: unknown sglang finish_reason type {kind!r}")
    replay = request.replay_len
    if replay is not None and replay <= request.max_new_tokens and n >= replay:
        return FinishReason.STOP
    if kind == "stop":
        return FinishReason.STOP
    if kind == "abort":
        stops = set(request.sampling.stop_token_ids) | set(eos_token_ids)
        if replay is None and n and output_ids[-1] in stops:
            return FinishReason.STOP
        if n < request.max_new_tokens:
            return FinishReason.ABORT
    return FinishReason.LENGTH


def error_message(body: bytes, status: int) -> str:
    """The message of an SGLang error response (``{"error": {"message"}}``, ``{"message"}``, text)."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text or f"HTTP {status}"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if key in data:
                return str(data[key])
    return str(data)


def _logprobs(triples: Any, output_ids: tuple[int, ...], rid: str) -> tuple[float, ...] | None:
    if triples is None:
        return () if not output_ids else None
    if len(triples) != len(output_ids):
        raise EngineError(f"{rid}: sglang returned {len(triples)} log-probs for {len(output_ids)} tokens")
    values = []
    for (logprob, token, *_), expected in zip(triples, output_ids, strict=True):
        if token is not None and int(token) != expected:
            raise EngineError(f"{rid}: sglang log-prob for token {token} where the output has {expected}")
        values.append(float(logprob))
    return tuple(values)


def _policy_version(meta: Mapping[str, Any], versions: VersionMap, rid: str) -> int:
    spans = meta.get("weight_versions")
    labels = [span["version"] for span in spans] if spans else [meta.get("weight_version", "default")]
    parsed = {versions.parse(label) for label in labels}
    if len(parsed) > 1:
        raise EngineError(
            f"{rid}: the weights changed while it ran (versions {sorted(parsed)}); "
            "update weights only when no request is in flight"
        )
    return parsed.pop()
