"""Task assembly: the workload, evaluator, tokenizer facts and starting weights of an experiment.

Three kinds of task, chosen by the data set, the model and whether the engine
produces tokens:

* ``synthetic`` (``--dataset synthetic`` on a token engine): the embedded task;
  a cached supervised warm start gives the engine and the trainer the same
  starting weights; rewards come from grading; held-out avg@k through the engine.
* ``math`` (a math data set and ``--model`` a checkpoint directory): real
  prompts through the checkpoint's chat template, the recipe's grader, avg@k
  on ``--eval-datasets``.
* ``lengths`` (the simulator, or a named architecture on a real engine): the
  data set's length profile; on a real engine the prompts get random ids and
  the drawn response lengths are replayed (EOS ignored until then) - the
  standard way to measure engine throughput without a checkpoint.  No accuracy.

Everything here is decided once per experiment and shared by every arm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError, config_from
from april_bench.data.claims import check_data_claims
from april_bench.evaluation import Evaluator
from april_bench.workload import Workload

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["Task", "build_task", "check_loaded", "looks_like_path", "sim_workload"]


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


#: The options each kind of task reads; any other kind given them is a mistake worth an error.
_TASK_OPTIONS = {
    "synthetic": ("task_args", "warmstart_args"),
    "math": ("task_args",),
    "lengths": ("workload_args",),
}
_FLAG = {"task_args": "--task-arg", "warmstart_args": "--warmstart-arg", "workload_args": "--workload-arg"}


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


def build_task(
    config: ExperimentConfig, *, produces_tokens: bool, simulated: bool = False, progress: bool = False
) -> Task:
    """The task of ``config`` on an engine that produces tokens (or lengths only), from a model or not
    (``simulated``: a fake engine's tokens are not a model's, so they replay lengths)."""
    model = config.model
    if looks_like_path(model) and not Path(model).expanduser().is_dir():
        raise ConfigError(
            f"--model {model}: no such checkpoint directory (a named architecture is one of "
            "`python -m april_bench ls models`)"
        )
    if config.dataset == "synthetic" and produces_tokens and not simulated:
        task = _synthetic_task(config, progress=progress)
    elif produces_tokens and not simulated and Path(model).expanduser().is_dir():
        task = _math_task(config)
    else:
        check_data_claims(config, kind="lengths", simulated=simulated, produces_tokens=produces_tokens)
        task = _lengths_task(config, produces_tokens=produces_tokens)
    check_data_claims(config, kind=task.kind, simulated=simulated, produces_tokens=produces_tokens)
    _check_options_used(config, task.kind)
    return task


def _check_options_used(config: ExperimentConfig, kind: str) -> None:
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


def sim_workload(config: ExperimentConfig, *, token_ids: bool = False) -> Any:
    """The simulated workload of ``config``: the data set's length profile, with prompt lengths measured
    from its ``--data-path`` file when one is given (``token_ids``: random prompt ids for a real engine)."""
    from april_bench.sim.workload import SimWorkload

    args = dict(config.workload_args)
    if config.dataset in config.data_paths:
        args.setdefault("data_path", config.data_paths[config.dataset])
    options = {"dataset": config.dataset, "model": config.model, "seed": config.seed, **args}
    settings = config_from(SimWorkload.Config, options, where="--workload-arg")
    return settings.build(n_samples_per_prompt=config.rollout.n_samples_per_prompt, token_ids=token_ids)


def _lengths_task(config: ExperimentConfig, *, produces_tokens: bool) -> Task:
    if produces_tokens:
        from april_bench.engines.hf.models import model_config

        model_config(config.model)  # an unknown architecture fails here, before anything runs
    workload = sim_workload(config, token_ids=produces_tokens)
    notes: list[str] = []
    if workload.load_report is not None:
        check_loaded(config.dataset, workload.load_report, notes=notes)
    if config.dynamic_sampling_on and not workload.has_rewards:
        raise ConfigError("dynamic sampling needs rewards: add a 'reward' column to the length trace")
    checkpoint = None
    if produces_tokens:

        def checkpoint() -> str:
            return _random_checkpoint(config.model, seed=config.seed)

    return Task(
        kind="lengths",
        workload=workload,
        evaluator=None,
        longest_prompt=workload.longest_prompt(),
        replay_lengths=produces_tokens,
        checkpoint=checkpoint,
        notes=notes,
    )


def _synthetic_task(config: ExperimentConfig, *, progress: bool) -> Task:
    from april_bench.engines.hf.models import model_config
    from april_bench.tasks.synthetic import CharTokenizer, SyntheticTask, synthetic_evaluator
    from april_bench.tasks.warmstart import WarmStart
    from april_bench.tasks.workload import SyntheticWorkload

    if looks_like_path(config.model):
        raise ConfigError(
            "the synthetic task trains a named architecture (--model tiny) from its own warm start and "
            f"character tokenizer; for the checkpoint {config.model} choose a math --dataset "
            "(dapo-math-17k, deepscaler, deepmath-103k)"
        )
    task = config_from(
        SyntheticTask.Config, config.task_args, where="--task-arg", owner="the synthetic task"
    ).build()
    warm_options = {"model": config.model, "seed": config.seed, **config.warmstart_args}
    warm = config_from(WarmStart.Config, warm_options, where="--warmstart-arg").build(task=task)
    vocab = task.tokenizer.vocab_size
    model_config(config.model, vocab_size=vocab)  # an unknown architecture fails here
    workload = SyntheticWorkload(task)
    rollout = config.rollout
    evaluator = synthetic_evaluator(
        task,
        max_new_tokens=rollout.max_response_len,
        samples=4,
        temperature=rollout.temperature,
        seed=config.seed,
    )

    def weights() -> Any:  # trained (or read from the cache) on first use, not by `validate`
        return warm.weights(progress=progress)

    def checkpoint() -> str:
        return _checkpoint_of(config.model, vocab, weights, key=f"warm-{warm.key}")

    return Task(
        kind="synthetic",
        workload=workload,
        evaluator=evaluator,
        longest_prompt=max(workload.longest_prompt(), evaluator.longest_prompt()),
        eos_token_ids=(CharTokenizer.EOS,),
        pad_token_id=CharTokenizer.PAD,
        vocab_size=vocab,
        initial_weights=weights,
        checkpoint=checkpoint,
    )


def _math_task(config: ExperimentConfig) -> Task:
    """A real checkpoint on a real data set: prompts through its chat template, the recipe's grader,
    avg@k on ``eval_datasets``."""
    from transformers import AutoTokenizer

    from april_bench.data import DATASETS, load
    from april_bench.tasks.math import (
        MathTaskSettings,
        MathWorkload,
        load_sets,
        math_evaluator,
        stop_token_ids,
    )

    if config.dataset not in DATASETS:
        raise ConfigError(
            f"--model {config.model} is a checkpoint, so --dataset must be a math data set "
            f"({', '.join(DATASETS)}), got {config.dataset!r}"
        )
    settings = MathTaskSettings.from_args(config.task_args)
    model = str(Path(config.model).expanduser())
    tokenizer = AutoTokenizer.from_pretrained(model)
    loaded = load(config.dataset, config.data_paths.get(config.dataset), limit=settings.limit)
    notes: list[str] = []
    check_loaded(config.dataset, loaded.report, min_share=settings.min_kept_share, notes=notes)
    problems = loaded.problems
    workload = MathWorkload(
        problems,
        tokenizer,
        dataset=config.dataset,
        template=settings.template,
        grader=settings.grader,
        seed=config.seed,
    )
    longest = workload.longest_prompt()
    evaluator = None
    if config.eval_datasets:
        rollout = config.rollout
        evaluator = math_evaluator(
            load_sets(config.eval_datasets, config.data_paths),
            tokenizer,
            max_new_tokens=rollout.max_response_len,
            samples=settings.eval_samples,
            temperature=rollout.temperature
            if settings.eval_temperature is None
            else settings.eval_temperature,
            top_p=settings.eval_top_p,
            template=settings.eval_template,
            grader=settings.eval_grader,
            seed=config.seed,
            limit=settings.eval_limit,
        )
        longest = max(longest, evaluator.longest_prompt())
    eos = stop_token_ids(model, tokenizer)
    return Task(
        kind="math",
        workload=workload,
        evaluator=evaluator,
        longest_prompt=longest,
        eos_token_ids=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0],
        checkpoint=lambda: model,
        notes=notes,
    )


def _random_checkpoint(model: str, *, seed: int) -> str:
    return _checkpoint_of(model, None, lambda: None, key=f"random-seed{seed}", seed=seed)


def _checkpoint_of(
    model: str, vocab: int | None, weights: Callable[[], Any], *, key: str, seed: int = 0
) -> str:
    """A cached checkpoint directory of a named architecture with the given starting weights."""
    from april_bench.engines.hf.checkpoint import save_state_dict
    from april_bench.engines.hf.models import build_model
    from april_bench.tasks.warmstart import cache_dir

    path = cache_dir() / "checkpoints" / f"{model}-{key}"
    if not (path / "config.json").exists():
        module = build_model(model, vocab_size=vocab, seed=seed)
        state = weights()
        if state is not None:
            module.load_state_dict(state)
        save_state_dict(module, path)
    return str(path)
