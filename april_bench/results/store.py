"""A run directory: config, provenance, tidy rows (JSON Lines), summary and tables.

::

    <out>/config.json          the resolved ExperimentConfig
    <out>/provenance.json      git commit, versions, machine, simulated or measured
    <out>/<table>.jsonl        one file per table of april_bench.results.records.TABLES
                               (requests, samples, steps, evals, engine_metrics, ...)
    <out>/summary.json         per-arm metrics (recomputable from the rows)
    <out>/table.md             the paper-style and detail tables
    <out>/result.json          one flat file of the headline numbers (results.result_file)
    <out>/readings.json        a paper row's other readings (april_bench.experiment.readings), if any

Rows are streamed: :class:`RunWriter` appends each row as it is recorded and
flushes at step boundaries, so an interrupted run keeps every completed step.
JSON files are written atomically (a temporary file, then a rename).  Row
files may be gzipped (``requests.jsonl.gz``): committed reference runs are, and
:func:`load_run` reads either form.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from april_bench.config import ConfigError
from april_bench.fsio import fsync_dir, open_append, write_atomic
from april_bench.results.coverage import covered, row_key
from april_bench.results.engine_report import ENGINE_COLUMNS, engine_table
from april_bench.results.episodes import EPISODE_COLUMNS, episode_table
from april_bench.results.headline import HEADLINE_COLUMNS, WORK_COLUMNS, has_work, headline_table, work_table
from april_bench.results.records import TABLES, as_row
from april_bench.results.summary import summarize
from april_bench.results.table import (
    DECOMPOSITION_COLUMNS,
    GAIN_TOLERANCE,
    GPU_COLUMNS,
    ITERATION_COLUMNS,
    decomposition_table,
    detail_columns,
    detail_table,
    gpu_table,
    iteration_table,
    render_markdown,
    results_table,
    wide_intervals,
)

__all__ = [
    "RunDirectory",
    "RunWriter",
    "check_run",
    "fsync_dir",
    "load_run",
    "render_tables",
    "run_report",
    "write_json_atomic",
    "write_run",
]

#: Tables a run directory must have (the others may be absent: older runs, or nothing recorded).
REQUIRED_TABLES = ("requests", "samples", "steps")


@dataclass(slots=True)
class RunDirectory:
    path: Path
    config: dict[str, Any]
    provenance: dict[str, Any]
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: The summary accumulated while the run ran (its large tables then stay on disk, not in ``tables``).
    accumulated: dict[str, dict[str, Any]] | None = None

    @property
    def simulated(self) -> bool:
        return self.provenance.get("result_kind") == "simulated"

    def rows(self, table: str) -> list[dict[str, Any]]:
        return self.tables.get(table, [])

    def summary(self) -> dict[str, dict[str, Any]]:
        if self.accumulated is not None:
            return self.accumulated
        return summarize(
            self.tables, baseline=self.config.get("baseline"), block_steps=self.config.get("block_steps")
        )


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 2) -> None:
    """Write ``data`` as JSON (indented; ``indent=None``: compact) to ``path`` through a temporary file
    and a rename.  Compact JSON is encoded by the C encoder, several times faster than the indented
    (pure-Python) one: for large machine-read files such as checkpoints."""
    from april_bench.redact import redact

    path.parent.mkdir(parents=True, exist_ok=True)
    # every JSON file a run writes (config, provenance, status, summary, checkpoints) holds no secret
    _write_text_atomic(path, json.dumps(redact(data), indent=indent) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a uniquely named temporary file and a rename (see below)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_text_atomic(path, text)


def _write_text_atomic(path: Path, text: str) -> None:
    """Every whole file goes through :func:`april_bench.fsio.write_atomic`: after a crash ``path`` holds
    the old text or the new, never a torn or empty file, and never a link followed."""
    write_atomic(path, text)


class RunWriter:
    """Streams rows into ``<out>/<table>.jsonl`` as they are recorded (a :class:`RowSink`).

    Files are opened for append on first use; :meth:`flush` pushes buffered rows to the disk (flush
    and fsync: the session calls it before every checkpoint, so the rows a checkpoint counts survive
    a power cut); :meth:`close` closes them.  The writer counts the rows it holds per session and
    step, so a checkpoint can record how many rows it covers (:meth:`counts`).
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self._files: dict[str, IO[str]] = {}
        #: (table, session key) -> (step, end_of_run) -> rows
        self._counts: dict[tuple[str, str], dict[tuple[int, bool], int]] = {}
        for table in TABLES:  # every table has a file, empty or not: a reader sees what was recorded
            open_append(out / f"{table}.jsonl").close()

    def write(self, table: str, row: Mapping[str, Any]) -> None:
        f = self._files.get(table)
        if f is None:
            f = self._files[table] = open_append(self.out / f"{table}.jsonl")
        f.write(json.dumps(row, separators=(",", ":")))
        f.write("\n")
        self._count(table, row)

    def count_existing(self, tables: Mapping[str, Iterable[Mapping[str, Any]]]) -> None:
        """Count rows already in the files (a resumed run's kept rows) as if written here."""
        for table, rows in tables.items():
            for row in rows:
                self._count(table, row)

    def _count(self, table: str, row: Mapping[str, Any]) -> None:
        key, step, end_of_run = row_key(row)
        per_step = self._counts.setdefault((table, key), {})
        per_step[(step, end_of_run)] = per_step.get((step, end_of_run), 0) + 1

    def counts(self, key: str, done: int | None) -> dict[str, int]:
        """Rows per table of session ``key`` that its checkpoint after ``done`` steps covers
        (``None``: every row of the finished session)."""
        out: dict[str, int] = {}
        for (table, session), per_step in self._counts.items():
            if session != key:
                continue
            out[table] = sum(
                n for (step, end), n in per_step.items() if done is None or covered(table, step, end, done)
            )
        return out

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def finish(
        self,
        config: Mapping[str, Any],
        provenance: Mapping[str, Any],
        tables: Mapping[str, Iterable[Any]],
        *,
        summary: dict[str, dict[str, Any]] | None = None,
    ) -> RunDirectory:
        """Close the row files, then write the summary and tables of the complete run.  ``summary``:
        the run's, accumulated as it ran (``tables`` may then hold only the small tables)."""
        self.close()
        run = RunDirectory(
            self.out,
            dict(config),
            dict(provenance),
            {name: [as_row(r) for r in records] for name, records in tables.items()},
            accumulated=summary,
        )
        write_summary(run, summary)
        return run


