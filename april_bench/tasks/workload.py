"""The synthetic task as a workload: real prompts, real grading, lengths chosen by the model."""

from __future__ import annotations

from april_bench.tasks.synthetic import Problem, SyntheticTask
from april_bench.types import Prompt, Sample
from april_bench.workload import PromptStream

__all__ = ["SyntheticWorkload"]


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
