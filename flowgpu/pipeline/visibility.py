"""Before a run computes: does every worker see the run's inputs and outputs as the client does?

A worker on another host, in another mount namespace, or one whose storage is not the client's,
would find no Zarr store at an input's path and read every chunk as the fill value. So a run asks
each worker first, in one round trip (:func:`flowgpu.io.paths.probe` through ``client.run``):

* every input's metadata (a Zarr store's ``zarr.json`` / ``.zarray``, a ``.npy`` file) opens and reads;
* every output's staging folder, which the client has just made, is the same folder there (it
  holds the client's ``owner.json``) and takes a file.

``flowgpu validate --scheduler`` asks the same of the inputs, and for each output that its nearest
existing folder is the client's (same inode) and writable, writing nothing. A worker that cannot
is a :class:`~flowgpu.errors.PathNotVisibleError` (exit 2) naming the worker, its host and working
directory, the path, and what to do; nothing has been computed, and the run's staging is removed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from flowgpu import runtime
from flowgpu.errors import PathNotVisibleError
from flowgpu.io import paths, sources
from flowgpu.pipeline.compiler import Plan

__all__ = ["input_entries", "output_entries", "folder_entries", "check", "check_joined"]

# The file a staging folder holds from the start (flowgpu.io.atomic): who writes there.
STAGE_MARKER = "owner.json"


def _plans(plan: Plan) -> Iterable[Plan]:
    yield plan
    for child in plan.children.values():
        yield from _plans(child)


def input_entries(plans: Iterable[Plan]) -> list[dict[str, Any]]:
    """What the workers must read: the metadata of every input that reads stored data (in included specs too)."""
    out, seen = [], set()
    for top in plans:
        for plan in _plans(top):
            for name, node in plan.nodes.items():
                if node.kind != "input" or not node.reads_files:
                    continue
                model = plan.spec.inputs[name]
                path = getattr(model, "path", None)
                if not isinstance(path, str) or paths.is_url(path) or path in seen:
                    continue
                seen.add(path)
                files = paths.metadata_files(path, getattr(model, "component", None))
                if files:
                    out.append({"what": f"input {name!r} ({sources.source_entry(model.source).name})",
                                "path": path, "read": files})
    return out


def output_entries(pending: Iterable[Any]) -> list[dict[str, Any]]:
    """What the workers must write: the staging folder of every staged output (``PendingWrite``s)."""
    return [{"what": f"output {p.location!r}", "path": p.location, "write": p.atomic.stage, "marker": STAGE_MARKER}
            for p in pending if getattr(p, "atomic", None) is not None]


def folder_entries(spec: Any) -> list[dict[str, Any]]:
    """For a check that writes nothing (validate): each output path's nearest existing folder, by inode."""
    out = []
    for name, o in spec.outputs.items():
        if not o.path or paths.is_url(o.path):
            continue
        folder = os.path.dirname(o.path)
        while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        out.append({"what": f"output {name!r}", "path": o.path, "write": folder, "inode": os.stat(folder).st_ino})
    return out


def check(client: Any, entries: list[dict[str, Any]]) -> None:
    """Ask every worker of ``client``'s cluster about ``entries``; raise when one cannot reach one."""
    if client is None or not entries:
        return
    answers = client.run(paths.probe, [{k: v for k, v in e.items() if k not in ("what", "path")} for e in entries])
    problems = [(address, answer, problem) for address, answer in sorted(answers.items())
                for problem in answer["problems"]]
    if not problems:
        return
    address, answer, (index, path, why) = problems[0]
    entry = entries[index]
    shown = entry["path"] if path == entry["path"] else f"{entry['path']} ({path})"
    workers = len({a for a, _, _ in problems})
    more = f" (and {len(problems) - 1} more problem(s) on {workers} worker(s))" if len(problems) > 1 else ""
    raise PathNotVisibleError(
        f"{entry['what']}: {shown} {why} for worker {address} on host {answer['host']} (working directory "
        f"{answer['cwd']}){more}; {paths.FIX}. Nothing was computed")


def check_joined(spec: Any, plan: Plan, options: dict[str, Any]) -> None:
    """What ``validate --scheduler`` adds: join the scheduler in ``options`` (Session keywords) and ask
    its workers about ``plan``'s inputs and ``spec``'s output folders, writing nothing. Nothing when
    ``options`` names no scheduler."""
    options = {k: v for k, v in options.items() if k != "standalone"}
    address = options.pop("address", None)
    if address is None:
        return
    with runtime.Session(address, **options) as session:
        check(session.client, input_entries([plan]) + folder_entries(spec))
