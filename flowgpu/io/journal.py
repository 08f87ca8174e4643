"""Outputs committed together through a journal: all of a run's outputs new, or all old.

Each output is staged beside its path in ``.NAME.flowgpu-tmp-<id>/`` (``data``: the new output;
``owner.json``: pid, host and start time of the run). :meth:`Transaction.commit`:

1. writes flowgpu's marker into every staged output (a file output's marker is staged beside it);
2. writes the journal ``.flowgpu-journal-<run>.json`` (every output: path and staging dir) into
   each output's parent directory, fsynced, and holds an ``flock`` on it while the process lives;
3. sets every old output aside into its staging dir, and checks there that flowgpu wrote it: data
   that appeared meanwhile and is not flowgpu's is put back, and the commit fails;
4. decides: creates ``.flowgpu-journal-<run>.committed`` beside the first journal;
5. moves every new output into place, never over anything (a path taken meanwhile fails);
6. removes the staging dirs, then the journals, then the decision.

A failure in the process undoes all of it. A process that dies leaves its journals unlocked;
:func:`recover_journal` (called by the next run that targets one of the paths, and by
``flowgpu clean``) rolls forward if the decision exists, back otherwise. Every step of either
direction can be repeated, so a crash during recovery is recovered in turn.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field

from flowgpu.errors import OutputError
from flowgpu.io import faults
from flowgpu.io.lock import owner

__all__ = ["MARKER", "STAGE_TAG", "Output", "Transaction", "recover_journal", "journals_in", "stages_in",
           "marker_path", "written_by_flowgpu", "stage_dir", "new_id", "remove"]

MARKER = ".flowgpu-output.json"
STAGE_TAG = ".flowgpu-tmp-"
JOURNAL_TAG = ".flowgpu-journal-"
_STAGE = re.compile(r"^\.(?P<name>.+)\.flowgpu-tmp-(?P<id>r[0-9a-f]{16})$")
_JOURNAL = re.compile(r"^\.flowgpu-journal-r[0-9a-f]{16}\.json$")
# (staged name, aside name) inside the staging dir, in the order they move into place: a file
# output's marker first, so a half-done move is still recognised as this run's by its marker
_PARTS = (("marker", "old.marker"), ("data", "old"))


def new_id() -> str:
    return "r" + uuid.uuid4().hex[:16]


def stage_dir(target: str, id: str) -> str:
    head, tail = os.path.split(target)
    return os.path.join(head, f".{tail}{STAGE_TAG}{id}")


def _beside(target: str) -> str:
    head, tail = os.path.split(target)
    return os.path.join(head, f".{tail}{MARKER}")


def marker_path(path: str) -> str:
    """Where the marker of ``path`` lives: inside a directory output, beside a file output."""
    return os.path.join(path, MARKER) if os.path.isdir(path) else _beside(path)


def written_by_flowgpu(path: str) -> bool:
    return os.path.exists(marker_path(path))


def _run_of(marker: str) -> str | None:
    try:
        with open(marker) as f:
            return json.load(f).get("run")
    except (OSError, ValueError, AttributeError):
        return None


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path: str, text: str) -> None:
    with open(path, "x") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)


def _move_into_place(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` only if ``dst`` does not exist, atomically where the OS allows."""
    if _renameat2 is not None:
        if _renameat2(-100, os.fsencode(src), -100, os.fsencode(dst), 1) == 0:  # AT_FDCWD, RENAME_NOREPLACE
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(code, os.strerror(code), dst)
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    os.rename(src, dst)


@dataclass
class Output:
    """A staged output as the journal knows it."""

    path: str
    stage: str
    id: str
    overwrite: bool = False
    meta: dict = field(default_factory=dict)

    def parts(self):
        """``(staged, aside, live)`` paths, in the order they move into place."""
        for (staged, aside), live in zip(_PARTS, (_beside(self.path), self.path)):
            yield os.path.join(self.stage, staged), os.path.join(self.stage, aside), live

    def staged_marker(self) -> str:
        data = os.path.join(self.stage, "data")
        return os.path.join(data, MARKER) if os.path.isdir(data) else os.path.join(self.stage, "marker")

    def ours(self, live: str) -> bool:
        """Whether ``live`` is this output's new data (or marker), moved into place by its run."""
        marker = live if live == _beside(self.path) else marker_path(live)
        return os.path.lexists(live) and _run_of(marker) == self.id

    def old_is_flowgpus(self) -> bool:
        old = os.path.join(self.stage, "old")
        if os.path.isdir(old) and not os.path.islink(old):
            return os.path.exists(os.path.join(old, MARKER))
        return os.path.exists(os.path.join(self.stage, "old.marker"))


