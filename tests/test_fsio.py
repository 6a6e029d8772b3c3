"""Every write is to a regular file april-bench owns (issue 32, item 2).

One helper, :func:`april_bench.fsio.write_atomic`, writes every whole file (a unique temporary file
beside the target, fsync, validation, rename, directory fsync) and :func:`april_bench.fsio.open_append`
every streamed table.  Neither writes through a symbolic link or over a FIFO, a device or a directory;
the probes use a FIFO and links inside ``tmp_path``, never a system path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import one_error

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.fsio import open_append, write_atomic


def _specials(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a link to a file, a dangling link and a directory, each where a file would be written."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(victim)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    directory = tmp_path / "dir"
    directory.mkdir()
    return {"fifo": fifo, "link": link, "dangling": dangling, "dir": directory}


def _unchanged(tmp_path: Path) -> None:
    assert (tmp_path / "victim.txt").read_text() == "the user's file\n"
    assert not (tmp_path / "nowhere").exists()
    assert (tmp_path / "fifo").is_fifo()
    assert os.readlink(tmp_path / "link") == str(tmp_path / "victim.txt")
    assert list((tmp_path / "dir").iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left


def test_write_atomic_writes_text_bytes_and_streams_with_a_shared_mode(tmp_path: Path) -> None:
    write_atomic(tmp_path / "a.txt", "text é\n")
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    write_atomic(tmp_path / "c.bin", lambda f: f.write(b"streamed"))
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "text é\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "c.bin").read_bytes() == b"streamed"
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 != 0o600  # not mkstemp's private mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin", "c.bin"]


@pytest.mark.parametrize("kind", ["fifo", "link", "dangling", "dir"])
def test_write_atomic_never_writes_through_a_link_or_over_a_special_file(tmp_path: Path, kind: str) -> None:
    target = _specials(tmp_path)[kind]
    with pytest.raises(ConfigError, match="writes only regular files"):
        write_atomic(target, "x")
    _unchanged(tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "link", "dangling", "dir"])
def test_open_append_never_writes_through_a_link_or_into_a_special_file(tmp_path: Path, kind: str) -> None:
    target = _specials(tmp_path)[kind]
    with pytest.raises(ConfigError, match="writes only regular files"):
        open_append(target)
    _unchanged(tmp_path)


def test_a_write_that_does_not_validate_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "t.json"
    target.write_text("old\n")

    def refuse(path: Path) -> None:
        assert path != target and path.read_text() == "new\n"  # the temporary file is what is checked
        raise ConfigError("not valid")

    with pytest.raises(ConfigError, match="not valid"):
        write_atomic(target, "new\n", validate=refuse)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "t.bin"
    target.write_bytes(b"old")

    def broken(f: object) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(target, broken)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]


def test_config_yaml_and_trainer_state_are_written_through_the_same_helper(tmp_path: Path) -> None:
    import torch

    from april_bench.config_files import write_config_file
    from april_bench.experiment_config import ExperimentConfig
    from april_bench.trainers.state_file import save_atomic

    specials = _specials(tmp_path)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_config_file(specials["link"], ExperimentConfig())
    with pytest.raises(ConfigError, match="FIFO"):
        save_atomic({"w": torch.ones(1)}, specials["fifo"])
    _unchanged(tmp_path)


# ---------------------------------------------------------------- the trace writers


def _csv(tmp_path: Path, body: str = "step,response_length/mean\n1,400\n2,500\n") -> Path:
    path = tmp_path / "stats.csv"
    path.write_text(body)
    return path


_STATS = ["--groups-per-step", "2", "--samples-per-prompt", "2", "--max-response-len", "1000"]


@pytest.mark.parametrize("kind", ["fifo", "link", "dangling", "dir"])
def test_trace_import_to_a_fifo_or_a_link_is_refused_untouched(tmp_path: Path, capsys, kind: str) -> None:
    """The `-o /dev/null` probe, on a FIFO and links in tmp_path: one line, nothing replaced."""
    target = _specials(tmp_path)[kind]
    source = _csv(tmp_path)
    assert main(["trace", "import-stats", str(source), *_STATS, "-o", str(target)]) == 2
    line = one_error(capsys.readouterr().err)
    assert str(target) in line and "regular files" in line
    _unchanged(tmp_path)


def test_trace_export_to_a_link_is_refused(tmp_path: Path, capsys) -> None:
    target = _specials(tmp_path)["link"]
    assert main(["trace", "export", str(tmp_path / "no-run"), "-o", str(target)]) == 2
    assert "symbolic link" in one_error(capsys.readouterr().err)
    _unchanged(tmp_path)


def test_a_failed_import_names_the_inputs_line_and_keeps_the_old_output(tmp_path: Path, capsys) -> None:
    out = tmp_path / "trace.jsonl"
    out.write_text("the previous trace\n")
    source = _csv(tmp_path, "step,response_length/mean\n1,400\n2,500\n1,450\n")  # step 1 twice
    assert main(["trace", "import-stats", str(source), *_STATS, "-o", str(out)]) == 2
    line = one_error(capsys.readouterr().err)
    assert f"{source}, line 4" in line and "repeats" in line and "line 2" in line, line
    assert out.read_text() == "the previous trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.csv", "trace.jsonl"]


def test_a_verl_step_below_zero_is_named_by_the_dump_line(tmp_path: Path, capsys) -> None:
    dump = tmp_path / "verl"
    dump.mkdir()
    rows = [
        {"input": "p", "output": "a b", "score": 1.0, "step": 1},
        {"input": "q", "output": "c", "score": 0},
    ]
    rows[1]["step"] = -3
    (dump / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "t.jsonl"
    assert main(["trace", "import-verl", str(dump), "-o", str(out)]) == 2
    line = one_error(capsys.readouterr().err)
    assert f"{dump / '1.jsonl'}, line 2" in line and "step" in line, line
    assert not out.exists()


def test_a_streamed_table_in_a_resumed_run_is_never_appended_through_a_link(tmp_path: Path) -> None:
    from april_bench.results.store import RunWriter

    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    (run / "steps.jsonl").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        RunWriter(run)
    assert victim.read_text() == "the user's file\n"


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tmp_path: Path, capsys) -> None:
    """The probe: `run --resume` on a directory whose `.lock` links to a user's file truncated it."""
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    (run / ".lock").symlink_to(victim)
    assert main(["run", "--resume", str(run)]) == 2
    assert "cannot lock run directory" in one_error(capsys.readouterr().err)
    assert victim.read_text() == "the user's file\n"


