"""A run directory: config, provenance, tidy rows (JSON Lines), summary and tables.

::

    <out>/config.json        the resolved ExperimentConfig
    <out>/provenance.json    git commit, versions, machine, simulated or measured
    <out>/requests.jsonl     one row per engine request (segment)
    <out>/samples.jsonl      one row per sample fate (trained / dropped / buffered)
    <out>/steps.jsonl        one row per step
    <out>/evals.jsonl        one row per held-out evaluation (measured runs)
    <out>/summary.json       per-arm metrics (recomputable from the rows)
    <out>/table.md           the paper-style and detail tables

Row files may be gzipped (``requests.jsonl.gz``): committed reference runs are,
and :func:`load_run` reads either form.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from april_bench.results.records import as_row
from april_bench.results.summary import summarize
from april_bench.results.table import (
    DETAIL_COLUMNS,
    PAPER_COLUMNS,
    detail_table,
    paper_table,
    render_markdown,
)

__all__ = ["RunDirectory", "load_run", "render_tables", "write_run"]


@dataclass(slots=True)
class RunDirectory:
    path: Path
    config: dict[str, Any]
    provenance: dict[str, Any]
    requests: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]

    @property
    def simulated(self) -> bool:
        return self.provenance.get("result_kind") == "simulated"

    def summary(self) -> dict[str, dict[str, Any]]:
        return summarize(self.requests, self.samples, self.steps, self.evals)


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")))
            f.write("\n")


def _rows_file(run: Path, name: str) -> Path | None:
    for candidate in (run / f"{name}.jsonl", run / f"{name}.jsonl.gz"):
        if candidate.exists():
            return candidate
    return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_run(
    out: Path,
    *,
    config: Mapping[str, Any],
    provenance: Mapping[str, Any],
    requests: Iterable[Any],
    samples: Iterable[Any],
    steps: Iterable[Any],
    evals: Iterable[Any] = (),
) -> RunDirectory:
    out.mkdir(parents=True, exist_ok=True)
    rows = {
        "requests": [as_row(r) for r in requests],
        "samples": [as_row(r) for r in samples],
        "steps": [as_row(r) for r in steps],
        "evals": [as_row(r) for r in evals],
    }
    for name, data in rows.items():
        _write_jsonl(out / f"{name}.jsonl", data)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    run = RunDirectory(
        out, dict(config), dict(provenance), rows["requests"], rows["samples"], rows["steps"], rows["evals"]
    )
    summary = run.summary()
    (out / "summary.json").write_text(
        json.dumps({"result_kind": provenance.get("result_kind"), "arms": summary}, indent=2) + "\n"
    )
    (out / "table.md").write_text(render_tables(run.config, summary, run.simulated) + "\n")
    return run


def load_run(path: Path) -> RunDirectory:
    rows = {name: _rows_file(path, name) for name in ("requests", "samples", "steps")}
    missing = [n for n in ("config.json", "provenance.json") if not (path / n).exists()]
    missing += [f"{name}.jsonl" for name, found in rows.items() if found is None]
    if missing:
        raise FileNotFoundError(f"{path} is not a run directory (missing {', '.join(missing)})")
    return RunDirectory(
        path=path,
        config=json.loads((path / "config.json").read_text()),
        provenance=json.loads((path / "provenance.json").read_text()),
        requests=_read_jsonl(rows["requests"]),  # type: ignore[arg-type]
        samples=_read_jsonl(rows["samples"]),  # type: ignore[arg-type]
        steps=_read_jsonl(rows["steps"]),  # type: ignore[arg-type]
        evals=_read_jsonl(evals) if (evals := _rows_file(path, "evals")) else [],
    )


def render_tables(
    config: Mapping[str, Any], summary: Mapping[str, Mapping[str, Any]], simulated: bool
) -> str:
    kind = "SIMULATED (calibrated simulator; no accuracy)" if simulated else "MEASURED"
    paper = render_markdown(PAPER_COLUMNS, paper_table(config, summary, simulated))
    detail = render_markdown(DETAIL_COLUMNS, detail_table(summary))
    rollout = config.get("rollout", {})
    setup = (
        f"{config['steps']} steps, {rollout.get('rollout_batch_size')} groups x "
        f"{rollout.get('n_samples_per_prompt')} samples, "
        f"over-sampling {rollout.get('over_sampling_batch_size')}, "
        f"max response {rollout.get('max_response_len')} tokens, seed {config.get('seed')}"
    )
    label = kind.split()[0].lower()
    return f"## Results: {kind}\n\n{setup}\n\n{paper}\n\n### Where time and tokens go ({label})\n\n{detail}"
