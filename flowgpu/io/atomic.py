"""Writes that never leave an output looking finished when it is not, nor lose the old one.

Every output is written into a staging dir beside it and moved into place when complete, with a
marker that flowgpu wrote it: a path flowgpu did not write is replaced only with ``overwrite``.
A run's outputs are committed together (:mod:`flowgpu.io.journal`), one run at a time writes an
output (:mod:`flowgpu.io.lock`), and taking that lock finishes what a dead run left half-done.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator

from flowgpu.errors import FlowgpuError, OutputError, OutputExistsError, OutputLockedError
from flowgpu.io import faults
from flowgpu.io.journal import (MARKER, Output, Refused, Transaction, journals_in, marked, marker_path, new_id,
                                recover_journal, referenced_stages, remove, stage_dir, stage_owner, stages_in,
                                written_by_flowgpu)
from flowgpu.io.lock import OutputLock, alive, describe, held, lock_path, locked_targets, owner, read_head, remove_stale
from flowgpu.io.paths import resolve

__all__ = ["MARKER", "AtomicPath", "Refused", "atomic_output", "notify_stderr", "canonical", "check_writable", "clean",
           "commit_together", "hold", "marker_path", "output_error", "protected_paths", "replaces_protected", "within",
           "starts_with", "write_text", "written_by_flowgpu"]

_FIXES = {
    errno.EROFS: "its filesystem is read-only: choose a path on a writable one",
    errno.ENOSPC: "its filesystem is full: free space there, or choose a path on another filesystem",
    errno.EDQUOT: "the disk quota is used up: free space there, or choose a path on another filesystem",
    errno.EACCES: "check the permissions of its folder, or choose another path",
    errno.EPERM: "check the permissions of its folder, or choose another path",
}


def notify_stderr(message: str) -> None:
    print(f"flowgpu: {message}", file=sys.stderr, flush=True)


def output_error(path: str, e: OSError) -> OutputError:
    """A clear message for an OS error met while writing ``path``: what, the OS's words, the fix."""
    code = errno.errorcode.get(e.errno, "") if e.errno else ""
    fix = _FIXES.get(e.errno, "check that path and its filesystem")
    what = e.strerror or str(e)
    return OutputError(f"cannot write output {path!r}: {what}{f' ({code})' if code else ''}; {fix}. "
                       "Nothing was replaced: an old output there is as it was")


def check_writable(path: str, overwrite: bool = False) -> None:
    """Refuse to replace what flowgpu did not write (an earlier output is fine), unless ``overwrite``;
    touches nothing."""
    path = os.path.abspath(path)
    if os.path.lexists(path) and not overwrite and not written_by_flowgpu(path):
        how = ("is not the one flowgpu wrote there: a new file took its place since (a copy, or an edit by a tool "
               "that saves a new file, as sed -i and many editors do)") if marked(path) \
            else "was not written by flowgpu"
        raise OutputExistsError(f"output {path!r} already exists and {how}; choose another path, or pass "
                                "overwrite=True (--overwrite) to replace it")


_PLACES = ("the working directory", "your home folder")  # what a command may write inside, never replace


def protected_paths(reads: dict[str, str] | None = None) -> dict[str, str]:
    """``{realpath: what}`` no command replaces, nor a folder holding it, ``--overwrite`` or not: the
    working directory, the home folder, and ``reads`` (inputs), which it never writes inside either."""
    found = dict(zip((os.path.realpath(os.getcwd()), os.path.realpath(os.path.expanduser("~"))), _PLACES))
    for path, what in (reads or {}).items():
        found.setdefault(os.path.realpath(os.path.expanduser(path)), what)
    return found


def replaces_protected(path: str, protected: dict[str, str]) -> str | None:
    """What replacing ``path`` destroys of ``protected`` (``"is ..."``, ``"contains ..."``, ``"is inside
    ..."``), or None."""
    real = os.path.realpath(os.path.expanduser(path))
    for kept, what in protected.items():
        if kept == real or within(kept, real):
            return f"{'is' if kept == real else 'contains'} {what}"
        if what not in _PLACES and within(real, kept):
            return f"is inside {what}"
    return None


def within(path: str, folder: str) -> bool:
    """Whether ``path`` lies below ``folder`` (both absolute, alike resolved)."""
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def canonical(path: str) -> str:
    """``path`` absolute, its folder's links resolved: one canonical path is one file (and one lock)."""
    path = os.path.abspath(os.path.expanduser(path))
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def starts_with(path: str, head: bytes) -> bool:
    """Whether ``path`` is a regular file (not a link) beginning with ``head`` (a summary flowgpu wrote)."""
    return read_head(path, len(head)) == head


