"""Per-step response-length statistics (a W&B or CSV export) as a trace: the weakest evidence.

A logger's per-step summary is the least a user has: verl logs ``response_length/mean`` (and ``/max``,
``/min``, ``/clip_ratio``), slime ``rollout/response_len/mean`` (and ``rollout/truncated_ratio``).
Exported from W&B (the run's CSV, or a panel's "Export CSV" whose columns read ``RUN - KEY``) or
written by hand, the file needs a step column and a mean-length column.

It holds no samples, so the importer **synthesizes** them, and the trace's header says so: per step,
``groups x n`` lengths from the simulator's hierarchical log-normal (between-prompt sigma 0.8, within
0.6: ``docs/simulator.md``, an assumption), its median chosen so that the mean of the lengths clipped
at the response limit equals the logged mean.  Lost for good: the real grouping, the coupling of length
and reward (no rewards are made up), the tail beyond what a mean implies.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from pathlib import Path

import numpy as np

from april_bench.config import ConfigError
from april_bench.trace.format import PER_STEP_STATS, RowChecker, TraceHeader, TraceRow

__all__ = ["STEP_COLUMNS", "import_stats"]

STEP_COLUMNS = ("_step", "step", "Step", "global_step", "trainer/global_step", "rollout/step", "train/step")
MEAN_KEYS = ("response_length/mean", "rollout/response_len/mean", "response_len/mean")
PROMPT_KEYS = ("prompt_length/mean",)
#: Samples a step may synthesize (groups x samples per prompt): more is not a run, and would not fit.
MAX_SAMPLES_PER_STEP = 1_000_000
#: The simulator's length spread (docs/simulator.md): between prompts, within a group.
PROMPT_SIGMA, WITHIN_SIGMA = 0.8, 0.6


def _key(column: str) -> str:
    """A W&B panel export names columns ``RUN - KEY``; the key is what matters."""
    return column.rsplit(" - ", 1)[-1].strip()


def _find(columns: list[str], wanted: tuple[str, ...], given: str | None, path: Path) -> str | None:
    if given is not None:
        if given not in columns:
            raise ConfigError(f"{path}: no column {given!r}; it has {', '.join(columns)}")
        return given
    for column in columns:
        key = _key(column)
        if key in wanted and not key.endswith(("__MIN", "__MAX")):
            return column
    return None


def import_stats(
    path: Path,
    *,
    groups_per_step: int,
    samples_per_prompt: int,
    max_response_len: int,
    prompt_tokens: int = 128,
    mean_column: str | None = None,
    step_column: str | None = None,
    seed: int = 0,
) -> tuple[TraceHeader, list[TraceRow]]:
    """A synthesized trace matching each step's logged mean response length (see the module doc)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such CSV file")
    if min(groups_per_step, samples_per_prompt, max_response_len, prompt_tokens) < 1:
        raise ConfigError(
            "--groups-per-step, --samples-per-prompt, --max-response-len and --prompt-tokens must be >= 1"
        )
    if groups_per_step * samples_per_prompt > MAX_SAMPLES_PER_STEP:
        raise ConfigError(
            f"--groups-per-step x --samples-per-prompt = {groups_per_step * samples_per_prompt:,} samples a "
            f"step, more than any run makes ({MAX_SAMPLES_PER_STEP:,}); give the source run's values"
        )
    from april_bench.bounded import MAX_CONFIG_BYTES, read_bytes

    try:
        text = read_bytes(path, 64 * MAX_CONFIG_BYTES, "CSV file").decode("utf-8")
        reader = csv.DictReader(io.StringIO(text, newline=""))
        columns = list(reader.fieldnames or [])
        table = list(reader)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); export the CSV as UTF-8") from None
    except csv.Error as exc:
        raise ConfigError(
            f"{path}, line {reader.line_num}: not a CSV row april-bench reads ({exc})"
        ) from None
    step_col = _find(columns, STEP_COLUMNS, step_column, path)
    mean_col = _find(columns, MEAN_KEYS, mean_column, path)
    if step_col is None or mean_col is None:
        raise ConfigError(
            f"{path}: needs a step column ({', '.join(STEP_COLUMNS)}) and a mean response length "
            f"({', '.join(MEAN_KEYS)}); name them with --step-column/--mean-column"
        )
    prompt_col = _find(columns, PROMPT_KEYS, None, path)
    rng = np.random.default_rng(seed)
    rows: list[TraceRow] = []
    check = RowChecker()  # an invalid row fails here, named by the input's line
    for number, record in enumerate(table, 2):  # line 1 is the header
        where = f"{path}, line {number}"
        if not (record.get(mean_col) or "").strip():
            continue  # W&B leaves cells empty on steps that logged other keys
        step = _number(record.get(step_col), step_col, where)
        mean = _number(record[mean_col], mean_col, where)
        if step < 0 or step != int(step) or not 0 < mean <= max_response_len:
            raise ConfigError(
                f"{where}: step must be a whole number >= 0 and the mean in (0, {max_response_len}], "
                f"got step {step} and mean {mean}"
            )
        prompt = prompt_tokens
        if prompt_col is not None and (record.get(prompt_col) or "").strip():
            prompt = max(1, round(_number(record[prompt_col], prompt_col, where)))
        u = PROMPT_SIGMA * rng.standard_normal((groups_per_step, 1))
        z = u + WITHIN_SIGMA * rng.standard_normal((groups_per_step, samples_per_prompt))
        median = _median_for_mean(z, mean, max_response_len)
        lengths = np.minimum(np.maximum(1, np.rint(median * np.exp(z))), max_response_len).astype(int)
        for g in range(groups_per_step):
            for j in range(samples_per_prompt):
                n = int(lengths[g, j])
                rows.append(
                    check(
                        TraceRow(
                            step=int(step),
                            prompt_id=f"s{int(step)}g{g}",
                            sample_index=j,
                            prompt_tokens=prompt,
                            response_tokens=n,
                            finish="truncated" if n >= max_response_len else "stop",
                            reward=None,
                        ),
                        where,
                    )
                )
    if not rows:
        raise ConfigError(f"{path}: no step has a value in {mean_col!r}")
    header = TraceHeader(
        source="per-step length statistics",
        evidence=f"{PER_STEP_STATS} (samples synthesized: the weakest evidence)",
        token_counts=f"as logged ({_key(mean_col)}), per-step means only",
        max_response_len=max_response_len,
        origin=str(path),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        notes=(
            f"lengths synthesized per step: log-normal, sigma {PROMPT_SIGMA} between prompts and "
            f"{WITHIN_SIGMA} within a group (the simulator's assumption), matched to each step's mean",
            "no real groups, no rewards, no tail: a what-if on this trace mostly replays the assumption",
        ),
        provenance={
            "importer": "april_bench.trace.stats",
            "mean_column": mean_col,
            "step_column": step_col,
            "groups_per_step": groups_per_step,
            "samples_per_prompt": samples_per_prompt,
            "seed": seed,
        },
    )
    return header, rows


def _number(value: str | None, column: str, where: str) -> float:
    try:
        number = float(value or "")
    except ValueError:
        raise ConfigError(f"{where}: {column!r} is not a number ({value!r})") from None
    if not math.isfinite(number):
        raise ConfigError(f"{where}: {column!r} is not finite ({value!r})")
    return number


def _median_for_mean(z: np.ndarray, mean: float, limit: int) -> float:
    """The median m with mean(min(m * exp(z), limit)) = mean, by bisection in log space."""
    lo, hi = math.log(1e-3), math.log(limit * 1e3)
    for _ in range(80):
        mid = (lo + hi) / 2
        if float(np.minimum(math.exp(mid) * np.exp(z), limit).mean()) < mean:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)
