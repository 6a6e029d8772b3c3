"""The trace format: one JSON Lines file, a header line, then one row per finished sample.

::

    {"trace_format": "april-bench-trace", "version": 1, "source": "verl rollout dump", ...}
    {"step": 1, "prompt_id": "9f2c01", "sample_index": 0, "prompt_tokens": 212,
     "response_tokens": 3071, "finish": "stop", "reward": 1.0}
    ...

A **group** is the rows sharing ``(step, prompt_id)``; groups replay in the order of their step, then
of their first row in the file, so the trace's drift over steps is kept.  ``finish`` is ``stop`` (the
response ended by itself) or ``truncated`` (it hit the limit: its natural length is at least
``response_tokens``).  ``reward`` is the scalar the source run's filter and advantage saw (``null``:
unknown).  The header says where the numbers come from (:class:`TraceHeader`); ``docs/whatif.md``
describes every field.

A run directory is read as a trace too: its ``trace`` table holds the same rows per arm (with ``arm``
and ``repeat``), and its ``config.json``/``provenance.json`` make the header.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from april_bench.config import ConfigError

__all__ = [
    "FINISH",
    "TRACE_FORMAT",
    "RowChecker",
    "Trace",
    "TraceGroup",
    "TraceHeader",
    "TraceRow",
    "read_trace",
    "trace_from_run",
    "write_trace",
]

TRACE_FORMAT = "april-bench-trace"
TRACE_VERSION = 1
FINISH = ("stop", "truncated")
#: Evidence levels, strongest first (the header's ``evidence``).
PER_SAMPLE = "per-sample"
PER_STEP_STATS = "per-step statistics"


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """Where a trace's numbers come from: printed beside every result replayed from it."""

    #: What produced the rows: ``april-bench run``, ``verl rollout dump``, ``slime debug rollout data``,
    #: ``per-step length statistics``.
    source: str
    #: ``per-sample`` (each row is a real sample) or ``per-step statistics`` (rows synthesized from
    #: per-step summaries: the weakest evidence).
    evidence: str
    #: How token counts were obtained: exact from the engine, re-tokenized, or an estimate.
    token_counts: str
    #: The source run's response limit (tokens); ``None``: unknown (whatif uses the longest row).
    max_response_len: int | None = None
    #: The files the trace was made from.
    origin: str = ""
    created: str = ""
    #: What the source could not say (dropped rows, unknown truncation, ...).
    notes: tuple[str, ...] = ()
    #: Free-form facts about the producing run or importer (git commit, versions, options).
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        data["provenance"] = dict(self.provenance)
        return {"trace_format": TRACE_FORMAT, "version": TRACE_VERSION, **data}

    def lines(self) -> list[str]:
        """The provenance lines shown with every result replayed from this trace."""
        out = [
            f"trace: {self.source} ({self.evidence}); token counts: {self.token_counts}",
            f"  from {self.origin or 'unknown'}"
            + (f", made {self.created}" if self.created else "")
            + (f", response limit {self.max_response_len}" if self.max_response_len else ""),
        ]
        out += [f"  note: {n}" for n in self.notes]
        return out


@dataclass(frozen=True, slots=True)
class TraceRow:
    step: int
    prompt_id: str
    sample_index: int
    prompt_tokens: int
    response_tokens: int
    finish: str
    reward: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TraceGroup:
    """The samples of one prompt in one step, in sample order."""

    step: int
    prompt_id: str
    rows: tuple[TraceRow, ...]

    @property
    def prompt_tokens(self) -> int:
        return self.rows[0].prompt_tokens


