"""Math RL and evaluation on real data sets, for any engine that generates tokens.

:class:`MathWorkload` turns a loaded data set into prompts - rendered with the
recipe's template through the model tokenizer's chat template - and rewards
responses with the data set's grader.  :func:`math_evaluator` computes avg@k
accuracy on evaluation sets (AIME 2024/2025, MATH-500, ...), one engine pass
for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from april_bench.config import BaseConfig, ConfigError, param
from april_bench.data import MathProblem, render
from april_bench.evaluation import AvgAtK, EvalItem, EvalResult
from april_bench.graders import correct_value, score, style_for
from april_bench.tasks.base import Task, check_loaded
from april_bench.types import Prompt, Sample
from april_bench.workload import EpochOrder, PromptStream

if TYPE_CHECKING:
    from april_bench.experiment_config import ExperimentConfig

__all__ = [
    "MathTaskSettings",
    "MathWorkload",
    "build",
    "evaluate_checkpoint",
    "load_sets",
    "math_evaluator",
    "stop_token_ids",
]


@dataclass(kw_only=True, slots=True, frozen=True)
class MathTaskSettings(BaseConfig):
    """A math run's task settings (``--task-arg NAME=VALUE``); unset means the data set's recipe."""

    grader: str | None = param(
        None, help="training grader: dapo, deepscaler or math-verify (default: recipe)"
    )
    template: str | None = param(None, help="training prompt template (default: the recipe's)")
    limit: int | None = param(None, help="train on the first N problems only")
    min_kept_share: float = param(
        0.5, help="fail when a data file loses more of its rows than this lets through"
    )
    eval_grader: str | None = param(None, help="grader of every evaluation set (default: math-verify)")
    eval_template: str | None = param(None, help="evaluation prompt template (default: boxed)")
    eval_samples: int = param(4, help="k of avg@k (APRIL reports avg@16 on AIME 2024)")
    eval_limit: int | None = param(None, help="first N problems of each evaluation set")
    eval_temperature: float | None = param(None, help="evaluation temperature (default: the rollout's)")
    eval_top_p: float = param(1.0, help="evaluation nucleus threshold (DAPO's evaluation: 0.7)")

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> MathTaskSettings:
        unknown = sorted(set(args) - set(cls.field_help()))
        if unknown:
            known = ", ".join(cls.field_help())
            raise ConfigError(f"unknown --task-arg {', '.join(unknown)} for a math run; known: {known}")
        return cls(**dict(args))


def stop_token_ids(model: str, tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a response: the checkpoint's generation config (chat models list their
    end-of-turn token there, e.g. Qwen's ``<|im_end|>``), else the tokenizer's EOS; neither is an error."""
    ids: list[int] = []
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(model).eos_token_id
        ids.extend([eos] if isinstance(eos, int) else list(eos or ()))
    except OSError:  # no generation_config.json: fine, the tokenizer knows its EOS
        pass
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ConfigError(f"{model}: neither its generation config nor its tokenizer names an EOS token")
    return tuple(ids)


