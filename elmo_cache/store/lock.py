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

A lock file can be deleted (or replaced) while it is held: the lock stays on the unlinked inode, and
the next build would create a fresh file and lock that. Two guards close this:

* **A second lock nobody can delete.** On Linux the holder also binds an abstract-namespace UNIX socket
  named after the output (the parent folder's device and inode, and the output's name). Abstract names
  live in the kernel, not in any folder, so no ``rm`` removes them, and the kernel frees the name when
  the process dies (``kill -9`` included). A build that gets the file lock but not the name is refused
  with the holder's pid (``SO_PEERCRED`` of the listening socket). The guarantee: on one host (one
  network namespace) a second build never starts while a first holds the lock, whatever happened to the
  lock file.
* **The holder checks its file at every commit** (:func:`check_held`, from the staging Writer): when the
  path no longer names the locked inode it takes the lock again (a fresh file, its owner record
  rewritten, so readers keep seeing who builds), waiting up to a second for a second build on this host
  that holds a fresh file only until the guard refuses it; when another process holds whatever is there
  now (a build on another host of a shared filesystem, where the socket cannot see), it stops with
  :class:`~elmo_cache.errors.OutputLockedError` before that commit writes anything, so its interrupted
  work is resumable and never mixed into the other build's.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from elmo_cache.errors import OutputLockedError
from elmo_cache.store.format import LOCK_SUFFIX

__all__ = ["LockOwner", "lock_path", "output_lock", "current_builder", "check_held"]

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
    # Written, then cut to its length: a reader never finds the file empty between the two.
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))


def _read_owner(path: Path) -> LockOwner:
    try:
        record = json.loads(path.read_bytes())
        return LockOwner(int(record["pid"]), str(record["host"]), str(record.get("started", "")))
    except (OSError, ValueError, KeyError, TypeError):
        # The holder has locked but not yet written its record (or wrote something foreign).
        return LockOwner(None, "", "")


def _refused(output: str | os.PathLike[str], owner: LockOwner) -> OutputLockedError:
    return OutputLockedError(
        f"{output} is being built by {owner.describe()}; wait for that build to finish (or stop it: "
        "a stopped build resumes when the same command runs again)"
    )


