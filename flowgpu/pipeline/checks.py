"""What :func:`~flowgpu.pipeline.run` (and ``validate``) refuses before it computes anything: outputs
that are taken, given twice, or are or contain what the run needs; ``--summary``/``--report`` paths
that would replace any of these; a ``cluster:`` block that sends the run off this machine unasked.
"""

from __future__ import annotations

import ipaddress
import os
import pathlib
from typing import Any

from flowgpu import config
from flowgpu.diagnostics import runreport
from flowgpu.errors import BackendError, ConfigError, OutputExistsError, SpecError, SpecLimitError
from flowgpu.io import atomic, sinks
from flowgpu.io.paths import expand, misnamed, shown
from flowgpu.pipeline import tables
from flowgpu.pipeline.build import load
from flowgpu.pipeline.compiler import resolve_uses
from flowgpu.pipeline.loader import limit
from flowgpu.pipeline.spec import Spec
from flowgpu.runtime.options import resolve

__all__ = ["check_outputs", "check_side_files", "protected_paths", "session_options", "cluster_error",
           "check_session"]


def _spec_paths(spec: Spec, found: dict[str, str], stack: tuple[str, ...] = (), loaded: set | None = None) -> None:
    """The files a run reads (``realpath -> what it is``): the spec, its includes and its inputs' paths.
    Each included file is read once per params, at most ``flowgpu.spec.max-includes`` times in all."""
    loaded = set() if loaded is None else loaded
    origin = spec.origin
    if origin.file:
        found.setdefault(os.path.realpath(origin.file), f"the spec {origin.file!r}" if not stack
                         else f"the included spec {origin.file!r}")
    for name, model in spec.inputs.items():
        path = getattr(model, "path", None)
        if isinstance(path, str) and path:
            for one in expand(os.path.expanduser(path)):  # a glob (a TIFF source's pages): each file it matches
                found.setdefault(os.path.realpath(one), f"input {name!r} ({shown(one)})")
    for name, step in spec.steps.items():
        if step.uses is None:
            continue
        child_file = resolve_uses(spec, name, origin.smap, stack)
        key = (child_file, repr(sorted(step.params.items())))
        if key in loaded:
            continue
        loaded.add(key)
        if len(loaded) > limit("max-includes"):
            raise origin.smap.error(f"more than {limit('max-includes')} included specs to read", ("steps", name, "uses"),
                                    kind=SpecLimitError,
                                    hint="include each spec from fewer steps, or raise flowgpu.spec.max-includes")
        child = load(child_file, {f"params.{k}": v for k, v in step.params.items()})
        _spec_paths(child, found, (*stack, os.path.abspath(origin.file or os.curdir)), loaded)


