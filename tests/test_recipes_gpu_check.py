"""``--recipe gpu-check``: the preset one GPU lease runs, and the prediction committed for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from april_bench.cli import main
from april_bench.experiment_config import load_config
from april_bench.recipes import GPU_CHECK, RECIPES, recipe_for

ROOT = Path(__file__).resolve().parents[1]
PREDICTION = ROOT / "results" / "gpu" / "prediction-gpu-check" / "prediction.json"


def test_the_preset_measures_sync_against_april_in_blocks_with_forced_lengths_and_no_warm_start() -> None:
    config = recipe_for("h100", GPU_CHECK)
    assert GPU_CHECK in RECIPES
    assert (config.engine, config.trainer, config.model, config.dataset) == (
        "hf",
        "torch",
        "r1-distill-qwen-1.5b",
        "synthetic",
    )
    assert config.strategies == ("sync", "april") and config.num_gpus == 1
    assert (
        10 <= config.steps <= 12
        and config.block_steps is not None
        and config.steps // config.block_steps >= 4
    )
    assert config.length_oracle == "deepscaler" and config.warmstart_args["steps"] == 0
    assert config.checkpoint_every == 0  # a 15.7 GB trainer state only if the run is interrupted
    assert config.telemetry.backend == "auto"


def test_flags_apply_on_top_of_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--recipe", GPU_CHECK, "--hw", "cpu", "--model", "tiny", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "ok: hf engine, tiny on cpu" in out and "arms: sync, april; 4 steps" in out


def test_the_committed_prediction_is_for_the_preset_as_it_is() -> None:
    """Changing the preset without sealing a new prediction fails here: rerun the command in
    results/gpu/prediction-gpu-check/README.md."""
    sealed = json.loads(PREDICTION.read_text())
    assert load_config(sealed["preset"]) == recipe_for("h100", GPU_CHECK)  # sealed at config_version 1
    assert "SIMULATED" in sealed["what"] and sealed["git"]["dirty"] is False
    arms = sealed["summary"]["arms"]
    assert set(arms) == {"sync", "april"}
