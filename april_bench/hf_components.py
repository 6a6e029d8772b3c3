"""Components for the ``hf`` engine: the embedded default, or dummy-weight throughput runs.

* ``--dataset synthetic``: the synthetic task; a cached supervised warm start
  gives the engine and the trainer the same starting weights; rewards come
  from grading; held-out accuracy is evaluated through the engine.
* a math data set with ``--model`` a checkpoint directory: real prompts
  (loaded from ``--data-path`` or the hub, rendered through the checkpoint's
  chat template), rewards from the recipe's grader, avg@k accuracy on
  ``--eval-datasets`` (:mod:`april_bench.tasks.math`).
* a math data set with a named architecture: random ("dummy") weights of a
  real architecture, prompts of the data set's lengths with random ids, and
  the length model's responses replayed (EOS ignored until the drawn length) -
  the standard way to measure engine throughput without a checkpoint.  There
  is no accuracy to report.

Imports torch and transformers; only loaded when the ``hf`` engine is used.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError

if TYPE_CHECKING:
    from april_bench.experiment import Components, ExperimentConfig

__all__ = ["hf_components"]


def _build(cls: Any, where: str, **settings: Any) -> Any:
    """``cls.Config(**settings)``, with unknown keys reported as the user's mistake."""
    known = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"unknown {where} {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls.Config(**settings)


def _math_task(config: ExperimentConfig) -> tuple[Any, Any, int]:
    """A real checkpoint on a real data set: prompts through its chat template, the recipe's grader,
    avg@k on ``eval_datasets``.  Returns the workload, the evaluator (or None) and the longest prompt."""
    from transformers import AutoTokenizer

    from april_bench.data import DATASETS, load
    from april_bench.tasks.math import MathEvaluator, MathTaskSettings, MathWorkload, load_sets

    if config.dataset not in DATASETS:
        raise ConfigError(
            f"--model {config.model} is a checkpoint, so --dataset must be a math data set "
            f"({', '.join(DATASETS)}), got {config.dataset!r}"
        )
    settings = MathTaskSettings.from_args(config.task_args)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    problems = load(config.dataset, config.data_paths.get(config.dataset), limit=settings.limit).problems
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
        evaluator = MathEvaluator(
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
    return workload, evaluator, longest


def hf_components(config: ExperimentConfig, *, progress: bool = False) -> Components:
    from april_bench.engines.hf import HFEngine
    from april_bench.engines.hf.models import build_model, model_config
    from april_bench.experiment import Components
    from april_bench.tasks.math import stop_token_ids
    from april_bench.trainers.torch_trainer import TorchTrainer

    rollout = config.rollout
    context = rollout.max_response_len + 64
    if config.dataset == "synthetic" and Path(config.model).is_dir():
        raise ConfigError(
            "the synthetic task trains a named architecture (--model tiny) from its own warm start and "
            f"character tokenizer; for the checkpoint {config.model} choose a math --dataset "
            "(dapo-math-17k, deepscaler, deepmath-103k)"
        )
    if config.dataset == "synthetic":
        from april_bench.evaluation import TaskEvaluator
        from april_bench.tasks.synthetic import CharTokenizer, SyntheticTask
        from april_bench.tasks.warmstart import WarmStart
        from april_bench.tasks.workload import SyntheticWorkload

        task = _build(SyntheticTask, "--task-arg", **dict(config.task_args)).build()
        warm = _build(
            WarmStart, "--warmstart-arg", model=config.model, seed=config.seed, **dict(config.warmstart_args)
        )
        warm = warm.build(task=task)
        vocab = task.tokenizer.vocab_size
        workload: Any = SyntheticWorkload(task)
        evaluator: Any = TaskEvaluator(
            task,
            max_new_tokens=rollout.max_response_len,
            samples=4,
            temperature=rollout.temperature,
            seed=config.seed,
        )
        eos: tuple[int, ...] = (CharTokenizer.EOS,)
        pad = CharTokenizer.PAD
    elif Path(config.model).is_dir():
        workload, evaluator, longest = _math_task(config)
        tokenizer = workload.tokenizer
        warm, vocab = None, None
        eos = stop_token_ids(config.model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        context = longest + rollout.max_response_len + 1
    else:
        from april_bench.experiment import sim_workload

        warm, vocab, evaluator, eos, pad = None, None, None, (), 0
        workload = sim_workload(config, token_ids=True)
        context = rollout.max_response_len + 4096

    if not Path(config.model).is_dir():
        model_config(config.model, vocab_size=vocab)  # an unknown name fails here, before any training
    engine_settings: dict[str, Any] = {
        "model": config.model,
        "max_context_len": context,
        "eos_token_ids": eos,
        "seed": config.seed,
    }
    engine_settings.update(config.engine_args)
    engine_config = _build(HFEngine, "--engine-arg", **engine_settings)
    trainer_settings: dict[str, Any] = {
        "algorithm": config.algorithm,
        "off_policy": config.off_policy,
        "temperature": rollout.temperature,
        "max_response_len": rollout.max_response_len,
        "pad_token_id": pad,
    }
    trainer_settings.update(config.trainer_args)
    trainer_config = _build(TorchTrainer, "--trainer-arg", **trainer_settings)

    def weights() -> Any:  # trained (or read from the cache) on first use, not by `validate`
        return None if warm is None else warm.weights(progress=progress)

    def engine() -> Any:
        return engine_config.build(vocab_size=vocab, weights=weights())

    def trainer() -> Any:
        module = build_model(config.model, vocab_size=vocab, seed=config.seed)
        start = weights()
        if start is not None:
            module.load_state_dict(start)
        return trainer_config.build(module=module)

    return Components(engine=engine, trainer=trainer, workload=workload, evaluator=evaluator)
