"""Recipes: experiments are Python functions returning a complete :class:`ExperimentConfig`.

``python -m april_bench run`` starts from :func:`recipe_for` the chosen
hardware and applies the flags the user gave on top, so two arms of a
comparison differ only in ``strategies``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from april_bench.experiment_config import DEFAULT_HARDWARE, ExperimentConfig, paper_defaults
from april_bench.rollout.loop import RolloutConfig

if TYPE_CHECKING:
    from april_bench.sim.paper_settings import PaperSetting

__all__ = [
    "GPU_CHECK",
    "PAPER_RECIPES",
    "RECIPES",
    "embedded",
    "gpu_check",
    "paper",
    "paper_experiment",
    "paper_recipe",
    "recipe_for",
]

#: ``--recipe`` names: one per row of APRIL's published table (``april_bench/sim/paper_settings.py``).
PAPER_RECIPES = {
    "paper-dapo-math": "dapo-math",
    "paper-deepscaler": "deepscaler",
    "paper-deepmath": "deepmath",
}

#: ``--recipe gpu-check``: one GPU lease's measured sync-vs-APRIL run (:func:`gpu_check`).
GPU_CHECK = "gpu-check"
#: Every ``--recipe`` name.
RECIPES = (*PAPER_RECIPES, GPU_CHECK)


def embedded(**overrides: Any) -> ExperimentConfig:
    """The embedded default: a tiny Qwen3 learning the synthetic task on the CPU, sync vs APRIL.

    Sized to finish in about five minutes on two cores, warm start included
    (about a minute, cached for later runs).
    """
    return ExperimentConfig(**{"hardware": DEFAULT_HARDWARE, **overrides})  # the field defaults: this


def gpu_check(hardware: str = "h100", **overrides: Any) -> ExperimentConfig:
    """One GPU lease's measured run (``--recipe gpu-check``, ``benchmarks/gpu_recipe.sh``'s run stage):
    sync vs APRIL on one GPU, hf engine and torch trainer at the R1-Distill-Qwen-1.5B shape, sized to
    finish in about two minutes on an H100 so that a 15-minute lease measures a gain.

    - Forced paper-shaped lengths (``--length-oracle deepscaler``: DeepScaleR's profile scaled from its
      16,384-token limit to 192): the schedule is a function of the seed, so the warm start can be
      skipped (``steps=0``: random weights; what is measured is the rollout's schedule and cost, not
      learning) and the simulator predicts the same lengths (``results/gpu/prediction-gpu-check``).
    - 10 steps per arm in blocks of 2, ABBA (5 paired blocks; the first step of each arm is warm-up).
    - The trainer's state only at an interruption (``checkpoint_every=0``): a checkpoint at this shape
      is 15.7 GB (``benchmarks/checkpoint_cost.py``).
    - GPU telemetry on where the machine has NVML or AMD SMI (``auto``).
    """
    settings: dict[str, Any] = {
        "hardware": hardware,
        "algorithm": "grpo",
        "dataset": "synthetic",
        "model": "r1-distill-qwen-1.5b",
        "engine": "hf",
        "trainer": "torch",
        "num_gpus": 1,
        "strategies": ("sync", "april"),
        "steps": 10,
        "block_steps": 2,
        "warmup_steps": 1,
        "length_oracle": "deepscaler",
        "checkpoint_every": 0,
        "rollout": RolloutConfig(
            rollout_batch_size=16,
            n_samples_per_prompt=8,
            over_sampling_batch_size=32,
            max_response_len=192,  # the first lease's run: its measured cost curve prices the prediction
            temperature=1.0,
        ),
        "engine_args": {"device": "auto", "max_running_requests": 256, "prefill_chunk_tokens": 8192},
        # 4096 tokens a micro-batch: both arms' trainers and engines ran 10 steps with it on one 80 GB
        # H100 on the first lease (results/gpu/h100-2026-11-26/second-call-run.log)
        "trainer_args": {"device": "auto", "lr": 1e-5, "max_tokens_per_micro_batch": 4096},
        "warmstart_args": {"steps": 0},
    }
    settings.update(overrides)
    return ExperimentConfig(**settings)


def paper(hardware: str = "mi300x", **overrides: Any) -> ExperimentConfig:
    """APRIL's published setting as its scripts run it: Qwen3-4B on one 8-GPU node (4 engines at TP2,
    mem_fraction_static 0.6: the simulator's defaults), 32 groups x 8, over-sampling 64, 16,384 tokens,
    temperature 0.8 (``RolloutConfig``'s defaults), the sync arm as the scripted baseline (waves of
    rollout_batch_size, DAPO's filter when ``--algo dapo``), lengths from the (data set, model) profiles
    (``april_bench.sim.length_evidence``).  ``--algo``/``--dataset`` pick the paper's row (``--algo dapo``
    on the default data set is its DAPO-Math-17k row)."""
    return ExperimentConfig(**{**paper_defaults(), "hardware": hardware, **overrides})


def paper_experiment(setting: PaperSetting, hardware: str, **overrides: Any) -> ExperimentConfig:
    """A simulated run of one paper row on ``hardware``: exactly :func:`paper` with the row's algorithm
    and data set on the simulator (what ``run --hw HW --algo A --dataset D`` runs without a GPU)."""
    settings: dict[str, Any] = {"engine": "sim", "trainer": "sim"}
    settings.update(overrides)
    return paper(hardware, algorithm=setting.algorithm, dataset=setting.dataset, **settings)


def paper_recipe(name: str, hardware: str, **overrides: Any) -> ExperimentConfig:
    """One row of the paper table, simulated (``docs/calibration.md``): the same as ``run --hw HW --algo A
    --dataset D`` with the row's algorithm and data set; no per-row parameter of any kind."""
    from april_bench.config import ConfigError
    from april_bench.sim.paper_settings import paper_setting

    if name not in PAPER_RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose from {', '.join(PAPER_RECIPES)}")
    if hardware == "cpu":
        raise ConfigError(f"--recipe {name} simulates 8 GPUs: add --hw h100 or --hw mi300x")
    return paper_experiment(paper_setting(PAPER_RECIPES[name]), hardware, **overrides)


def default_hardware(recipe: str | None) -> str:
    """The hardware a recipe runs on when ``--hw`` is not given: the CPU's embedded default, the paper's
    MI300X node for a paper row, one H100 for ``gpu-check``."""
    if recipe is None:
        return DEFAULT_HARDWARE
    return "h100" if recipe == GPU_CHECK else "mi300x"


def recipe_for(hardware: str | None, recipe: str | None = None, **overrides: Any) -> ExperimentConfig:
    """The recipe ``recipe`` (``None``: the embedded default on the CPU, APRIL's paper setting on a GPU)
    on ``hardware`` (``None``: the recipe's own, :func:`default_hardware`), ``overrides`` on top."""
    if hardware is None:
        hardware = default_hardware(recipe)
    if recipe == GPU_CHECK:
        return gpu_check(hardware, **overrides)
    if recipe is not None:
        return paper_recipe(recipe, hardware, **overrides)
    return embedded(**overrides) if hardware == "cpu" else paper(hardware, **overrides)
