"""A test hook: stop, fail or pause the process at named points of an output's commit.

``FLOWGPU_TEST_FAULT`` holds comma-separated ``POINT[#N][@ACTION]`` items, read at each point
(``#N``: only the N-th time this process reaches it, e.g. the second item of a batch):

- ``kill`` (the default): ``os._exit(137)``, as a SIGKILL would leave things;
- ``raise`` or ``raise=ENOSPC``: an ``OSError`` (EIO unless an errno name is given);
- ``pause=DIR``: create ``DIR/POINT.reached`` and wait (at most 120 s) until ``DIR/POINT.go`` exists.

Points: ``after-prepare`` (staged outputs created, before computing), ``after-compute``,
``item-committed`` (a batch item's outputs in place, before its cache entries are written),
``commit:before-marker``, ``commit:after-journal``, ``commit:after-aside`` (the first old output
set aside), ``commit:after-decision``, ``commit:after-first-rename`` (the first new output in
place), ``commit:before-cleanup``; ``zarr:unit-written`` (a Zarr chunk or shard file written from the
device path, in the task that wrote it); ``cluster:stopping`` (the daemon of a cluster that stays up, told
to stop, before it closes its workers). Unset (always, outside tests), every point is a no-op.
"""

from __future__ import annotations

import errno
import os
import time

__all__ = ["point", "ENV"]

ENV = "FLOWGPU_TEST_FAULT"
_reached: dict[str, int] = {}


def point(name: str) -> None:
    """Act on ``name`` if ``FLOWGPU_TEST_FAULT`` names it; return at once otherwise."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    count = _reached[name] = _reached.get(name, 0) + 1
    for item in spec.split(","):
        where, _, action = item.strip().partition("@")
        where, _, nth = where.partition("#")
        if where == name and (not nth or int(nth) == count):
            _act(name, action or "kill")


def _act(name: str, action: str) -> None:
    kind, _, arg = action.partition("=")
    if kind == "kill":
        os._exit(137)
    if kind == "raise":
        code = getattr(errno, arg, errno.EIO) if arg else errno.EIO
        raise OSError(code, f"{os.strerror(code)} (injected at {name})")
    if kind == "pause":
        stem = os.path.join(arg, name.replace(":", "-"))
        open(stem + ".reached", "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(stem + ".go") and time.monotonic() < deadline:
            time.sleep(0.02)
