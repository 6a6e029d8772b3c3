"""Math runs on real data: the workload, avg@k evaluation, the eval / data CLIs, simulator prompt lengths.

The checkpoint is the offline tiny one (random weights, a real tokenizer with a
chat template), so these tests check plumbing and bookkeeping exactly, never
accuracy.  The data sets are the real rows vendored in ``tests/data/math`` (the ``shared_data``
fixture), read in place; nothing here depends on how many rows a file has.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import table_rows

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.data import MathProblem, load
from april_bench.engines.protocol import Completion, GenerateRequest
from april_bench.tasks.math import MathTaskSettings, MathWorkload, math_evaluator, stop_token_ids
from april_bench.types import FinishReason, Sample, SampleStatus, Segment


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from april_bench.models.checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


class AnswerEngine:
    """Answers request ``...-{problem}-{sample}``: the reference for even samples, a wrong one for odd."""

    def __init__(self, tokenizer: Any, problems: Sequence[MathProblem]) -> None:
        self.tokenizer = tokenizer
        self.problems = list(problems)
        self.seen: list[GenerateRequest] = []

    async def generate(self, requests: Sequence[GenerateRequest]) -> AsyncIterator[Completion]:
        for request in requests:
            self.seen.append(request)
            *_, problem, sample = request.request_id.split("-")
            answer = self.problems[int(problem)].answer
            text = f"so \\boxed{{{answer}}}" if int(sample) % 2 == 0 else "so \\boxed{-12345}"
            ids = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            yield Completion(request.request_id, len(ids), FinishReason.STOP, 0, 0.0, output_ids=ids)


def test_evaluator_computes_avg_at_k_per_set(tokenizer: Any, shared_data: Path) -> None:
    math500 = load("math-500", shared_data / "math-500" / "sample.jsonl", limit=5).problems
    aime = load("aime-2024", shared_data / "aime-2024" / "sample.jsonl", limit=3).problems
    evaluator = math_evaluator({"math-500": math500, "aime-2024": aime}, tokenizer, max_new_tokens=16)
    engine = AnswerEngine(tokenizer, math500)  # problem indices are per set: rebound for AIME below
    rows: list[Any] = []

    async def both() -> None:
        for name, problems in (("math-500", math500), ("aime-2024", aime)):
            engine.problems = problems
            sub = math_evaluator({name: problems}, tokenizer, max_new_tokens=16, samples=4)
            rows.append(await sub.evaluate(engine))

    asyncio.run(both())
    for result, n in zip(rows, (5, 3), strict=True):
        assert result.n == 4 * n
        assert result.accuracy == pytest.approx(0.5)  # two of four samples right on every problem
        assert result.stderr == pytest.approx(0.0)
        assert len(result.rows) == 4 * n
    # the zero-padded AIME labels ("025") still grade right under the default grader (math-verify)
    assert all(r.correct == (r.sample % 2 == 0) for r in rows[1].rows)
    assert evaluator.sets == ["math-500", "aime-2024"] and evaluator.longest_prompt() > 0
    # each (problem, sample) has its own seed, and a second evaluation reuses them: accuracy moves
    # only because the policy does
    first = [r.sampling.seed for r in engine.seen if r.request_id.startswith("eval0001-math-500")]
    assert len(set(first)) == len(first) == 20
    assert engine.seen[0].input_ids is not None
    prompt = tokenizer.decode(engine.seen[0].input_ids)
    assert prompt.startswith("<|user|>") and "\\boxed{}" in prompt and prompt.endswith("<|assistant|>")


def test_math_workload_renders_the_recipe_and_grades_with_its_grader(
    tokenizer: Any, shared_data: Path
) -> None:
    dapo = load("dapo-math-17k", shared_data / "dapo-math-17k" / "sample.jsonl", limit=8).problems
    workload = MathWorkload(dapo, tokenizer, dataset="dapo-math-17k", seed=3)
    assert workload.style == "dapo"
    stream = workload.prompt_stream()
    prompts = stream.take(8)
    assert sorted(p.metadata["index"] for p in prompts) == list(range(8))  # one epoch = every problem once
    again = MathWorkload(dapo, tokenizer, dataset="dapo-math-17k", seed=3).prompt_stream().take(8)
    assert [p.source_id for p in again] == [p.source_id for p in prompts]  # seeded: every arm the same
    prompt = prompts[0]
    assert "Remember to put your answer on its own line after" in (prompt.text or "")
    assert prompt.length == len(prompt.token_ids or ())

    def sample(text: str) -> Sample:
        ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
        s = Sample(prompt=prompt, index=0)
        s.append(Segment("r", 0, len(ids), FinishReason.STOP, 0, token_ids=ids))
        return s

    assert workload.reward(sample(f"work\nAnswer: {prompt.answer}")) == 1.0
    assert workload.reward(sample(f"\\boxed{{{prompt.answer}}}")) == -1.0  # DAPO needs its "Answer:" line
    assert sample("x").status is SampleStatus.COMPLETED
    boxed = MathWorkload(dapo, tokenizer, dataset="dapo-math-17k", grader="deepscaler")
    assert boxed.reward(sample(f"\\boxed{{{prompt.answer}}}")) == 1.0


def test_task_settings_reject_unknown_args_and_name_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown --task-arg gradr.*known: grader"):
        MathTaskSettings.from_args({"gradr": "dapo"})
    assert MathTaskSettings.from_args({"eval_samples": 16}).eval_samples == 16


def test_stop_token_ids_come_from_the_checkpoint(checkpoint: Path, tokenizer: Any) -> None:
    assert stop_token_ids(str(checkpoint), tokenizer) == (tokenizer.eos_token_id,)


def test_eval_cli_on_a_checkpoint(
    checkpoint: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            "--model", str(checkpoint),
            "--datasets", "math-500,aime-2025",
            "--data-path", f"math-500={shared_data / 'math-500' / 'sample.jsonl'}",
            "--data-path", f"aime-2025={shared_data / 'aime-2025' / 'sample.jsonl'}",
            "--limit", "3",
            "--samples", "2",
            "--max-new-tokens", "6",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "| math-500 " in printed and "| aime-2025 " in printed and "measured" in printed
    summary = json.loads((out / "eval.json").read_text())
    assert summary["result_kind"] == "measured"
    assert set(summary["by_dataset"]) == {"math-500", "aime-2025"}
    assert summary["by_dataset"]["math-500"]["problems"] == 3
    assert summary["provenance"]["git"]
    rows = table_rows(out, "eval_rows")
    assert len(rows) == 2 * 3 * 2
    assert all(0 < r["response_len"] <= 6 for r in rows)


def test_eval_cli_names_the_fix_for_a_missing_data_set(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["eval", "--model", str(checkpoint), "--datasets", "aime-2031"])
    assert code == 2
    assert "aime-2024" in capsys.readouterr().err  # the known names are listed


def test_math_rl_run_on_a_checkpoint(
    checkpoint: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--engine", "hf",
            "--model", str(checkpoint),
            "--dataset", "deepscaler",
            "--data-path", f"deepscaler={shared_data / 'deepscaler' / 'sample.jsonl'}",
            "--data-path", f"math-500={shared_data / 'math-500' / 'sample.jsonl'}",
            "--eval-datasets", "math-500",
            "--task-arg", "limit=40",
            "--task-arg", "eval_limit=2",
            "--task-arg", "eval_samples=2",
            "--strategies", "sync,april",
            "--steps", "2",
            "--eval-every", "1",
            "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2",
            "--over-sampling-batch-size", "4",
            "--max-response-len", "6",
            "--no-progress",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config["eval_datasets"] == ["math-500"] and "deepscaler" in config["data_paths"]
    evals = table_rows(out, "evals")
    assert {(e["arm"], e["step"]) for e in evals} == {(a, s) for a in ("sync", "april") for s in (0, 1, 2)}
    assert all(set(e["by_dataset"]) == {"math-500"} and e["n"] == 4 for e in evals)
    samples = table_rows(out, "samples")
    trained = [s for s in samples if s["fate"] == "trained"]
    assert len(trained) == 2 * 2 * 2 * 2  # arms x steps x groups x samples
    assert all(s["reward"] in (0.0, 1.0) for s in trained)  # DeepScaleR's 1/0 reward


def test_a_checkpoint_run_needs_a_math_data_set(checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["run", "--engine", "hf", "--model", str(checkpoint), "--dataset", "synthetic", "--steps", "1"]
    )
    assert code == 2
    assert "choose a math --dataset" in capsys.readouterr().err


def test_unknown_eval_data_set_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", "--hw", "mi300x", "--eval-datasets", "aime-2099"])
    assert code == 2
    assert "known: dapo-math-17k" in capsys.readouterr().err


def test_data_stats_cli(
    shared_data: Path, tokenizer: Any, checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = shared_data / "aime-2024" / "sample.jsonl"
    assert main(["data", "stats", "aime-2024", "--path", str(path)]) == 0
    card = capsys.readouterr().out
    assert "30" in card and "zero-padded integer" in card and "chars/3.5" in card
    assert main(["data", "stats", "aime-2024", "--path", str(path), "--tokenizer", str(checkpoint)]) == 0
    assert "tokens" in capsys.readouterr().out


def test_simulator_takes_prompt_lengths_from_the_data(shared_data: Path) -> None:
    from april_bench.data import prompt_lengths
    from april_bench.sim.workload import SimWorkload

    path = shared_data / "deepscaler" / "sample.jsonl"
    measured, unit = prompt_lengths(load("deepscaler", path))
    workload = SimWorkload.Config(dataset="deepscaler", data_path=path).build(n_samples_per_prompt=8)
    first = [p.length for p in workload.prompt_stream().take(len(measured))]
    assert sorted(first) == sorted(measured)  # one epoch is every problem once
    assert workload.prompt_length_unit == unit
    again = SimWorkload.Config(dataset="deepscaler", data_path=path).build(n_samples_per_prompt=8)
    assert [p.length for p in again.prompt_stream().take(len(first))] == first
    with pytest.raises(ConfigError, match="data_path needs a real data set"):
        SimWorkload.Config(dataset="synthetic", data_path=path).build(n_samples_per_prompt=8)


@pytest.mark.parametrize(
    ("dataset", "path"),
    [("dapo-math-17k", "dapo-math-17k/sample.jsonl"), ("deepscaler", "deepscaler/sample.jsonl")],
)
def test_simulator_prompt_profiles_match_the_data(dataset: str, path: str, shared_data: Path) -> None:
    """The built-in profiles' prompt medians were derived from these samples; keep them in step."""
    import statistics

    from april_bench.data import prompt_lengths
    from april_bench.sim.workload import DATASET_PROFILES

    measured, _ = prompt_lengths(load(dataset, shared_data / path))
    median = statistics.median(measured)
    assert DATASET_PROFILES.get(dataset).prompt_median == pytest.approx(median, rel=0.15)


def test_sim_run_with_a_data_path_records_it(shared_data: Path, tmp_path: Path) -> None:
    from april_bench.data import prompt_lengths

    out = tmp_path / "sim"
    path = shared_data / "deepscaler" / "sample.jsonl"
    code = main(
        [
            "run", "--hw", "h100", "--engine", "sim", "--dataset", "deepscaler", "--steps", "2",
            "--data-path", f"deepscaler={path}", "--no-progress", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    requests = table_rows(out, "requests")
    measured, _ = prompt_lengths(load("deepscaler", path))
    assert {r["prompt_len"] for r in requests} <= set(measured)
