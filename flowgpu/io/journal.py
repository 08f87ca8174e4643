"""Outputs committed together through a journal: all of a run's outputs new, or all old.

Each output is staged in ``.NAME.flowgpu-tmp-<id>/`` beside it (``data``; ``owner.json``: the
run's pid, host, start time and the dir's inode). :meth:`Transaction.commit` writes each marker
(``.NAME.flowgpu-output.json``, beside the output, never inside a store), writes and locks one
fsynced journal ``.flowgpu-journal-<run>.json`` per output folder, sets the old outputs aside
(data that is not flowgpu's fails the commit), decides (``.flowgpu-journal-<run>.committed``),
moves the new outputs in (never over anything), then removes stages, journals and decision.
A failure undoes it all; a dead run's journals are unlocked, and :func:`recover_journal` rolls
forward if the decision exists, back otherwise (every step repeatable).

A journal is followed only when flowgpu can tell it wrote it, there, for that run: this user's
regular file with one link, whose content records its own inode and run id, in its outputs'
folder; the staging dirs it names must be this user's dirs with the recorded inodes. Anything
else is left alone, with a :class:`Refused` note.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import uuid
from dataclasses import dataclass, field

from flowgpu.errors import OutputError
from flowgpu.io import faults
from flowgpu.io.lock import beside, is_record, listing, owner, read_open_record, read_record

__all__ = ["MARKER", "STAGE_TAG", "Output", "Refused", "Transaction", "recover_journal", "journals_in", "stages_in",
           "marker_path", "written_by_flowgpu", "stage_dir", "stage_owner", "new_id", "remove"]

MARKER = ".flowgpu-output.json"
STAGE_TAG = ".flowgpu-tmp-"
JOURNAL_TAG = ".flowgpu-journal-"
_STAGE = re.compile(r"^\.(?P<name>.+)\.flowgpu-tmp-(?P<id>r[0-9a-f]{16})$")
_JOURNAL = re.compile(r"^\.flowgpu-journal-(?P<run>r[0-9a-f]{16})\.json$")
_ID = re.compile(r"^r[0-9a-f]{16}$")
_MOST = 1 << 20  # a journal of many outputs is a few hundred KB
# (staged name, aside name) inside the staging dir, in the order they move into place: the marker
# first, so a half-done move is still recognised as this run's by its marker
_PARTS = (("marker", "old.marker"), ("data", "old"))


class Refused(str):
    """A note on something left alone because flowgpu cannot tell that it made it."""


class _NotOurs(Exception):
    """Why a journal, or a path it names, is not one flowgpu made for it."""


def new_id() -> str:
    return "r" + uuid.uuid4().hex[:16]


def stage_dir(target: str, id: str) -> str:
    return beside(target, f"{STAGE_TAG}{id}")


def marker_path(path: str) -> str:
    """``.NAME.flowgpu-output.json`` beside ``path``: a Zarr store holds only Zarr's own files."""
    return beside(path, MARKER)


def _legacy_marked(path: str) -> bool:
    """Whether ``path`` is a directory output of an earlier version, which put its marker inside it."""
    return os.path.isdir(path) and not os.path.islink(path) and os.path.exists(os.path.join(path, MARKER))


_FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): an inode's generation (ext4, xfs, btrfs)


def identity(path: str) -> dict[str, int]:
    """What tells this file or folder from a later one at ``path``: its inode, and the inode's
    generation where the file system keeps one (a freed inode is given to the next file made, with a
    new generation: a user's file put where flowgpu's output was may get its inode)."""
    found = {"ino": os.lstat(path).st_ino}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return found
    try:
        found["gen"] = int.from_bytes(fcntl.ioctl(fd, _FS_IOC_GETVERSION, bytes(8))[:4], "little")
    except OSError:  # not kept here (tmpfs, NFS): the inode alone
        pass
    finally:
        os.close(fd)
    return found