def write_text(path: str | os.PathLike, text: str, *, head: bytes | None = None, what: str = "",
               sync: bool = True, public: bool = False) -> None:
    """Write ``text`` at ``path`` atomically: a temporary file beside it, synced, renamed over it.

    With ``head``, refuse to replace a file not beginning with it (not a ``what`` flowgpu wrote).
    ``sync=False`` (a cache entry its reader checks) skips the fsync, which can take 10 ms. The file
    is 0600 (credentials, state), or with ``public`` (a summary, a report, a spec) as the umask says."""
    path = os.fspath(path)
    if head is not None and os.path.lexists(path) and not starts_with(path, head):
        raise OutputExistsError(f"{path!r} already exists and is not a {what} flowgpu wrote; choose another "
                                "path, or pass --overwrite (overwrite=True) to replace it")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)  # as an output's folder is made
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if public else 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _clean_dir(directory: str, only: str | None, blocking: bool) -> list[str]:
    """Finish dead runs' commits in ``directory`` (naming ``only``); remove their staging and lock files."""
    notes = []
    for j in journals_in(directory):
        done = recover_journal(j, blocking, only)
        notes += [f"{j}: a run that is still committing holds it; left alone"] if done is None else done
    keep = referenced_stages(directory)
    for stage, out in stages_in(directory):
        if only not in (None, out) or stage in keep:
            continue
        who = stage_owner(stage)
        if who is None:
            notes.append(Refused(f"left alone {stage}: it is named like a flowgpu staging folder but does not carry "
                                 "the owner record flowgpu writes into those it makes (a folder of yours, or a copy); "
                                 "remove it yourself if it is not needed"))
            continue
        if alive(who):
            if only is None:
                notes.append(f"{stage}: staging of {describe(who)}, still running; left alone")
            continue
        lock = None
        if held(out) is None:
            try:
                lock = OutputLock(out).acquire(wait=False)
            except OutputError as e:  # held by a run, or a lock file flowgpu did not write
                notes.append(f"{stage}: {out} is being written by another run; left alone"
                             if isinstance(e, OutputLockedError) else Refused(f"left alone {stage}: {e}"))
                continue
        try:
            remove(stage)
            notes.append(f"removed {stage}, left by {describe(who)} that is no longer running")
        finally:
            if lock is not None:
                lock.release()
    for out in locked_targets(directory):  # lock files of runs that died: free, so removed
        if only in (None, out) and held(out) is None:
            why = remove_stale(out)
            if why is not None:
                notes.append(Refused(f"left alone {lock_path(out)}: {why}; remove it yourself if it is not needed"))
    return notes


def _lock(target: str, wait: bool, notify: Callable[[str], None]) -> OutputLock:
    """``target``'s write lock; once held, its interrupted commits are finished and stale staging dirs removed."""
    lock = OutputLock(target).acquire(wait, notify)
    for note in _clean_dir(os.path.dirname(target), target, blocking=True):
        notify(note)
    return lock


def clean(paths: Iterable[str]) -> list[str]:
    """``flowgpu clean``: recover every output in ``paths`` (and in a folder that is not an output)
    of runs no longer alive; returns notes on what was done or left alone (:class:`Refused`)."""
    notes = []
    try:
        for path in map(os.path.abspath, paths):
            notes += _clean_dir(os.path.dirname(path), path, blocking=False)
            if os.path.isdir(path) and not written_by_flowgpu(path):
                notes += _clean_dir(path, None, blocking=False)
    except OSError as e:
        raise output_error(e.filename or path, e) from None
    return notes


