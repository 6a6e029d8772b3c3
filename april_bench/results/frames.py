"""Many run directories as one long pandas table per record kind.

Each row keeps its own fields (those of :data:`april_bench.results.records.TABLES`)
and gains the run-level columns of :data:`RUN_COLUMNS`, so rows of different runs
can be filtered, grouped and plotted together::

    tables = load_runs([Path("results/runs/embedded-cpu-grpo"), Path("results/runs/sim-...")])
    tables["steps"].groupby(["run", "arm"])["generated_tokens"].sum()

pandas is imported here and only here (and by the figure code): ``import april_bench``
never needs it (the ``plot`` extra installs it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.results.records import TABLES
from april_bench.results.store import RunDirectory, load_run

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RUN_COLUMNS", "frames_of", "load_runs", "one_run", "run_facts", "strategy_of"]

#: Columns every row gains: which run it came from and what that run was.
RUN_COLUMNS = (
    "run",
    "dataset",
    "model",
    "algorithm",
    "hardware",
    "engine",
    "result_kind",
    "commit",
    "max_response_len",
)


def strategy_of(arm: str) -> str:
    """The strategy an arm runs: ``april[max_version_span=2]`` -> ``april``."""
    return arm.split("[", 1)[0]


def run_facts(run: RunDirectory) -> dict[str, Any]:
    """The run-level columns of one run (see :data:`RUN_COLUMNS`), from its config and provenance."""
    config, provenance = run.config, run.provenance
    engine = provenance.get("engine") or config.get("engine")  # provenance has the engine "auto" resolved to
    return {
        "run": run.path.name,
        "dataset": config.get("dataset"),
        "model": config.get("model"),
        "algorithm": config.get("algorithm"),
        "hardware": config.get("hardware"),
        "engine": engine,
        "result_kind": provenance.get("result_kind", "measured"),
        "commit": (provenance.get("git") or {}).get("commit"),
        "max_response_len": (config.get("rollout") or {}).get("max_response_len"),
    }


def load_runs(dirs: Iterable[Path]) -> dict[str, pd.DataFrame]:
    """Read run directories (:func:`~april_bench.results.store.load_run`) into one table per record kind."""
    return frames_of([load_run(Path(d)) for d in dirs])


def frames_of(runs: Sequence[RunDirectory]) -> dict[str, pd.DataFrame]:
    """One long DataFrame per table of :data:`TABLES`, plus ``runs`` (one row of facts per run).

    A table no run recorded is an empty frame with every column, so filters never miss a column.
    Rows of tables that carry an arm also get ``strategy`` (:func:`strategy_of`).
    """
    import pandas as pd

    facts = [run_facts(run) for run in runs]
    names = [f["run"] for f in facts]
    if len(set(names)) != len(names):
        from april_bench.config import ConfigError

        raise ConfigError(f"two run directories share a name ({', '.join(names)}); rename one of them")
    frames: dict[str, pd.DataFrame] = {"runs": pd.DataFrame(facts, columns=list(RUN_COLUMNS))}
    for table, record in TABLES.items():
        fields = [f.name for f in dataclasses.fields(record)]
        defaults = _defaults(record)
        rows = [
            {**fact, **defaults, **row}
            for fact, run in zip(facts, runs, strict=True)
            for row in run.rows(table)
        ]
        frame = pd.DataFrame(rows, columns=[*RUN_COLUMNS, *fields, *_extra_columns(rows, fields)])
        if "arm" in fields:
            frame.insert(len(RUN_COLUMNS), "strategy", [strategy_of(a) for a in frame["arm"]])
        frames[table] = frame
    return frames


def _defaults(record: type) -> dict[str, Any]:
    """Defaults of the fields added later: rows of older runs lack them (``repeat`` = 0, ...)."""
    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


def _extra_columns(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> list[str]:
    """Fields a row has beyond its record's (rows written by a newer version): kept, after the rest."""
    known = {*RUN_COLUMNS, *fields}
    return list(dict.fromkeys(key for row in rows for key in row if key not in known))


def one_run(tables: Mapping[str, pd.DataFrame], run: str) -> dict[str, pd.DataFrame]:
    """The rows of one run (by its ``run`` name) out of the long tables."""
    return {name: frame[frame["run"] == run] for name, frame in tables.items()}
