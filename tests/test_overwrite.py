"""``--overwrite`` removes only what a run wrote (issue 32, item 1).

A run directory starts with a manifest (:mod:`april_bench.fsio`) that lists every name the run writes;
``--overwrite`` (``run``, ``ablate``, ``simcheck``, ``whatif``) removes those and refuses, with one line
naming the first file, a directory holding anything else.  Run directories made before manifests
(the committed ``results/``) are recognised by their status or provenance, and only a run's file names
are removed from them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import one_error, sim_flags

from april_bench.cli import main
from april_bench.config import ConfigError
from april_bench.fsio import MANIFEST_NAME, read_manifest, record, start_manifest
from april_bench.results.rundir import claim_run_dir, clear_run_dir

REPO = Path(__file__).resolve().parents[1]
SIM = sim_flags(engine="sim", steps=2, over_sampling_batch_size=None)


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` with its content (links by their target)."""
    out: dict[str, bytes] = {}
    for root, dirs, files in os.walk(path):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            p = Path(root) / name
            key = str(p.relative_to(path))
            out[key] = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
    return out


def _user_dir(path: Path) -> Path:
    path.mkdir()
    (path / "thesis.tex").write_text("t\n")
    (path / "README.md").write_text("r\n")
    return path


# ---------------------------------------------------------------- a user's directory is never emptied


@pytest.mark.parametrize("overwrite", [True, False])
def test_a_directory_of_user_files_is_refused_naming_the_first_file(
    tmp_path: Path, capsys, overwrite: bool
) -> None:
    """The issue's repro: ``run --out u --overwrite`` on thesis.tex and README.md deletes neither."""
    out = _user_dir(tmp_path / "u")
    before = _tree(out)
    capsys.readouterr()
    assert main(["run", *SIM, "--out", str(out), *(["--overwrite"] if overwrite else [])]) == 2
    line = one_error(capsys.readouterr().err)
    assert f"{out}/README.md" in line if overwrite else "README.md" in line
    assert "did not write" in line or "not written by april-bench" in line
    assert "--overwrite" not in line.split(";")[-1] or not overwrite  # never suggested for a user's files
    assert _tree(out) == before


@pytest.mark.parametrize(
    "command",
    [
        ["ablate", "--hw", "h100", "--steps", "2", "--no-progress", "--strategies", "sync,april"],
        ["whatif", "example", "--hw", "h100", "--steps", "2", "--no-progress"],
        ["simcheck", "--engine", "fake", "--steps", "2", "--no-progress"],
    ],
    ids=["ablate", "whatif", "simcheck"],
)
def test_every_command_with_overwrite_keeps_a_users_files(tmp_path: Path, capsys, command: list[str]) -> None:
    out = _user_dir(tmp_path / "u")
    before = _tree(out)
    capsys.readouterr()
    assert main([*command, "--out", str(out), "--overwrite"]) == 2
    line = one_error(capsys.readouterr().err)
    assert "README.md" in line
    assert _tree(out) == before


# ---------------------------------------------------------------- a run's own directory is replaced


