"""What made each output (its recipe) and the fingerprints of the files it read, so a run can tell
which outputs are up to date (:mod:`flowgpu.pipeline.cache`).

An output's digest is a Merkle hash, from the spec (never the Dask graph), over the nodes upstream
of it: sources and options, ops, args, the params they use, the user code they call, flowgpu's
version, then the sink, path and options. So it does not change with chunks chosen for the machine,
fusion, dict order or steps not upstream. Input fingerprints are kept beside it, not in it, so the
cache can say which input changed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from dask.base import tokenize

from flowgpu import __version__, importcheck
from flowgpu.io import paths, sinks, sources
from flowgpu.ops import registry
from flowgpu.pipeline.compiler import Plan
from flowgpu.pipeline.spec import PARAM_REF
from flowgpu.registry import import_candidates

__all__ = ["Recipe", "recipes", "fingerprint", "same_fingerprint", "content_digest"]

# -- fingerprints of files and folders -------------------------------------------------------------
_hasher = functools.partial(hashlib.blake2b, digest_size=16)


def content_digest(path: str) -> str:
    """blake2b of a file's bytes (``hashlib.file_digest``: read in blocks, bounded memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, _hasher).hexdigest()


def _folder(path: str, checksum: bool) -> dict:
    files = []
    for root, dirs, names in os.walk(path, onerror=_raise):
        dirs.sort()
        for name in names:
            full = os.path.join(root, name)
            st = os.stat(full)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            files.append((rel, st.st_size, st.st_mtime_ns, stat.S_ISREG(st.st_mode)))
    files.sort()
    listing = _hasher()
    for rel, size, mtime, _ in files:
        listing.update(f"{rel}\0{size}\0{mtime}\n".encode())
    out = {"kind": "dir", "files": len(files), "size": sum(f[1] for f in files), "stat": listing.hexdigest()}
    if checksum:
        h = _hasher()
        for rel, size, _, regular in files:
            h.update(f"{rel}\0{size}\n".encode())
            if regular:
                h.update(bytes.fromhex(content_digest(os.path.join(path, rel))))
        out["content"] = h.hexdigest()
    return out


def _raise(e: OSError) -> None:
    raise e


def fingerprint(path: str, checksum: bool = False) -> dict:
    """What a file or folder looks like now (size and mtimes; ``checksum``: a digest of the contents).
    Never raises: a missing, unreadable, special or remote path has a kind never the same as another."""
    if "://" in path:
        return {"kind": "remote"}  # never the same: a remote input is read again every run
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return _folder(path, checksum)
        if not stat.S_ISREG(st.st_mode):
            return {"kind": "special"}  # a FIFO or device: never read, never the same
        out: dict[str, Any] = {"kind": "file", "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if checksum:
            out["content"] = content_digest(path)
        return out
    except (FileNotFoundError, NotADirectoryError):
        return {"kind": "missing"}
    except OSError as e:
        return {"kind": "unreadable", "error": e.strerror or str(e)}


def same_fingerprint(recorded: dict | None, now: dict, checksum: bool = False) -> bool:
    """Whether ``now`` shows the same data as ``recorded``: same contents with ``checksum``, else same
    sizes and modification times."""
    if not recorded or now.get("kind") not in ("file", "dir") or recorded.get("kind") != now["kind"]:
        return False
    if checksum:
        return recorded.get("content") is not None and recorded.get("content") == now.get("content")
    keys = ("size", "mtime_ns") if now["kind"] == "file" else ("files", "size", "stat")
    return all(recorded.get(k) == now.get(k) for k in keys)


# -- canonical data and digests --------------------------------------------------------------------
def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    if hasattr(obj, "model_dump"):
        return _plain(obj.model_dump())
    if isinstance(obj, (set, frozenset)):
        return sorted((_plain(v) for v in obj), key=_canonical)
    if hasattr(obj, "dtype") and hasattr(obj, "shape") and hasattr(obj, "tobytes"):
        if obj.shape == ():
            return _plain(obj.item())
        return {"array": str(obj.dtype), "shape": list(obj.shape), "bytes": hashlib.blake2b(obj.tobytes()).hexdigest()}
    if isinstance(obj, bytes):
        return {"bytes": obj.hex()}
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    try:
        return {"object": type(obj).__qualname__, "token": tokenize(obj, ensure_deterministic=True)}
    except Exception:  # noqa: BLE001 - not tokenizable the same in every process: its text (maybe never equal)
        return {"object": type(obj).__qualname__, "repr": repr(obj)}


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=True)


