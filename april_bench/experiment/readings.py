"""Both readings of a paper row whose algorithm its sources leave uncertain, in one simulated run.

APRIL's README names DAPO for its DAPO-Math-17k row, but the same README runs
"Qwen3-4B with DAPO" with a GRPO script on the DAPO-Math data
(:data:`april_bench.sim.paper_settings.DAPO_ROW_READINGS`).  So ``run --hw
mi300x --algo dapo`` simulates the row as asked (the run directory's arms) and
also under every other reading of the row (:attr:`PaperSetting.other_readings`),
in memory, with the same everything else; ``readings.json`` beside the run's
rows holds every reading's gains, and the printed table and ``table.md`` show
them beside the paper's figure.  The run's own rows, summary and gate are those
of the algorithm asked for: a reading adds a file, never a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["other_readings", "write_readings"]


def other_readings(config: ExperimentConfig) -> list[ExperimentConfig]:
    """The row's other readings as runs (empty when the run is no paper row with an uncertain
    algorithm, or sets dynamic sampling itself, which would make a reading something else)."""
    from april_bench.sim.paper_settings import paper_reference

    if config.dynamic_sampling is not None:
        return []
    setting = paper_reference(config.to_dict())
    if setting is None:
        return []
    return [config.replace(algorithm=algorithm) for algorithm in setting.other_readings]


def write_readings(
    out: Path, config: ExperimentConfig, summary: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """Simulate the row's other readings of ``config`` (a completed simulated run with ``summary``) and
    write ``readings.json`` into ``out``; the record, or ``None`` when the row has no other reading."""
    from april_bench.experiment import run
    from april_bench.results.readings import READINGS_FILE, readings_record
    from april_bench.results.store import write_json_atomic

    others = []
    for other in other_readings(config):
        others.append((other.to_dict(), run(other, progress=False).recorder.summary()))
    record = readings_record(config.to_dict(), summary, others)
    if record is not None:
        write_json_atomic(out / READINGS_FILE, record)
    return record