@dataclass(slots=True)
class Trace:
    header: TraceHeader
    rows: list[TraceRow]
    path: Path
    #: The arm of a run directory's trace (``None``: a trace file).
    arm: str | None = None

    def groups(self) -> list[TraceGroup]:
        """Groups in replay order: by step, then by the position of their first row."""
        by_key: dict[tuple[int, str], list[TraceRow]] = {}
        for row in self.rows:
            by_key.setdefault((row.step, row.prompt_id), []).append(row)
        keys = sorted(by_key, key=lambda k: k[0])  # stable: first appearance inside a step
        return [
            TraceGroup(step, pid, tuple(sorted(by_key[step, pid], key=lambda r: r.sample_index)))
            for step, pid in keys
        ]

    @property
    def steps(self) -> list[int]:
        return sorted({r.step for r in self.rows})

    def group_size(self) -> int:
        """The most common number of samples per group (GRPO's n)."""
        sizes = [len(g.rows) for g in self.groups()]
        return statistics.mode(sizes)

    def groups_per_step(self) -> int:
        """The median number of groups per step (the source run's batch of prompts)."""
        per_step: dict[int, int] = {}
        for g in self.groups():
            per_step[g.step] = per_step.get(g.step, 0) + 1
        return max(1, round(statistics.median(per_step.values())))

    @property
    def has_rewards(self) -> bool:
        return all(r.reward is not None for r in self.rows)

    def longest_response(self) -> int:
        return max(r.response_tokens for r in self.rows)

    def response_limit(self) -> int:
        """The response limit to replay with: the source's, else the longest response in the trace."""
        return self.header.max_response_len or self.longest_response()

    def summary(self) -> dict[str, Any]:
        lengths = sorted(r.response_tokens for r in self.rows)
        return {
            "steps": len(self.steps),
            "groups": len(self.groups()),
            "samples": len(self.rows),
            "group_size": self.group_size(),
            "groups_per_step": self.groups_per_step(),
            "response_median": statistics.median(lengths),
            "response_p99": lengths[min(len(lengths) - 1, math.ceil(0.99 * len(lengths)) - 1)],
            "truncated_share": sum(r.finish == "truncated" for r in self.rows) / len(self.rows),
            "has_rewards": self.has_rewards,
        }


# ------------------------------------------------------------------ reading
def _open(path: Path) -> IO[str]:
    return gzip.open(path, "rt") if path.suffix == ".gz" else path.open()


