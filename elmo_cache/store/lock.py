"""One writer per output: the lock a build holds on its output from start to finish.

Two builds into one output would interleave their commits in the same staging folder and each
fail with an error about the disk, so every build (both engines) first takes an exclusive lock
on ``<output>.lock``, a file beside the output. The lock is the operating system's (``flock``
through :mod:`filelock`), so the kernel drops it when its process dies: a build killed with
``kill -9`` never blocks the next one, and no stale-lock guessing from pids is needed. The file
holds who took the lock (pid, host, time), only to tell the second build and readers who is
building; a finished build removes it, a killed one leaves it behind, harmlessly unlocked.

Locks on network filesystems are as good as the filesystem's ``flock`` (NFSv4 and Lustre
honour it across hosts; some older NFS mounts lock only within one host).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from elmo_cache.errors import OutputLockedError
from elmo_cache.store.format import LOCK_SUFFIX

__all__ = ["LockOwner", "lock_path", "output_lock", "current_builder"]

# A reader probing the lock (current_builder) holds it for microseconds; a build starting at that
# moment waits this long instead of mistaking the probe for another build.
_ACQUIRE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class LockOwner:
    """Who holds an output's lock, as the holder recorded it."""

    pid: int | None  # process id on its host; None when the record is unreadable
    host: str  # socket.gethostname() of the holder
    started: str  # ISO 8601 UTC time the lock was taken

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "another process"
        since = f" since {self.started}" if self.started else ""
        return f"{who} on {self.host or 'an unknown host'}{since}"


def lock_path(output: str | os.PathLike[str]) -> Path:
    """The lock file of ``output``: ``<output>.lock`` beside it."""
    output = Path(output)
    return output.with_name(output.name + LOCK_SUFFIX)


def _record_owner(fd: int) -> None:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    data = json.dumps(record).encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_owner(path: Path) -> LockOwner:
    try:
        record = json.loads(path.read_bytes())
        return LockOwner(int(record["pid"]), str(record["host"]), str(record.get("started", "")))
    except (OSError, ValueError, KeyError, TypeError):
        # The holder has locked but not yet written its record (or wrote something foreign).
        return LockOwner(None, "", "")


@contextlib.contextmanager
def output_lock(output: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the exclusive build lock of ``output`` for the ``with`` block.

    Raises :class:`~elmo_cache.errors.OutputLockedError` ("OUTPUT is being built by pid N on HOST")
    at once when another live process holds it. Creates the output's folder when it is missing.
    """
    import filelock

    path = lock_path(output)
    lock = filelock.FileLock(path, timeout=_ACQUIRE_TIMEOUT_S, on_acquired=_record_owner, fallback_to_soft=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except filelock.Timeout:
        owner = _read_owner(path)
        raise OutputLockedError(
            f"{output} is being built by {owner.describe()}; wait for that build to finish (or stop it: "
            "a stopped build resumes when the same command runs again)"
        ) from None
    except OSError as exc:
        raise OutputLockedError(f"{output}: cannot take the build lock {path} ({exc})") from None
    try:
        yield
    finally:
        # Removed while still held, so no lock file outlives a finished build. A build waiting on the old
        # file's lock gets an unlinked inode, which filelock detects and retries on a fresh file.
        with contextlib.suppress(OSError):
            path.unlink()
        lock.release()


def current_builder(output: str | os.PathLike[str]) -> LockOwner | None:
    """Who is building ``output`` now, or None when no live process holds its lock.

    Probes without creating anything (a reader may have no write access): a shared ``flock`` on
    the existing lock file fails exactly while a build holds it.
    """
    path = lock_path(output)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None  # no lock file: nobody has the lock
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the file exists only while a build holds the lock
        os.close(fd)
        return _read_owner(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_owner(path)
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