@contextlib.contextmanager
def hold(targets: Iterable[str], wait: bool = True, notify: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the write lock of every target (in path order: no deadlock) for the block.

    ``wait=False``: fail with :class:`OutputLockedError` if another run holds one. ``notify``: told
    when waiting and what was recovered (default: stderr)."""
    notify = notify or notify_stderr
    locks, made = [], []
    targets = sorted(set(map(os.path.abspath, targets)))
    same: dict[str, str] = {}
    for target in targets:  # one file under two names would wait forever for its own lock
        other = same.setdefault(canonical(target), target)
        if other != target:
            raise OutputError(f"outputs {other!r} and {target!r} are the same file ({canonical(target)}), through "
                              "a linked folder; give each output a path of its own")
    try:
        for target in targets:
            if held(target) is not None:
                continue
            try:
                made += _missing_folders(os.path.dirname(target))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                locks.append(_lock(target, wait, notify))
            except FlowgpuError:
                raise
            except OSError as e:
                raise output_error(target, e) from None
        yield
    finally:
        for lock in reversed(locks):
            lock.release()
        for folder in sorted(made, key=len, reverse=True):  # a run that wrote nothing leaves no new folder
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def _missing_folders(folder: str) -> list[str]:
    """``folder`` and its parents that do not exist yet (makedirs would create them)."""
    out = []
    while folder and not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        out.append(folder)
        folder = os.path.dirname(folder)
    return out


def _remove_settled(path: str, limit: float = 5.0) -> None:
    """Remove ``path``, again if tasks of a failed compute that were still running write into it."""
    deadline = time.monotonic() + limit
    remove(path)
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if not os.path.lexists(path):
            return
        remove(path)


class AtomicPath:
    """One output: ``begin()`` locks and checks it and returns the path to write; ``commit()`` moves
    it into place with the marker (:func:`commit_together`); ``abort()`` removes the staging dir."""

    def __init__(self, path: str, overwrite: bool = False, meta: dict | None = None,
                 reads: dict[str, str] | None = None, named: bool = False):
        self.path = resolve(path)
        self.reads = reads  # {path: what} the data written is read from: never replaced
        self.overwrite = overwrite
        self.meta = meta or {}
        self.id = new_id()
        self.stage = stage_dir(self.path, self.id)
        self.tmp = os.path.join(self.stage, "data")
        # named: the writer gets a path with the output's own name, since its suffix may choose the format
        # (np.savetxt gzips a .gz); settle() moves it to `data`, where the journal expects it
        self.given = os.path.join(self.stage, "named", os.path.basename(self.path)) if named else self.tmp
        self._lock: OutputLock | None = None
        self.stuck = False

    def begin(self) -> str:
        hit = replaces_protected(self.path, protected_paths(self.reads))
        if hit is not None:  # before anything is made: a staging folder beside '..' would be outside it
            raise OutputError(f"output {self.path!r} {hit}, which no write replaces, overwrite or not; write it to "
                              "a new path of its own")
        with self.preparing():
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            if held(self.path) is None:
                self._lock = _lock(self.path, True, notify_stderr)
            check_writable(self.path, self.overwrite)
            os.mkdir(self.stage)
            with open(os.path.join(self.stage, "owner.json"), "x") as f:  # its inode: what a copy cannot have
                json.dump({**owner(), "ino": os.lstat(self.stage).st_ino}, f)
            if self.given != self.tmp:
                os.mkdir(os.path.dirname(self.given))
        return self.given

    def settle(self) -> bool:
        """Whether the write made anything at the path it was given; moved to where the commit takes it."""
        if self.given != self.tmp and os.path.lexists(self.given):
            os.rename(self.given, self.tmp)  # the inode, which the marker will name, stays
        return os.path.lexists(self.tmp)

    @contextlib.contextmanager
    def preparing(self) -> Iterator[str]:
        """For setting up the staged output: on failure abort, and name an OS error's path and fix."""
        try:
            yield self.tmp
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError) and not isinstance(e, FlowgpuError):
                raise output_error(self.path, e) from None
            raise

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def abort(self) -> None:
        if not self.stuck and os.path.lexists(self.stage):  # stuck: its journal names it, for recovery
            _remove_settled(self.stage)
        self._release()

    def commit(self) -> str:
        return commit_together([self])[0]


def commit_together(targets: list[AtomicPath]) -> list[str]:
    """Move every target into place in one transaction: all of them, or (on any failure) none."""
    tx = Transaction([Output(t.path, t.stage, t.id, t.overwrite, t.meta) for t in targets])
    try:
        faults.point("after-compute")
        if targets:
            tx.commit()
    except FlowgpuError:
        raise
    except OSError as e:
        where = os.fspath(e.filename or "")
        path = next((t.path for t in targets if where.startswith((t.stage, t.path))), targets[0].path)
        raise output_error(path, e) from None
    finally:
        for t in targets:
            t.stuck = tx.stuck
            t._release()
    return [t.path for t in targets]


@contextlib.contextmanager
def atomic_output(path: str, overwrite: bool = False, meta: dict | None = None,
                  reads: dict[str, str] | None = None) -> Iterator[str]:
    """Yield a temporary path to write; on success it moves to ``path``, on an exception it is removed."""
    target = AtomicPath(path, overwrite, meta, reads)
    tmp = target.begin()
    try:
        yield tmp
    except BaseException:
        target.abort()
        raise
    target.commit()
