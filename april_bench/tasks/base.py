"""What every task gives the run (:class:`Task`), and the helpers the task builders share.

A task module (:mod:`.workload` for the synthetic task, :mod:`.math`, :mod:`.lengths`) has a
``build(config, model, *, produces_tokens, progress) -> Task`` (``model``: the run's resolved model, a
hub id's local snapshot); :data:`april_bench.tasks.TASKS` names them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError
from april_bench.evaluation import Evaluator
from april_bench.workload import Workload

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = [
    "Task",
    "check_data_claims",
    "check_loaded",
    "check_model",
    "check_options_used",
    "checkpoint_of",
    "looks_like_path",
    "random_checkpoint",
]


@dataclass(slots=True)
class Task:
    kind: str
    workload: Workload
    evaluator: Evaluator | None
    #: Tokens of the longest prompt (training or evaluation): with the response limit, the context.
    longest_prompt: int
    #: True when a real engine must replay the workload's lengths instead of sampling EOS.
    replay_lengths: bool = False
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    vocab_size: int | None = None
    #: The starting weights as a state dict (``None``: the model's own, seeded).
    initial_weights: Callable[[], Any] | None = None
    #: A checkpoint directory with the starting weights, for engines in another process.
    checkpoint: Callable[[], str] | None = None
    #: Lines for the user and the provenance (rows a data file lost, ...).
    notes: list[str] = field(default_factory=list)
    #: ``--length-oracle``: what the forced lengths and rewards are drawn from (``None``: the model's own).
    forced_lengths: dict[str, Any] | None = None


#: The options each kind of task reads; any other kind given them is a mistake worth an error.
_TASK_OPTIONS = {
    "synthetic": ("task_args", "warmstart_args"),
    "synthetic-agent": ("task_args", "warmstart_args"),
    "synthetic-agent-replayed": ("task_args",),
    "math": ("task_args",),
    "lengths": ("workload_args",),
}
_FLAG = {"task_args": "--task-arg", "warmstart_args": "--warmstart-arg", "workload_args": "--workload-arg"}


def check_model(model: str) -> str:
    """``--model``: a named architecture, or a checkpoint directory that exists (returned as given)."""
    if looks_like_path(model) and not Path(model).expanduser().is_dir():
        from april_bench.profiles.models import MODELS

        named = model.rsplit("/", 1)[-1].lower()
        hint = f" (here: --model {named})" if named in MODELS else ""
        raise ConfigError(
            f"--model {model}: no such checkpoint directory; a hub id or checkpoint needs a real engine "
            f"(--engine hf or vllm), the simulator takes a named architecture{hint}: "
            "`python -m april_bench ls models`"
        )
    return model


def check_options_used(config: ExperimentConfig, kind: str) -> None:
    """Options the chosen task never reads are a mistake: say which task reads them."""
    for name, flag in _FLAG.items():
        if getattr(config, name) and name not in _TASK_OPTIONS[kind]:
            readers = [k for k, used in _TASK_OPTIONS.items() if name in used]
            raise ConfigError(
                f"{flag} is not used by this run's {kind} task (it applies to the {' and '.join(readers)} "
                f"task{'s' if len(readers) > 1 else ''}); drop it"
            )
    used = {config.dataset, *config.eval_datasets}
    unused = sorted(set(config.data_paths) - used)
    if unused:
        raise ConfigError(
            f"--data-path {', '.join(unused)} is not used: the run trains on {config.dataset}"
            + (f" and evaluates on {', '.join(config.eval_datasets)}" if config.eval_datasets else "")
            + "; add it to --eval-datasets or drop it"
        )


def check_data_claims(
    config: ExperimentConfig, model: str, *, kind: str, simulated: bool, produces_tokens: bool
) -> None:
    """Refuse (one line naming the fix) a run whose task would not read the data sets it names.

    A data set name on a run is a claim: the table prints it beside the numbers.  A real engine can
    honour it only with a model that reads the data set's text (a checkpoint with its tokenizer, local
    or from the hub); a named architecture with random weights cannot, so such a run is refused rather
    than run on random prompt ids under the data set's name.  The simulator takes the data set's
    *length profile* and says so (its results are labelled simulated).  Evaluation sets are evaluated
    by the math task only; anywhere else they are refused.

    ``model`` is the run's resolved model, ``kind`` the task chosen (synthetic, math or lengths);
    ``simulated`` and ``produces_tokens`` describe the engine.
    """
    real_tokens = produces_tokens and not simulated
    if kind == "lengths" and real_tokens:
        raise ConfigError(
            f"--dataset {config.dataset} needs a model that can read it, and --model {model} is a "
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


def check_loaded(name: str, report: Any, *, min_share: float = 0.5, notes: list[str]) -> None:
    """Say what a data file lost (count and the first reasons); fail when too little is left."""
    if not report.skipped_total:
        return
    reasons = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items(), key=lambda kv: -kv[1])[:3])
    line = f"{report.source}: kept {report.kept} of {report.rows_read} rows; skipped {reasons}"
    notes.append(line)
    if report.kept == 0 or report.kept < min_share * report.rows_read:
        raise ConfigError(
            f"{line}: too few usable rows (under {min_share:.0%}); check the file is a {name} copy "
            "(`python -m april_bench data stats` shows its schema) or lower --task-arg min_kept_share"
        )


def looks_like_path(model: str) -> bool:
    """A model spec that names a local directory rather than an architecture."""
    return model.startswith((".", "/", "~")) or "/" in model or Path(model).is_dir()


def random_checkpoint(model: str, *, seed: int) -> str:
    return checkpoint_of(model, None, lambda: None, key=f"random-seed{seed}", seed=seed)


def checkpoint_of(
    model: str, vocab: int | None, weights: Callable[[], Any], *, key: str, seed: int = 0
) -> str:
    """A cached checkpoint directory of a named architecture with the given starting weights."""
    from april_bench.models.checkpoint import save_state_dict
    from april_bench.models.zoo import build_model
    from april_bench.tasks.warmstart import cache_dir, writable_cache

    path = cache_dir() / "checkpoints" / f"{model}-{key}"
    if not (path / "config.json").exists():
        writable_cache(path.parent)
        module = build_model(model, vocab_size=vocab, seed=seed)
        state = weights()
        if state is not None:
            module.load_state_dict(state)
        save_state_dict(module, path)
    return str(path)
