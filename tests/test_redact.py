"""Secrets never leave memory (issue 32, item 3).

Credentials in URLs and ``api_key``-like settings are redacted in every message, every JSON file a
run writes (status, config, provenance), config.yaml and what the trackers get; the provenance's
environment filter matches secret names by pattern.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from april_bench.cli import main
from april_bench.redact import (
    REDACTED,
    is_secret_env,
    is_secret_setting,
    redact,
    redact_text,
    redacted_fields,
)
from april_bench.results.provenance import result_environment


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://user:hunter2@host:8000/v1", "http://user:***@host:8000/v1"),
        ("https://ghp_token@github.com/x", "https://***@github.com/x"),
        ("attach url=http://u:p@h:1 failed", "attach url=http://u:***@h:1 failed"),
        ("api_key=sk-123 and hf_token=abc", "api_key=*** and hf_token=***"),
        ("{'api_key': 'sk-123', 'max_tokens': 5}", "{'api_key': '***', 'max_tokens': 5}"),
        ('"password": "pw"', '"password": "***"'),
        ("--api-key sk-123 --port 30000", "--api-key *** --port 30000"),
        ("max_tokens=5 reward_key=score prompt_tokens: 3", "max_tokens=5 reward_key=score prompt_tokens: 3"),
        ("the key was wrong", "the key was wrong"),
        ("http://host:8000/health", "http://host:8000/health"),
    ],
)
def test_redact_text(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_redact_a_config_keeps_everything_but_the_secrets() -> None:
    config: dict[str, Any] = {
        "engine_args": {"url": "http://user:pw@host:1", "api_key": "sk-1", "max_running_requests": 8},
        "trainer_args": {"hf_token": "hf_abc", "lr": 1e-6, "db_password": "x", "token": None, "key": 3},
        "task_args": {"reward_key": "score", "max_tokens": 12, "credentials": ["a"]},
        "command": [
            "april-bench",
            "run",
            "--engine-arg",
            "api_key=sk-2",
            "--api-key",
            "sk-3",
            "--steps",
            "2",
        ],
        "metadata": {"note": "pass", "secret": ""},
    }
    out = redact(config)
    assert out["engine_args"] == {
        "url": "http://user:***@host:1",
        "api_key": REDACTED,
        "max_running_requests": 8,
    }
    assert out["trainer_args"] == {
        "hf_token": REDACTED,
        "lr": 1e-6,
        "db_password": REDACTED,
        "token": None,
        "key": 3,  # a number is not a credential
    }
    assert out["task_args"] == {"reward_key": "score", "max_tokens": 12, "credentials": REDACTED}
    assert out["command"] == [
        "april-bench",
        "run",
        "--engine-arg",
        "api_key=***",
        "--api-key",
        "***",
        "--steps",
        "2",
    ]
    assert out["metadata"] == {"note": "pass", "secret": ""}  # an unset secret still reads unset
    assert "sk-" not in json.dumps(out) and "hf_abc" not in json.dumps(out)
    assert sorted(redacted_fields(out)) == [
        "command[3]",
        "command[5]",
        "engine_args.api_key",
        "engine_args.url",
        "task_args.credentials",
        "trainer_args.db_password",
        "trainer_args.hf_token",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "DB_PASSWD",
        "MY_PWD",
        "CUDA_PASSWORD",
        "X_SECRET",
        "HF_TOKEN",
        "WANDB_API_KEY",
        "AWS_CREDENTIALS",
        "sglang_auth",
    ],
)
def test_the_environment_filter_matches_secret_names_by_pattern(name: str) -> None:
    assert is_secret_env(name)
    environ = {name: "s3cr3t", "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "4"}
    environ[f"VLLM_{name}"] = "s3cr3t"
    environ[f"CUDA_{name}"] = "s3cr3t"
    assert result_environment(environ) == {"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "4"}


@pytest.mark.parametrize(
    "name",
    [
        "max_tokens",
        "reward_key",
        "prompt_tokens",
        "bypass_cache",
        "passes",
        "steps",
        "t_first_token",
        "prefill_s_per_token",
        "per_kv_token",
        "chars_per_token",
        "eos_token",
        "sort_key",
        "key",
    ],
)
def test_settings_that_are_not_secrets_are_kept(name: str) -> None:
    """Token counts and times (``t_first_token`` is in checkpoints and summaries) are never redacted."""
    assert not is_secret_setting(name)
    assert redact({name: "5"}) == {name: "5"}


def test_trackers_never_get_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from april_bench.results import trackers

    seen: list[Any] = []

    class Recording:
        def __init__(self, options: Any, config: Any, provenance: Any) -> None:
            seen.append((config, provenance))

    monkeypatch.setattr(trackers, "TRACKERS", {"rec": ("json", "json", Recording)})
    trackers.open_trackers(
        ["rec"],
        inner=None,
        out=tmp_path,
        config={"engine_args": {"url": "http://u:pw@h:1", "api_key": "sk-9"}},
        provenance={"command": ["run", "--engine-url", "http://u:pw@h:1"]},
    )
    assert "pw" not in json.dumps(seen) and "sk-9" not in json.dumps(seen)
    assert seen[0][0]["engine_args"]["url"] == "http://u:***@h:1"


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_url_and_an_api_key_appear_nowhere_and_a_dead_server_fails_in_seconds(
    tmp_path: Path, capsys
) -> None:
    """The issue's probe: the URL's password and the api_key reach no message, status.json, config.json,
    config.yaml or provenance.json; nothing listens at the URL, so the run stops within seconds (not
    the 900 s launch timeout), naming the redacted URL."""
    from april_bench.engines.sglang.engine import ATTACH_REFUSED_S

    port = _dead_port()
    url = f"http://user:hunter2@127.0.0.1:{port}"
    out = tmp_path / "run"
    argv = ["run", "--engine", "sglang", "--engine-url", url, "--engine-arg", "api_key=sk-hunter3"]
    assert main([*argv, "--steps", "1", "--no-progress", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"http://user:***@127.0.0.1:{port}" in err and f"{ATTACH_REFUSED_S:g} s" in err, err
    assert "hunter" not in err
    for path in out.iterdir():
        assert "hunter" not in path.read_text(), path
    assert json.loads((out / "config.json").read_text())["engine_args"]["api_key"] == REDACTED
    assert "hunter" not in json.dumps(json.loads((out / "provenance.json").read_text()))
    assert json.loads((out / "status.json").read_text())["state"] == "failed"


def test_a_run_whose_config_holds_redacted_secrets_is_refused_on_resume(tmp_path: Path, capsys) -> None:
    from helpers import sim_flags

    out = tmp_path / "run"
    assert main(["run", *sim_flags(steps=1, strategies="sync"), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    config["engine_args"]["api_key"] = REDACTED
    (out / "config.json").write_text(json.dumps(config))
    status = json.loads((out / "status.json").read_text())
    status["state"] = "interrupted"
    (out / "status.json").write_text(json.dumps(status))
    capsys.readouterr()
    assert main(["run", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert "engine_args.api_key redacted" in err and "Traceback" not in err


def test_attaching_vllm_where_nothing_listens_fails_at_once_naming_the_redacted_url() -> None:
    import asyncio

    from april_bench.engines.protocol import EngineError
    from april_bench.engines.vllm.server import VLLMServerEngine

    port = _dead_port()
    engine = VLLMServerEngine.Config(url=f"http://user:hunter2@127.0.0.1:{port}").build()
    with pytest.raises(EngineError) as caught:  # at the first refused connection: no retry loop
        asyncio.run(engine.start())
    assert f"http://user:***@127.0.0.1:{port}" in redact_text(str(caught.value))
