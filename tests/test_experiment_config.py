"""``ExperimentConfig`` from Python, flags or a file: one set of defaults, the engine's recipe rules for every
caller, a versioned config.json that older runs' files migrate from."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import flags

import april_bench
from april_bench.cli import build_parser, main
from april_bench.cli.args import config_from_args
from april_bench.config import ConfigError
from april_bench.experiment_config import CONFIG_VERSION, ExperimentConfig, load_config
from april_bench.recipes import paper, recipe_for
from april_bench.results.store import RunDirectory
from april_bench.rollout.loop import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]
#: Every committed run directory: each must still load, its config.json migrated if older.
COMMITTED_RUNS = sorted(
    p.parent for base in ("results/runs", "results/gates") for p in (ROOT / base).glob("*/config.json")
)
#: config.json fields that must differ between two runs of the same experiment: none (no path, no time:
#: those live in provenance.json).
MUST_DIFFER: frozenset[str] = frozenset()


def _cli(argv: list[str]) -> ExperimentConfig:
    config: ExperimentConfig = config_from_args(build_parser().parse_args(["run", *argv]))
    return config


def test_the_python_defaults_are_the_command_lines() -> None:
    assert ExperimentConfig() == _cli([]) == recipe_for("cpu")
    assert ExperimentConfig().hardware == "cpu"
    assert ExperimentConfig(hardware="mi300x") == _cli(["--hw", "mi300x"]) == paper("mi300x")
    assert ExperimentConfig(hardware="h100", algorithm="dapo", steps=7) == _cli(
        ["--hw", "h100", "--algo", "dapo", "--steps", "7"]
    )


def test_a_named_engines_recipe_rules_apply_to_every_caller() -> None:
    # vLLM's CPU attention cannot run `tiny`: the recipe's model becomes tiny32 unless a model is given
    assert ExperimentConfig(engine="vllm").model == _cli(["--engine", "vllm"]).model == "tiny32"
    assert ExperimentConfig(engine="vllm", model="tiny").model == "tiny"
    assert ExperimentConfig().replace(engine="vllm").model == "tiny32"
    assert ExperimentConfig().replace(engine="vllm", model="tiny").model == "tiny"
    # a simulated engine pairs with the simulated trainer: the recipe's real-trainer settings go ...
    assert ExperimentConfig().trainer_args == {"lr": 3e-4}
    assert ExperimentConfig(engine="sim").trainer_args == _cli(["--engine", "sim"]).trainer_args == {}
    # ... and settings a caller gives stay, checked as the config is built
    assert ExperimentConfig(engine="hf", trainer_args={"lr": 1}).trainer_args == {"lr": 1}
    with pytest.raises(ConfigError, match="unknown --trainer-arg x for the simulated trainer"):
        ExperimentConfig(engine="sim", trainer_args={"x": 1})
    with pytest.raises(ConfigError, match="unknown --trainer-arg x for the simulated trainer"):
        _cli(["--engine", "sim", "--trainer-arg", "x=1"])


def test_component_options_are_parsed_from_their_config_when_the_experiment_config_is_built(
    tmp_path: Path,
) -> None:
    assert ExperimentConfig(engine="sim", engine_args={"tp_size": "4"}).engine_args == {"tp_size": 4}
    assert ExperimentConfig(engine="hf", trainer_args={"lr": "0.5"}).trainer_args == {"lr": 0.5}
    with pytest.raises(ConfigError, match=r"--engine-arg tp_size='x': expected an integer"):
        ExperimentConfig(engine="sim", engine_args={"tp_size": "x"})
    with pytest.raises(ConfigError, match=r"unknown --engine-arg tp for the simulator; known: .*tp_size"):
        _cli(["--engine", "sim", "--engine-arg", "tp=2"])
    with pytest.raises(ConfigError, match="--engine-arg hardware is set by --hw"):
        ExperimentConfig(engine="sim", engine_args={"hardware": "h100"})
    with pytest.raises(ConfigError, match="unknown --trainer-arg lrr for the torch trainer"):
        ExperimentConfig(engine="hf", trainer="torch", trainer_args={"lrr": 1})
    path = tmp_path / "exp.toml"
    path.write_text('engine = "sim"\n[engine_args]\ntp_size = "two"\n')
    with pytest.raises(ConfigError, match="tp_size='two'"):
        _cli(["--config", str(path)])
    # the workload's and warm start's options too, against their Configs
    assert ExperimentConfig(workload_args={"solve_rate": "0.25"}).workload_args == {"solve_rate": 0.25}
    with pytest.raises(ConfigError, match=r"unknown --workload-arg solve; known: .*solve_rate"):
        ExperimentConfig(workload_args={"solve": 0.25})
    with pytest.raises(ConfigError, match="--warmstart-arg steps='many'"):
        ExperimentConfig(warmstart_args={"steps": "many"})
    # --engine auto is chosen where the run starts: its options are parsed then
    assert ExperimentConfig(engine_args={"anything": 1}).engine_args == {"anything": 1}


def test_a_config_file_gets_the_engines_rules(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text('engine = "vllm"\n')
    assert _cli(["--config", str(path)]).model == "tiny32"
    path.write_text('engine = "vllm"\nmodel = "tiny"\n')
    assert _cli(["--config", str(path)]).model == "tiny"


def test_replace_checks_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    import april_bench.experiment_config as module

    config = ExperimentConfig(strategies=("sync", "april[max_version_span=2]"))
    built: list[str] = []
    monkeypatch.setattr(module, "build_strategy", lambda arm, options: built.append(arm.label))
    config.replace(model="tiny32", steps=5, seed=3)
    assert built == []  # no arm rebuilt for a new model, length or seed
    config.replace(strategies=("sync", "april"))
    assert built == ["sync", "april"]
    with pytest.raises(ConfigError, match="--steps must be >= 1"):
        config.replace(steps=0)  # the cheap checks always run
    assert config.replace(steps=1).warmup_steps == 0  # the recipe's warm-up is for its own length
    assert ExperimentConfig(steps=1).warmup_steps == 0 == _cli(["--steps", "1"]).warmup_steps
    with pytest.raises(ConfigError, match="--warmup-steps"):
        config.replace(steps=1, warmup_steps=1)  # across fields: a given warm-up must fit the length
    with pytest.raises(TypeError, match="no field colour"):
        config.replace(colour="red")


def _sim_run(tmp_path: Path, name: str, *, python: ExperimentConfig | None, argv: list[str]) -> dict:
    out = tmp_path / name
    if python is not None:
        april_bench.run(python, out=out, progress=False)
    else:
        assert main(["run", *argv, "--out", str(out), "--no-progress"]) == 0
    config: dict = json.loads((out / "config.json").read_text())
    return config


@pytest.mark.parametrize("hardware", ["cpu", "h100"])
def test_python_and_the_command_line_write_the_same_config_json(tmp_path: Path, hardware: str) -> None:
    """The same experiment from Python and from flags: equal config.json files (apart from
    :data:`MUST_DIFFER`), with the CPU's defaults and the engine's rules on both sides."""
    rollout = {"rollout_batch_size": 4, "n_samples_per_prompt": 4, "over_sampling_batch_size": 8}
    argv = flags(hw=hardware, engine="sim", steps=2, warmup_steps=0, max_response_len=96, **rollout)
    base = ExperimentConfig(hardware=hardware)
    python = ExperimentConfig(
        hardware=hardware,
        engine="sim",
        steps=2,
        warmup_steps=0,
        rollout=base.rollout.replace(max_response_len=96, **rollout),
    )
    from_python = _sim_run(tmp_path, "python", python=python, argv=[])
    from_flags = _sim_run(tmp_path, "flags", python=None, argv=argv)
    assert from_python["config_version"] == CONFIG_VERSION
    assert from_python["trainer_args"] == {}  # the rule: a simulated engine drops the recipe's lr
    differing = {k for k in from_python.keys() | from_flags.keys() if from_python.get(k) != from_flags.get(k)}
    assert differing == MUST_DIFFER


def test_a_version_1_config_json_migrates_with_the_defaults_it_was_written_under() -> None:
    old = {"hardware": "cpu", "algorithm": "grpo", "dataset": "synthetic", "model": "tiny", "steps": 4}
    config = load_config(old)  # no config_version: version 1, whose defaults were the paper's
    assert config.strategies == ("sync", "oversample-discard", "april")
    assert config.rollout == RolloutConfig()
    assert (config.trainer_args, config.eval_every, config.block_steps) == ({}, None, None)
    assert (config.hardware, config.steps, config.warmup_steps) == ("cpu", 4, 0)
    assert load_config({**old, "max_version_span": 2}).strategy_args == {"april": {"max_version_span": 2}}
    assert load_config(config.to_dict()) == config  # version 2 reads back as written
    with pytest.raises(ConfigError, match=r"config_version 99 .*upgrade april-bench"):
        load_config({**config.to_dict(), "config_version": 99})


@pytest.mark.parametrize("run", COMMITTED_RUNS, ids=lambda p: p.name)
def test_every_committed_run_directory_still_loads(
    run: Path, committed_run: Callable[[Path], RunDirectory]
) -> None:
    stored = json.loads((run / "config.json").read_text())
    loaded = load_config(stored).to_dict()
    moved = ("max_version_span", "max_aborts_per_sample")  # version 1's April options: in strategy_args
    assert _within({k: v for k, v in stored.items() if k not in moved}, loaded)  # nothing said is lost
    assert committed_run(run).config == stored


def _within(stored: object, loaded: object) -> bool:
    """Whether every field of ``stored`` is in ``loaded`` with its value (``loaded`` may hold fields
    added since, at their defaults)."""
    if isinstance(stored, dict) and isinstance(loaded, dict):
        return all(k in loaded and _within(v, loaded[k]) for k, v in stored.items())
    return stored == loaded
