"""``--help`` names every flag's default.

Most ``run`` flags default to *unset*, which means "the recipe's value": the
embedded CPU recipe (``--hw cpu``) or APRIL's paper setting (a GPU ``--hw``).
:func:`name_defaults` appends those values to each flag's help, read from the
recipes themselves, so the help cannot drift from what a run does.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["name_defaults", "recipe_defaults"]

#: Flag dest -> how to read its value from an ExperimentConfig.
_READ: Mapping[str, Callable[[Any], Any]] = {
    "algo": lambda c: c.algorithm,
    "dataset": lambda c: c.dataset,
    "model": lambda c: c.model,
    "engine": lambda c: c.engine,
    "trainer": lambda c: c.trainer,
    "strategies": lambda c: ",".join(c.strategies),
    "baseline": lambda c: c.baseline or "sync, else the first arm",
    "steps": lambda c: c.steps,
    "seed": lambda c: c.seed,
    "rollout_batch_size": lambda c: c.rollout.rollout_batch_size,
    "n_samples_per_prompt": lambda c: c.rollout.n_samples_per_prompt,
    "over_sampling_batch_size": lambda c: c.rollout.over_sampling_batch_size,
    "max_response_len": lambda c: c.rollout.max_response_len,
    "refill": lambda c: getattr(c.rollout.refill, "value", c.rollout.refill),
    "dynamic_sampling": lambda c: "on" if c.dynamic_sampling_on else "off (on with --algo dapo)",
    "off_policy": lambda c: c.off_policy,
    "eval_every": lambda c: c.eval_every or "no evaluation",
    "num_gpus": lambda c: c.num_gpus or "one node of the hardware",
    "telemetry": lambda c: c.telemetry.backend,
    "telemetry_rate": lambda c: c.telemetry.rate_hz,
    "telemetry_devices": lambda c: ",".join(map(str, c.telemetry.devices or ())) or "every visible GPU",
    "repeats": lambda c: c.repeats,
    "block_steps": lambda c: c.block_steps or "all steps in one block",
    "warmup_steps": lambda c: c.warmup_steps,
    "eval_datasets": lambda c: ",".join(c.eval_datasets) or "none",
    "checkpoint_every": lambda c: c.checkpoint_every,
}
#: Flags whose unset value is a rule, not a recipe field.
_RULES = {
    "recipe": "none (the --hw recipe)",
    "engine_url": "launch the engine",
    "max_version_span": "unlimited (a resumed sample's tokens may span any number of versions)",
    "max_aborts_per_sample": "unlimited (a sample is resumed however often it was aborted)",
    "resume": "a new run",
    "config": "none",
}


def recipe_defaults() -> dict[str, str]:
    """Each recipe-backed flag's default, as ``X`` or ``X on cpu, Y on a GPU --hw``."""
    from april_bench.recipes import recipe_for

    cpu, gpu = recipe_for("cpu"), recipe_for("h100")
    texts = {}
    for dest, read in _READ.items():
        a, b = read(cpu), read(gpu)
        texts[dest] = str(a) if a == b else f"{a} on cpu, {b} on a GPU --hw"
    return texts


def name_defaults(parser: argparse.ArgumentParser, recipe: Mapping[str, str] | None = None) -> None:
    """Append ``(default: ...)`` to every optional flag's help that does not name its default yet."""
    recipe = recipe_defaults() if recipe is None else recipe
    for action in parser._actions:  # argparse keeps no public list of a parser's actions
        if isinstance(action, argparse._SubParsersAction):  # `data stats`, `data ...`: their flags too
            for sub in action.choices.values():
                name_defaults(sub, recipe)
            continue
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        if action.default == argparse.SUPPRESS:  # --help, --version
            continue
        help_text = str(action.help)
        if "default" in help_text.lower():
            continue
        if action.dest in recipe:
            default = recipe[action.dest]
        elif action.dest in _RULES:
            default = _RULES[action.dest]
        elif isinstance(action, argparse._StoreTrueAction):
            default = "off"
        elif action.default == []:
            default = "none"
        elif action.default is not None:
            default = str(action.default)
        else:
            default = "none"
        action.help = f"{help_text} (default: {default.replace('%', '%%')})"
