"""A run claims only the data it reads: named data sets need a model that reads them, evaluation sets are
evaluated or refused, and hub ids resolve through the local Hugging Face cache (offline: one line)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from april_bench.cli import main


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    return err


def test_a_data_set_name_on_a_random_weights_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["run", "--dataset", "deepscaler", "--steps", "2", "--no-progress", "--out", str(out)]
    err = _fails(capsys, argv, "--dataset deepscaler needs a model that can read it")
    assert "--engine sim" in err and "--data-path deepscaler=" in err  # the fixes are named
    assert not out.exists()  # nothing written under the data set's name
    _fails(capsys, ["validate", "--dataset", "dapo-math-17k"], "needs a model that can read it")


def test_the_simulator_takes_a_data_sets_length_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--engine", "sim", "--dataset", "deepscaler", "--steps", "2"]) == 0
    assert "sim engine" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--eval-datasets", "aime-2024"], "the synthetic task evaluates its own"),
        (["--hw", "mi300x", "--eval-datasets", "math-500"], "the simulator has no accuracy"),
    ],
)
def test_eval_datasets_a_run_cannot_evaluate_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _fails(capsys, ["validate", *argv], message)
    assert "drop --eval-datasets" in err


def _cache_with(model_dir: Path, cache: Path, repo: str) -> Path:
    """A Hugging Face hub cache holding ``repo`` at revision main, laid out as ``hf download`` leaves it."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    snapshot = folder / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_hub_id_resolves_through_the_local_cache(
    hub_cache: Path, tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from april_bench.hub import is_hub_id, resolve_model
    from april_bench.models.checkpoint import make_tiny_checkpoint

    snapshot = _cache_with(make_tiny_checkpoint(tmp_path / "tiny"), hub_cache, "april-test/tiny-qwen")
    assert is_hub_id("april-test/tiny-qwen") and not is_hub_id("tiny") and not is_hub_id("./a/b")
    assert Path(resolve_model("april-test/tiny-qwen")) == snapshot
    data = f"deepscaler={shared_data / 'deepscaler' / 'sample.jsonl'}"
    argv = ["validate", "--engine", "hf", "--model", "april-test/tiny-qwen", "--dataset", "deepscaler"]
    assert main([*argv, "--data-path", data]) == 0, capsys.readouterr().err
    assert "math task on deepscaler" in capsys.readouterr().out


def test_a_hub_id_missing_offline_is_one_line(hub_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", "--engine", "hf", "--model", "april-test/absent", "--dataset", "deepscaler"]
    err = _fails(capsys, argv, "--model april-test/absent: not in the local Hugging Face cache")
    assert "HF_HUB_OFFLINE" in err
