"""``--config FILE``: an experiment configuration from a TOML or YAML file, and the file a run writes.

A file holds the fields of :class:`~april_bench.experiment_config.ExperimentConfig` (the keys of a
run's ``config.json``), all or some: the fields it leaves out come from the recipe of its
``hardware`` (the embedded CPU recipe, or APRIL's paper setting on a GPU), exactly as unset flags
do, and ``rollout`` / ``telemetry`` tables are merged field by field.  Values go through the same
typed checks as flags (:func:`~april_bench.config.config_from`), so a wrong name or type is one
line naming the file, the field and what it expects.  Flags given beside ``--config`` apply on top.

Every run writes ``config.yaml`` (YAML: it can say ``null``, which TOML cannot), and
``run --config RUN/config.yaml`` repeats the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError, config_from

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["config_from_file", "read_config_file", "write_config_file"]

_NESTED = ("rollout", "telemetry")
_SUFFIXES = (".toml", ".yaml", ".yml", ".json")


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in ``path`` (TOML, YAML or JSON by suffix); a bad file is one ``ConfigError`` line."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise ConfigError(f"--config {path}: expected a .toml, .yaml or .json file")
    from april_bench.bounded import MAX_CONFIG_BYTES, check_values, json_loads, read_bytes, yaml_load

    where = f"--config {path}"
    try:
        text = read_bytes(path, MAX_CONFIG_BYTES, "config file").decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {exc.start})") from None
    data: Any
    if suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--config {path}: not valid TOML ({exc})") from None
        except RecursionError:
            raise ConfigError(f"--config {path}: nested too deeply") from None
    elif suffix == ".json":
        data = json_loads(text, where)
    else:
        import yaml

        try:
            data = yaml_load(text, where)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(
                f"--config {path}: not valid YAML{line} ({getattr(exc, 'problem', exc)})"
            ) from None
    check_values(data, where, string_keys=True)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"--config {path}: expected a table of fields (steps = 20, ...), got {type(data).__name__}"
        )
    return dict(data)


def config_from_file(
    path: Path, *, hardware: str | None = None, recipe: str | None = None
) -> ExperimentConfig:
    """The configuration in ``path`` over the recipe of its hardware (``hardware``: the --hw flag, used
    when the file names none; a different one is a conflict)."""
    from april_bench.experiment_config import CONFIG_VERSION, ExperimentConfig, engine_rules
    from april_bench.recipes import recipe_for

    data = read_config_file(path)
    version = data.pop("config_version", CONFIG_VERSION)  # a run's config.yaml names its version
    if version != CONFIG_VERSION:
        raise ConfigError(
            f"{path}: config_version {version!r} is not {CONFIG_VERSION}; drop the field to read the file "
            "as this april-bench's configuration"
        )
    named = data.get("hardware")
    if named is not None and hardware is not None and named != hardware:
        raise ConfigError(f"--hw {hardware} and --config {path} (hardware = {named!r}) disagree; drop one")
    given = named or hardware  # neither: the recipe's own hardware
    base = recipe_for(str(given) if given else None, recipe).to_dict()
    del base["config_version"]  # the file's fields over the recipe's; the version is checked above
    merged = dict(base)
    for key, value in data.items():
        if key in _NESTED and isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    if data.get("engine", base["engine"]) != base["engine"]:  # the file's engine: its recipe rules
        merged.update(engine_rules(str(merged["engine"]), str(merged["model"]), given=data))
    if isinstance(merged.get("telemetry"), Mapping):
        from april_bench.telemetry.sampler import TelemetryConfig

        merged["telemetry"] = config_from(
            TelemetryConfig, merged["telemetry"], where=f"{path} telemetry field"
        )
    if isinstance(merged.get("rollout"), Mapping):
        from april_bench.rollout.loop import RolloutConfig

        merged["rollout"] = config_from(RolloutConfig, merged["rollout"], where=f"{path} rollout field")
    return config_from(ExperimentConfig, merged, where=f"{path} field")


def write_config_file(path: Path, config: ExperimentConfig) -> None:
    """``config`` as YAML that ``run --config`` reads back to the same configuration."""
    import yaml

    header = (
        "# april-bench run configuration: `python -m april_bench run --config THIS_FILE` repeats the run.\n"
        "# Fields: docs/results-schema.md and `run --help`; any field left out comes from the recipe.\n"
    )
    from april_bench.redact import redact
    from april_bench.results.store import write_text_atomic

    body = yaml.safe_dump(redact(config.to_dict()), sort_keys=False, default_flow_style=False)
    # atomic, through a uniquely named temporary file: a reader sees the old file or the whole new one
    write_text_atomic(path, header + body)
