"""The synthetic task as a workload (real prompts, real grading, lengths chosen by the model), and its
``build``: the embedded task with its warm start."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from april_bench.config import ConfigError, config_from
from april_bench.tasks.base import Task, checkpoint_of, looks_like_path
from april_bench.tasks.synthetic import Problem, SyntheticTask
from april_bench.types import Prompt, Sample
from april_bench.workload import PromptStream

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = ["SyntheticWorkload", "build"]


class SyntheticWorkload:
    """Prompt ``uid`` is RL draw ``uid``; rewards come from grading the decoded answer."""

    def __init__(self, task: SyntheticTask) -> None:
        self.task = task
        self.name = "synthetic"

    def problem(self, prompt: Prompt) -> Problem:
        return Problem(int(prompt.metadata["n"]), int(prompt.metadata["k"]))

    def _prompt(self, uid: int) -> Prompt:
        problem = self.task.draw("rl", uid)
        ids = tuple(self.task.prompt_ids(problem))
        return Prompt(
            uid=uid,
            source_id=problem.prompt,
            length=len(ids),
            token_ids=ids,
            text=problem.prompt,
            answer=str(problem.answer),
            metadata={"n": problem.n, "k": problem.k},
        )

    def longest_prompt(self) -> int:
        """Tokens of the longest prompt of any split (``<bos>`` + ``n-k=``)."""
        task = self.task
        problems = [*task.sft_problems, *task.rl_problems, *task.heldout_problems]
        return max(len(task.prompt_ids(p)) for p in problems)

    def prompt_stream(self) -> PromptStream:
        return PromptStream(self._prompt)

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int | None:
        return None  # real generation: the model decides where a response ends

    def reward(self, sample: Sample) -> float:
        return self.task.grade(self.problem(sample.prompt), sample.response_ids())


def build(
    config: ExperimentConfig, model: str, *, produces_tokens: bool = True, progress: bool = False
) -> Task:
    """The embedded synthetic task of ``config`` for ``model``: a cached supervised warm start gives the
    engine and the trainer the same starting weights; rewards come from grading; held-out avg@k through
    the engine."""
    from april_bench.models.zoo import model_config
    from april_bench.tasks.synthetic import CharTokenizer, SyntheticTask, synthetic_evaluator
    from april_bench.tasks.warmstart import WarmStart

    if looks_like_path(model):
        raise ConfigError(
            "the synthetic task trains a named architecture (--model tiny) from its own warm start and "
            f"character tokenizer; for the checkpoint {model} choose a math --dataset "
            "(dapo-math-17k, deepscaler, deepmath-103k)"
        )
    task = config_from(
        SyntheticTask.Config, config.task_args, where="--task-arg", owner="the synthetic task"
    ).build()
    warm_options = {"model": model, "seed": config.seed, **config.warmstart_args}
    warm = config_from(WarmStart.Config, warm_options, where="--warmstart-arg").build(task=task)
    vocab = task.tokenizer.vocab_size
    model_config(model, vocab_size=vocab)  # an unknown architecture fails here
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
        return checkpoint_of(model, vocab, weights, key=f"warm-{warm.key}")

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
