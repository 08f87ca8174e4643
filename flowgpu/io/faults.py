"""A test hook: stop, fail or pause the process at named points (``faults.point(NAME)`` calls).

``FLOWGPU_TEST_FAULT`` holds comma-separated ``POINT[#N][@ACTION]`` items (``#N``: only the N-th
time this process reaches it). Actions: ``kill`` (default: ``os._exit(137)``, as SIGKILL),
``raise[=ERRNO]`` (an ``OSError``, EIO by default), ``pause=DIR`` (create ``DIR/POINT.reached``,
``:`` as ``-``, and wait up to 120 s for ``DIR/POINT.go``). Unset (outside tests), a point is a no-op.
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
