"""Response-length models: what the simulator replays as each sample's length.

:class:`LognormalLengths` is the hierarchical, censored log-normal recommended
in ``landscape.md`` §5b::

    log L_ij = log(median) + drift * step + u_i + e_ij + log(incorrect_factor) * [sample j wrong]
    u_i ~ N(0, prompt_sigma^2)     (prompt difficulty, shared inside a group)
    e_ij ~ N(0, within_sigma^2)    (within-group spread; Seer: within < between)
    sample j right with probability p_i ~ Beta(solve_a, solve_b)

Right-censoring happens in the engine: a response longer than the limit is
truncated there (and still costs the full budget).  The draws for prompt
``uid`` come from ``numpy.random.default_rng([seed, uid // 256])`` (a block of
256 prompts at a time), so every arm of a comparison sees the same lengths for
the same prompt, whatever order it launches prompts in.  Drift depends on the
step a sample *starts* in.

:class:`TraceLengths` replays real lengths recorded in a file instead.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from april_bench.config import ConfigError

__all__ = ["LengthDraw", "LengthModel", "LognormalLengths", "TraceLengths"]

BLOCK = 256  # prompts drawn together (one RNG per block keeps draws cheap and order-independent)


@dataclass(frozen=True, slots=True)
class LengthDraw:
    """Everything random about one prompt group."""

    #: log-length of each sample at step 0, before drift.
    log_lengths: tuple[float, ...]
    #: Whether each sample's answer is right (drives rewards, i.e. DAPO dynamic sampling).
    correct: tuple[bool, ...]


class LengthModel(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def drift_per_step(self) -> float: ...

    def draw(self, uid: int, n: int) -> LengthDraw: ...

    def extra(self, uid: int, n: int, index: int) -> tuple[float, bool]:
        """Sample ``index >= n`` of prompt ``uid``'s group of ``n`` (a strategy that launches more
        responses than the run's n): its log-length and correctness, from the same prompt, without
        changing the first ``n`` draws."""
        ...


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    median: float
    prompt_sigma: float
    within_sigma: float
    incorrect_factor: float
    solve_a: float
    solve_b: float
    drift_per_step: float
    seed: int
    name: str = "lognormal"
    _blocks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.median <= 0:
            raise ConfigError(f"length median must be > 0, got {self.median}")
        if min(self.prompt_sigma, self.within_sigma) < 0:
            raise ConfigError("length sigmas must be >= 0")
        if self.incorrect_factor <= 0 or min(self.solve_a, self.solve_b) <= 0:
            raise ConfigError("incorrect_factor and the solve-rate Beta parameters must be > 0")

    def draw(self, uid: int, n: int) -> LengthDraw:
        block, row = divmod(uid, BLOCK)
        cached = self._blocks.get((block, n))
        if cached is None:
            cached = self._blocks[(block, n)] = self._block(block, n)
        logs, correct = cached
        return LengthDraw(tuple(logs[row].tolist()), tuple(correct[row].tolist()))

    def extra(self, uid: int, n: int, index: int) -> tuple[float, bool]:
        """The prompt's own effect and solve rate, a fresh within-prompt draw (its own RNG stream)."""
        block, row = divmod(uid, BLOCK)
        first = np.random.default_rng([self.seed, block, n])  # the block's stream: its first draws are
        u = self.prompt_sigma * first.standard_normal((BLOCK, 1))  # the prompt effects and solve rates
        solve = first.beta(self.solve_a, self.solve_b, (BLOCK, 1))
        rng = np.random.default_rng([self.seed, block, n, row, index])
        eps = self.within_sigma * float(rng.standard_normal())
        correct = bool(rng.random() < solve[row, 0])
        log_len = math.log(self.median) + float(u[row, 0]) + eps
        return log_len + (0.0 if correct else math.log(self.incorrect_factor)), correct

    def _block(self, block: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, block, n])
        u = self.prompt_sigma * rng.standard_normal((BLOCK, 1))
        solve = rng.beta(self.solve_a, self.solve_b, (BLOCK, 1))
        eps = self.within_sigma * rng.standard_normal((BLOCK, n))
        correct = rng.random((BLOCK, n)) < solve
        logs = math.log(self.median) + u + eps + np.where(correct, 0.0, math.log(self.incorrect_factor))
        return logs, correct


