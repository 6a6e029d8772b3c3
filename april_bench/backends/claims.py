"""A run claims only the data it reads.

A data set name on a run is a claim: the table prints it beside the numbers.  A
real engine can honour it only with a model that reads the data set's text (a
checkpoint with its tokenizer, local or from the hub); a named architecture
with random weights cannot, so such a run is refused rather than run on random
prompt ids under the data set's name.  The simulator takes the data set's
*length profile* and says so (its results are labelled simulated).  Evaluation
sets are evaluated by the math task only; anywhere else they are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from april_bench.config import ConfigError

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["check_data_claims"]


def check_data_claims(config: ExperimentConfig, *, kind: str, simulated: bool, produces_tokens: bool) -> None:
    """Refuse (one line naming the fix) a run whose task would not read the data sets it names.

    ``kind`` is the task chosen (synthetic, math or lengths); ``simulated`` and ``produces_tokens``
    describe the engine.
    """
    real_tokens = produces_tokens and not simulated
    if kind == "lengths" and real_tokens:
        raise ConfigError(
            f"--dataset {config.dataset} needs a model that can read it, and --model {config.model} is a "
            "named architecture with random weights: pass --model a checkpoint directory or hub id (e.g. "
            f"Qwen/Qwen3-0.6B) with --data-path {config.dataset}=FILE (or the hub), or --engine sim for its "
            "simulated length profile, or --dataset synthetic for the embedded task"
        )
    if config.eval_datasets and kind != "math":
        where = "the simulator has no accuracy" if not real_tokens else f"the {kind} task evaluates its own"
        what = "held-out problems" if kind == "synthetic" else "nothing"
        raise ConfigError(
            f"--eval-datasets {','.join(config.eval_datasets)} is evaluated only by a math run (--model a "
            f"checkpoint and a math --dataset); {where} ({what}): drop --eval-datasets"
        )