def marked(path: str) -> bool:
    """Whether a marker of flowgpu's stands beside ``path`` (flowgpu wrote an output there, maybe another file)."""
    with contextlib.suppress(OSError, ValueError, AttributeError), open(marker_path(path)) as f:
        return json.load(f).get("writer") == "flowgpu"
    return False


def written_by_flowgpu(path: str) -> bool:
    """Whether ``path`` is an output flowgpu wrote: its marker says so and names ``path``'s inode (and
    the inode's generation, where the marker and the file system have one)."""
    try:
        with open(marker_path(path)) as f:
            mark = json.load(f)
        if not isinstance(mark, dict) or mark.get("writer") != "flowgpu":
            return False
        now = identity(path)
        return all(mark[k] == now[k] for k in ("ino", "gen") if k in mark and k in now)
    except (OSError, ValueError):
        return _legacy_marked(path)


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
    stage_ino: int | None = None  # the staging dir's inode, as the journal records it

    def parts(self):
        """``(staged, aside, live)`` paths, in the order they move into place."""
        for (staged, aside), live in zip(_PARTS, (marker_path(self.path), self.path)):
            yield os.path.join(self.stage, staged), os.path.join(self.stage, aside), live

    def ours(self, live: str) -> bool:
        """Whether ``live`` is this output's new data (or marker), moved into place by its run."""
        if not os.path.lexists(live):
            return False
        try:
            with open(marker_path(self.path)) as f:
                return json.load(f).get("run") == self.id
        except (OSError, ValueError, AttributeError):
            return False

    def old_is_flowgpus(self) -> bool:
        return os.path.exists(os.path.join(self.stage, "old.marker")) or _legacy_marked(os.path.join(self.stage, "old"))


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


def _finish(outputs: list[Output], journals: list[str], present: list[str] | None = None) -> None:
    """Remove staging dirs, then journals (the first last; only those ``present`` when given), then the decision."""
    for d in {os.path.dirname(o.path) for o in outputs}:
        _fsync_dir(d)  # the moves are on disk before the journal that could redo them is gone
    for o in outputs:
        remove(o.stage)
    for j in [*journals[1:], journals[0], _flag(journals)]:
        if present is not None and j in journals and j not in present:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(j)


class Transaction:
    """The commit of a run's staged outputs: all of them, or none."""

    def __init__(self, outputs: list[Output]):
        self.run = new_id()
        self.outputs = sorted(outputs, key=lambda o: o.path)
        # one journal per folder, in the staging dir of its first output (reversed: the first one wins)
        self.by_journal = {_journal_of(self.run, os.path.dirname(o.path)): o for o in reversed(self.outputs)}
        self.journals = sorted(self.by_journal)
        self.fds: list[int] = []
        self.stuck = False

    def commit(self) -> None:
        notes: list[str] = []
        try:
            faults.point("commit:before-marker")
            for o in self.outputs:
                made = identity(os.path.join(o.stage, "data"))  # a rename keeps it
                _write_durable(os.path.join(o.stage, "marker"),
                               json.dumps({"writer": "flowgpu", "run": o.id, **made, **o.meta}))
            self._write_journals()
            faults.point("commit:after-journal")
            self._each(self._set_aside, "commit:after-aside")
            _write_durable(_flag(self.journals), "")  # the decision
            _fsync_dir(os.path.dirname(self.journals[0]))
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
                raise OutputError(f"the commit of {', '.join(o.path for o in self.outputs)} failed ({e}) and "
                                  f"could not be undone ({undo}); `flowgpu clean` on those paths restores the "
                                  "old outputs") from e
            finally:
                self._close()  # unlocked: a stuck undo is finished by the next run or `flowgpu clean`
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
        outputs = [{"path": o.path, "id": o.id, "stage_ino": os.lstat(o.stage).st_ino} for o in self.outputs]
        for j in self.journals:
            tmp = os.path.join(self.by_journal[j].stage, "journal.tmp")  # in place only when complete
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            self.fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)  # held while this process lives: the journal is not stale
            # its own inode (kept by the rename) is what a copy or a hand-written file cannot have
            text = json.dumps({"writer": "flowgpu", "run": self.run, "ino": os.fstat(fd).st_ino, "owner": owner(),
                               "outputs": outputs})
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