def _keep(src: str, live: str, what: str, id: str, notes: list[str]) -> None:
    kept = f"{live}.flowgpu-{what}-{id}"
    os.rename(src, kept)
    notes.append(f"{live} is taken by data flowgpu did not write; the {what} output was kept at {kept}")


def _roll_back(o: Output, notes: list[str]) -> None:
    parts = list(o.parts())
    for staged, _, live in reversed(parts):  # take this run's new data out of the way ...
        if not os.path.lexists(staged) and o.ours(live):
            os.rename(live, staged)
    for _, aside, live in parts:  # ... and put the old back (marker first: never an unmarked flowgpu output)
        if os.path.lexists(aside):
            if os.path.lexists(live):
                _keep(aside, live, "old", o.id, notes)
            else:
                os.rename(aside, live)


def _roll_forward(o: Output, notes: list[str]) -> None:
    for staged, _, live in o.parts():
        if os.path.lexists(staged):
            if os.path.lexists(live) and not o.ours(live):
                _keep(staged, live, "new", o.id, notes)
            elif not os.path.lexists(live):
                os.rename(staged, live)


def _flag(journals: list[str]) -> str:
    return journals[0][: -len(".json")] + ".committed"


def _finish(outputs: list[Output], journals: list[str]) -> None:
    """Remove staging dirs, then journals (the first last), then the decision."""
    for d in {os.path.dirname(o.path) for o in outputs}:
        _fsync_dir(d)  # the moves are on disk before the journal that could redo them is gone
    for o in outputs:
        remove(o.stage)
    for j in [*journals[1:], journals[0], _flag(journals)]:
        try:
            os.unlink(j)
        except FileNotFoundError:
            pass