def write_summary(
    run: RunDirectory, summary: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Write ``summary.json`` and ``table.md`` of a run directory from its rows (or ``summary``)."""
    from april_bench.results.schema import SCHEMA_VERSION, with_old_names

    summary = run.summary() if summary is None else summary
    write_json_atomic(
        run.path / "summary.json",
        {
            "schema_version": SCHEMA_VERSION,
            "result_kind": run.provenance.get("result_kind"),
            "metadata": run.provenance.get("metadata", {}),
            "arms": {arm: with_old_names(metrics) for arm, metrics in summary.items()},
        },
    )
    _write_text_atomic(run.path / "table.md", render_tables(run.config, summary, run.simulated) + "\n")
    from april_bench.results.result_file import result_record

    steps = run.rows("steps")
    if not steps:  # a summary accumulated while the run ran: its rows stayed on disk
        file = _rows_file(run.path, "steps")
        steps = _read_jsonl(file, "steps") if file is not None else []
    write_json_atomic(
        run.path / "result.json", result_record(run.path.name, run.config, run.provenance, summary, steps)
    )
    return summary


def write_run(
    out: Path,
    *,
    config: Mapping[str, Any],
    provenance: Mapping[str, Any],
    tables: Mapping[str, Iterable[Any]],
) -> RunDirectory:
    """Write a whole run directory at once (records or plain rows per table)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "config.json", dict(config))
    write_json_atomic(out / "provenance.json", dict(provenance))
    rows = {
        name: [r if isinstance(r, dict) else as_row(r) for r in records] for name, records in tables.items()
    }
    for name, data in rows.items():
        write_atomic(
            out / f"{name}.jsonl", "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in data)
        )
    run = RunDirectory(out, dict(config), dict(provenance), rows)
    write_summary(run)
    return run


