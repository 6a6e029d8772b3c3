"""Bounded execution shared by the graders: a wall-clock limit that works from any thread.

math-verify's own timeouts use ``SIGALRM``, which only works in the main thread, and a signal cannot stop a
long C-level operation anyway. Instead, :func:`call_bounded` runs the work in a short-lived daemon thread
and waits for it with a deadline; on expiry the caller gets the default at once and the worker is asked to
stop with an asynchronous exception (delivered at its next Python bytecode). That interrupts sympy's
pure-Python loops, but not one long C call holding the GIL (a huge integer power, a catastrophic regex), so
the graders also cap input sizes and screen expressions before sympy sees them.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

THINK_END = "</think>"

DEFAULT_TIMEOUT_S = 3.0
"""Wall-clock budget for one sympy/math-verify grading call (DeepMath used 3 s inside math-verify)."""


class GradingTimeout(BaseException):
    """Raised asynchronously inside an overdue worker.

    A ``BaseException`` on purpose: math-verify and sympy wrap their work in ``except Exception`` blocks
    that would otherwise swallow the interrupt and carry on.
    """


def _interrupt(thread: threading.Thread) -> None:
    """Ask ``thread`` to raise :class:`GradingTimeout` at its next bytecode (best effort)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(GradingTimeout)
        )


def call_bounded(fn: Callable[..., T], /, *args: object, timeout_s: float, default: T) -> T:
    """Return ``fn(*args)``, or ``default`` if it raises anything or takes longer than ``timeout_s``.

    Works from any thread (no signals). Never raises.
    """
    lock = threading.Lock()
    done = threading.Event()
    state = {"running": True}
    box: list[T] = []

    def worker() -> None:
        # The caller sends the interrupt only while holding ``lock`` and while "running" is set, so a late
        # interrupt always lands inside this outer try, never in threading's machinery.
        try:
            try:
                value, ok = fn(*args), True
            except BaseException:
                value, ok = default, False
            with lock:
                state["running"] = False
                if ok:
                    box.append(value)
        except BaseException:
            pass
        finally:
            done.set()

    thread = threading.Thread(target=worker, name="april-bench-grader", daemon=True)
    thread.start()
    if not done.wait(timeout_s):
        with lock:
            if state["running"]:
                state["running"] = False
                _interrupt(thread)
                return default
    return box[0] if box else default


_NOISY_LOGGERS = ("math_verify", "latex2sympy2_extended", "pylatexenc")
"""Loggers that report expected failures (e.g. math-verify's "timeout is disabled" notice) at WARNING."""

_quiet_lock = threading.Lock()
_quiet_depth = 0
_saved_levels: dict[str, int] = {}


@contextlib.contextmanager
def quiet_loggers() -> Iterator[None]:
    """Raise the grading libraries' loggers to ERROR for the duration.

    Reference-counted, so overlapping calls from several threads restore the original levels exactly
    once, when the last one leaves.
    """
    global _quiet_depth
    with _quiet_lock:
        if _quiet_depth == 0:
            for name in _NOISY_LOGGERS:
                logger = logging.getLogger(name)
                _saved_levels[name] = logger.level
                logger.setLevel(logging.ERROR)
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                for name, level in _saved_levels.items():
                    logging.getLogger(name).setLevel(level)
                _saved_levels.clear()


def as_text(value: object) -> str | None:
    """Coerce a response/reference to ``str`` (upstream graders call ``str()`` on labels); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:
        return None


def after_think(response: str) -> str | None:
    """The text after the last ``</think>`` (what the thinking-model graders look at), or None without one."""
    cut = response.rfind(THINK_END)
    return None if cut < 0 else response[cut + len(THINK_END) :]