def test_overwrite_replaces_a_run_and_refuses_once_a_foreign_file_is_added(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", *SIM, "--out", str(out)]) == 0
    manifest = read_manifest(out)
    assert manifest is not None and manifest.kind == "run"
    assert {"status.json", "config.json", "provenance.json", "summary.json", "state"} <= manifest.names
    # every entry of the directory is the run's: listed, or its lock and manifest
    assert set(os.listdir(out)) - manifest.names <= {".lock", MANIFEST_NAME}
    (out / "state" / "old-r0-s9.json").write_text("{}")  # an old checkpoint: never resumed from
    assert main(["run", *SIM, "--out", str(out), "--overwrite"]) == 0
    assert not (out / "state" / "old-r0-s9.json").exists()
    assert json.loads((out / "status.json").read_text())["state"] == "complete"

    (out / "notes.txt").write_text("mine")
    before = _tree(out)
    capsys.readouterr()
    assert main(["run", *SIM, "--out", str(out), "--overwrite"]) == 2
    assert f"{out}/notes.txt" in one_error(capsys.readouterr().err)
    assert _tree(out) == before  # refused before anything was removed


def test_a_users_file_inside_the_state_directory_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    claim_run_dir(out, default_name="x")
    (out / "status.json").write_text('{"state": "complete"}')
    record(out / "status.json")
    (out / "state").mkdir()
    record(out / "state" / "a-r0-s1.json")
    (out / "state" / "a-r0-s1.json").write_text("{}")
    (out / "state" / "diary.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"state/diary\.txt"):
        clear_run_dir(out)
    assert (out / "state" / "a-r0-s1.json").exists()


def test_an_ablation_is_replaced_with_its_mode_runs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "abl"
    argv = ["ablate", *sim_flags(steps=2, over_sampling_batch_size=None), "--strategies", "sync,april"]
    argv += ["--ratios", "2", "--spans", "none", "--drivers", "none"]
    assert main([*argv, "--out", str(out)]) == 0
    manifest = read_manifest(out)
    assert manifest is not None and manifest.kind == "ablate"
    mode = next(p for p in out.iterdir() if p.is_dir())
    assert mode.name in manifest.names and read_manifest(mode) is not None  # a nested run, its own manifest
    (mode / "mine.csv").write_text("1,2\n")
    capsys.readouterr()
    assert main([*argv, "--out", str(out), "--overwrite"]) == 2
    assert f"{mode.name}/mine.csv" in one_error(capsys.readouterr().err)
    (mode / "mine.csv").unlink()
    assert main([*argv, "--out", str(out), "--overwrite"]) == 0
    assert (out / "ablation.json").exists()


def test_a_whatif_directory_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "wi"
    # two arms, no drivers: what is checked is the replacement, not the zoo (test_whatif.py replays it)
    argv = ["whatif", "example", "--hw", "h100", "--model", "qwen3-4b", "--gpus", "8", "--steps", "2"]
    argv += ["--strategies", "sync,april", "--drivers", "none"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    manifest = read_manifest(out)
    assert manifest is not None and manifest.kind == "whatif"
    assert {"whatif.json", "whatif.md"} <= manifest.names
    assert main([*argv, "--out", str(out), "--no-progress", "--overwrite"]) == 0


# ---------------------------------------------------------------- links and crafted manifests


def test_a_listed_link_is_unlinked_and_its_target_kept(tmp_path: Path) -> None:
    out = tmp_path / "r"
    claim_run_dir(out, default_name="x")
    precious = tmp_path / "precious.json"
    precious.write_text("keep")
    record(out / "summary.json")
    (out / "summary.json").symlink_to(precious)
    clear_run_dir(out)
    assert precious.read_text() == "keep" and not (out / "summary.json").is_symlink()


def test_a_state_link_to_a_users_directory_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    claim_run_dir(out, default_name="x")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "a.json").write_text("{}")
    record(out / "state" / "a-r0-s1.json")  # the run made state/
    (out / "state").symlink_to(theirs)
    with pytest.raises(ConfigError, match=r"r/state was not written"):
        clear_run_dir(out)
    assert (theirs / "a.json").read_text() == "{}"


def test_a_crafted_manifest_cannot_reach_outside_its_directory(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    start_manifest(out, "run")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    with (out / MANIFEST_NAME).open("a") as f:
        f.write('"../outside.txt"\n"/etc/passwd"\n"a/b"\n')
    manifest = read_manifest(out)
    assert manifest is not None and manifest.names == frozenset()
    clear_run_dir(out)
    assert outside.read_text() == "keep"


def test_a_manifest_that_is_a_link_is_not_a_manifest(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    real = tmp_path / "elsewhere"
    real.mkdir()
    start_manifest(real, "run")
    (out / MANIFEST_NAME).symlink_to(real / MANIFEST_NAME)
    (out / "README.md").write_text("mine")
    assert read_manifest(out) is None
    record(out / "README.md")  # never written through the link
    theirs = read_manifest(real)
    assert theirs is not None and "README.md" not in theirs.names
    with pytest.raises(ConfigError, match=r"README\.md"):
        clear_run_dir(out)


def test_an_empty_directory_or_one_holding_only_the_lock_is_claimed(tmp_path: Path) -> None:
    out = tmp_path / "e"
    out.mkdir()
    (out / ".lock").write_text("1\n")
    assert claim_run_dir(out, default_name="x") == out
    assert claim_run_dir(out, default_name="x") == out  # a claim leaves only lock and manifest


# ---------------------------------------------------------------- run directories made before manifests


def _committed(tmp_path: Path, rel: str) -> Path:
    target = tmp_path / Path(rel).name
    shutil.copytree(REPO / rel, target)
    assert read_manifest(target) is None
    return target


@pytest.mark.parametrize(
    "rel",
    [
        "results/runs/sim-mi300x-dapo-dapo-math-17k",
        "results/gates/ci-embedded-gate",
        "results/ablations/h100-dapo",
        "results/agent/sim-cpu-agent-grpo",
    ],
)
def test_a_committed_run_without_a_manifest_is_recognised_and_cleared(tmp_path: Path, rel: str) -> None:
    target = _committed(tmp_path, rel)
    clear_run_dir(target)
    assert os.listdir(target) == []


@pytest.mark.parametrize(
    ("rel", "foreign"),
    [
        ("results/validation/simcheck-hf-cpu", "load.txt"),
        ("results/whatif/hf-cpu-own-trace", "comparison.md"),
        ("results/ablations/embedded-cpu-accuracy", "README.md"),
    ],
)
def test_a_committed_run_with_a_hand_written_file_is_refused_whole(
    tmp_path: Path, rel: str, foreign: str
) -> None:
    target = _committed(tmp_path, rel)
    before = _tree(target)
    with pytest.raises(ConfigError, match=foreign):
        clear_run_dir(target)
    assert _tree(target) == before


def test_a_committed_run_is_overwritten_by_the_cli(tmp_path: Path) -> None:
    target = _committed(tmp_path, "results/runs/sim-mi300x-dapo-dapo-math-17k")
    assert main(["run", *SIM, "--out", str(target), "--overwrite"]) == 0
    manifest = read_manifest(target)
    assert manifest is not None and "summary.json" in manifest.names
    assert not (target / "state" / "april-r0-s30.json").exists()  # the old run's checkpoints are gone


def test_a_directory_that_merely_holds_a_config_json_is_not_a_run(tmp_path: Path) -> None:
    """Another tool's config.json is not a run's: without april-bench's status or provenance, nothing
    is recognised and nothing removed."""
    out = tmp_path / "other"
    out.mkdir()
    (out / "config.json").write_text('{"lr": 0.1}')
    (out / "provenance.json").write_text('{"author": "me"}')
    with pytest.raises(ConfigError, match=r"config\.json"):
        clear_run_dir(out)
    assert (out / "config.json").exists() and (out / "provenance.json").exists()
