"""The version of a run directory's files, and the field names older versions used.

Every JSON file april-bench writes for a run (``summary.json``, ``provenance.json``, ``eval.json``,
``ablation.json``) carries ``schema_version``; the row files (``*.jsonl``) follow the version in
their run's ``provenance.json``.  Fields are documented in one place, ``docs/results-schema.md``.

Policy: a renamed field is written under both names for one version (the old one listed in
:data:`RENAMED`) and read under either name; the version after that drops the old name.  A file
without ``schema_version`` is version 1.

* 1: no ``schema_version``; summary gains named ``*_vs_sync`` (until 2026-09).
* 2: ``schema_version`` added; gains named ``throughput_gain``, ``useful_gain`` ... (against the run's
  baseline arm, which is sync when there is one); the ``*_vs_sync`` names still written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "RENAMED",
    "SCHEMA_VERSION",
    "read_arm_metrics",
    "read_summary",
    "schema_version_of",
    "with_old_names",
]

SCHEMA_VERSION = 2

#: Old per-arm summary field -> its current name (old names written too until version 3).
RENAMED: Mapping[str, str] = {
    "throughput_gain_vs_sync": "throughput_gain",
    "useful_gain_vs_sync": "useful_gain",
    "end_to_end_gain_vs_sync": "end_to_end_gain",
    "accuracy_improvement_vs_sync": "accuracy_improvement",
    "accuracy_improvement_equal_time_vs_sync": "accuracy_improvement_equal_time",
}


def schema_version_of(document: Mapping[str, Any]) -> int:
    """The version a JSON document was written under (1 when it does not say)."""
    version = document.get("schema_version", 1)
    return int(version) if isinstance(version, (int, float, str)) and str(version).isdigit() else 1


def with_old_names(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """One arm's metrics with every renamed field also under its old name (for readers of version 1)."""
    out = dict(metrics)
    for old, new in RENAMED.items():
        if new in out:
            out.setdefault(old, out[new])
    return out


def read_arm_metrics(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-arm metrics of a ``summary.json`` of any supported version, under current names."""
    arms = summary.get("arms", {})
    out: dict[str, dict[str, Any]] = {}
    for arm, metrics in arms.items():
        current = dict(metrics)
        for old, new in RENAMED.items():
            if old in current:
                value = current.pop(old)
                current.setdefault(new, value)
        out[arm] = current
    return out


def read_summary(path: Path) -> dict[str, Any]:
    """A run's ``summary.json`` of any supported version, per-arm fields under their current names
    (``{"schema_version", "result_kind", "metadata", "arms"}``).  For scripts that read results."""
    import json

    from april_bench.config import ConfigError

    try:
        document = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    version = schema_version_of(document)
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"{path}: schema version {version} is newer than this april-bench reads ({SCHEMA_VERSION}); "
            "upgrade april-bench"
        )
    return {
        "schema_version": version,
        "result_kind": document.get("result_kind"),
        "metadata": dict(document.get("metadata", {})),
        "arms": read_arm_metrics(document),
    }
