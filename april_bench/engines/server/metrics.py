"""Read a server's Prometheus ``/metrics`` page (SGLang with ``--enable-metrics``, vLLM) into flat numbers."""

from __future__ import annotations

import math

__all__ = ["parse_prometheus"]


def parse_prometheus(text: str, prefix: str = "") -> dict[str, float]:
    """``name{labels} value`` lines -> ``{name: value}``, summed over label sets.

    Only metrics whose name starts with ``prefix`` are kept; histogram buckets
    and ``_created`` timestamps are dropped (their ``_sum`` and ``_count`` are
    kept); comments and NaN samples are skipped.
    """
    values: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ") if "{" not in line else _split_labels(line)
        name = name_part.strip()
        if not name.startswith(prefix) or name.endswith(("_bucket", "_created")):
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if math.isnan(value):
            continue
        values[name] = values.get(name, 0.0) + value
    return values


def _split_labels(line: str) -> tuple[str, str, str]:
    name, _, tail = line.partition("{")
    _labels, _, rest = tail.rpartition("}")
    return name, "", rest
