"""Writes that never leave an output looking finished when it is not.

Every output is written under a temporary name beside its destination and moved into place only
when complete. A marker records that flowgpu wrote it, so an existing path that flowgpu did not
write is never replaced unless the caller says ``overwrite=True``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator

from flowgpu.errors import OutputExistsError

MARKER = ".flowgpu-output.json"
TMP_TAG = ".flowgpu-tmp-"


def marker_path(path: str) -> str:
    """Where the marker of ``path`` lives: inside a directory output, beside a file output."""
    if os.path.isdir(path):
        return os.path.join(path, MARKER)
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{MARKER}")


def written_by_flowgpu(path: str) -> bool:
    return os.path.exists(marker_path(path))


def check_writable(path: str, overwrite: bool = False) -> None:
    """Refuse to replace something flowgpu did not write, unless ``overwrite``.

    An output of an earlier flowgpu run (it carries flowgpu's marker) is replaced, so re-running a
    pipeline works; anything else at ``path`` is left alone unless ``overwrite=True``.
    """
    if os.path.lexists(path) and not overwrite and not written_by_flowgpu(path):
        raise OutputExistsError(
            f"output {path!r} already exists and was not written by flowgpu; "
            "choose another path, or pass overwrite=True (--overwrite) to replace it"
        )


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


class AtomicPath:
    """One output written under a temporary name and moved into place by :meth:`commit`.

    ``begin()`` checks the destination and returns the temporary path; ``commit()`` moves it into
    place with flowgpu's marker; ``abort()`` removes the temporary and leaves the destination as it was.
    """

    def __init__(self, path: str, overwrite: bool = False, meta: dict | None = None):
        self.path = os.path.abspath(path)
        self.overwrite = overwrite
        self.meta = meta or {}
        parent, name = os.path.split(self.path)
        self.tmp = os.path.join(parent, f".{name}{TMP_TAG}{uuid.uuid4().hex[:12]}")

    def begin(self) -> str:
        check_writable(self.path, self.overwrite)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        return self.tmp

    def abort(self) -> None:
        _remove(self.tmp)

    def commit(self) -> str:
        parent, name = os.path.split(self.path)
        old = None
        if os.path.lexists(self.path):
            old = os.path.join(parent, f".{name}{TMP_TAG}old-{uuid.uuid4().hex[:12]}")
            old_marker = marker_path(self.path)
            os.rename(self.path, old)
            if os.path.exists(old_marker):
                os.remove(old_marker)
        os.rename(self.tmp, self.path)
        with open(marker_path(self.path), "w") as f:
            json.dump({"writer": "flowgpu", **self.meta}, f)
        if old is not None:
            _remove(old)
        return self.path


@contextlib.contextmanager
def atomic_output(path: str, overwrite: bool = False, meta: dict | None = None) -> Iterator[str]:
    """Yield a temporary path to write to; on success move it to ``path`` with a marker.

    On any exception the temporary is removed and ``path`` is left as it was.
    """
    target = AtomicPath(path, overwrite, meta)
    tmp = target.begin()
    try:
        yield tmp
    except BaseException:
        target.abort()
        raise
    target.commit()
