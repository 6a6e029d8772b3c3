"""Re-prefill and log-prob gap: computed from rows, and the trainer's gap metric behind the latter."""

from __future__ import annotations

import pytest
import torch

from april_bench.results.engine_report import ENGINE_COLUMNS, engine_report, engine_table
from april_bench.trainers.torch_trainer import _engine_logprob_gap, _Rows


def req(arm: str, step: int, prompt: int, prefix: int, repeat: int = 0) -> dict:
    return {"arm": arm, "step": step, "prompt_len": prompt, "prefix_len": prefix, "repeat": repeat}


def step(arm: str, i: int, **metrics: float) -> dict:
    return {"arm": arm, "step": i, "train_metrics": metrics}


def test_resumed_requests_prefill_their_prompt_and_partial_again() -> None:
    tables = {
        "requests": [
            req("april", 0, 10, 0),
            req("april", 0, 10, 0),
            req("april", 1, 10, 30),
            req("sync", 0, 8, 0),
        ],
        "steps": [step("april", 0), step("april", 1), step("sync", 0)],
        "engine_metrics": [
            {"arm": "april", "t": 1.0, "metrics": {"prefix_cache_queries": 10, "prefix_cache_hits": 1}},
            {"arm": "april", "t": 2.0, "metrics": {"prefix_cache_queries": 60, "prefix_cache_hits": 15}},
        ],
    }
    report = engine_report(tables)
    april = report["april"]
    assert (april["resumed_requests"], april["reprefilled_tokens"], april["reprefilled_partial_tokens"]) == (
        1,
        40,
        30,
    )
    assert april["reprefilled_tokens_per_step"] == 20
    assert april["reprefill_share_of_prefill"] == pytest.approx(40 / 60)
    assert april["prefix_cache_hit_rate"] == pytest.approx(15 / 60)  # the counters' last values
    assert report["sync"]["reprefilled_tokens"] == 0 and report["sync"]["prefix_cache_hit_rate"] is None


def test_logprob_gap_is_token_weighted_over_steps_that_measured_it() -> None:
    steps = [
        step("a", 0, engine_logprob_gap_mean=0.1, engine_logprob_gap_max=0.3, engine_logprob_tokens=10),
        step("a", 1, engine_logprob_gap_mean=0.4, engine_logprob_gap_max=0.5, engine_logprob_tokens=30),
        step("a", 2, loss=1.0),  # no token of the current policy
    ]
    gap = engine_report({"steps": steps})["a"]
    assert gap["logprob_gap_mean"] == pytest.approx((0.1 * 10 + 0.4 * 30) / 40)
    assert (gap["logprob_gap_max"], gap["logprob_gap_tokens"]) == (0.5, 40)
    assert engine_report({"steps": [step("b", 0)]})["b"]["logprob_gap_mean"] is None
    row = engine_table({"a": {"engine": gap}})[0]
    assert len(row) == len(ENGINE_COLUMNS) and row[-1] == "5.00e-01"


def test_the_trainer_compares_only_tokens_of_the_policy_it_holds() -> None:
    behaviour = torch.tensor([[-1.0, -2.0, -3.0, 0.0]])
    trainer = torch.tensor([[-1.1, -2.5, -9.0, -7.0]])
    rows = _Rows(
        ids=torch.zeros(1, 5, dtype=torch.long),
        attention=torch.ones(1, 5, dtype=torch.long),
        mask=torch.tensor([[1.0, 1.0, 1.0, 0.0]]),  # the last position is padding
        behaviour=behaviour,
        versions=torch.tensor([[4, 4, 3, -1]]),  # the third token came from an older policy
        advantages=torch.zeros(1),
        lengths=[4],
        prompts=[1],
        groups=[0],
    )
    gap = _engine_logprob_gap(trainer, rows, policy_version=4)
    assert gap["engine_logprob_tokens"] == 2
    assert gap["engine_logprob_gap_mean"] == pytest.approx(0.3)
    assert gap["engine_logprob_gap_max"] == pytest.approx(0.5)
    assert _engine_logprob_gap(trainer, rows, policy_version=9) == {}