def _encode(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


class MathWorkload:
    """Prompt ``uid`` is problem ``uid`` of a seeded shuffle (reshuffled every epoch)."""

    def __init__(
        self,
        problems: Sequence[MathProblem],
        tokenizer: Any,
        *,
        dataset: str,
        template: str | None = None,
        grader: str | None = None,
        seed: int = 0,
    ) -> None:
        if not problems:
            raise ValueError(f"data set {dataset!r} has no problems to train on")
        self.name = f"math:{dataset}"
        self.problems = list(problems)
        self.tokenizer = tokenizer
        self.template = template
        self.style = style_for(dataset, grader)
        self._order = EpochOrder(len(self.problems), seed)
        self._rendered: dict[int, tuple[str, tuple[int, ...]]] = {}

    def _prompt(self, uid: int) -> Prompt:
        index = self._order.index(uid)
        problem = self.problems[index]
        cached = self._rendered.get(index)
        if cached is None:
            text = render(problem, self.tokenizer, self.template)
            cached = self._rendered[index] = (text, _encode(self.tokenizer, text))
        text, ids = cached
        return Prompt(
            uid=uid,
            source_id=problem.source_id,
            length=len(ids),
            token_ids=ids,
            text=text,
            answer=problem.answer,
            metadata={"dataset": problem.dataset, "index": index},
        )

    def prompt_stream(self) -> PromptStream:
        return PromptStream(self._prompt)

    def longest_prompt(self) -> int:
        """Tokens of the longest rendered prompt (sizes the engine's context)."""
        return max(self._prompt(i).length for i in range(len(self.problems)))

    def replay_len(self, prompt: Prompt, sample_index: int, start_step: int) -> int | None:
        return None

    def reward(self, sample: Sample) -> float:
        response = self.tokenizer.decode(sample.response_ids(), skip_special_tokens=True)
        return score(self.style, response, sample.prompt.answer or "")


def math_evaluator(
    sets: Mapping[str, Sequence[MathProblem]],
    tokenizer: Any,
    *,
    max_new_tokens: int,
    samples: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    template: str | None = None,
    grader: str | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> AvgAtK:
    """avg@k on one or more evaluation sets (APRIL reports avg@16 on AIME 2024), each graded with its
    recipe's grader (or ``grader`` for all), prompts rendered with ``template`` (default: boxed)."""
    if not sets:
        raise ValueError("evaluation needs at least one data set")
    styles = {name: style_for(name, grader) for name in sets}
    items = [
        EvalItem(
            name, problem.source_id, _encode(tokenizer, render(problem, tokenizer, template)), problem.answer
        )
        for name, problems in sets.items()
        for problem in (list(problems)[:limit] if limit else list(problems))
    ]

    def grade(item: EvalItem, output_ids: Sequence[int]) -> tuple[float, bool]:
        text = tokenizer.decode(list(output_ids), skip_special_tokens=True)
        value = score(styles[item.dataset], text, item.reference)
        return value, value >= correct_value(styles[item.dataset])

    return AvgAtK(
        items,
        grade,
        max_new_tokens=max_new_tokens,
        samples=samples,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )


def load_sets(names: Sequence[str], paths: Mapping[str, str] | None = None) -> dict[str, list[MathProblem]]:
    """Load evaluation (or training) sets by name, each from its path when given, else from the hub."""
    from april_bench.data import load

    paths = paths or {}
    return {name: load(name, paths.get(name)).problems for name in names}


def evaluate_checkpoint(
    model: str,
    datasets: Sequence[str],
    *,
    paths: Mapping[str, str] | None = None,
    samples: int = 4,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 1024,
    grader: str | None = None,
    template: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    engine_args: Mapping[str, Any] | None = None,
) -> EvalResult:
    """avg@k of a checkpoint directory on evaluation sets, generated by the ``hf`` engine."""
    from transformers import AutoTokenizer

    from april_bench.engines.hf import HFEngine
    from april_bench.vtime import run_real

    tokenizer = AutoTokenizer.from_pretrained(model)
    evaluator = math_evaluator(
        load_sets(datasets, paths),
        tokenizer,
        max_new_tokens=max_new_tokens,
        samples=samples,
        temperature=temperature,
        top_p=top_p,
        grader=grader,
        template=template,
        seed=seed,
        limit=limit,
    )
    longest = evaluator.longest_prompt()
    settings: dict[str, Any] = {
        "model": model,
        "max_context_len": longest + max_new_tokens + 1,
        "seed": seed,
        "eos_token_ids": stop_token_ids(model, tokenizer),
    }
    settings.update(engine_args or {})
    engine = HFEngine.Config(**settings).build()

    async def main() -> EvalResult:
        await engine.start()
        try:
            return await evaluator.evaluate(engine)
        finally:
            await engine.close()

    return run_real(main())


def build(
    config: ExperimentConfig, model: str, *, produces_tokens: bool = True, progress: bool = False
) -> Task:
    """The checkpoint ``model`` (a directory) on a real data set: prompts through its chat template, the
    recipe's grader, avg@k on ``eval_datasets``."""
    from transformers import AutoTokenizer

    from april_bench.data import DATASETS, load

    if config.dataset not in DATASETS:
        raise ConfigError(
            f"--model {model} is a checkpoint, so --dataset must be a math data set "
            f"({', '.join(DATASETS)}), got {config.dataset!r}"
        )
    settings = MathTaskSettings.from_args(config.task_args)
    model = str(Path(model).expanduser())
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
