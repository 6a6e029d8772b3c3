"""``--help`` teaches: every flag names its default, the trainer list is the registry's, every command and
argument has help, engines say whether they are installed, case slips get a "did you mean"."""

from __future__ import annotations

import argparse

import pytest

from april_bench.cli import build_parser, main, prog_name


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _parsers(parser: argparse.ArgumentParser):  # type: ignore[no-untyped-def]
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_flag_of_every_command_names_its_default() -> None:
    checked = 0
    for parser in _parsers(build_parser()):
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert "default" in str(action.help).lower(), (parser.prog, action.option_strings)
            checked += 1
    assert checked > 100


def test_run_help_matches_what_a_run_does(capsys: pytest.CaptureFixture[str]) -> None:
    from april_bench.recipes import recipe_for
    from april_bench.trainers.registry import TRAINERS

    helps = {a.dest: str(a.help) for a in _subparser("run")._actions}
    assert all(name in helps["trainer"] for name in TRAINERS.names())
    assert f"default: {recipe_for('cpu').block_steps} on cpu" in helps["block_steps"]
    assert f"default: {recipe_for('cpu').steps} on cpu, {recipe_for('h100').steps} on a GPU" in helps["steps"]
    assert main(["run", "--help"]) == 0
    assert "==SUPPRESS==" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "dests"),
    [
        ("ls", ["what"]),
        ("report", ["run_dir", "allow_incomplete"]),
        ("compare", ["base", "new", "gains", "json", "fail", "allow_incomplete"]),
    ],
)
def test_every_command_argument_has_help(command: str, dests: list[str]) -> None:
    parser = _subparser(command)
    assert parser.description
    helps = {a.dest: a.help for a in parser._actions}
    for dest in dests:
        assert helps[dest], dest
    if command == "compare":
        assert "end_to_end" in str(helps["gains"]) and "trained tokens" in str(helps["gains"])


def test_ls_engines_says_which_are_installed_here(capsys: pytest.CaptureFixture[str]) -> None:
    from april_bench.engines import ENGINES

    assert main(["ls", "engines"]) == 0
    out = capsys.readouterr().out
    assert sum("installed here" in line for line in out.splitlines()) == len(ENGINES.names())
    assert "hf " in out and out.split("hf ", 1)[1].splitlines()[1].strip() == "installed here"


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["--strategies", "sync,APRIL"], "Did you mean: april?"),
        (["--hw", "MI300X"], "Did you mean: mi300x?"),
        (["--algo", "DAPO"], "Did you mean: dapo?"),
        (["--model", "Qwen3-4B", "--engine", "sim"], "Did you mean: qwen3-4b?"),
    ],
)
def test_case_slips_get_a_did_you_mean(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", *argv]) == 2
    err = capsys.readouterr().err
    assert hint in err and len(err.strip().splitlines()) == 1


def test_the_program_name_is_the_one_invoked() -> None:
    assert prog_name("/venv/bin/april-bench") == "april-bench"
    assert prog_name("/src/april_bench/__main__.py") == "python -m april_bench"


def test_ls_lists_each_components_options_from_its_config(capsys: pytest.CaptureFixture[str]) -> None:
    """`ls engines` / `ls trainers` print the options each component parses, read from its Config: what
    another flag sets is left out, what the run decides says so, a composite names where the rest go."""
    from april_bench.engines import ENGINES
    from april_bench.registry import load

    assert main(["ls", "engines"]) == 0
    out = capsys.readouterr().out
    sim = out.split("\n  sim ", 1)[1].split("\n  hf ", 1)[0]
    assert "      max_running_requests: " in sim and "      hardware:" not in sim  # --hw sets it
    hf = out.split("\n  hf ", 1)[1].split("\n  fake ", 1)[0]
    assert "      seed: " in hf and "unless given, the run's seed" in hf
    pool = out.split("\n  fake-pool ", 1)[1].split("\n  sglang ", 1)[0]
    assert "      chaos_seed: " in pool and "      faults:" not in pool  # FaultOptions, flat
    assert "+ any other option goes to each fake replica" in pool

    # what is listed is what parse_options takes: a listed name is known, a name not listed is not
    hf_spec = ENGINES.get("hf")
    listed = set(hf_spec.option_help())
    fields = set(load(str(hf_spec.config)).field_help())
    assert listed == fields - {"model"}
    with pytest.raises(Exception, match="--engine-arg model is set by --model"):
        hf_spec.parse_options({"model": "tiny"})

    assert main(["ls", "trainers"]) == 0
    out = capsys.readouterr().out
    assert "      mini_batches: optimizer steps per rollout step" in out
    assert "      world_size: " in out.split("\n  fsdp ", 1)[1].split("\n  megatron ", 1)[0]
    assert "(no options: its flags set it)" in out.split("\n  sim ", 1)[1]


def test_component_arg_help_points_at_ls() -> None:
    run = _subparser("run")
    helps = {a.dest: str(a.help) for a in run._actions}
    assert "`ls engines` lists each engine's options" in helps["engine_arg"]
    assert "`ls trainers` lists each trainer's options" in helps["trainer_arg"]
