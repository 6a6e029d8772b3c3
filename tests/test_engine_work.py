"""Exact engine accounting (forward passes, occupancy, prefill, re-prefill) and the gate built on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from helpers import fake_arm

from april_bench.engines.fake import FakeEngine
from april_bench.engines.hf import HFEngine
from april_bench.engines.protocol import EngineWork, GenerateRequest, SamplingParams
from april_bench.results.compare import Rule, compare_runs, default_rules, parse_rule
from april_bench.results.summary import summarize
from april_bench.rollout.strategy import Candidate, RolloutStrategy, RolloutView
from april_bench.strategies import build_strategy
from april_bench.vtime import run_real, run_virtual

GREEDY = SamplingParams(temperature=0.0)


def _req(rid: str, ids: tuple[int, ...], replay: int, prefix_len: int = 0) -> GenerateRequest:
    return GenerateRequest(
        rid,
        input_len=len(ids),
        max_new_tokens=64,
        sampling=GREEDY,
        input_ids=ids,
        replay_len=replay,
        prefix_len=prefix_len,
    )


def test_the_fake_engine_counts_requests_decoding_together_as_one_iteration() -> None:
    async def main() -> EngineWork:
        engine = FakeEngine.Config().build()
        await engine.start()
        # lengths 3 and 5 side by side: 5 iterations, 8 tokens; then a resume of 2 more alone: 2
        [c async for c in engine.generate([_req("a", (1, 2), 3), _req("b", (3, 4, 5), 5)])]
        [c async for c in engine.generate([_req("c", (1, 2, 7, 8), 2, prefix_len=2)])]
        return engine.work()

    assert run_virtual(main()) == EngineWork(
        engine_iterations=7, decode_iterations=7, decode_tokens=10, prefill_tokens=9, reprefill_tokens=4
    )


@pytest.mark.parametrize("path", ["eager", "static"])
def test_the_hf_engine_counts_its_forward_passes(path: str) -> None:
    async def main() -> EngineWork:
        engine = HFEngine.Config(
            model="tiny",
            dtype="float64",
            max_running_requests=8,
            max_context_len=128,
            eos_token_ids=(2,),
            decode_path=path,
        ).build(vocab_size=40)
        await engine.start()
        requests = [
            _req("a", (1, 5, 6), 4),
            _req("b", (1, 9), 6),
            _req("r", (1, 5, 6, 7, 8), 3, prefix_len=2),
        ]
        [c async for c in engine.generate(requests)]
        await engine.close()
        return engine.work()

    work = run_real(main())
    # one prefill forward samples every request's first token; then decode steps of 3, 3, 2, 1, 1
    # sequences (lengths 4, 6 and 3: the others finish after 3 and 4 tokens)
    assert work == EngineWork(
        engine_iterations=1 + 5,
        decode_iterations=5,
        decode_tokens=(4 - 1) + (6 - 1) + (3 - 1),
        prefill_tokens=3 + 2 + 5,
        reprefill_tokens=5,
    )


def _length(uid: int, index: int) -> int:
    return 2 + ((uid * 37 + index * 11) % 23) ** 2 // 8  # a long tail: 2..62 tokens


def _run(april: RolloutStrategy) -> dict[str, dict[str, Any]]:
    """Sync and ``april`` on the fake engine, six steps each; the run's summary."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for strategy in (build_strategy("sync"), april):
        _, recorder, _ = fake_arm(
            strategy,
            _length,
            steps=6,
            rollout_batch_size=4,
            over_sampling_batch_size=8,
            n_samples_per_prompt=4,
        )
        for name, rows in recorder.rows().items():
            tables.setdefault(name, []).extend(rows)
    return summarize(tables)


_April: Any = type(build_strategy("april"))


class _ResumesPartialsLast(_April):  # type: ignore[misc]
    """An injected scheduling regression: APRIL launching fresh prompts before its buffered partials."""

    @dataclass(kw_only=True, slots=True, frozen=True)
    class Config(_April.Config):  # type: ignore[misc,name-defined]
        pass

    def select(self, candidates: Any, count: int, view: RolloutView) -> list[Candidate]:
        return sorted(candidates, key=lambda c: not c.fresh)[:count]


def test_the_iteration_gate_passes_unchanged_code_and_fails_an_injected_scheduling_regression() -> None:
    base = _run(build_strategy("april"))
    april = base["april"]
    assert april["engine_iterations"] and april["work_deterministic"] is True
    assert april["iteration_useful_gain"] == pytest.approx(
        april["useful_tokens_per_iteration"] / base["sync"]["useful_tokens_per_iteration"] - 1
    )
    rules = [parse_rule("iterations:0")]
    assert not any(c.regressed for c in compare_runs(base, _run(build_strategy("april")), rules))
    regressed = compare_runs(base, _run(_ResumesPartialsLast.Config().build()), rules)
    assert [c.gain for c in regressed if c.regressed] == ["iteration_useful"]


def test_the_default_measured_rule_fails_a_107_point_end_to_end_drop() -> None:
    """The drop the issue saw (committed reference vs a run at load 3.4-7.2) passed median:ci as
    'intervals overlap'; the default rules now fail it."""

    def summary(median: float, ci: list[float]) -> dict[str, dict[str, Any]]:
        paired = {"end_to_end": {"median": median, "ci": ci}}
        return {
            "sync": {"baseline": "sync"},
            "april": {"baseline": "sync", "end_to_end_gain": median, "paired_gains": paired},
        }

    base, new = summary(0.9356, [0.1439, 1.6128]), summary(0.9356 - 1.068, [-0.45, 0.62])
    rows = compare_runs(base, new, default_rules(simulated=False), ["end_to_end"])
    assert [(c.rule, c.regressed) for c in rows if c.gain == "end_to_end"] == [(Rule("median", None), True)]
    same = summary(0.70, [0.10, 1.30])  # within the reference's interval: not a regression
    assert not any(c.regressed for c in compare_runs(base, same, default_rules(simulated=False)))


def test_an_iteration_rule_parses_and_other_views_have_no_interval() -> None:
    assert parse_rule("iterations:0") == Rule("iterations", 0.0)
    from april_bench.config import ConfigError

    with pytest.raises(ConfigError, match="use median:ci"):
        parse_rule("iterations:ci")


def test_steps_without_engine_counts_give_no_iteration_rates() -> None:
    _, recorder, _ = fake_arm(build_strategy("sync"), _length, steps=2)
    tables = recorder.rows()
    tables["steps"][1]["engine_iterations"] = None  # an engine that does not count its work
    metrics = summarize(tables)["sync"]
    assert metrics["engine_iterations"] is None and metrics["useful_tokens_per_iteration"] is None
    assert summarize(recorder.rows())["sync"]["useful_tokens_per_iteration"] > 0


def test_an_exact_iteration_rule_does_not_gate_an_engine_whose_schedule_depends_on_timing() -> None:
    def run(gain: float, deterministic: bool) -> dict[str, dict[str, Any]]:
        arm = {"baseline": "sync", "iteration_useful_gain": gain, "work_deterministic": deterministic}
        return {"sync": {"baseline": "sync"}, "april": arm}

    rows = compare_runs(run(1.0, False), run(0.9, False), [parse_rule("iterations:0")])
    assert not any(c.regressed for c in rows) and "depends on timing" in rows[1].why
    assert compare_runs(run(1.0, False), run(0.9, False), [parse_rule("iterations:5%")])[1].regressed
    assert compare_runs(run(1.0, True), run(0.9, True), [parse_rule("iterations:0")])[1].regressed
