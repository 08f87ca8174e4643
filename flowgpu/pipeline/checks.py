"""What :func:`~flowgpu.pipeline.run` refuses before it computes anything (``validate`` makes the
same checks): outputs that are taken, given twice, or that are or contain what the run needs, and
a spec's ``cluster:`` block sending the run or its dashboard off this machine without a word.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from flowgpu.errors import OutputExistsError
from flowgpu.io import sinks
from flowgpu.io.paths import shown
from flowgpu.pipeline import compose
from flowgpu.pipeline.build import load
from flowgpu.pipeline.spec import Spec

__all__ = ["check_outputs", "protected_paths", "session_options"]


def _spec_paths(spec: Spec, found: dict[str, str], stack: tuple[str, ...] = ()) -> None:
    """The files a run reads (``realpath -> what it is``): the spec, its includes and its inputs' paths."""
    origin = spec._origin
    if origin is not None and origin.file:
        found.setdefault(os.path.realpath(origin.file), f"the spec {origin.file!r}" if not stack
                         else f"the included spec {origin.file!r}")
    for name, model in spec.inputs.items():
        path = getattr(model, "path", None)
        if isinstance(path, str) and path:
            found.setdefault(os.path.realpath(os.path.expanduser(path)), f"input {name!r} ({shown(path)})")
    for name, step in spec.steps.items():
        if step.uses is None or origin is None:
            continue
        child_file = compose.resolve_uses(spec, name, origin.smap, stack)
        child = load(child_file, {f"params.{k}": v for k, v in step.params.items()})
        _spec_paths(child, found, (*stack, os.path.abspath(origin.file or os.curdir)))


def protected_paths(spec: Spec, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What no output may be or contain (``realpath -> what it is``): the working directory, the spec,
    its includes, every input path of the run, and ``extra`` (e.g. the params file)."""
    found = {os.path.realpath(os.getcwd()): "the working directory"}
    for path, what in (extra or {}).items():
        found.setdefault(os.path.realpath(path), what)
    _spec_paths(spec, found)
    return found


def check_outputs(spec: Spec, overwrite: bool = False, protect: dict[str, str] | None = None) -> None:
    """Refuse, before anything runs, output paths that are taken, given twice, or that are or
    contain what the run needs (:func:`protected_paths`; ``protect`` adds paths and what they are)."""
    smap = spec._origin.smap
    seen: dict[str, str] = {}
    protected = protected_paths(spec, protect) if any(o.path for o in spec.outputs.values()) else {}
    for name, out in spec.outputs.items():
        if out.path is None:
            continue
        path = os.path.abspath(out.path)
        if path in seen:
            raise smap.error(f"outputs {seen[path]!r} and {name!r} both write {shown(out.path)!r}", ("outputs", name, "path"),
                             hint="give each output its own path")
        seen[path] = name
        real = os.path.realpath(path)
        for kept, what in protected.items():
            if kept == real or kept.startswith(real.rstrip(os.sep) + os.sep):
                raise smap.error(f"output {name!r} would replace {shown(out.path)!r}, which {'is' if kept == real else 'contains'} "
                                 f"{what}", ("outputs", name, "path"),
                                 hint="write the output to a path of its own (a new name such as 'result.zarr'); "
                                      "--overwrite never replaces these")
        try:
            sinks.check_destination(path, overwrite)
        except OutputExistsError as e:
            raise smap.error(str(e).split(";")[0], ("outputs", name, "path"),
                             hint="choose another path, or pass --overwrite (overwrite=True) to replace it") from None


def _loopback(address: str) -> bool:
    """Whether ``address`` (``host:port``, ``tcp://host:port``, ``:port``) listens on this machine only."""
    rest = address.rpartition("://")[2].strip()
    if rest.startswith("["):
        host = rest[1:].partition("]")[0]
    elif rest.count(":") > 1:
        host = rest  # a bare IPv6 address
    else:
        host = rest.partition(":")[0] if ":" in rest else ("" if rest.isdigit() else rest)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" and 0.0.0.0 mean every interface; a name may resolve anywhere


def session_options(spec: Spec, cluster: dict[str, Any] | None = None, allow_spec_address: bool = False
                    ) -> dict[str, Any]:
    """Session keyword arguments: the spec's ``cluster:`` block, then ``cluster`` (CLI) overrides.

    A spec from elsewhere must not send the run's data to another scheduler or to batch jobs, or open
    the dashboard to the network, without a word: its ``cluster.address``, a ``cluster.kind`` other
    than local, and a ``cluster.dashboard_address`` that is not a loopback address are refused unless
    confirmed (``allow_spec_address``, the key in ``cluster``, or set on the command line with ``--set``).
    """
    opts = {k: v for k, v in spec.cluster.model_dump().items() if v is not None}
    given = {k: v for k, v in (cluster or {}).items() if v is not None}
    set_here = spec._origin.overrides if spec._origin is not None else {}
    risky = {"address": ("sends this run, and its data, to the scheduler at", lambda v: False),
             "kind": ("sends this run, and its data, to batch jobs of", lambda v: v == "local"),
             "dashboard_address": ("opens the dashboard to the network at", _loopback)}
    for key, (does, harmless) in risky.items():
        value = opts.get(key)
        if (value is None or allow_spec_address or key in given or f"cluster.{key}" in set_here
                or harmless(str(value))):
            continue
        flag = {"address": f"--scheduler {value}", "kind": f"--cluster {value}"}.get(key, f"--set cluster.{key}={value}")
        raise spec._origin.smap.error(
            f"the spec {does} {value!r} (cluster.{key}); a spec from elsewhere could send your data anywhere",
            ("cluster", key), hint=f"if you mean it, confirm with {flag} or --allow-spec-address "
                                   "(Python: run(..., allow_spec_address=True)); else remove it from the spec")
    opts.update(given)
    return opts