def _journal_of(run: str, directory: str) -> str:
    return os.path.join(directory, f"{JOURNAL_TAG}{run}.json")


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """``path`` opened without following a link or waiting on a FIFO; _NotOurs unless a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _NotOurs("it is a symbolic link" if e.errno == errno.ELOOP else f"it cannot be opened ({e.strerror})"
                       ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MOST:
        os.close(fd)
        raise _NotOurs("it is not a regular file" if not stat.S_ISREG(info.st_mode) else
                       "it is larger than any journal flowgpu writes")
    return fd, info


def _outputs_of(data, run: str) -> list[Output]:
    """The outputs a journal's content names; _NotOurs unless it is a journal of ``run`` as flowgpu writes them."""
    if not isinstance(data, dict) or data.get("writer") != "flowgpu" or data.get("run") != run:
        raise _NotOurs("its content is not a flowgpu journal of the run its name gives")
    outputs = []
    for o in data.get("outputs") or ():
        path, id, ino = (o.get("path"), o.get("id"), o.get("stage_ino")) if isinstance(o, dict) else (None, None, None)
        if not (isinstance(path, str) and "\0" not in path and os.path.isabs(path) and os.path.normpath(path) == path
                and os.path.basename(path) not in ("", ".", "..") and isinstance(id, str) and _ID.match(id)
                and isinstance(ino, int)):
            raise _NotOurs("it names an output or a staging dir that flowgpu would not have written")
        outputs.append(Output(path, stage_dir(path, id), id, stage_ino=ino))
    if not outputs:
        raise _NotOurs("it names no output")
    return outputs


def _open_journal(path: str) -> tuple[int, list[Output], str]:
    """``(fd, outputs, run)`` of the journal ``path`` once checked that flowgpu wrote it, there; else
    :class:`_NotOurs` saying why (``named``: the outputs its content names, as far as readable)."""
    m = _JOURNAL.match(os.path.basename(path))
    if m is None:
        raise _NotOurs("its name is not one flowgpu gives journals")
    fd, info = _open_regular(path)
    try:
        data = read_open_record(fd, _MOST + 1)
        try:
            if info.st_uid != os.geteuid():
                raise _NotOurs(f"it belongs to another user (uid {info.st_uid})")
            if info.st_nlink != 1:
                raise _NotOurs(f"it has {info.st_nlink} names (hard links)")
            outputs = _outputs_of(data, m["run"])
            if data.get("ino") != info.st_ino:
                raise _NotOurs("it is not the file flowgpu wrote (its content records another inode: a copy, "
                               "or a file written by hand)")
            here = os.path.realpath(os.path.dirname(os.path.abspath(path)))
            if here not in {os.path.realpath(os.path.dirname(o.path)) for o in outputs}:
                raise _NotOurs("none of the outputs it names is in its folder")
        except _NotOurs as e:
            e.named = {o["path"] for o in _named(data)}
            raise
        return fd, outputs, m["run"]
    except BaseException:
        os.close(fd)
        raise