def _int(value: Any, name: str, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ConfigError(f"{where}: {name} must be a whole number, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}: {name} must be >= {minimum}, got {value}")
    return int(value)


def parse_row(data: Any, where: str) -> TraceRow:
    """One row of the format, checked; ``where`` (file and line) starts every error."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a trace row must be a JSON object")
    missing = [k for k in ("step", "prompt_id", "sample_index", "response_tokens") if k not in data]
    if missing:
        raise ConfigError(f"{where}: not a trace row (missing {', '.join(missing)}; see docs/whatif.md)")
    finish = data.get("finish", "stop")
    if finish not in FINISH:
        raise ConfigError(f"{where}: finish must be one of {', '.join(FINISH)}, got {finish!r}")
    reward = data.get("reward")
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
    ):
        raise ConfigError(f"{where}: reward must be a finite number or null, got {reward!r}")
    prompt_id = data["prompt_id"]
    if not isinstance(prompt_id, str | int) or isinstance(prompt_id, bool):
        raise ConfigError(f"{where}: prompt_id must be a string, got {prompt_id!r}")
    return TraceRow(
        step=_int(data["step"], "step", where),
        prompt_id=str(prompt_id),
        sample_index=_int(data["sample_index"], "sample_index", where),
        prompt_tokens=_int(data.get("prompt_tokens", 1), "prompt_tokens", where, minimum=1),
        response_tokens=_int(data["response_tokens"], "response_tokens", where),
        finish=str(finish),
        reward=None if reward is None else float(reward),
    )


def _parse_header(data: Any, where: str) -> TraceHeader:
    if not isinstance(data, dict) or data.get("trace_format") != TRACE_FORMAT:
        raise ConfigError(
            f"{where}: not an april-bench trace (the first line must be the header, "
            f'{{"trace_format": "{TRACE_FORMAT}", ...}}); import other formats with `python -m april_bench '
            "trace import-verl|import-slime|import-stats` (docs/whatif.md)"
        )
    if data.get("version") != TRACE_VERSION:
        raise ConfigError(
            f"{where}: trace version {data.get('version')!r}; this april-bench reads {TRACE_VERSION}"
        )
    for key in ("source", "evidence", "token_counts"):
        if not isinstance(data.get(key), str):
            raise ConfigError(f"{where}: the header needs a {key!r} string")
    limit = data.get("max_response_len")
    return TraceHeader(
        source=data["source"],
        evidence=data["evidence"],
        token_counts=data["token_counts"],
        max_response_len=None if limit is None else _int(limit, "max_response_len", where, minimum=1),
        origin=str(data.get("origin", "")),
        created=str(data.get("created", "")),
        notes=tuple(str(n) for n in data.get("notes", ())),
        provenance=dict(data.get("provenance") or {}),
    )


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    from april_bench.bounded import read_line

    number = 0
    try:
        with _open(path) as f:
            while line := read_line(f, f"{path}, line {number + 1}"):
                number += 1
                if line.strip():
                    yield number, json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}, line {number}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise ConfigError(f"{path}, line {number}: nested too deeply") from None
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ConfigError(f"{path}: unreadable after line {number} ({exc})") from None


def _check_unique(rows: Iterable[tuple[int, TraceRow]], path: Path) -> list[TraceRow]:
    seen: dict[tuple[int, str, int], int] = {}
    out = []
    for number, row in rows:
        key = (row.step, row.prompt_id, row.sample_index)
        if key in seen:
            raise ConfigError(
                f"{path}, line {number}: step {row.step}, prompt {row.prompt_id!r}, "
                f"sample {row.sample_index} repeats line {seen[key]}"
            )
        seen[key] = number
        out.append(row)
    return out


def read_trace(path: Path, *, arm: str | None = None) -> Trace:
    """A trace file, or a run directory's ``trace`` table (``arm``: which arm; default the baseline)."""
    path = Path(path).expanduser()
    foreign = _importer_for(path)
    if foreign is not None:
        what, command = foreign
        raise ConfigError(
            f"{path} is {what}, not a trace: import it first with `python -m april_bench trace {command} "
            "-o trace.jsonl` (docs/whatif.md), then give trace.jsonl"
        )
    if path.is_dir():
        return trace_from_run(path, arm=arm)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such trace file or run directory")
    if not path.is_file():
        raise ConfigError(f"{path}: not a regular file (a trace is a file or a run directory)")
    if path.name.startswith("trace.jsonl") and (path.parent / "config.json").exists():
        return trace_from_run(path.parent, arm=arm)
    if arm is not None:
        raise ConfigError(f"--arm picks an arm of a run directory; {path} is a trace file")
    lines = _json_lines(path)
    first = next(lines, None)
    if first is None:
        raise ConfigError(f"{path}, line 1: empty file; a trace starts with its header line")
    header = _parse_header(first[1], f"{path}, line {first[0]}")
    rows = _check_unique(((n, parse_row(d, f"{path}, line {n}")) for n, d in lines), path)
    if not rows:
        raise ConfigError(f"{path}: the trace has a header but no rows")
    return Trace(header, rows, path)


def _importer_for(path: Path) -> tuple[str, str] | None:
    """What another framework's rollout dump at ``path`` is, and the ``trace`` command that imports it:
    verl's ``rollout_data_dir`` (``{step}.jsonl`` files), slime's ``--save-debug-rollout-data`` ``.pt``
    files, a CSV of per-step statistics.  ``None`` for a trace, a run directory or anything else.
    The command is the import's arguments up to ``-o``."""
    if path.is_dir():
        if (path / "config.json").exists():
            return None  # an april-bench run directory
        names = [p.name for p in path.iterdir() if p.is_file()]
        if any(n.endswith(".jsonl") and n[: -len(".jsonl")].isdigit() for n in names):
            return "verl's rollout_data_dir ({step}.jsonl files)", f"import-verl {path}"
        if any(n.endswith(".pt") for n in names):
            return "a folder of slime rollout dumps (.pt files)", f"import-slime {path}/*.pt"
        return None
    if path.suffix == ".pt":
        return "a slime rollout dump (--save-debug-rollout-data)", f"import-slime {path}"
    if path.suffix == ".csv":
        stats = "--groups-per-step N --samples-per-prompt N --max-response-len L"
        return "a CSV of per-step statistics", f"import-stats {path} {stats}"
    return None


def trace_from_run(run_dir: Path, *, arm: str | None = None) -> Trace:
    """The trace an april-bench run wrote: one arm's rows (repeat 0) and a header from its config."""
    config = _read_json(run_dir / "config.json")
    provenance = _read_json(run_dir / "provenance.json")
    file = next((p for p in (run_dir / "trace.jsonl", run_dir / "trace.jsonl.gz") if p.exists()), None)
    if file is None:
        raise ConfigError(
            f"{run_dir}: no trace.jsonl (the run predates traces); rerun it with this april-bench to get one"
        )
    arms = [a if isinstance(a, str) else str(a) for a in config.get("strategies", ())]
    by_arm: dict[str, list[tuple[int, TraceRow]]] = {}
    for number, data in _json_lines(file):
        where = f"{file}, line {number}"
        if not isinstance(data, dict) or "arm" not in data:
            raise ConfigError(f"{where}: a run's trace row needs an 'arm'")
        if data.get("repeat", 0) == 0:
            by_arm.setdefault(str(data["arm"]), []).append((number, parse_row(data, where)))
    if not by_arm:
        raise ConfigError(f"{file}: no trace rows (did the run finish a step?)")
    if arm is not None and arm not in by_arm:
        raise ConfigError(f"--arm {arm!r} has no trace rows in {run_dir}; it has {', '.join(by_arm)}")
    # By default the baseline: a synchronous arm's lengths are the policy's own, unshaped by aborts.
    preferred = [arm, config.get("baseline"), "sync", *arms]
    chosen = next((str(a) for a in preferred if a in by_arm), next(iter(by_arm)))
    rows = _check_unique(by_arm[chosen], file)
    result_kind = provenance.get("result_kind", "unknown")
    git = provenance.get("git") or {}
    header = TraceHeader(
        source=f"april-bench run, arm {chosen}",
        evidence=PER_SAMPLE,
        token_counts="exact (the engine's token counts)"
        if result_kind == "measured"
        else "simulated (the simulator's own length draws: replaying them is circular)",
        max_response_len=(config.get("rollout") or {}).get("max_response_len"),
        origin=str(run_dir),
        created=str(provenance.get("utc", "")),
        notes=(),
        provenance={
            "result_kind": result_kind,
            "engine": provenance.get("engine"),
            "model": config.get("model"),
            "dataset": config.get("dataset"),
            "hardware": config.get("hardware"),
            "commit": git.get("commit") if isinstance(git, dict) else None,
            "command": provenance.get("command"),
            "machine": {
                k: (provenance.get("machine") or {}).get(k)
                for k in ("cpu", "cpu_count", "load_average_start", "load_average_end")
            },
        },
    )
    return Trace(header, rows, file, arm=chosen)


def _read_json(path: Path) -> dict[str, Any]:
    from april_bench.bounded import MAX_LINE_BYTES, read_bytes

    try:
        data = json.loads(read_bytes(path, 4 * MAX_LINE_BYTES, "run file").decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path.parent} is not a run directory (no {path.name})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start}); the file is damaged") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply; the file is damaged") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