def _digest(data: Any) -> str:
    return hashlib.blake2b(_canonical(_plain(data)).encode(), digest_size=16).hexdigest()


# -- user code --------------------------------------------------------------------------------------
def _find_file(module: str) -> str | None:
    """The file of ``module`` (found without importing anything)."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return getattr(loaded, "__file__", None)
    spec = importcheck.find_module(module)
    return spec.origin if spec is not None and spec.has_location else None


_READ: dict[str, tuple] = {}  # a Python file's digest by its stat: read again only once it changed


def _code_digest(file: str) -> str:
    """A Python file by its bytes; a compiled extension by its size and modification time. A file
    is read once per process while its inode, size, mtime and ctime stay (a write moves its ctime,
    which no one can set back; one within 2 s of the read may share its tick, so it is read again).
    Reading it cost a YAML run 1-3 ms for its callable's module."""
    try:
        st = os.stat(file)
        if not file.endswith(".py"):
            return f"stat:{st.st_size}:{st.st_mtime_ns}"
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if _READ.get(file, (None,))[0] == key:
            return _READ[file][1]
        digest = content_digest(file)
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > 2_000_000_000:  # not within a clock tick
            _READ[file] = (key, digest)  # of a write (git's "racily clean" rule): the stat says it all
        return digest
    except OSError:
        return "unreadable"


def _code(func: Any, import_path: Any = None) -> dict[str, str]:
    """Digests of the code a node calls: ``func``'s module unless it is flowgpu's, and ``import_path``'s."""
    code: dict[str, str] = {}
    if isinstance(import_path, str):
        found = next(filter(None, (_find_file(m) for m, _ in import_candidates(import_path.strip()))), None)
        code.update({os.path.abspath(found): _code_digest(found)} if found else {f"<{import_path}>": "not found"})
    module = getattr(func, "__module__", None) or type(func).__module__
    if module != "flowgpu" and not module.startswith("flowgpu."):
        found = _find_file(module)
        code.update({os.path.abspath(found): _code_digest(found)} if found else {f"<{module}>": "not readable"})
    return code


