"""``plot`` (a run's figures) and ``paper`` (the README's tables and figures from the committed runs)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "cmd_paper", "cmd_plot", "find_runs"]


def add_parsers(sub: Any) -> None:
    plot = sub.add_parser(
        "plot",
        help="draw a run's figures (occupancy, throughput, lengths, accuracy, versions) as PNGs",
        description="Figures are pure functions of the runs' rows; each title says MEASURED or SIMULATED.",
    )
    plot.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories")
    plot.add_argument(
        "--out", type=Path, default=None, help="write DIR/<run name>/*.pdf and *.png (default: RUN/figures/)"
    )
    plot.add_argument(
        "--allow-incomplete", action="store_true", help="draw an interrupted or inconsistent run too (noted)"
    )
    plot.add_argument(
        "--allow-dirty", action="store_true", help="write figures under results/ from uncommitted code"
    )
    plot.set_defaults(handler=cmd_plot)
    paper = sub.add_parser(
        "paper",
        help="regenerate the README's and docs/results.md's tables and figures from committed runs",
        description="Write paper tables (Markdown, LaTeX, CSV) and figures for every run under --runs, "
        "and rewrite the README between <!-- paper:table:start/end --> and "
        "<!-- paper:figures:start/end --> markers.",
    )
    paper.add_argument("--runs", type=Path, default=Path("results/runs"), help="folder of run directories")
    paper.add_argument("--out", type=Path, default=Path("docs/figures"), help="where tables and figures go")
    paper.add_argument(
        "--readme",
        type=Path,
        action="append",
        default=None,
        metavar="FILE",
        help="a Markdown file with <!-- paper:table|figures:start/end --> markers, rewritten between them "
        "(repeatable; default: README.md, which holds the table, and docs/results.md, which holds both)",
    )
    paper.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the README or the tables are stale or a figure is missing (for CI)",
    )
    paper.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="include interrupted or inconsistent runs (their rows are marked 'incomplete' in the tables)",
    )
    paper.set_defaults(handler=cmd_paper)


def find_runs(folder: Path) -> list[Path]:
    """Run directories directly under ``folder`` (those with a ``config.json``), sorted by name."""
    from april_bench.config import ConfigError

    if not folder.is_dir():
        raise ConfigError(f"--runs {folder} is not a directory; point it at a folder of run directories")
    runs = sorted(p for p in folder.iterdir() if (p / "config.json").is_file())
    if not runs:
        raise ConfigError(
            f"no run directories under {folder}; make one with `python -m april_bench run --out`"
        )
    return runs


def _require_plotting() -> None:
    """The figures need pandas, matplotlib and seaborn (core dependencies); an environment that lost one
    gets one line naming the install, not a traceback."""
    import importlib.util

    from april_bench.config import ConfigError

    missing = [name for name in ("pandas", "matplotlib", "seaborn") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"figures need {', '.join(missing)}, which april-bench installs: reinstall it (pip install -e .)"
        )


def _load_checked(
    dirs: Sequence[Path], *, allow_incomplete: bool = False, doing: str = "use it"
) -> list[Any]:
    """Load runs, refusing any that is incomplete or whose rows do not add up or repeat (its numbers
    would be wrong) unless ``allow_incomplete``."""
    from april_bench.results.fitness import check_fit
    from april_bench.results.store import load_run

    runs = []
    for path in dirs:
        run = load_run(path)
        for note in check_fit(run, allow_incomplete=allow_incomplete, doing=doing):
            print(f"note: {path}: {note}", file=sys.stderr)
        runs.append(run)
    return runs


def cmd_plot(args: argparse.Namespace) -> int:
    from april_bench.results.figures import save_figures
    from april_bench.results.frames import frames_of, one_run
    from april_bench.results.reference import check_reference_output

    check_reference_output(args.out, allow_dirty=args.allow_dirty)
    _require_plotting()
    runs = _load_checked(args.runs, allow_incomplete=args.allow_incomplete, doing="plot it")
    tables = frames_of(runs)
    for run in runs:
        out = run.path / "figures" if args.out is None else args.out / run.path.name
        for path in save_figures(one_run(tables, run.path.name), out):
            print(path)
    return 0


def cmd_paper(args: argparse.Namespace) -> int:
    from april_bench.fsio import write_atomic
    from april_bench.results.figures import figure_names, save_figures
    from april_bench.results.frames import frames_of, one_run
    from april_bench.results.paper import (
        marked_sections,
        paper_tables,
        render_paper_markdown,
        replace_sections,
    )

    _require_plotting()
    runs = _load_checked(
        find_runs(args.runs), allow_incomplete=args.allow_incomplete, doing="put it in the paper tables"
    )
    paper = paper_tables(runs)
    files = _table_files(paper, args.out)
    long_tables = frames_of(runs)
    per_run = {run.path.name: one_run(long_tables, run.path.name) for run in runs}
    figures = {
        name: [args.out / name / f"{figure}.png" for figure in figure_names(tables)]
        for name, tables in per_run.items()
    }
    readmes = args.readme or [Path("README.md"), Path("docs/results.md")]
    rewritten: dict[Path, tuple[str | None, str | None]] = {}  # file -> (text now, text it should have)
    for readme in readmes:
        readme_text = readme.read_text() if readme.is_file() else None
        new_readme = None
        if readme_text is not None and marked_sections(readme_text):
            sections = {
                "table": render_paper_markdown(paper),
                "figures": _figure_links(runs, figures, readme.parent),
            }
            new_readme = replace_sections(readme_text, sections)
        else:
            print(
                f"note: {readme} has no <!-- paper:table:start --> markers; it is left as it is",
                file=sys.stderr,
            )
        rewritten[readme] = (readme_text, new_readme)
    if args.check:
        return _check(files, figures, rewritten)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
        print(path)
    for name, tables in per_run.items():
        for path in save_figures(tables, args.out / name):
            print(path)
    for readme, (readme_text, new_readme) in rewritten.items():
        if new_readme is not None and new_readme != readme_text:
            write_atomic(readme, new_readme)
            print(f"{readme} updated")
    return 0


def _table_files(tables: Sequence[Any], out: Path) -> dict[Path, str]:
    from april_bench.results.paper import render_csv, render_latex, render_paper_markdown

    files: dict[Path, str] = {}
    for table in tables:
        stem = out / f"paper-{table.result_kind}"
        files[stem.with_suffix(".md")] = render_paper_markdown([table]) + "\n"
        files[stem.with_suffix(".tex")] = render_latex(table) + "\n"
        files[stem.with_suffix(".csv")] = render_csv(table)
    return files


def _figure_links(runs: Sequence[Any], figures: Mapping[str, Sequence[Path]], base: Path) -> str:
    """Per run, its kind and name, then its figures as images linked relative to the README."""
    parts = []
    for run in runs:
        kind = "SIMULATED" if run.simulated else "MEASURED"
        images = [
            f"![{kind}: {p.stem} ({run.path.name})]({Path(os.path.relpath(p, base)).as_posix()})"
            for p in figures[run.path.name]
        ]
        parts.append(f"**{kind}: {run.path.name}**\n\n" + "\n".join(images))
    return "\n\n".join(parts)


def _check(
    files: Mapping[Path, str],
    figures: Mapping[str, Sequence[Path]],
    rewritten: Mapping[Path, tuple[str | None, str | None]],
) -> int:
    """Exit status 1 and one line per stale file; figures are checked for presence only (their pixels
    depend on the installed fonts and matplotlib)."""
    stale = [str(path) for path, text in files.items() if not path.is_file() or path.read_text() != text]
    stale += [
        f"{path} (missing)"
        for paths in figures.values()
        for png in paths
        for path in (png.with_suffix(".pdf"), png)  # the vector copy for papers, the PNG for the README
        if not path.is_file()
    ]
    stale += [str(readme) for readme, (now, new) in rewritten.items() if new is not None and new != now]
    if stale:
        print(
            f"stale: {', '.join(stale)}; regenerate with `python -m april_bench paper` and commit",
            file=sys.stderr,
        )
        return 1
    print("paper tables, figures and README are up to date")
    return 0