def _rows_file(run: Path, name: str) -> Path | None:
    for candidate in (run / f"{name}.jsonl", run / f"{name}.jsonl.gz"):
        if candidate.exists():
            return candidate
    return None


def _read_jsonl(path: Path, table: str) -> list[dict[str, Any]]:
    """The rows of one table file; a damaged file is a ``ConfigError`` naming the file and line."""
    from april_bench.bounded import read_line

    opener = gzip.open if path.suffix == ".gz" else open
    required = _required_fields(table)
    numeric = _numeric_fields(table)
    rows: list[dict[str, Any]] = []
    number = 0
    try:
        with opener(path, "rt") as f:
            while line := read_line(f, f"{path}, line {number + 1}"):
                number += 1
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ConfigError(f"{path}, line {number}: a row must be a JSON object")
                missing = required - set(row)
                if missing:
                    raise ConfigError(
                        f"{path}, line {number}: not a {table} row (missing {', '.join(sorted(missing))})"
                    )
                for name in numeric:
                    if type(row[name]) not in (int, float):
                        raise ConfigError(
                            f"{path}, line {number}: {name} must be a number, got {row[name]!r:.40}; the "
                            "file is damaged"
                        )
                rows.append(row)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}, line {number}: not JSON ({exc.msg}); the file is damaged") from None
    except RecursionError:
        raise ConfigError(f"{path}, line {number}: nested too deeply; the file is damaged") from None
    except (EOFError, gzip.BadGzipFile, UnicodeDecodeError, zlib.error) as exc:
        raise ConfigError(
            f"{path}: damaged after line {number} ({exc}); the file is truncated or not a row file"
        ) from None
    return rows


def _numeric_fields(table: str) -> tuple[str, ...]:
    """Required fields of ``table`` declared ``int`` or ``float`` (a row holding text there is damaged)."""
    import dataclasses

    return tuple(
        f.name
        for f in dataclasses.fields(TABLES[table])
        if f.name in _required_fields(table) and str(f.type) in ("int", "float")
    )


def _required_fields(table: str) -> set[str]:
    """Fields a row of ``table`` must have (fields added later with defaults may be absent)."""
    import dataclasses

    return {
        f.name
        for f in dataclasses.fields(TABLES[table])
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


def _read_json(path: Path) -> dict[str, Any]:
    from april_bench.bounded import MAX_LINE_BYTES, read_bytes

    try:
        data = json.loads(read_bytes(path, 4 * MAX_LINE_BYTES, "run file").decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); the file is damaged"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start}); the file is damaged") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply; the file is damaged") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


#: The config fields every reader of a run uses (tables, figures, comparisons): checked when it is read.
_CONFIG_FIELDS: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("steps", int, "a whole number"),
    ("strategies", list, "a list of arms"),
    ("model", str, "a string"),
    ("dataset", str, "a string"),
    ("algorithm", str, "a string"),
    ("hardware", str, "a string"),
)


def check_run_config(path: Path, config: Mapping[str, Any]) -> None:
    """The fields every reader of a run's ``config.json`` uses, present and typed (else it is damaged);
    ``strategies`` may be absent (runs older than it), never of the wrong type."""
    for name, kind, want in _CONFIG_FIELDS:
        value = config.get(name)
        if value is None and name == "strategies":
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ConfigError(
                f"{path}: field {name!r} must be {want}, got {value!r:.40}; the file is damaged"
            )