def _there(path: str, isdir: bool, why: str, ino: int | None = None) -> bool:
    """Whether ``path`` is there; _NotOurs(``why``) unless this user's dir (or file), of inode ``ino``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not (stat.S_ISDIR if isdir else stat.S_ISREG)(info.st_mode) or info.st_uid != os.geteuid() \
            or ino not in (None, info.st_ino):
        raise _NotOurs(why)
    return True


def _refusal(path: str, why: str) -> Refused:
    return Refused(f"left alone {path}: {why}; flowgpu follows a journal only when it can tell that it wrote it, "
                   "there, and made all it names, so it touched nothing it names. Check the outputs it names, then "
                   "remove it")


def recover_journal(path: str, blocking: bool = True, only: str | None = None) -> list[str] | None:
    """Finish the commit of a run that died: forward if it had decided, else back.

    Returns notes on what was done ([]: nothing to do, or it does not name ``only``), or None when
    the run is alive and ``blocking`` is False. A journal not flowgpu's gives a :class:`Refused`.
    """
    fds: list[int] = []
    try:
        try:
            fd, outputs, run = _open_journal(path)
        except _NotOurs as e:
            if only is not None and only not in getattr(e, "named", set()):
                return []
            return [_refusal(path, str(e))]
        fds.append(fd)
        if only is not None and only not in {o.path for o in outputs}:
            return []
        journals = sorted({_journal_of(run, os.path.dirname(o.path)) for o in outputs})
        present = []
        for j in journals:  # every journal of the run, each checked as this one was, then locked
            try:
                jfd, theirs, _ = _open_journal(j)
            except FileNotFoundError:
                continue
            fds.append(jfd)
            if theirs != outputs:
                raise _NotOurs(f"the journal {j} of the same run names other outputs")
            try:
                fcntl.flock(jfd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                return None
            with contextlib.suppress(FileNotFoundError):  # a journal removed meanwhile is no longer there
                if os.lstat(j).st_ino == os.fstat(jfd).st_ino:
                    present.append(j)
        if not present or not os.path.exists(path):
            return []  # finished meanwhile
        forward = _there(_flag(journals), False, f"its decision {_flag(journals)} is not a file flowgpu made")
        touched = [o for o in outputs if _there(  # all checked before anything moves
            o.stage, True, f"{o.stage} is not the staging dir flowgpu made for {o.path} (it was replaced since)",
            o.stage_ino)]
        notes: list[str] = []
        for o in touched:
            (_roll_forward if forward else _roll_back)(o, notes)
        _finish(touched, journals, present)
        done = "completed (all new)" if forward else "undone (all old)"
        return [f"an interrupted commit of {', '.join(o.path for o in outputs)} was {done}", *notes]
    except FileNotFoundError:
        return []
    except _NotOurs as e:
        return [_refusal(path, str(e))]
    finally:
        for fd in fds:
            os.close(fd)


def journals_in(directory: str) -> list[str]:
    return sorted(os.path.join(directory, n) for n in listing(directory) if _JOURNAL.match(n))


def stages_in(directory: str) -> list[tuple[str, str]]:
    """``(staging dir, output path)`` of every path in ``directory`` named like a staging dir."""
    found = ((n, _STAGE.match(n)) for n in sorted(listing(directory)))
    return [(os.path.join(directory, n), os.path.join(directory, m["name"])) for n, m in found if m]


def _named(data: object) -> list[dict]:
    """The outputs a journal's content lists (with a path), as far as it can be read."""
    named = data.get("outputs") if isinstance(data, dict) else None
    if not isinstance(named, list):
        return []
    return [o for o in named if isinstance(o, dict) and isinstance(o.get("path"), str)]


def stage_owner(stage: str) -> dict | None:
    """The owner record flowgpu wrote into ``stage``; None for a user's folder, a copy, another user's."""
    record = read_record(os.path.join(stage, "owner.json"))
    try:  # the record names the inode of the dir it was written into: what a copy cannot have
        ours = is_record(record) and isinstance(record["ino"], int) and _there(stage, True, "", record["ino"])
    except (KeyError, OSError, _NotOurs):
        return None
    return record if ours else None


def referenced_stages(directory: str) -> set[str]:
    """Staging dirs named by journals still in ``directory`` (never removed as stale)."""
    # a file larger than _MOST is no journal flowgpu wrote: not JSON within it
    return {stage_dir(o["path"], o["id"]) for j in journals_in(directory) for o in _named(read_record(j, _MOST + 1))
            if isinstance(o.get("id"), str)}
