"""The sglang adapter's pure parts: payloads, output parsing, finish classification, launch command."""

from __future__ import annotations

import pytest

from april_bench.config import ConfigError
from april_bench.engines.protocol import EngineError, GenerateRequest, SamplingParams
from april_bench.engines.server.metrics import parse_prometheus
from april_bench.engines.server.process import flag_args
from april_bench.engines.sglang import SGLangEngine
from april_bench.engines.sglang.engine import launch_command
from april_bench.engines.sglang.wire import (
    VersionMap,
    classify_finish,
    error_message,
    generate_payload,
    parse_generate_output,
)
from april_bench.types import FinishReason


def _request(max_new: int = 8, replay: int | None = None, stop: tuple[int, ...] = (), seed: int | None = 5):
    return GenerateRequest(
        request_id="a-01",
        input_len=3,
        max_new_tokens=max_new,
        sampling=SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=seed, stop_token_ids=stop),
        input_ids=(11, 12, 13),
        replay_len=replay,
    )


def test_payload_sends_ids_budget_stop_ids_seed_and_asks_for_logprobs() -> None:
    body = generate_payload(_request(stop=(7,)), "a-01#x", eos_token_ids=(2, 7))
    assert body == {
        "input_ids": [11, 12, 13],
        "rid": "a-01#x",
        "return_logprob": True,
        "stream": False,
        "sampling_params": {
            "max_new_tokens": 8,
            "temperature": 0.8,
            "top_p": 0.9,
            "top_k": 20,
            "ignore_eos": False,
            "stop_token_ids": [2, 7],
            "sampling_seed": 5,
        },
    }


def test_a_replayed_length_ignores_eos_and_caps_the_budget() -> None:
    short = generate_payload(_request(max_new=8, replay=5, stop=(7,)), "r", eos_token_ids=(2,))
    assert short["sampling_params"]["max_new_tokens"] == 5
    assert short["sampling_params"]["ignore_eos"] is True
    assert "stop_token_ids" not in short["sampling_params"]
    long = generate_payload(_request(max_new=8, replay=50), "r")
    assert long["sampling_params"]["max_new_tokens"] == 8


def test_a_request_without_token_ids_is_refused() -> None:
    request = GenerateRequest("x", 3, 4, SamplingParams())
    with pytest.raises(EngineError, match="needs token ids"):
        generate_payload(request, "x#1")


@pytest.mark.parametrize(
    ("kind", "ids", "max_new", "replay", "stop", "expected"),
    [
        ("stop", (5, 2), 8, None, (), FinishReason.STOP),
        ("length", (5,) * 8, 8, None, (), FinishReason.LENGTH),
        ("abort", (5, 6), 8, None, (), FinishReason.ABORT),
        ("abort", (), 8, None, (), FinishReason.ABORT),  # aborted in the waiting queue
        # The abort landed in the step that used the last of the budget: SGLang still says abort.
        ("abort", (5,) * 8, 8, None, (), FinishReason.LENGTH),
        # ... or in the step that sampled EOS (2) or a stop id (9).
        ("abort", (5, 2), 8, None, (), FinishReason.STOP),
        ("abort", (5, 9), 8, None, (9,), FinishReason.STOP),
        # Replayed lengths: ``length`` at the replayed length is the end of the response.
        ("length", (5,) * 5, 8, 5, (), FinishReason.STOP),
        ("abort", (5,) * 5, 8, 5, (), FinishReason.STOP),
        ("abort", (5, 2), 8, 5, (), FinishReason.ABORT),  # EOS is only a token while replaying
        ("length", (5,) * 8, 8, 50, (), FinishReason.LENGTH),  # replay beyond the budget truncates
    ],
)
def test_finish_classification(kind, ids, max_new, replay, stop, expected) -> None:
    request = _request(max_new=max_new, replay=replay, stop=stop)
    assert classify_finish(kind, ids, request, eos_token_ids=(2,)) is expected


def test_unknown_finish_type_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="unknown sglang finish_reason"):
        classify_finish("timeout", (), _request())


def _out(ids, triples=None, **meta):
    meta = {"id": "a-01#x", "finish_reason": {"type": "length", "length": len(ids)}, **meta}
    if triples is not None:
        meta["output_token_logprobs"] = triples
    return {"output_ids": list(ids), "meta_info": meta}