def load_run(path: Path) -> RunDirectory:
    """Read a run directory: its config, provenance and every table present."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a run directory (no such directory)")
    files = {name: _rows_file(path, name) for name in TABLES}
    missing = [n for n in ("config.json", "provenance.json") if not (path / n).exists()]
    missing += [f"{name}.jsonl" for name in REQUIRED_TABLES if files[name] is None]
    if missing:
        raise FileNotFoundError(f"{path} is not a run directory (missing {', '.join(missing)})")
    config = _read_json(path / "config.json")
    check_run_config(path / "config.json", config)
    return RunDirectory(
        path=path,
        config=config,
        provenance=_read_json(path / "provenance.json"),
        tables={name: _read_jsonl(file, name) for name, file in files.items() if file is not None},
    )


def check_run(run: RunDirectory) -> list[str]:
    """What is wrong with a run's rows, as lines (empty: consistent).

    Every launched prompt must end trained, dropped or buffered, exactly one of them; and for a
    complete run, every generated token is trained, wasted or still buffered at the end.
    """
    problems = _duplicates(run)
    steps, samples = run.rows("steps"), run.rows("samples")
    if steps and not samples:
        problems.append(f"{run.path}: {len(steps)} step rows but no sample rows (samples.jsonl empty)")
    complete = _status(run.path) in (None, "complete")
    for arm, m in run.summary().items():
        if m["prompts"]["inconsistent"]:
            problems.append(f"arm {arm}: {m['prompts']['inconsistent']} prompts have more than one fate")
        balance = m["trained_tokens"] + m["wasted_tokens"] + m["buffered_tokens_at_end"]
        if complete and samples and m["generated_tokens"] != balance:
            problems.append(
                f"arm {arm}: {m['generated_tokens']:,} tokens generated but {balance:,} trained, wasted or "
                "buffered: rows are missing"
            )
    return problems


#: What identifies a row of each table: two rows with one identity are one row recorded twice (row
#: files concatenated, a resume that appended without dropping).
_IDENTITY = {
    "steps": ("arm", "repeat", "step"),
    "evals": ("arm", "repeat", "step"),
    "requests": ("arm", "repeat", "request_id", "t_submit"),
    "samples": ("arm", "repeat", "group_uid", "sample_index", "step", "fate", "reason"),
}


def _duplicates(run: RunDirectory) -> list[str]:
    problems = []
    for table, fields in _IDENTITY.items():
        seen: set[tuple[Any, ...]] = set()
        twice = 0
        for row in run.rows(table):
            key = tuple(json.dumps(row.get(f), sort_keys=True) for f in fields)
            if key in seen:
                twice += 1
            seen.add(key)
        if twice:
            problems.append(f"{twice:,} duplicated {table} rows (the same {', '.join(fields)})")
    return problems


def _status(path: Path) -> str | None:
    try:
        return str(json.loads((path / "status.json").read_text()).get("state"))
    except (OSError, ValueError, AttributeError, RecursionError):  # damaged: the readers say how
        return None


def run_report(stored: RunDirectory, out: Path) -> str:
    """What ``run`` prints when a run completes: the ``table.md`` it wrote (rendered once, with any
    section added beside the tables, such as the row's other readings), its directory and a one-line
    JSON summary."""
    summary = stored.summary()
    final: dict[str, Any] = {
        "result_kind": stored.provenance["result_kind"],
        "out": str(out),
        "baseline": next(iter(summary.values()), {}).get("baseline"),
        "throughput_gain": {arm: m["throughput_gain"] for arm, m in summary.items()},
    }
    tables = (stored.path / "table.md").read_text().removesuffix("\n")
    figures = f"figures: python -m april_bench plot {out}  (writes {out / 'figures'})"
    return "\n".join((tables, f"\nrun directory: {out}", figures, json.dumps(final)))


def render_tables(
    config: Mapping[str, Any], summary: Mapping[str, Mapping[str, Any]], simulated: bool
) -> str:
    kind = "SIMULATED (simulator, published-evidence parameters; no accuracy)" if simulated else "MEASURED"
    oracle = config.get("length_oracle")
    if oracle:
        kind += (
            f", FORCED LENGTHS (every response's length and reward drawn from {oracle}: the schedule is "
            "measured, the rewards and accuracy are not the model's)"
        )
    columns, rows, assumes = results_table(config, summary, simulated)
    paper = render_markdown(columns, rows) + (f"\n\n{assumes}" if assumes else "")
    gpus = None
    if simulated:  # a simulated node's GPUs; a measured run's tables do not know its machine
        from april_bench.results.result_file import gpus_of

        gpus = gpus_of(config, {"result_kind": "simulated"})
    detail = render_markdown(detail_columns(gpus), detail_table(summary, gpus))
    rollout = config.get("rollout", {})
    setup = (
        f"{config['steps']} steps, {rollout.get('rollout_batch_size')} groups x "
        f"{rollout.get('n_samples_per_prompt')} samples, "
        f"over-sampling {rollout.get('over_sampling_batch_size')}, "
        f"max response {rollout.get('max_response_len')} tokens, seed {config.get('seed')}"
    )
    baseline = next(iter(summary.values()), {}).get("baseline")
    if baseline is not None and baseline != "sync":
        setup += f"; gains are against {baseline} (the run has no sync arm)"
    wide = wide_intervals(summary)
    if wide and not simulated:
        setup += (
            f"\n\nNote: the paired 95% interval of {', '.join(wide)} is wider than "
            f"+-{GAIN_TOLERANCE * 100:.0f} points: the machine was noisy; rerun with more --repeats or "
            "smaller --block-steps"
        )
    label = kind.split()[0].rstrip(",").lower()
    text = f"## Results: {kind}\n\n{setup}\n\n"
    if not simulated:  # the paired median leads; the ratio of totals is secondary
        headline = render_markdown(HEADLINE_COLUMNS, headline_table(summary))
        text += (
            f"### Headline (measured): paired median gain against {baseline}, 95% bootstrap interval\n\n"
            f"{headline}\n\n"
        )
    text += f"{paper}\n\n### Where time and tokens go ({label})\n\n{detail}"
    decomposition = decomposition_table(summary)
    if decomposition:
        text += (
            f"\n\n### Where the gain comes from ({label}; against {baseline}, in points; "
            "docs/calibration.md#where-the-gain-comes-from)\n\n"
            f"{render_markdown(DECOMPOSITION_COLUMNS, decomposition)}\n\n"
            "Throughput gain = tail + fuller batches + peak concurrency; useful-token gain = throughput "
            "gain + not discarding.  APRIL's argument (long responses hold a step open while its batch "
            "empties) is the tail and fuller-batch columns; peak concurrency is what launching more "
            "requests buys whatever the lengths."
        )
    episodes = episode_table(summary)
    if episodes:
        text += f"\n\n### Episodes: trained multi-turn episodes ({label}; docs/agents.md)\n\n"
        text += render_markdown(EPISODE_COLUMNS, episodes)
    if has_work(summary):
        work = render_markdown(WORK_COLUMNS, work_table(summary))
        text += (
            f"\n\n### Engine work: forward passes and tokens per iteration ({label}; counted; the gains per "
            f"iteration assume every iteration costs the same, as on a memory-bound GPU, not on a CPU: "
            f"docs/measured.md)\n\n{work}"
        )
    rounds = iteration_table(summary)
    if rounds:
        text += (
            f"\n\n### Engine rounds: decode steps and the tail at low batch ({label}; the iterations "
            "table has them against time)\n\n" + render_markdown(ITERATION_COLUMNS, rounds)
        )
    gpu = gpu_table(summary)
    if gpu:
        text += (
            f"\n\n### GPU: busy share, idle GPU-seconds and energy per arm and phase ({label}; "
            f"telemetry samples on the run clock; busy = a kernel ran, not occupancy; docs/gpu.md)\n\n"
            + render_markdown(GPU_COLUMNS, gpu)
        )
    if not simulated:  # a real engine's cost of partial rollouts (april_bench.results.engine_report)
        engine = render_markdown(ENGINE_COLUMNS, engine_table(summary))
        text += f"\n\n### Engine: re-prefill on resume and log-prob gap to the trainer ({label})\n\n{engine}"
    from april_bench.results.faults import failure_lines  # replica failures and their cost, if any

    failures = failure_lines([{"arm": arm, **m} for arm, m in summary.items()], kind=label)
    if failures:
        text += "\n" + "\n".join(failures)
    from april_bench.results.legend import table_legend

    return f"{text}\n\n{table_legend(summary, simulated)}"
