"""Components for the ``hf`` engine: the embedded default, or dummy-weight throughput runs.

* ``--dataset synthetic``: the synthetic task; a cached supervised warm start
  gives the engine and the trainer the same starting weights; rewards come
  from grading; held-out accuracy is evaluated through the engine.
* a simulated data set (``dapo-math-17k`` ...): random ("dummy") weights of a
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


def hf_components(config: ExperimentConfig, *, progress: bool = False) -> Components:
    from april_bench.engines.hf import HFEngine
    from april_bench.engines.hf.models import build_model, model_config
    from april_bench.experiment import Components
    from april_bench.trainers.torch_trainer import TorchTrainer

    rollout = config.rollout
    context = rollout.max_response_len + 64
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
    else:
        from april_bench.sim.workload import SimWorkload

        warm, vocab, evaluator, eos, pad = None, None, None, (), 0
        workload = SimWorkload.Config(
            dataset=config.dataset, model=config.model, seed=config.seed, **dict(config.workload_args)
        ).build(n_samples_per_prompt=rollout.n_samples_per_prompt, token_ids=True)
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
