"""Reference runs: anything written under the checkout's ``results/`` is committed as evidence, so its
provenance must name a commit that holds exactly the code that produced it.  Every command that writes
there (``run``, ``run --resume``, ``ablate``, ``plot --out``, ``eval --out``) checks this first."""

from __future__ import annotations

from pathlib import Path

from april_bench.config import ConfigError

__all__ = ["check_reference_output"]


def check_reference_output(out: Path | None, *, allow_dirty: bool) -> None:
    """Refuse to write ``out`` under ``results/`` from a checkout with uncommitted changes (untracked,
    not gitignored files included; ``out`` itself excluded) unless ``allow_dirty``."""
    from april_bench.results import provenance

    root = provenance.source_root()
    if out is None or root is None or allow_dirty:
        return
    try:
        target = Path(out).expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # a symbolic link loop (RuntimeError before Python 3.13)
        raise ConfigError(f"--out {out} cannot be resolved ({exc}); choose another --out") from None
    if not target.is_relative_to((root / "results").resolve()):
        return
    if provenance.git_info(root, exclude=target).get("dirty"):
        raise ConfigError(
            f"{out} is a reference run under results/ but the checkout has uncommitted changes (untracked "
            "files count): commit them first, or pass --allow-dirty"
        )