class TraceLengths:
    """Replays recorded response lengths (JSON Lines or CSV with a ``length`` column).

    Rows are grouped by ``uid`` (exact: prompt ``uid`` replays the rows recorded
    for that prompt - how a measured run is replayed), else by ``prompt_id``,
    else in consecutive blocks of the group size; a prompt without its own rows
    replays group ``uid mod groups``.  An optional ``reward`` (or ``correct``)
    column gives the rewards, which DAPO dynamic sampling needs.
    """

    drift_per_step = 0.0

    def __init__(self, path: Path, group_size: int) -> None:
        self.path = Path(path)
        self.name = f"trace:{self.path.name}"
        rows = _read_rows(self.path)
        if not rows:
            raise ConfigError(f"length trace {self.path} has no rows")
        if "length" not in rows[0]:
            raise ConfigError(f"length trace {self.path} needs a 'length' column; found {sorted(rows[0])}")
        self.has_rewards = any(k in rows[0] for k in ("reward", "correct"))
        groups: dict[str, list[dict[str, str]]] = {}
        key = "uid" if "uid" in rows[0] else "prompt_id" if "prompt_id" in rows[0] else None
        if key is not None:
            for row in rows:
                groups.setdefault(str(row[key]), []).append(row)
            self._groups = list(groups.values())
        else:
            self._groups = [list(rows[i : i + group_size]) for i in range(0, len(rows), group_size)]
        self._by_uid = {int(k): g for k, g in groups.items()} if key == "uid" else {}
        for g in self._groups:
            for row in g:
                if int(float(row["length"])) < 1:
                    raise ConfigError(f"length trace {self.path}: lengths must be >= 1, got {row['length']}")

    def draw(self, uid: int, n: int) -> LengthDraw:
        group = self._by_uid.get(uid) or self._groups[uid % len(self._groups)]
        rows = [group[j % len(group)] for j in range(n)]
        logs = tuple(math.log(int(float(r["length"]))) for r in rows)
        correct = tuple(_truthy(r.get("reward", r.get("correct", 1))) for r in rows)
        return LengthDraw(logs, correct)

    def extra(self, uid: int, n: int, index: int) -> tuple[float, bool]:
        """The group's recorded rows, cycled on."""
        wider = self.draw(uid, index + 1)
        return wider.log_lengths[index], wider.correct[index]


def _truthy(value: object) -> bool:
    try:
        return float(value) > 0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value).strip().lower() in {"true", "yes"}


def _read_rows(path: Path) -> Sequence[dict[str, str]]:
    """The trace's rows, every one checked: a bad row is one ``ConfigError`` naming the file, the line
    and what the row needs (never a ``ValueError`` from deep inside a run)."""
    if not path.exists():
        raise ConfigError(f"length trace {path} does not exist")
    if path.suffix not in {".jsonl", ".json", ".csv"}:
        raise ConfigError(f"length trace {path}: use .jsonl or .csv")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"length trace {path} cannot be read ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"length trace {path}, line {line}: not UTF-8 text (byte {exc.start}); give a .jsonl or .csv "
            "text file"
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise ConfigError(f"length trace {path}, line {line}: a NUL byte; give a .jsonl or .csv text file")
    numbered = _json_rows(path, text) if path.suffix in {".jsonl", ".json"} else _csv_rows(path, text)
    rows = []
    group_key = next((k for k in ("uid", "prompt_id") if numbered and k in numbered[0][1]), None)
    for line, row in numbered:
        _check_row(path, line, row)
        if group_key is not None and row.get(group_key) in (None, ""):
            raise ConfigError(
                f"length trace {path}, line {line}: no '{group_key}' (the first row has one, so every row "
                "needs one)"
            )
        rows.append(row)
    return rows


def _json_rows(path: Path, text: str) -> list[tuple[int, dict[str, str]]]:
    rows = []
    for line, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"length trace {path}, line {line}: not a JSON object ({exc.msg}); each line must be one "
                'object such as {"uid": 0, "length": 812}'
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"length trace {path}, line {line}: a row must be a JSON object such as "
                '{"uid": 0, "length": 812}, '
                f"got {type(row).__name__}"
            )
        rows.append((line, row))
    return rows


def _csv_rows(path: Path, text: str) -> list[tuple[int, dict[str, str]]]:
    import io

    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        return [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise ConfigError(f"length trace {path}, line {reader.line_num}: not CSV ({exc})") from None


def _check_row(path: Path, line: int, row: dict[str, Any]) -> None:
    """``length``: a whole number >= 1 (``12`` or ``"12"``; NaN, infinities, null, text refused);
    ``uid``, when present: a whole number; ``None`` keys (a CSV row longer than its header) refused."""
    where = f"length trace {path}, line {line}"
    if None in row:
        raise ConfigError(f"{where}: more cells than the header has columns; fix the row")
    if "length" not in row:
        raise ConfigError(f"{where}: no 'length' field (found {sorted(map(str, row))}); every row needs one")
    length = _whole(row["length"])
    if length is None or length < 1:
        raise ConfigError(
            f"{where}: 'length' must be a whole number of tokens >= 1, got {row['length']!r:.40}"
        )
    row["length"] = str(length)
    if "uid" in row and _whole(row["uid"]) is None:
        raise ConfigError(f"{where}: 'uid' must be a whole number, got {row['uid']!r:.40}")
    if "uid" in row:
        row["uid"] = str(_whole(row["uid"]))


def _whole(value: object) -> int | None:
    """``value`` as a whole number, or ``None`` (NaN, infinite, fractional, empty, text, null, bool)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number) or number != int(number):
        return None
    return int(number)
