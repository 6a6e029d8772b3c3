"""The recipes' prompt templates, and rendering a problem into a model prompt.

Each recipe wraps the bare problem text in its own instruction (the strings are
exactly those documented in ``tests/data/math/README.md``):

========== ======================================================================
dapo       DAPO-Math-17k and the DAPO AIME eval parquet: "Solve the following ...
           Answer: $Answer ..." around the problem (graded by an ``Answer:`` line).
dapo-boxed slime's copy of DAPO-Math-17k (used by APRIL): the same, but asking for
           ``Answer: \\boxed{$Answer}`` so that boxed-answer graders work too.
deepscaler problem + " Let's think step by step and output the final answer within
           \\boxed{}." (DeepScaleR training).
deepmath   system "Please reason step by step, and put your final answer within
           \\boxed{}." plus the question as the user message (DeepMath-103K).
boxed      the deepscaler text; the default for evaluation sets, because the boxed
           answer is what math-verify and the deepscaler grader read.
plain      the problem alone.
========== ======================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from april_bench.data.records import MathProblem

__all__ = ["DAPO_PREFIX", "DAPO_SUFFIX", "TEMPLATES", "Template", "messages", "render"]


@dataclass(frozen=True, slots=True)
class Template:
    """An optional system message, and text put before and after the problem in the user message."""

    system: str | None
    prefix: str
    suffix: str

    def user(self, problem: str) -> str:
        """The user message for ``problem``."""
        return self.prefix + problem + self.suffix

    def strip(self, content: str) -> str | None:
        """The problem inside a user message built by this template, or ``None`` if it was not."""
        if not (self.prefix or self.suffix):
            return None
        if len(content) < len(self.prefix) + len(self.suffix):
            return None
        if content.startswith(self.prefix) and content.endswith(self.suffix):
            return content[len(self.prefix) : len(content) - len(self.suffix)]
        return None


DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
# slime's DAPO-Math-17k copy (zhuzilin/dapo-math-17k) rewrote the instruction for boxed graders; its
# documented example row reads "... of the form Answer: \boxed{$Answer} where $Answer is ...".
_SLIME_DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: \\boxed{$Answer} where $Answer is the answer to the problem.\n\n"
)
_BOXED_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."

_BOXED = Template(system=None, prefix="", suffix=_BOXED_SUFFIX)

TEMPLATES: Mapping[str, Template] = MappingProxyType(
    {
        "dapo": Template(system=None, prefix=DAPO_PREFIX, suffix=DAPO_SUFFIX),
        "dapo-boxed": Template(system=None, prefix=_SLIME_DAPO_PREFIX, suffix=DAPO_SUFFIX),
        "deepscaler": _BOXED,
        "deepmath": Template(
            system="Please reason step by step, and put your final answer within \\boxed{}.",
            prefix="",
            suffix="",
        ),
        "boxed": _BOXED,
        "plain": Template(system=None, prefix="", suffix=""),
    }
)


def _template_for(problem: MathProblem | str, template: str | None) -> Template:
    if template is None:
        from april_bench.data.specs import DATASETS

        spec = DATASETS.get(problem.dataset) if isinstance(problem, MathProblem) else None
        template = spec.template if spec is not None else "boxed"
    try:
        return TEMPLATES[template]
    except KeyError:
        raise ValueError(
            f"unknown prompt template {template!r}; valid templates: {', '.join(sorted(TEMPLATES))}"
        ) from None


def messages(problem: MathProblem | str, template: str | None = None) -> list[dict[str, str]]:
    """Chat messages for ``problem``: the template's system message (if any), then the user message.

    ``template`` defaults to the recipe template of the problem's data set (see ``DATASETS``), and to
    ``"boxed"`` for a bare string or an unregistered data set.
    """
    chosen = _template_for(problem, template)
    text = problem.problem if isinstance(problem, MathProblem) else problem
    out = [{"role": "system", "content": chosen.system}] if chosen.system is not None else []
    out.append({"role": "user", "content": chosen.user(text)})
    return out


def render(problem: MathProblem | str, tokenizer: Any = None, template: str | None = None) -> str:
    """The prompt text a model sees for ``problem``.

    With a tokenizer that has a chat template, the messages go through
    ``tokenizer.apply_chat_template(..., tokenize=False, add_generation_prompt=True)``.  Without one,
    the system text (if any), a blank line, and the user text.
    """
    msgs = messages(problem, template)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):
            raise TypeError(
                f"tokenizer.apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str"
            )
        return text
    return "\n\n".join(m["content"] for m in msgs)
