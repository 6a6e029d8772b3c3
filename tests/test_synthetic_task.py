"""The synthetic task: tokenizer, problems, grading, splits, and the length tail it produces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from april_bench.config import ConfigError
from april_bench.tasks.synthetic import CharTokenizer, Problem, SyntheticTask


def test_worked_answer_and_grading() -> None:
    p = Problem(73, 7)
    assert p.prompt == "73-7="
    assert p.solution == "66,59,52,45,38,31,24,17,10,3#3"
    assert (p.answer, p.steps) == (3, 10)
    assert p.grade(p.solution) == 1.0
    assert p.grade("66,59#3") == 1.0  # only the answer is graded
    assert p.grade("66,59,52#4") == 0.0
    assert p.grade("no answer") == 0.0 and p.grade("") == 0.0 and p.grade("#") == 0.0
    assert Problem(10, 5).solution == "5,0#0"


@given(st.text(max_size=200))
def test_grading_never_raises(response: str) -> None:
    assert Problem(50, 7).grade(response) in (0.0, 1.0)


def test_tokenizer_round_trip_and_specials() -> None:
    tok = SyntheticTask.Config().build().tokenizer
    assert tok.vocab_size == 17
    ids = tok.encode("73-7=66,59#3")
    assert min(ids) >= 3 and tok.decode(ids) == "73-7=66,59#3"
    assert tok.decode([*ids[:3], CharTokenizer.EOS, *ids[3:]]) == "73-"  # stops at <eos>
    assert tok.decode([CharTokenizer.BOS, CharTokenizer.PAD, *ids[:2]]) == "73"
    with pytest.raises(ValueError, match="not in the alphabet"):
        tok.encode("7x")


def test_splits_are_disjoint_and_cover_the_space() -> None:
    task = SyntheticTask.Config().build()
    sft, rl, held = (set(task.sft_problems), set(task.rl_problems), set(task.heldout_problems))
    assert not (sft & rl) and not (sft & held) and not (rl & held)
    cfg = task.config
    space = {
        (n, k) for k in range(cfg.min_k, cfg.max_k + 1) for n in range(max(cfg.min_n, k + 1), cfg.max_n + 1)
    }
    assert {(p.n, p.k) for p in sft | rl | held} == space
    assert 0.15 < len(held) / len(space) < 0.25
    assert all(task.draw("rl", i) in rl for i in range(200))
    assert task.draw("rl", 7) == task.draw("rl", 7)  # deterministic


def test_answer_lengths_have_a_long_tail_from_the_task() -> None:
    task = SyntheticTask.Config().build()
    lengths = sorted(len(task.solution_ids(task.draw("rl", i))) for i in range(4000))
    p50, p99 = lengths[2000], lengths[3960]
    assert p99 >= 4 * p50  # harder problems (small divisors) need much longer worked answers


def test_bad_task_settings_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="min_k <= max_k < max_n"):
        SyntheticTask.Config(max_k=200)
    with pytest.raises(ConfigError, match="sft_share"):
        SyntheticTask.Config(sft_share=1.0)
