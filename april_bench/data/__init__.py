"""Math data sets: loaders, prompt templates and statistics.

``import april_bench.data`` is light: pyarrow, datasets and transformers are imported only
inside the functions that need them.
"""

from april_bench.data.loaders import (
    DATASETS,
    DataError,
    DatasetSpec,
    MissingDependencyError,
    load,
    repair_latex,
)
from april_bench.data.records import LoadedDataset, LoadReport, MathProblem
from april_bench.data.stats import DatasetStats, answer_type, format_stats, prompt_lengths, stats
from april_bench.data.templates import TEMPLATES, Template, messages, render

__all__ = [
    "DATASETS",
    "TEMPLATES",
    "DataError",
    "DatasetSpec",
    "DatasetStats",
    "LoadReport",
    "LoadedDataset",
    "MathProblem",
    "MissingDependencyError",
    "Template",
    "answer_type",
    "format_stats",
    "load",
    "messages",
    "prompt_lengths",
    "render",
    "repair_latex",
    "stats",
]
