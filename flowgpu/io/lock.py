"""One writer per output: a lock file beside it, and records of which process owns what.

The lock is ``flock`` on ``.NAME.flowgpu-lock`` beside the output: the OS releases it when its
process dies, however it dies. Its holder writes its pid, host and start time into it, so a run
that waits (or fails with ``--no-wait``) can name the other. The holder removes the file while it
still holds the lock; a waiter that then gets the lock on the removed file opens it again. A file
of that name that is not flowgpu's (a link, other data) is never written to nor removed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import threading
from collections.abc import Callable

import psutil

from flowgpu.errors import OutputError, OutputLockedError

__all__ = ["OutputLock", "owner", "alive", "lock_path", "held", "describe", "locked_targets", "is_record",
           "remove_stale"]

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


def _read_record(fd: int) -> object:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None


def _open(path: str, flags: int) -> int:
    """``path`` opened without following a link; OutputError when it is not a regular file."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise OutputError(f"{path} is a symbolic link, not flowgpu's lock file; flowgpu leaves it as it is: "
                          "remove it, or write the output elsewhere") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OutputError(f"{path} is not a regular file, so not flowgpu's lock file; flowgpu leaves it as it is: "
                          "remove it, or write the output elsewhere")
    return fd


def remove_stale(target: str) -> str | None:
    """Remove ``target``'s lock file when no process holds it and it carries flowgpu's owner record
    (a run that died left it). Returns why a file of that name was left alone, else None."""
    path = lock_path(target)
    try:
        fd = _open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as e:
        return str(e)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # a run holds it
        if not os.path.exists(path) or os.stat(path).st_ino != os.fstat(fd).st_ino:
            return None  # removed meanwhile by its holder
        if not is_record(_read_record(fd)):
            return "it is named like flowgpu's lock file but does not hold the owner record flowgpu writes there"
        os.unlink(path)
        return None
    finally:
        os.close(fd)


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


def lock_path(target: str) -> str:
    head, tail = os.path.split(target)
    return os.path.join(head, f".{tail}{LOCK_TAG}")


def locked_targets(directory: str) -> list[str]:
    """The outputs in ``directory`` that have a lock file (held now, or left by a run that died)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n[1:-len(LOCK_TAG)]) for n in names
                  if n.startswith(".") and n.endswith(LOCK_TAG) and len(n) > len(LOCK_TAG) + 1)


def held(target: str) -> OutputLock | None:
    """The lock this thread holds on ``target``, if any."""
    return getattr(_held, "locks", {}).get(target)


class OutputLock:
    """The exclusive right to write ``target``; :meth:`acquire` waits or fails, :meth:`release` frees it."""

    def __init__(self, target: str):
        self.target = target
        self.path = lock_path(target)
        self.fd: int | None = None

    def _holder(self, fd: int) -> dict | None:
        record = _read_record(fd)
        return record if isinstance(record, dict) else None

    def acquire(self, wait: bool = True, notify: Callable[[str], None] | None = None) -> OutputLock:
        told = False
        while True:
            fd = _open(self.path, os.O_RDWR | os.O_CREAT)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    other = describe(self._holder(fd))
                    if not wait:
                        raise OutputLockedError(
                            f"output {self.target!r} is being written by {other}; wait for it to finish, "
                            "or run without --no-wait to wait for it") from None
                    if notify is not None and not told:
                        notify(f"waiting for {other} to finish writing {self.target} ...")
                        told = True
                    fcntl.flock(fd, fcntl.LOCK_EX)
                if os.path.exists(self.path) and os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    if os.fstat(fd).st_size and not is_record(_read_record(fd)):
                        raise OutputError(f"{self.path} holds data that is not flowgpu's owner record, so it is not "
                                          "flowgpu's lock file; flowgpu leaves it as it is: move it away, or write "
                                          f"{self.target} elsewhere")
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, json.dumps(owner()).encode(), 0)
                    self.fd, fd = fd, None
                    locks = getattr(_held, "locks", None)
                    if locks is None:
                        locks = _held.locks = {}
                    locks[self.target] = self
                    return self
            finally:
                if fd is not None:
                    os.close(fd)  # the file was removed by its last holder (or we failed): open it again

    def release(self) -> None:
        if self.fd is None:
            return
        getattr(_held, "locks", {}).pop(self.target, None)
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