def protected_paths(spec: Spec, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What no output may be or contain (``realpath -> what it is``): what no command replaces, the
    cache, the spec, its includes, its inputs and ``extra``."""
    cache = config.get("cache.directory")
    found = atomic.protected_paths({**(extra or {}), cache: f"flowgpu's record of outputs ({cache})"})
    _spec_paths(spec, found)
    return found


def check_outputs(spec: Spec, overwrite: bool = False, protect: dict[str, str] | None = None) -> None:
    """Refuse output paths that are taken, given twice, nested, or are or contain what the run needs."""
    if not spec.outputs:  # an empty file too: a run that computes nothing and says ok is a mistake
        raise spec.error("the spec has no outputs, so a run would compute nothing", ("outputs",),
                         hint="add one, e.g. 'outputs: {result: {from: STEP}}'")
    smap = spec.origin.smap
    seen: dict[str, str] = {}
    protected = protected_paths(spec, protect) if any(o.path for o in spec.outputs.values()) else {}
    for name, out in spec.outputs.items():
        if out.path is None:
            continue
        path, same = os.path.abspath(out.path), atomic.canonical(out.path)
        if tables.collects(out):
            tables.check_path(spec, name, out.path)
            if same in seen and tables.collects(spec.outputs[seen[same]]):
                continue  # another column of the same table
        if same in seen:
            first = os.path.abspath(spec.outputs[seen[same]].path)
            through = "" if first == path else f" (through a linked folder: both are {same})"
            raise smap.error(f"outputs {seen[same]!r} and {name!r} both write {shown(out.path)!r}{through}",
                             ("outputs", name, "path"), hint="give each output its own path")
        nested = next((other for at, other in seen.items() if atomic.within(same, at) or atomic.within(at, same)), None)
        if nested is not None:  # one output's commit would replace (or write into) the other's
            inner, outer = sorted((shown(out.path), shown(spec.outputs[nested].path)), key=len, reverse=True)
            raise smap.error(f"outputs {nested!r} and {name!r}: {inner!r} is inside {outer!r}",
                             ("outputs", name, "path"), hint="give each output a path outside the others")
        seen[same] = name
        hit = atomic.replaces_protected(path, protected)
        if hit is not None:
            raise smap.error(f"output {name!r} would replace {shown(out.path)!r}, which {hit}",
                             ("outputs", name, "path"),
                             hint="write the output to a path of its own (a new name such as 'result.zarr'); "
                                  "--overwrite never replaces these")
        folder = next(p for p in (path, *map(str, pathlib.PurePath(path).parents)) if os.path.lexists(p))
        if folder != path and not os.path.isdir(folder):
            raise smap.error(f"output {name!r}: {shown(folder)!r} is a file, so {shown(out.path)!r} cannot be made "
                             "inside it", ("outputs", name, "path"), hint="give the output a path in a folder")
        try:
            sinks.check_destination(path, overwrite)
        except OutputExistsError as e:
            raise smap.error(str(e).split(";")[0], ("outputs", name, "path"),
                             hint="choose another path, or pass --overwrite (overwrite=True) to replace it") from None
    for name, out in spec.outputs.items():  # after the paths' clashes: two outputs at one path is the error then
        if out.path and (wrong := misnamed(out.path, sinks.sink_entry(out.sink).suffixes, f"sink {out.sink!r}")):
            raise smap.error(f"output {name!r}: {wrong[0]}", ("outputs", name, "path"), hint=f"name it e.g. {wrong[1]!r}")


SUMMARY_HEAD = b'{\n  "flowgpu": '  # how every summary a run writes begins (its first key is the version)
# each side file: its flag, what it is, and whether a path holds one flowgpu wrote (a file that begins as one)
_SIDE_FILES = (("--summary", "run summary", lambda path: atomic.starts_with(os.fspath(path), SUMMARY_HEAD)),
               ("--report", "run report", runreport.is_report))


def check_side_files(spec: Spec | str | os.PathLike | dict | None, summary: str | os.PathLike | None,
                     report: str | os.PathLike | None, overwrite: bool = False, params_file: str | None = None) -> None:
    """Refuse a ``--summary`` or ``--report`` path that is protected, an output's, the other one's, a
    folder, or (unless ``overwrite``) a file flowgpu did not write. ``spec``: loaded, or a path."""
    if summary is None and report is None:
        return
    extra = {params_file: f"the params file {params_file!r}"} if params_file else {}
    outputs: dict[str, str] = {}
    if isinstance(spec, Spec):
        protected = protected_paths(spec, extra)
        outputs = {atomic.canonical(o.path): n for n, o in spec.outputs.items() if o.path is not None}
    else:
        if isinstance(spec, (str, os.PathLike)):
            extra[os.fspath(spec)] = f"the spec {os.fspath(spec)!r}"
        protected = atomic.protected_paths(extra)
    seen: dict[str, str] = {}
    for (flag, what, ours), given in zip(_SIDE_FILES, (summary, report)):
        if given is None:
            continue
        path = os.fspath(given)
        hit = atomic.replaces_protected(path, protected)
        same = atomic.canonical(path)
        fix = f"write the {what} to a path of its own, e.g. {flag} run.{'json' if flag == '--summary' else 'html'}"
        if hit is not None:
            raise ConfigError(f"{flag} {path!r} {hit}, which the run must not replace; {fix} (--overwrite never "
                              "replaces the spec, its inputs or the working directory)")
        if same in outputs:
            raise ConfigError(f"{flag} {path!r} is the path of output {outputs[same]!r}; {fix}")
        if same in seen:
            raise ConfigError(f"{seen[same]} and {flag} are both {path!r}; {fix}")
        seen[same] = flag
        if os.path.isdir(path):
            raise ConfigError(f"{flag} {path!r} is a folder; {fix}")
        if os.path.lexists(path) and not overwrite and not ours(path):
            raise OutputExistsError(f"{flag} {path!r} already exists and is not a {what} flowgpu wrote; choose "
                                    "another path, or pass --overwrite (overwrite=True) to replace it")


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
    """Session keyword arguments: the spec's ``cluster:`` block, then ``cluster`` (CLI) overrides. A spec's
    address, non-local kind or non-loopback dashboard is refused unless confirmed (``allow_spec_address``,
    the key in ``cluster``, or ``--set``): a spec from elsewhere could send the data anywhere."""
    opts = {k: v for k, v in spec.cluster.model_dump().items() if v is not None}
    given = {k: v for k, v in (cluster or {}).items() if v is not None}
    set_here = spec.origin.overrides
    risky = {"address": ("sends this run, and its data, to the scheduler at", lambda v: False),
             "kind": ("sends this run, and its data, to batch jobs of", lambda v: v == "local"),
             "dashboard_address": ("opens the dashboard to the network at", _loopback)}
    for key, (does, harmless) in risky.items():
        value = opts.get(key)
        if (value is None or allow_spec_address or key in given or f"cluster.{key}" in set_here
                or harmless(str(value))):
            continue
        flag = {"address": f"--scheduler {value}", "kind": f"--cluster {value}"}.get(key, f"--set cluster.{key}={value}")
        raise spec.error(
            f"the spec {does} {value!r} (cluster.{key}); a spec from elsewhere could send your data anywhere",
            ("cluster", key), hint=f"if you mean it, confirm with {flag} or --allow-spec-address "
                                   "(Python: run(..., allow_spec_address=True)); else remove it from the spec")
    opts.update(given)
    return opts


def cluster_error(spec: Spec, opts: dict[str, Any], error: ConfigError | BackendError) -> SpecError:
    """``error`` of the session ``opts`` at the ``cluster:`` key it names first (else the block)."""
    said = {f" {error} ".find(f" {k}="): k for k in opts if f" {k}=" in f" {error} "}
    where = ("cluster",) + ((said[min(said)],) if said else ())
    return spec.error(str(error), where, hint="fix the cluster: block or the CLI option")


def check_session(spec: Spec, opts: dict[str, Any]) -> None:
    """Refuse the session ``opts`` that starting it would refuse (a bad size, no GPU for backend gpu);
    starts nothing."""
    kwargs = {k: v for k, v in opts.items() if k != "standalone"}
    try:
        resolve(kwargs.pop("address", None), **kwargs)
    except (ConfigError, BackendError) as e:
        raise cluster_error(spec, opts, e) from None
