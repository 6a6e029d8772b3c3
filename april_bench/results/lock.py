"""One process per run directory: an exclusive ``flock`` on ``<run>/.lock`` held for the whole run.

``run`` and ``run --resume`` take the lock before they look at or write anything in the directory, and
keep it until they exit.  A second process that finds it taken stops with one line naming the holder's
pid.  The kernel drops a ``flock`` when its holder dies (SIGKILL, a power cut reboots anyway), so a lock
left by a killed run never blocks the next ``--resume``: there is no stale lock to clean up.

The lock file's content (the holder's pid) is informational only; the lock is the ``flock`` itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path
from types import TracebackType

from april_bench.config import ConfigError

__all__ = ["LOCK_NAME", "RunLock"]

#: The lock file inside a run directory (a dot file: readers never see it as a run file; kept by
#: ``--overwrite``).
LOCK_NAME = ".lock"


class RunLock:
    """An exclusive, non-blocking lock on a run directory; a context manager, or ``acquire``/``release``."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.path = Path(run_dir or ".") / LOCK_NAME
        self._fd: int | None = None
        self._created = False

    def acquire(self, run_dir: Path | None = None) -> RunLock:
        """Take the lock (of ``run_dir``, else the directory given at construction), or raise
        ``ConfigError`` naming the process that holds it."""
        if run_dir is not None:
            self.path = Path(run_dir) / LOCK_NAME
        try:
            fd, created = _open_lock_file(self.path)
        except OSError as exc:
            raise ConfigError(
                f"cannot lock run directory {self.path.parent} ({exc.strerror}); choose another --out"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"cannot lock run directory {self.path.parent} ({exc.strerror}); choose another --out"
                ) from None
            holder = _holder(self.path)
            raise ConfigError(
                f"{self.path.parent} is in use by {holder}: wait for it to end (or stop it), "
                "or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd, self._created = fd, created
        return self

    def abandon(self) -> None:
        """Release the lock, removing the lock file if this lock created it: a directory the run was
        refused (it holds a user's files) is left exactly as it was found."""
        if self._fd is not None and self._created:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.release()

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """The lock file, opened never through a link (a ``.lock`` that is a symbolic link is refused, not
    followed: its target is never truncated); whether this call created it."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
    except FileExistsError:
        pass
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "the lock file is not a regular file", str(path))
    return fd, False


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"another april-bench process (pid {pid})" if pid.isdigit() else "another april-bench process"
