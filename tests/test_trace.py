"""The trace format, the trace table every run writes, and the importers (verl, slime, W&B/CSV)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import sim_flags, table_rows
from trace_fixtures import Opaque, slime_dump, verl_dump

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.trace.format import TraceHeader, TraceRow, read_trace, write_trace
from april_bench.trace.slime import import_slime
from april_bench.trace.stats import import_stats
from april_bench.trace.tokens import CHARS_PER_TOKEN, token_counter
from april_bench.trace.verl import import_verl

HEADER = TraceHeader(source="test", evidence="per-sample", token_counts="exact", max_response_len=100)


def _trace_rows() -> list[TraceRow]:
    return [
        TraceRow(step, f"p{g}", j, 10 + g, 20 * (j + 1), "stop", float(j % 2))
        for step in range(2)
        for g in range(3)
        for j in range(4)
    ]


def test_a_written_trace_reads_back_with_its_groups_in_step_order(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = _trace_rows()[::-1]  # written newest step first: groups still replay in step order
    assert write_trace(path, HEADER, rows) == 24
    trace = read_trace(path)
    assert trace.header == HEADER
    groups = trace.groups()
    assert [(g.step, g.prompt_id) for g in groups][:3] == [(0, "p2"), (0, "p1"), (0, "p0")]
    assert [r.sample_index for r in groups[0].rows] == [0, 1, 2, 3]
    assert trace.group_size() == 4 and trace.groups_per_step() == 3 and trace.has_rewards


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: not JSON"),
        (
            '{"step": 0, "prompt_id": "a", "sample_index": 0}',
            r"line 2: not a trace row \(missing response_tokens",
        ),
        (
            '{"step": -1, "prompt_id": "a", "sample_index": 0, "response_tokens": 3}',
            "line 2: step must be >= 0",
        ),
        ('{"step": 0, "prompt_id": "a", "sample_index": 0, "response_tokens": 3, "finish": "eos"}', "finish"),
        ('{"step": 0, "prompt_id": "a", "sample_index": 0, "response_tokens": 3, "reward": "1"}', "reward"),
    ],
)
def test_a_malformed_row_is_one_error_naming_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(HEADER.to_json()) + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=message) as err:
        read_trace(path)
    assert str(path) in str(err.value)


def test_a_file_without_the_header_or_with_a_repeated_sample_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    row = {"step": 0, "prompt_id": "a", "sample_index": 0, "response_tokens": 3}
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match="line 1: not an april-bench trace"):
        read_trace(path)
    path.write_text(json.dumps(HEADER.to_json()) + "\n" + json.dumps(row) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=r"line 3: .*repeats line 2"):
        read_trace(path)


def test_the_cli_names_file_and_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(HEADER.to_json()) + "\n{broken\n")
    assert main(["trace", "show", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and f"{path}, line 2" in err[0]


# ----------------------------------------------------------------------------- verl


def test_verl_dumps_import_with_groups_from_the_prompt_text(tmp_path: Path) -> None:
    header, rows = import_verl(verl_dump(tmp_path / "verl"), token_counter(None), max_response_len=150)
    assert header.source == "verl rollout dump" and "estimate" in header.token_counts
    assert len(rows) == 8 and {r.step for r in rows} == {1, 2}
    by_group: dict[tuple[int, str], list[TraceRow]] = {}
    for r in rows:
        by_group.setdefault((r.step, r.prompt_id), []).append(r)
    assert sorted(len(v) for v in by_group.values()) == [2, 2, 2, 2]
    short = [r for r in rows if r.step == 1 and r.response_tokens < 150]
    # 35 characters at 3.5 per token = 10 tokens, plus the EOS the decoded text lost
    assert min(r.response_tokens for r in short) == 35 // CHARS_PER_TOKEN + 1
    long = [r for r in rows if r.finish == "truncated"]
    assert long and all(r.response_tokens == 150 for r in long)  # clipped to the limit, marked truncated
    assert {r.reward for r in rows} == {0.0, 1.0}


def test_a_verl_row_without_output_names_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "verl"
    root.mkdir()
    (root / "3.jsonl").write_text('{"input": "a", "output": "b", "score": 1, "step": 3}\n{"input": "a"}\n')
    with pytest.raises(ConfigError, match=r"3\.jsonl, line 2: .*'output'"):
        import_verl(root, token_counter(None))


# ----------------------------------------------------------------------------- slime


def test_slime_dumps_import_exact_counts_groups_and_truncation(tmp_path: Path) -> None:
    files = [slime_dump(tmp_path / "d_1.pt", 1), slime_dump(tmp_path / "d_0.pt", 0)]
    header, rows = import_slime(files, token_counter(None))
    assert header.token_counts.startswith("exact") and any("2 unfinished" in n for n in header.notes)
    assert [r.step for r in rows][:8] == [0] * 8  # rollout order, whatever order the files came in
    assert len(rows) == 16 and {r.prompt_tokens for r in rows} == {5}
    assert [r.response_tokens for r in rows[:4]] == [7, 8, 9, 10]
    assert [r.finish for r in rows[4:8]] == ["stop", "stop", "stop", "truncated"]
    assert header.max_response_len == 17  # the longest truncated response stands for the unknown limit


def test_a_slime_dict_reward_needs_a_key(tmp_path: Path) -> None:
    path = slime_dump(tmp_path / "d.pt", 0, reward={"acc": 1.0, "format": 0.5})
    with pytest.raises(ConfigError, match=r"reward is a dict .*--reward-key"):
        import_slime([path], token_counter(None))
    _, rows = import_slime([path], token_counter(None), reward_key="format")
    assert {r.reward for r in rows} == {0.5}


def test_a_slime_dump_with_arbitrary_objects_is_refused_not_unpickled(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "evil.pt"
    torch.save({"rollout_id": 0, "samples": [Opaque()]}, path)
    with pytest.raises(ConfigError, match=r"refused: .*never unpickles"):
        import_slime([path], token_counter(None))


# ----------------------------------------------------------------------------- W&B / CSV
def test_per_step_stats_synthesize_samples_matching_each_mean_and_say_so(tmp_path: Path) -> None:
    path = tmp_path / "wandb.csv"
    path.write_text(
        "Step,run-1 - response_length/mean,run-1 - response_length/mean__MIN\n1,400,300\n2,,\n3,900,800\n"
    )
    header, rows = import_stats(path, groups_per_step=8, samples_per_prompt=4, max_response_len=4096)
    assert "weakest" in header.evidence and header.max_response_len == 4096
    assert sorted({r.step for r in rows}) == [1, 3] and len(rows) == 64
    for step, mean in ((1, 400), (3, 900)):
        lengths = [r.response_tokens for r in rows if r.step == step]
        assert sum(lengths) / len(lengths) == pytest.approx(mean, rel=0.01)  # rounding to whole tokens
    assert all(r.reward is None for r in rows)


def test_stats_without_a_mean_column_say_which_names_they_look_for(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("step,loss\n1,0.5\n")
    with pytest.raises(ConfigError, match="response_length/mean"):
        import_stats(path, groups_per_step=2, samples_per_prompt=2, max_response_len=100)


# ----------------------------------------------------------------------------- the CLI
def test_trace_import_verl_writes_a_trace_whatif_can_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "verl-trace.jsonl"
    argv = [
        "trace",
        "import-verl",
        str(verl_dump(tmp_path / "verl")),
        "--max-response-len",
        "150",
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    assert "verl rollout dump" in capsys.readouterr().out
    assert read_trace(out).summary()["groups"] == 4


def test_every_run_writes_its_finished_samples_as_its_trace(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = sim_flags(
        algo="dapo", strategies="sync,april", max_response_len=4096, over_sampling_batch_size=None
    )
    assert main(["run", *argv, "--out", str(out)]) == 0
    samples = table_rows(out, "samples")
    trace = table_rows(out, "trace")
    finished = [s for s in samples if s["status"] in ("completed", "truncated")]
    key = ("arm", "step", "sample_index", "response_len")
    assert sorted((t["arm"], t["step"], t["sample_index"], t["response_tokens"]) for t in trace) == sorted(
        tuple(s[k] for k in key) for s in finished
    )
    assert any(s["reason"] == "filter_rejected" for s in finished)  # rejected groups are in the trace too
    assert any(s["status"] == "aborted" for s in samples if s["arm"] != "sync")  # partials are not
    replay = read_trace(out)  # the baseline arm by default, with a header from the run
    assert replay.arm == "sync" and replay.header.source == "april-bench run, arm sync"
    assert "simulated" in replay.header.token_counts and replay.header.max_response_len == 4096