def test_parse_takes_logprobs_from_the_triples_and_the_version_from_the_server() -> None:
    out = _out([4, 5], [[-0.5, 4, None], [-1.5, 5, None]], weight_version="3", num_retractions=2)
    parsed = parse_generate_output(out, _request(max_new=2), versions=VersionMap("default"))
    assert parsed.output_ids == (4, 5)
    assert parsed.logprobs == (-0.5, -1.5)
    assert parsed.policy_version == 3
    assert parsed.num_retractions == 2
    assert parsed.finish_reason is FinishReason.LENGTH


def test_parse_rejects_logprobs_that_do_not_match_the_tokens() -> None:
    versions = VersionMap("default")
    with pytest.raises(EngineError, match="1 log-probs for 2 tokens"):
        parse_generate_output(_out([4, 5], [[-0.5, 4, None]]), _request(), versions=versions)
    with pytest.raises(EngineError, match="log-prob for token 9"):
        parse_generate_output(_out([4, 5], [[-0.5, 4, None], [-1.0, 9, None]]), _request(), versions=versions)


def test_parse_rejects_a_request_that_spans_two_weight_versions() -> None:
    spans = [{"version": "0", "start": 0, "end": 3}, {"version": "1", "start": 3, "end": 5}]
    with pytest.raises(EngineError, match=r"weights changed while it ran \(versions \[0, 1\]\)"):
        parse_generate_output(
            _out([1] * 5, weight_versions=spans), _request(), versions=VersionMap("default")
        )


def test_version_labels_map_to_integers_and_foreign_labels_are_refused() -> None:
    versions = VersionMap("default")
    assert [versions.parse("default"), versions.parse("0"), versions.parse("12")] == [0, 0, 12]
    with pytest.raises(EngineError, match="another client updated the weights"):
        versions.parse("nightly")


def test_malformed_output_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="malformed sglang output"):
        parse_generate_output({"text": "hi"}, _request(), versions=VersionMap("default"))


def test_error_messages_are_read_from_each_sglang_error_shape() -> None:
    assert error_message(b'{"error": {"message": "too long"}}', 400) == "too long"
    assert error_message(b'{"success": false, "message": "no such dir"}', 400) == "no such dir"
    assert error_message(b'{"detail": "Not Found"}', 404) == "Not Found"
    assert error_message(b"Flush cache failed.\n", 400) == "Flush cache failed."
    assert error_message(b"", 503) == "HTTP 503"


def test_prometheus_samples_are_summed_over_labels_without_buckets() -> None:
    text = """# HELP sglang:num_running_reqs running
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 4.0
sglang:generation_tokens_total{model_name="m"} 120
sglang:generation_tokens_created{model_name="m"} 1.7e9
sglang:ttft_seconds_bucket{le="0.1"} 5
sglang:ttft_seconds_sum 0.5
sglang:token_usage{model_name="m"} NaN
process_cpu_seconds_total 9
"""
    assert parse_prometheus(text, prefix="sglang:") == {
        "sglang:num_running_reqs": 7.0,
        "sglang:generation_tokens_total": 120.0,
        "sglang:ttft_seconds_sum": 0.5,
    }


def test_launch_command_is_sglangs_cli_with_engine_args_appended() -> None:
    config = SGLangEngine.Config(
        model_path="/ckpt/qwen",
        context_length=4096,
        max_running_requests=64,
        deterministic=True,
        enable_metrics=False,
        python="/venv/bin/python",
        engine_args={"attention_backend": "fa3", "disable_radix_cache": True, "cuda_graph_bs": [1, 2]},
    )
    assert launch_command(config, 31000) == [
        "/venv/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/ckpt/qwen", "--host", "127.0.0.1", "--port", "31000", "--skip-tokenizer-init",
        "--tp-size", "1", "--random-seed", "0", "--weight-version", "0", "--context-length", "4096",
        "--max-running-requests", "64", "--enable-deterministic-inference",
        "--attention-backend", "fa3", "--disable-radix-cache", "--cuda-graph-bs", "1", "2",
    ]  # fmt: skip


def test_flag_args_spell_values_like_argparse_expects() -> None:
    assert flag_args("max_total_tokens", 100) == ["--max-total-tokens", "100"]
    assert flag_args("--log-level", "info") == ["--log-level", "info"]
    assert flag_args("enable_x", False) == [] and flag_args("y", None) == []


def test_config_needs_exactly_one_way_to_reach_a_server() -> None:
    with pytest.raises(ConfigError, match="either model_path"):
        SGLangEngine.Config(model_path="m", url="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="needs model_path"):
        SGLangEngine.Config().build()
    with pytest.raises(ConfigError, match="must start with http"):
        SGLangEngine.Config(url="127.0.0.1:30000")
