"""One writer per output: a lock file beside it, and records of which process owns what.

The lock is filelock's ``flock`` on ``.NAME.flowgpu-lock`` (freed when its process dies). flowgpu
adds: the holder writes its pid, host and start time into it (so a waiter names the other, and
``flowgpu clean`` tells a dead run's file from a user's); a file of that name that is not
flowgpu's is never written nor removed; the holder removes the file before it unlocks.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import threading
from collections.abc import Callable

import filelock
import psutil

from flowgpu.errors import OutputError, OutputLockedError

__all__ = ["OutputLock", "Waiting", "owner", "alive", "lock_path", "held", "describe", "locked_targets",
           "is_record", "read_head", "read_record", "read_open_record", "remove_stale", "beside", "listing"]

LOCK_TAG = ".flowgpu-lock"
_held = threading.local()  # target path -> OutputLock held by this thread


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def owner() -> dict:
    """This process: pid, host and start time (a reused pid has another start time)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": _start_time(os.getpid())}


def is_record(record: object) -> bool:
    """Whether ``record`` is an owner record as :func:`owner` makes them."""
    return isinstance(record, dict) and {"pid", "host", "start"} <= record.keys()


def read_open_record(fd: int, most: int = 4096) -> object:
    """The JSON value of the first ``most`` bytes of the open file ``fd``, None when it holds none."""
    try:
        return json.loads(os.pread(fd, most, 0) or b"null")
    except (OSError, ValueError):
        return None


def read_head(path: str, nbytes: int) -> bytes | None:
    """The first ``nbytes`` of ``path`` if a regular file (no link followed, no FIFO waited on), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            return os.pread(fd, nbytes, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)
    except OSError:
        return None


def read_record(path: str, most: int = 4096) -> object:
    """The JSON value of the first ``most`` bytes of ``path`` (a record), None when it holds none."""
    try:
        return json.loads(read_head(path, most) or b"null")
    except ValueError:
        return None


class _NotOurs(OutputError):
    """A file at a lock path that flowgpu did not write there (``what`` it is)."""

    def __init__(self, path: str, what: str):
        self.what = what
        super().__init__(f"{path} {what}, so it is not flowgpu's lock file; flowgpu leaves it as it is: "
                         "remove it, or write the output elsewhere")


def remove_stale(target: str) -> str | None:
    """Remove ``target``'s lock file if unheld and flowgpu's; returns why it was left alone, else None."""
    try:
        OutputLock(target).acquire(wait=False).release()  # taken and released: the file is gone
    except OutputLockedError:
        return None  # a run holds it
    except _NotOurs as e:
        return f"it is named like flowgpu's lock file but {e.what}"
    except OSError as e:
        return e.strerror or str(e)
    return None


def alive(record: dict | None) -> bool:
    """Whether the process of ``record`` (from :func:`owner`) still runs: same host, pid and start time."""
    if not isinstance(record, dict) or record.get("host") != socket.gethostname():
        return False
    try:
        start = _start_time(int(record["pid"]))
    except (KeyError, TypeError, ValueError):
        return False
    return start is not None and start == record.get("start")


def describe(record: dict | None) -> str:
    if not isinstance(record, dict) or "pid" not in record:
        return "another flowgpu run"
    return f"flowgpu run pid {record['pid']} on {record.get('host', '?')}"


def beside(path: str, tag: str) -> str:
    """The hidden file beside ``path`` that flowgpu names ``.NAME<tag>`` (lock, marker, staging dir)."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{tag}")


def lock_path(target: str) -> str:
    return beside(target, LOCK_TAG)


def listing(directory: str) -> list[str]:
    """The names in ``directory``; none when it cannot be listed."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


def locked_targets(directory: str) -> list[str]:
    """The outputs in ``directory`` that have a lock file (held now, or left by a run that died)."""
    return sorted(os.path.join(directory, n[1:-len(LOCK_TAG)]) for n in listing(directory)
                  if n.startswith(".") and n.endswith(LOCK_TAG) and len(n) > len(LOCK_TAG) + 1)


def held(target: str) -> OutputLock | None:
    """The lock this thread holds on ``target``, if any."""
    return getattr(_held, "locks", {}).get(target)


class Waiting(str):
    """The note that a run waits for another run's lock: said even with -q (a silent wait looks hung)."""


class OutputLock:
    """The exclusive right to write ``target``; :meth:`acquire` waits or fails, :meth:`release` frees it."""

    def __init__(self, target: str):
        self.target = target
        self.path = lock_path(target)
        self._lock = filelock.UnixFileLock(self.path, is_singleton=False, thread_local=False, fallback_to_soft=False,
                                           on_acquired=self._claim)

    def _claim(self, fd: int) -> None:
        """Called by filelock with the lock taken: check the file is flowgpu's, then write our record."""
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotOurs(self.path, "is not a regular file")
        if info.st_size and not is_record(read_open_record(fd)):
            raise _NotOurs(self.path, "holds data that is not flowgpu's owner record")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner()).encode(), 0)

    def _take(self, blocking: bool) -> bool:
        try:
            self._lock.acquire(blocking=blocking)
        except filelock.Timeout:
            return False
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise _NotOurs(self.path, "is a symbolic link") from None
        return True

    def acquire(self, wait: bool = True, notify: Callable[[str], None] | None = None) -> OutputLock:
        if not self._take(blocking=False):
            other = describe(read_record(self.path))  # read, never locked
            if not wait:
                raise OutputLockedError(
                    f"output {self.target!r} is being written by {other}; wait for it to finish, "
                    "or run without --no-wait to wait for it")
            if notify is not None:
                notify(Waiting(f"waiting for {other} to finish writing {self.target} ..."))
            self._take(blocking=True)
        vars(_held).setdefault("locks", {})[self.target] = self
        return self

    def release(self) -> None:
        if not self._lock.is_locked:
            return
        getattr(_held, "locks", {}).pop(self.target, None)
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still held: a waiter that then locks the removed file opens it again
        self._lock.release()
