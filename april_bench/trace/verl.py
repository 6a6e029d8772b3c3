"""verl's rollout dumps (``trainer.rollout_data_dir=DIR``) as a trace.

verl's ``RayPPOTrainer._dump_generations`` writes ``DIR/{global_step}.jsonl`` after every training
step: one JSON object per sample of the training batch, with ``input`` (the prompt, decoded with
``skip_special_tokens=True``), ``output`` (the response, decoded the same way), ``score`` (the
sequence reward, ``token_level_scores.sum(-1)``), ``step``, in newer versions ``gts`` (the ground
truth) and ``request_id``, plus every per-sample reward extra (``acc``, ``pred``, ...).

What it cannot say, and what the importer does about it:

* **groups**: the ``uid`` that ties a prompt's samples together is not dumped, and
  ``trainer.balance_batch`` reorders the batch; samples of one step with the same ``input`` text are
  one group (two copies of one problem in a batch become one larger group);
* **token counts**: only text is dumped; counts come from re-tokenizing it (``--tokenizer``), which
  misses special tokens (the chat template's, EOS), or from a characters-per-token estimate.  A
  finished response is counted one token longer, for its EOS;
* **truncation**: not dumped; with ``--max-response-len`` (verl's ``data.max_response_length``) a
  response counted at or above the limit is marked truncated (and clipped to it);
* **rejected groups**: verl dumps the batch it trained on, so groups a DAPO filter threw away are not in
  it.  The trace keeps the rewards of the groups that were kept.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from april_bench.config import ConfigError
from april_bench.trace.format import PER_SAMPLE, RowChecker, TraceHeader, TraceRow
from april_bench.trace.tokens import TokenCounter

__all__ = ["import_verl", "verl_files"]


def verl_files(source: Path) -> list[tuple[int, Path]]:
    """``(step, file)`` of a rollout_data_dir (``{step}.jsonl``), or of one such file, in step order."""
    source = Path(source).expanduser()
    if source.is_file():
        files = [source]
    elif source.is_dir():
        files = [p for p in source.iterdir() if p.suffix == ".jsonl" and _step_name(p.stem)]
        if not files:
            raise ConfigError(
                f"{source}: no {{step}}.jsonl files; point at verl's trainer.rollout_data_dir (not "
                "validation_data_dir)"
            )
    else:
        raise FileNotFoundError(f"{source}: no such verl rollout_data_dir or file")
    out = []
    for path in files:
        if not _step_name(path.stem):
            raise ConfigError(f"{path}: verl names its dumps {{step}}.jsonl; cannot tell this file's step")
        out.append((int(path.stem), path))
    return sorted(out)


def _step_name(stem: str) -> bool:
    """``12``, not ``²`` (a digit to ``str.isdigit`` that ``int`` refuses)."""
    return stem.isascii() and stem.isdigit() and len(stem) < 19


def import_verl(
    source: Path,
    counter: TokenCounter,
    *,
    max_response_len: int | None = None,
    reward_key: str = "score",
) -> tuple[TraceHeader, list[TraceRow]]:
    """The trace of a verl ``rollout_data_dir`` (or one ``{step}.jsonl`` file of it)."""
    rows: list[TraceRow] = []
    check = RowChecker()  # an invalid row fails here, named by the input's line
    files = verl_files(source)
    truncated = 0
    for file_step, path in files:
        counts: dict[str, int] = {}
        for number, entry in _entries(path):
            where = f"{path}, line {number}"
            for key in ("input", "output"):
                if not isinstance(entry.get(key), str):
                    raise ConfigError(
                        f"{where}: a verl dump row needs an {key!r} string (is this a verl dump?)"
                    )
                try:
                    entry[key].encode("utf-8")
                except UnicodeEncodeError:
                    raise ConfigError(
                        f"{where}: {key!r} holds a lone surrogate (\\ud800-\\udfff): not text"
                    ) from None
            step = entry.get("step", file_step)
            if isinstance(step, bool) or not isinstance(step, int):
                raise ConfigError(f"{where}: 'step' must be a whole number, got {step!r}")
            reward = _reward(entry, reward_key, where)
            prompt_id = hashlib.sha1(entry["input"].encode()).hexdigest()[:12]
            index = counts[prompt_id] = counts.get(prompt_id, -1) + 1
            response = counter.count(entry["output"])
            finish = "stop"
            if max_response_len is not None and response >= max_response_len:
                response, finish = max_response_len, "truncated"
                truncated += 1
            else:
                response += 1  # the EOS token, which decoding with skip_special_tokens dropped
            rows.append(
                check(
                    TraceRow(
                        step=step,
                        prompt_id=prompt_id,
                        sample_index=index,
                        prompt_tokens=max(1, counter.count(entry["input"])),
                        response_tokens=response,
                        finish=finish,
                        reward=reward,
                    ),
                    where,
                )
            )
    if not rows:
        raise ConfigError(f"{source}: the verl dump has no rows")
    notes = [
        "groups are samples of one step with the same prompt text (verl does not dump the group uid)",
        "groups a filter rejected are not in verl's dump (it holds the trained batch)",
    ]
    if max_response_len is None:
        notes.append("truncation unknown (no --max-response-len): every response counted as finished")
    else:
        notes.append(f"{truncated} responses at or above {max_response_len} tokens counted as truncated")
    if not counter.exact:
        notes.append("token counts are an estimate from characters: give --tokenizer for real counts")
    header = TraceHeader(
        source="verl rollout dump",
        evidence=PER_SAMPLE,
        token_counts=counter.label,
        max_response_len=max_response_len,
        origin=f"{Path(source).expanduser()} ({len(files)} step file(s))",
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        notes=tuple(notes),
        provenance={"importer": "april_bench.trace.verl", "reward_key": reward_key},
    )
    return header, rows


def _entries(path: Path) -> Any:
    from april_bench.bounded import read_line

    number = 0
    with path.open(encoding="utf-8") as f:
        while True:
            try:
                line = read_line(f, f"{path}, line {number + 1}")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{path}: not UTF-8 text after line {number} ({exc.reason})") from None
            if not line:
                return
            number += 1
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}, line {number}: not JSON ({exc.msg})") from None
            except RecursionError:
                raise ConfigError(f"{path}, line {number}: nested too deeply") from None
            if not isinstance(entry, dict):
                raise ConfigError(f"{path}, line {number}: a verl dump row must be a JSON object")
            yield number, entry


def _reward(entry: dict[str, Any], key: str, where: str) -> float | None:
    if key not in entry:
        raise ConfigError(
            f"{where}: no {key!r} field (this row has {', '.join(sorted(entry))}); "
            "choose one with --reward-key"
        )
    value = entry[key]
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where}: {key!r} must be a number, got {value!r}")
    return float(value)