class RowChecker:
    """The rows an importer makes, checked as :func:`read_trace` will check them and named by the
    input's line: an import that would write an invalid trace fails before anything is written."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, str, int], str] = {}

    def __call__(self, row: TraceRow, where: str) -> TraceRow:
        row = parse_row(row.to_json(), where)
        key = (row.step, row.prompt_id, row.sample_index)
        if key in self._seen:
            raise ConfigError(
                f"{where}: step {row.step}, prompt {row.prompt_id!r}, sample {row.sample_index} repeats "
                f"{self._seen[key]}"
            )
        self._seen[key] = where
        return row


# ------------------------------------------------------------------ writing
def write_trace(path: Path, header: TraceHeader, rows: Iterable[TraceRow]) -> int:
    """Write a trace file through :func:`april_bench.fsio.write_atomic` (a regular file or none, never a
    link or a device), read back and checked before it replaces ``path``; the number of rows."""
    from april_bench.fsio import check_target, write_atomic

    path = Path(path)
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0

    def write(f: IO[bytes]) -> None:
        nonlocal n
        f.write((json.dumps(header.to_json(), separators=(",", ":")) + "\n").encode())
        for row in rows:
            f.write((json.dumps(row.to_json(), separators=(",", ":")) + "\n").encode())
            n += 1

    write_atomic(path, write, validate=read_trace)
    return n
