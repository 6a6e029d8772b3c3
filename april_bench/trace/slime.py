"""slime's debug rollout data (``--save-debug-rollout-data PATH_{rollout_id}.pt``) as a trace.

slime's ``RolloutManager._save_debug_rollout_data`` calls
``torch.save({"rollout_id": id, "samples": [sample.to_dict() for sample in data]}, path)`` after every
rollout; ``Sample.to_dict`` is the sample's fields as plain values: ``group_index``, ``index``,
``prompt``, ``tokens`` (prompt + response ids), ``response``, ``response_length`` (tokens, from the
engine), ``reward`` (a number, or a dict read with ``--reward-key``), ``status`` (``completed``,
``truncated``, ``aborted``, ...), ``loss_mask``, ``weight_versions``, ``rollout_log_probs``,
``metadata`` and engine statistics.

Loading: ``torch.load(weights_only=True)`` only, which accepts tensors and plain containers and refuses
any other pickled object - an untrusted file cannot run code.  A dump holding other objects (a custom
``metadata`` class) is refused with that reason; convert it in a trusted environment.

What it says exactly: the group (``group_index``), the response tokens (``response_length``), the
prompt tokens (``len(tokens) - response_length``), truncation (``status``) and the reward.  What it
cannot: groups a filter rejected (the dump holds the rollout's kept samples), and the response limit
(give ``--max-response-len``; otherwise the longest truncated response stands for it).  Samples that
did not finish (aborted, failed) are left out and counted in the header's notes.  Evaluation dumps
(``eval_`` in the name) are not training rollouts; leave them out.
"""

from __future__ import annotations

import datetime as dt
import math
import pickle
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.trace.format import PER_SAMPLE, RowChecker, TraceHeader, TraceRow
from april_bench.trace.tokens import TokenCounter

__all__ = ["import_slime", "load_slime_dump"]

_FINISH = {"completed": "stop", "truncated": "truncated"}


def load_slime_dump(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """``(rollout_id, samples)`` of one ``.pt`` dump, loaded with ``weights_only=True`` (or refused)."""
    import torch

    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such slime rollout dump")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{path}: refused: it holds objects other than tensors and plain containers, and april-bench "
            f"never unpickles them ({reason[:160]}); re-save its samples as plain dicts where you trust it"
        ) from None
    except Exception as exc:  # the safe unpickler fails on garbage in any way it likes (IndexError, ...)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]  # an empty file says nothing
        raise ConfigError(f"{path}: not a torch.save file ({reason[:160]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise ConfigError(
            f"{path}: not slime debug rollout data (expected a dict with 'rollout_id' and 'samples')"
        )
    rollout_id = data.get("rollout_id")
    if isinstance(rollout_id, bool) or not isinstance(rollout_id, int):
        raise ConfigError(f"{path}: 'rollout_id' must be a whole number, got {rollout_id!r}")
    return rollout_id, data["samples"]


def import_slime(
    files: list[Path],
    counter: TokenCounter,
    *,
    max_response_len: int | None = None,
    reward_key: str | None = None,
) -> tuple[TraceHeader, list[TraceRow]]:
    """The trace of slime rollout dumps (one ``.pt`` per rollout), in rollout order."""
    if not files:
        raise ConfigError("give at least one slime rollout dump (.pt)")
    dumps = sorted(((*load_slime_dump(p), Path(p)) for p in files), key=lambda d: d[0])
    rows: list[TraceRow] = []
    check = RowChecker()  # an invalid row fails here, named by the input's line
    unfinished = 0
    estimated_prompts = 0
    for rollout_id, samples, path in dumps:
        counts: dict[str, int] = {}
        for i, sample in enumerate(samples):
            where = f"{path}, sample {i}"
            if not isinstance(sample, dict):
                raise ConfigError(f"{where}: a sample must be a dict (Sample.to_dict())")
            status = sample.get("status")
            if status not in _FINISH:
                if status in ("aborted", "pending", "failed"):
                    unfinished += 1
                    continue
                raise ConfigError(f"{where}: unknown status {status!r} (is this slime debug rollout data?)")
            response = sample.get("response_length")
            if isinstance(response, bool) or not isinstance(response, int) or response < 0:
                raise ConfigError(f"{where}: 'response_length' must be a whole number >= 0, got {response!r}")
            group = sample.get("group_index")
            if group is None:
                raise ConfigError(f"{where}: no 'group_index': slime's group of this sample is unknown")
            prompt_tokens = _prompt_tokens(sample, response, counter, where)
            if prompt_tokens is None:
                estimated_prompts += 1
                prompt_tokens = max(1, counter.count(_prompt_text(sample.get("prompt"))))
            prompt_id = str(group)
            index = counts[prompt_id] = counts.get(prompt_id, -1) + 1
            rows.append(
                check(
                    TraceRow(
                        step=rollout_id,
                        prompt_id=prompt_id,
                        sample_index=index,
                        prompt_tokens=prompt_tokens,
                        response_tokens=response,
                        finish=_FINISH[status],
                        reward=_reward(sample.get("reward"), reward_key, where),
                    ),
                    where,
                )
            )
    if not rows:
        raise ConfigError(f"{', '.join(str(p) for p in files)}: no finished samples in the slime dumps")
    notes = ["groups a filter rejected are not in slime's dump (it holds the rollout's kept samples)"]
    if unfinished:
        notes.append(f"{unfinished} unfinished samples (aborted, pending or failed) left out")
    if estimated_prompts:
        notes.append(f"{estimated_prompts} prompts without token ids: their length is {counter.label}")
    limit = max_response_len
    if limit is None:
        truncated = [r.response_tokens for r in rows if r.finish == "truncated"]
        if truncated:
            limit = max(truncated)
            notes.append(f"response limit taken from the longest truncated response ({limit} tokens)")
    header = TraceHeader(
        source="slime debug rollout data",
        evidence=PER_SAMPLE,
        token_counts="exact (slime's response_length and token ids)",
        max_response_len=limit,
        origin=f"{len(dumps)} dump(s): {dumps[0][2]}" + (f" ... {dumps[-1][2]}" if len(dumps) > 1 else ""),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        notes=tuple(notes),
        provenance={"importer": "april_bench.trace.slime", "reward_key": reward_key},
    )
    return header, rows


def _prompt_tokens(sample: dict[str, Any], response: int, counter: TokenCounter, where: str) -> int | None:
    tokens = sample.get("tokens")
    if tokens is None or len(tokens) == 0:
        return None
    prompt = len(tokens) - response
    if prompt < 1:
        raise ConfigError(f"{where}: {len(tokens)} token ids but response_length {response}: no prompt left")
    return prompt


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):  # chat messages
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    return ""


def _reward(value: Any, key: str | None, where: str) -> float | None:
    if isinstance(value, dict):
        if key is None:
            raise ConfigError(
                f"{where}: the reward is a dict ({', '.join(map(str, value))}); pick one with --reward-key"
            )
        if key not in value:
            raise ConfigError(f"{where}: reward has no {key!r} (it has {', '.join(map(str, value))})")
        value = value[key]
    if value is None:
        return None
    if hasattr(value, "item"):  # a 0-d tensor
        value = value.item()
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: reward must be a number, got {value!r}")
    return float(value)