class _Weights:
    """A module's ``save_pretrained`` stand-in: one safetensors file; ``fail_after`` bytes in, it raises
    (an interruption mid-write)."""

    def __init__(self, value: float, *, fail_after: int | None = None) -> None:
        self.value = value
        self.fail_after = fail_after

    def save_pretrained(self, directory: Path) -> None:
        import torch
        from safetensors.torch import save_file

        target = Path(directory) / "model.safetensors"
        save_file({"w": torch.full((4,), self.value)}, str(target))
        (Path(directory) / "config.json").write_text(json.dumps({"value": self.value}) + "\n")
        if self.fail_after is not None:
            with open(target, "r+b") as f:
                f.truncate(self.fail_after)  # half the weights on disk ...
            raise OSError("disk full")  # ... and the write stops


def test_an_interrupted_checkpoint_save_leaves_the_old_checkpoint_loadable(tmp_path: Path) -> None:
    import torch

    from april_bench.models.checkpoint import load_state_dict, save_state_dict

    path = tmp_path / "state" / "policy"
    save_state_dict(_Weights(1.0), path)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="disk full"):
        save_state_dict(_Weights(2.0, fail_after=10), path)  # type: ignore[arg-type]
    assert torch.equal(load_state_dict(path)["w"], torch.full((4,), 1.0))
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy"]  # no temporary left behind
    save_state_dict(_Weights(3.0), path)  # type: ignore[arg-type]
    assert torch.equal(load_state_dict(path)["w"], torch.full((4,), 3.0))
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy"]  # the old one removed once replaced


def test_a_failed_swap_puts_the_old_checkpoint_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from april_bench import fsio

    path = tmp_path / "ckpt"
    fsio.replace_dir_atomic(path, lambda d: (d / "weights").write_text("old"))
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        if Path(str(dst)) == path and ".old." not in str(src):  # the new one's rename into place fails
            raise OSError("interrupted")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(fsio.os, "replace", replace)
    with pytest.raises(OSError, match="interrupted"):
        fsio.replace_dir_atomic(path, lambda d: (d / "weights").write_text("new"))
    monkeypatch.undo()
    assert (path / "weights").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.parametrize("kind", ["fifo", "link", "dangling"])
def test_a_checkpoint_never_replaces_a_link_or_a_special_file(tmp_path: Path, kind: str) -> None:
    from april_bench.fsio import replace_dir_atomic

    target = _specials(tmp_path)[kind]
    with pytest.raises(ConfigError, match="not a directory"):
        replace_dir_atomic(target, lambda d: (d / "weights").write_text("x"))
    _unchanged(tmp_path)
