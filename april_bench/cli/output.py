"""Where the command line's diagnostics go: the ``april_bench`` logger, to standard error.

Tables and the closing JSON line go to standard output with ``print`` (they are the product, and a
pipe reads them); everything said along the way (notes, the engine chosen, resume lines, warnings) is
logged, so ``--log-level warning`` (or ``APRIL_BENCH_LOG_LEVEL``) quiets it.  Progress bars are drawn
only on a terminal: a log file or CI gets no control characters.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

__all__ = ["LEVELS", "echo", "setup"]

LEVELS = ("debug", "info", "warning", "error")
#: The environment variable a user sets once instead of passing ``--log-level`` every time.
ENV = "APRIL_BENCH_LOG_LEVEL"
log = logging.getLogger("april_bench")


class _Stderr(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (a test's capture, a redirect)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def setup(args: argparse.Namespace) -> None:
    """Set the ``april_bench`` logger's level from ``--log-level``, else ``APRIL_BENCH_LOG_LEVEL``, else
    info; raise ConfigError for an unknown level in the environment (the flag's choices are argparse's)."""
    from april_bench.config import ConfigError

    level = getattr(args, "log_level", None) or os.environ.get(ENV, "").strip().lower() or "info"
    if level not in LEVELS:
        raise ConfigError(f"{ENV}={level!r}: choose one of {', '.join(LEVELS)}")
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False  # the command line owns its output; a library caller configures its own
    if getattr(args, "no_progress", None) is False and not sys.stderr.isatty():
        args.no_progress = True  # bars only on a terminal


def echo(line: str) -> None:
    """One line said along the way (not a result): logged at info, credentials redacted."""
    from april_bench.redact import redact_text

    log.info(redact_text(line))