class Transaction:
    """The commit of a run's staged outputs: all of them, or none."""

    def __init__(self, outputs: list[Output]):
        self.run = new_id()
        self.outputs = sorted(outputs, key=lambda o: o.path)
        firsts: dict[str, Output] = {}
        for o in self.outputs:
            firsts.setdefault(os.path.dirname(o.path), o)
        self.by_journal = {os.path.join(d, f"{JOURNAL_TAG}{self.run}.json"): o for d, o in firsts.items()}
        self.journals = sorted(self.by_journal)
        self.fds: list[int] = []
        self.stuck = False

    def commit(self) -> None:
        notes: list[str] = []
        try:
            faults.point("commit:before-marker")
            for o in self.outputs:
                _write_durable(o.staged_marker(), json.dumps({"writer": "flowgpu", "run": o.id, **o.meta}))
            self._write_journals()
            faults.point("commit:after-journal")
            self._each(self._set_aside, "commit:after-aside")
            self._decide()
            faults.point("commit:after-decision")
            self._each(self._move_in, "commit:after-first-rename")
            faults.point("commit:before-cleanup")
        except BaseException as e:
            try:
                if os.path.exists(_flag(self.journals)):
                    os.unlink(_flag(self.journals))
                    _fsync_dir(os.path.dirname(self.journals[0]))
                for o in reversed(self.outputs):
                    _roll_back(o, notes)
                _finish(self.outputs, self.journals)
            except Exception as undo:
                self.stuck = True  # the staging dirs hold old outputs: only recovery may remove them
                self._close()  # unlocked: the next run or `flowgpu clean` finishes the undo
                raise OutputError(f"the commit of {', '.join(o.path for o in self.outputs)} failed ({e}) and "
                                  f"could not be undone ({undo}); `flowgpu clean` on those paths restores the "
                                  "old outputs") from e
            finally:
                self._close()
            if notes and isinstance(e, Exception):
                raise OutputError("; ".join([str(e), *notes])) from e
            raise
        _finish(self.outputs, self.journals)
        self._close()

    def _each(self, step, after_first: str) -> None:
        for i, o in enumerate(self.outputs):
            step(o)
            if i == 0:
                faults.point(after_first)

    def _write_journals(self) -> None:
        text = json.dumps({"run": self.run, "owner": owner(), "journals": self.journals,
                           "outputs": [{"path": o.path, "stage": o.stage, "id": o.id} for o in self.outputs]})
        for j in self.journals:
            tmp = os.path.join(self.by_journal[j].stage, "journal.tmp")  # in place only when complete
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            self.fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)  # held while this process lives: the journal is not stale
            os.write(fd, text.encode())
            os.fsync(fd)
            os.rename(tmp, j)
            _fsync_dir(os.path.dirname(j))

    def _set_aside(self, o: Output) -> None:
        for _, aside, live in o.parts():
            if os.path.lexists(live):
                os.rename(live, aside)
        if os.path.lexists(os.path.join(o.stage, "old")) and not o.overwrite and not o.old_is_flowgpus():
            raise OutputError(f"output {o.path!r} was created or replaced while the run was in progress, and "
                              "not by flowgpu; it was left as it is and no output was replaced (choose another "
                              "path, or pass --overwrite to replace it)")

    def _decide(self) -> None:
        fd = os.open(_flag(self.journals), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(os.path.dirname(self.journals[0]))

    def _move_in(self, o: Output) -> None:
        for staged, _, live in o.parts():
            if os.path.lexists(staged):
                try:
                    _move_into_place(staged, live)
                except FileExistsError:
                    raise OutputError(f"output {o.path!r} was created while the run was committing, and not by "
                                      "flowgpu; it was left as it is and no output was replaced") from None

    def _close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _lock_existing(path: str, blocking: bool) -> int | None:
    """An flock on the journal ``path``; None if it is gone (finished meanwhile); raises BlockingIOError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        if os.path.exists(path) and os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def recover_journal(path: str, blocking: bool = True, only: str | None = None) -> list[str] | None:
    """Finish the commit of a run that died: forward if it had decided, else back.

    Returns notes on what was done ([] when there was nothing left to do, or the journal does not
    name ``only``), or None when the run is alive (``blocking=False``; else this waits for it).
    """
    try:
        with open(path) as f:
            data = json.load(f)
        journals = sorted(data["journals"])
        outputs = [Output(o["path"], o["stage"], o["id"]) for o in data["outputs"]]
        if only is not None and only not in {o.path for o in outputs}:
            return []
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OutputError(f"journal {path!r} cannot be read ({e}); remove it after checking the outputs "
                          "it names") from None
    fds = []
    try:
        for j in journals:
            try:
                fd = _lock_existing(j, blocking)
            except BlockingIOError:
                return None
            if fd is not None:
                fds.append(fd)
        if not os.path.exists(path):
            return []
        forward = os.path.exists(_flag(journals))
        notes: list[str] = []
        for o in outputs:
            (_roll_forward if forward else _roll_back)(o, notes)
        _finish(outputs, journals)
        done = "completed (all new)" if forward else "undone (all old)"
        return [f"an interrupted commit of {', '.join(o.path for o in outputs)} was {done}", *notes]
    finally:
        for fd in fds:
            os.close(fd)


def journals_in(directory: str) -> list[str]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names if _JOURNAL.match(n))


def stages_in(directory: str) -> list[tuple[str, str]]:
    """``(staging dir, output path)`` of every flowgpu staging dir in ``directory``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = ((n, _STAGE.match(n)) for n in sorted(names))
    return [(os.path.join(directory, n), os.path.join(directory, m["name"])) for n, m in found if m]


def referenced_stages(directory: str) -> set[str]:
    """Staging dirs named by journals still in ``directory`` (never removed as stale)."""
    out = set()
    for j in journals_in(directory):
        try:
            with open(j) as f:
                out.update(o["stage"] for o in json.load(f)["outputs"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out