def _guard_name(output: Path) -> bytes | None:
    """The abstract socket name guarding ``output``, or None where there are none (not Linux).

    Named after the parent folder's (st_dev, st_ino) rather than its spelling, so every path to one
    output (relative, symlinked) names one guard; hashed because abstract names hold 107 bytes.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        parent = os.stat(output.parent)
    except OSError:
        return None
    key = f"{parent.st_dev}:{parent.st_ino}:{output.name}".encode("utf-8", "surrogateescape")
    return b"\0elmo-cache-build:" + hashlib.sha256(key).hexdigest().encode("ascii")


def _guard_owner(name: bytes) -> LockOwner | None:
    """Who holds the guard ``name`` (its listener's pid), or None when nobody does."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(name)
        pid = int.from_bytes(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[:4], sys.byteorder)
        return LockOwner(pid, socket.gethostname(), "")
    except (ConnectionRefusedError, FileNotFoundError):
        return None  # nobody listens on the name
    except OSError:
        return LockOwner(None, socket.gethostname(), "")  # bound (a full backlog, say): someone holds it
    finally:
        probe.close()


def _take_guard(output: Path) -> socket.socket | None:
    name = _guard_name(output)
    if name is None:
        return None
    guard = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        guard.bind(name)
    except OSError:
        guard.close()
        owner = _guard_owner(name) or LockOwner(None, socket.gethostname(), "")
        raise _refused(output, owner) from None
    # Every refused build and every reader asking who builds leaves a connection queued until the holder's
    # next commit drains them (_drain): a deep queue, so that a burst of them still learns the holder's pid.
    guard.listen(socket.SOMAXCONN)
    guard.setblocking(False)
    return guard


@dataclass
class _Held:
    """A lock this process holds: the file lock, the inode it locked, the guard socket."""

    output: Path
    lock: _FileLock
    inode: tuple[int, int]
    guard: socket.socket | None
    stale: list[_FileLock] = field(default_factory=list)  # locks on files removed under us, released at the end


# The locks this process holds, by absolute output path: check_held finds them from a Writer's output.
_HELD: dict[str, _Held] = {}


class _FileLock:
    """The file lock with the (st_dev, st_ino) of the descriptor it locked, taken from that descriptor
    (not the path, which may already name another file)."""

    def __init__(self, path: Path):
        import filelock

        self.inode: tuple[int, int] | None = None
        self.lock = filelock.FileLock(
            path, timeout=_ACQUIRE_TIMEOUT_S, on_acquired=self._acquired, fallback_to_soft=False
        )

    def _acquired(self, fd: int) -> None:
        st = os.fstat(fd)
        self.inode = (st.st_dev, st.st_ino)
        _record_owner(fd)

    def acquire(self, timeout: float | None = None) -> tuple[int, int]:
        self.lock.acquire(timeout=timeout)
        assert self.inode is not None
        return self.inode

    def release(self) -> None:
        self.lock.release()


def _path_inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def output_lock(output: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the exclusive build lock of ``output`` for the ``with`` block.

    Raises :class:`~elmo_cache.errors.OutputLockedError` ("OUTPUT is being built by pid N on HOST")
    at once when another live process holds it, even when its lock file was deleted (see the module's
    docstring). Creates the output's folder when it is missing.
    """
    import filelock

    output = Path(output)
    path = lock_path(output)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _FileLock(path)
        inode = lock.acquire()
    except filelock.Timeout:
        raise _refused(output, _read_owner(path)) from None
    except OSError as exc:
        raise OutputLockedError(f"{output}: cannot take the build lock {path} ({exc})") from None
    try:
        guard = _take_guard(output)
    except OutputLockedError:
        # The holder's file was deleted and this one is ours, fresh: it records no build, so it goes.
        with contextlib.suppress(OSError):
            if _path_inode(path) == inode:
                path.unlink()
        lock.release()
        raise
    held = _Held(output, lock, inode, guard)
    _HELD[os.path.abspath(output)] = held
    try:
        yield
    finally:
        _HELD.pop(os.path.abspath(output), None)
        # Removed while still held, so no lock file outlives a finished build (only our own: a file that
        # replaced ours is someone else's). A build waiting on the old file's lock gets an unlinked inode,
        # which filelock detects and retries on a fresh file.
        with contextlib.suppress(OSError):
            if _path_inode(path) == held.inode:
                path.unlink()
        held.lock.release()
        for old in held.stale:
            old.release()
        if held.guard is not None:
            held.guard.close()


def check_held(output: str | os.PathLike[str]) -> None:
    """Make sure this process still holds ``output``'s lock before it commits more of its build.

    A no-op unless this process took the lock (:func:`output_lock`) and its file is no longer the one
    it locked. Then the lock is taken again on whatever is at the path now (a fresh file when it was
    deleted); when another process holds that, raises :class:`~elmo_cache.errors.OutputLockedError`.
    Costs one ``stat`` when all is well.
    """
    held = _HELD.get(os.path.abspath(output))
    if held is None:
        return
    path = lock_path(held.output)
    if _path_inode(path) == held.inode:
        if held.guard is not None:
            _drain(held.guard)
        return
    import filelock

    lock = _FileLock(path)
    try:
        # While this process holds the guard, no build on this host can start: one that holds the fresh file
        # now is a second build between creating it and being refused at the guard, and lets it go within
        # moments. Waiting for it, rather than stopping, keeps a refused build from ending this one. Without
        # a guard (or past the wait) the holder is real: a build on another host of a shared filesystem.
        inode = lock.acquire(timeout=_ACQUIRE_TIMEOUT_S if held.guard is not None else 0)
    except (filelock.Timeout, OSError):
        raise OutputLockedError(
            f"{held.output}: its build lock {path} was removed or replaced while this build held it, and "
            f"{_read_owner(path).describe()} holds it now; this build stopped before its next commit "
            "(run the same command again once that build is done to resume it)"
        ) from None
    held.stale.append(held.lock)
    held.lock, held.inode = lock, inode


def _drain(guard: socket.socket) -> None:
    """Close the connections of refused builds asking the guard who holds it, so its backlog never fills."""
    while True:
        try:
            conn, _ = guard.accept()
        except OSError:
            return
        conn.close()


def current_builder(output: str | os.PathLike[str]) -> LockOwner | None:
    """Who is building ``output`` now, or None when no live process holds its lock.

    Probes without creating anything (a reader may have no write access): a shared ``flock`` on
    the existing lock file fails exactly while a build holds it; where the file is gone or free, the
    guard socket (module docstring) still names a build whose lock file was deleted under it.
    """
    owner = _file_holder(Path(output))
    if owner is None or owner.pid is None:  # no holder, or one that has not written its record yet
        name = _guard_name(Path(output))
        guarded = None if name is None else _guard_owner(name)
        owner = guarded if guarded is not None and (owner is None or guarded.pid is not None) else owner
    return owner


def _file_holder(output: Path) -> LockOwner | None:
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