# -- recipes ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """What makes output ``output``: ``digest`` covers everything behind it; ``params`` the values it uses,
    ``inputs`` the fingerprints of the files it reads, ``code`` the digests of the user code it calls."""

    output: str
    digest: str
    params: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, dict] = field(default_factory=dict)
    code: dict[str, str] = field(default_factory=dict)


@dataclass
class _Part:

    digest: str
    params: frozenset[str] = frozenset()
    files: frozenset[str] = frozenset()
    code: dict[str, str] = field(default_factory=dict)


def _param_names(data: Any) -> set[str]:
    if isinstance(data, (dict, list)):
        return set().union(*map(_param_names, data.values() if isinstance(data, dict) else data))
    return {m.group(1) for m in PARAM_REF.finditer(data)} if isinstance(data, str) else set()


class _Hasher:
    """Digests of the references of one plan; ``bindings``: the parts bound to a ``uses`` spec's inputs."""

    def __init__(self, plan: Plan, bindings: dict[str, _Part] | None = None):
        self.plan, self.spec = plan, plan.spec
        self.top = bindings is None
        self.bindings = bindings or {}
        origin = self.spec.origin
        self.raw = origin.raw if isinstance(origin.raw, dict) else {}
        self.overrides = {k: v for k, v in origin.overrides.items()
                          if not k.startswith("params.")}
        self.memo: dict[str, _Part] = {}
        self.children: dict[str, _Hasher] = {}
        for name in plan.order:  # bottom up, so a chain of any length never recurses deeper than one step
            step = self.spec.steps.get(name)
            if step is None or step.uses is None:
                self.ref(name)

    def used(self, section: str, name: str) -> set[str]:
        found = _param_names((self.raw.get(section) or {}).get(name))
        prefix = f"{section}.{name}"
        for key, value in self.overrides.items():
            if key == prefix or key.startswith(prefix + "."):
                found |= _param_names(value)
        return found & set(self.plan.params)

    def ref(self, ref: str) -> _Part:
        if ref in self.memo:
            return self.memo[ref]
        head, _, part = ref.partition(".")
        if head in self.spec.steps and self.spec.steps[head].uses is not None:
            out = self._uses(head, part)
        elif part:
            whole = self.ref(head)
            out = _Part(_digest({"of": whole.digest, "part": part}), whole.params, whole.files, whole.code)
        else:
            out = self._node(head)
        self.memo[ref] = out
        return out

    def _own(self, section: str, name: str, content: dict, code: dict[str, str], deps: list[_Part],
             files: frozenset[str] = frozenset()) -> _Part:
        names = self.used(section, name)
        content["params"] = {n: self.plan.params[n] for n in sorted(names)}
        content["code"] = code
        upstream_code = {k: v for d in deps for k, v in d.code.items()}
        return _Part(_digest(content), frozenset().union(*(d.params for d in deps), names if self.top else ()),
                     files.union(*(d.files for d in deps)), upstream_code | code)

    def _node(self, name: str) -> _Part:
        if name in self.bindings:
            return self.bindings[name]
        if name in self.spec.inputs:
            return self._input(name)
        step = self.spec.steps[name]
        op = registry.get(step.op)
        if isinstance(step.inputs, dict):
            deps = {k: self.ref(r) for k, r in step.inputs.items()}
            inputs: Any = {k: p.digest for k, p in deps.items()}
        else:
            deps = {str(i): self.ref(r) for i, r in enumerate(step.inputs)}
            inputs = [p.digest for p in deps.values()]
        code = _code(op.func, step.args.get("function") if op.kind == "user" else None)
        content = {"kind": "step", "op": step.op, "args": step.args, "inputs": inputs}
        return self._own("steps", name, content, code, list(deps.values()))

    def _input(self, name: str) -> _Part:
        model = self.spec.inputs[name]
        entry = sources.source_entry(model.source)
        options = model.model_dump(exclude={"source"})
        files: frozenset[str] = frozenset()
        if entry.has(sources.READS_FILES) and isinstance(options.get("path"), str):
            if "://" not in options["path"]:  # a URL has no fingerprint here: always "changed"
                options["path"] = os.path.abspath(options["path"])
            files = frozenset(paths.expand(options["path"]) or [options["path"]])  # a glob (TIFF pages): each file
        code = _code(entry.func, options.get("callable") if entry.has(sources.CALLS_USER_CODE) else None)
        content = {"kind": "input", "source": model.source, "options": options}
        return self._own("inputs", name, content, code, [], files)

    def _uses(self, name: str, part: str) -> _Part:
        step = self.spec.steps[name]
        if name not in self.children:
            bound = {inner: self.ref(r) for inner, r in (step.inputs or {}).items()}
            self.children[name] = _Hasher(self.plan.children[name], bound)
        child = self.children[name]
        inner = child.ref(child.spec.outputs[part].from_) if part in child.spec.outputs else child.ref(part)
        content = {"kind": "uses", "output": inner.digest}
        return self._own("steps", name, content, {}, [inner])

    def output(self, name: str) -> _Part:
        out = self.spec.outputs[name]
        upstream = self.ref(out.from_)
        entry = sinks.sink_entry(out.sink)
        content = {"flowgpu": __version__, "kind": "output", "from": upstream.digest, "sink": out.sink,
                   "path": os.path.abspath(out.path) if out.path is not None else None,
                   "options": out.sink_options()}
        return self._own("outputs", name, content, _code(entry.func), [upstream])


def recipes(plan: Plan, *, checksum: bool = False) -> dict[str, Recipe]:
    """The :class:`Recipe` of every output of ``plan``, its input files fingerprinted now: take them
    before a run reads its inputs, so a file changed during the run is seen as changed."""
    hasher = _Hasher(plan)
    parts = {name: hasher.output(name) for name in plan.spec.outputs}
    prints = {path: fingerprint(path, checksum) for path in set().union(*(part.files for part in parts.values()))}
    return {name: Recipe(name, part.digest, {n: plan.params[n] for n in sorted(part.params)},
                         {path: prints[path] for path in sorted(part.files)}, dict(sorted(part.code.items())))
            for name, part in parts.items()}
