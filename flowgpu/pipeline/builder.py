"""Pipelines written in Python: the same :class:`~flowgpu.pipeline.spec.Spec` as a YAML file, built by calls.

Each call adds one entry of the spec and returns a reference to it; references of params render
as ``${params.name}`` (in f-strings too), references of inputs and steps name them::

    import flowgpu as fg

    p = fg.Pipeline("quickstart", description="standardise the columns of a matrix")
    n = p.param("n", 500, description="rows and columns")
    x = p.input("x", source="normal", shape=[n, n], dtype="float32", seed=0, chunks=[250, -1])
    mu = p.step("mu", "mean", x, axis=0, keepdims=True)      # positional refs: the inputs (a list)
    z = p.step("z", "expr", x=x, mu=mu, expression="x - mu")  # keyword refs: the inputs by name
    p.output("z", z, sink="zarr", path=f"out/{n}.zarr")       # -> path: out/${params.n}.zarr
    p.output("total", p.step("total", "sum", z))
    p.run(session="local")                                    # or p.plan(), p.to_yaml("quickstart.yaml")

The spec is validated like a YAML file's, with a source map of the calls (:func:`call_site` parses
the calling expression), so a problem is reported at the argument that caused it
(``script.py:7:5: steps.z.args.expression: ...``). ``@p.blocks`` makes a module-level function a
``map_blocks`` step, its parameters naming its inputs.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import linecache
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from flowgpu import pipeline as api
from flowgpu.errors import ConfigError, SpecError, did_you_mean
from flowgpu.io import atomic
from flowgpu.pipeline.build import build, clip, load
from flowgpu.pipeline.checks import protected_paths
from flowgpu.pipeline.compiler import Plan, compile
from flowgpu.pipeline.loader import Path, SourceMap, format_path
from flowgpu.pipeline.planning import describe
from flowgpu.pipeline.spec import NAME_PATTERN, PARAM_TYPES, Spec
from flowgpu.registry import checking_only

__all__ = ["Pipeline", "Ref"]

Pos = tuple[int, int]
SPEC_HEAD = "# a flowgpu pipeline spec, written by Pipeline.to_yaml\n"  # what to_yaml replaces unasked


@dataclass
class Site:
    """One call: its file and position, and those of its arguments."""

    file: str
    at: Pos
    args: list[Pos | None] = field(default_factory=list)
    keywords: dict[str, Pos] = field(default_factory=dict)

    def arg(self, i: int) -> Pos:
        return (self.args[i] if i < len(self.args) else None) or self.at

    def keyword(self, name: str) -> Pos:
        return self.keywords.get(name, self.at)

    def given(self, name: str, i: int) -> Pos:
        return self.keywords.get(name) or self.arg(i)

    def error(self, message: str, path: Path = (), hint: str | None = None, at: Pos | None = None) -> SpecError:
        line, col = at or self.at
        return SpecError(message, file=self.file, line=line, col=col, path=format_path(tuple(path)), hint=hint)


@functools.lru_cache(maxsize=32)
def _calls(file: str, text: str) -> dict[tuple[int, int, int, int], ast.Call]:
    """The call expressions of a source text, by their :class:`dis.Positions`."""
    try:
        tree = ast.parse(text, filename=file)
    except (SyntaxError, ValueError):
        return {}
    return {(n.lineno, n.end_lineno, n.col_offset, n.end_col_offset): n
            for n in ast.walk(tree) if isinstance(n, ast.Call)}


def _pos(node: ast.AST) -> Pos:
    return node.lineno, node.col_offset + 1


def call_site() -> Site:
    """The call into the builder (the first frame outside this file), with its arguments' positions."""
    frame = sys._getframe(1)
    skip = os.path.abspath(__file__)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename) == skip:
        frame = frame.f_back
    file = frame.f_code.co_filename
    positions = inspect.getframeinfo(frame, context=0).positions
    if positions is None or positions.lineno is None:
        return Site(file, (frame.f_lineno, 1))
    site = Site(file, (positions.lineno, (positions.col_offset or 0) + 1))
    call = _calls(file, "".join(linecache.getlines(file, frame.f_globals))).get(tuple(positions))
    if call is None:  # no source (the REPL, exec) or not a call (a bare decorator): the line is all we know
        return site
    starred = False
    for a in call.args:
        starred = starred or isinstance(a, ast.Starred)
        site.args.append(None if starred else _pos(a))
    for k in call.keywords:
        if k.arg is not None:
            site.keywords[k.arg] = _pos(k)
    return site


_TYPE_NAMES = {t: name for name, t in PARAM_TYPES.items()}


class Ref:
    """A param, input or step of one :class:`~flowgpu.pipeline.builder.Pipeline`: what its methods return and take."""

    __slots__ = ("pipeline", "name", "kind", "part")

    def __init__(self, pipeline: Any, name: str, kind: str, part: str | None = None):  # a builder.Pipeline
        self.pipeline, self.name, self.kind, self.part = pipeline, name, kind, part

    def __str__(self) -> str:
        if self.kind == "param":
            return "${params.%s}" % self.name
        return self.name if self.part is None else f"{self.name}.{self.part}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"<{self.kind} {str(self)!r} of pipeline {self.pipeline.name!r}>"

    def __getitem__(self, part: str | int) -> "Ref":
        """One result of a step with several (a ``uses`` step's outputs, an op returning a tuple)."""
        if self.kind != "step" or self.part is not None:
            raise call_site().error(f"{self!r} has no parts", hint="only a step's results have parts")
        return Ref(self.pipeline, self.name, self.kind, str(part))

    def __iter__(self):
        raise TypeError(f"{self!r} is a reference to a pipeline entry, not a sequence")


def render(owner: Any, site: Site, value: Any, path: tuple, at: Pos) -> Any:
    """``value`` as spec data: param refs as ``${params.name}``, tuples as lists, paths as text."""
    if isinstance(value, Ref):
        if value.kind == "param" and value.pipeline is owner:
            return str(value)
        raise site.error(f"{value!r} cannot be used here", path, at=at, hint=(
            "an array goes in as an input of a step (by position, or by keyword for ops taking inputs by "
            "name)" if value.kind != "param" else "use params of this pipeline"))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [render(owner, site, v, path + (i,), at) for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: render(owner, site, v, path + (k,), at) for k, v in value.items()}
    raise site.error(f"{type(value).__name__} {clip(repr(value), 50)} is not spec data", path, at=at,
                     hint="a spec holds numbers, strings, booleans, lists and mappings with string keys")


def step_function(func: Callable, site: Site) -> tuple[str, str]:
    """``(qualname, module)`` of a function a spec can name by import path (not a lambda, a closure or
    one of ``__main__``)."""
    what = getattr(func, "__qualname__", repr(func))
    module = getattr(func, "__module__", None)
    fix = "define it with def at the top level of a module (beside the script), and import it from there"
    if not inspect.isfunction(func) or func.__name__ == "<lambda>" or "<locals>" in what:
        kind = "a lambda" if getattr(func, "__name__", "") == "<lambda>" else (
            "defined inside a function" if "<locals>" in what else f"a {type(func).__name__}, not a function")
        raise site.error(f"step function {what!r} is {kind}: a spec names its function by import path", ("steps",),
                         hint=fix)
    if module in (None, "__main__"):
        raise site.error(f"step function {what!r} is defined in the script that runs (__main__): workers and "
                         "`flowgpu run` import it by 'module:name'", ("steps",), hint=fix)
    return what, module


_NODE_HINT = "pass what p.input(...) or p.step(...) returned (p['name'] gives it by name)"


class Pipeline:
    """A pipeline built in Python; ``spec`` is the validated :class:`Spec`, equal to the one its
    ``to_yaml()`` text loads as.

    Parameters
    ----------
    name, description : the spec's name and description.
    cluster : the spec's ``cluster:`` block (Session options, e.g. ``{"n_workers": 2}``).
    """

    def __init__(self, name: str = "pipeline", description: str = "", *, cluster: dict[str, Any] | None = None):
        site = call_site()
        smap = SourceMap(site.file)
        smap.mark(site.file, (), site.at)
        smap.mark(site.file, ("name",), site.given("name", 0))
        smap.mark(site.file, ("description",), site.given("description", 1))
        data = {"version": 1, "name": name, "description": description}
        self._setup(data, smap, {})
        for key, value in (cluster or {}).items():
            self._data["cluster"][key] = self._put(site, ("cluster", key), value, site.keyword("cluster"))

    def _setup(self, data: dict, smap: SourceMap, overrides: dict[str, Any]) -> None:
        self._data = data
        for section in ("params", "inputs", "steps", "outputs", "foreach", "cluster"):
            data.setdefault(section, {})
        self._smap, self._overrides = smap, overrides
        self._functions: dict[Callable, Ref] = {}
        self._spec: Spec | None = None

    @classmethod
    def from_spec(cls, spec: Spec) -> "Pipeline":
        """The pipeline of a spec (as written: params not substituted), to extend or write out."""
        origin = spec.origin
        p = cls.__new__(cls)
        p._setup(copy.deepcopy(origin.raw), copy.deepcopy(origin.smap), dict(origin.overrides))
        return p

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> "Pipeline":
        """:func:`from_spec` of the YAML spec at ``path``."""
        return cls.from_spec(load(path, overrides))

    # -- defining -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._data.get("name", "pipeline")

    def param(self, name: str, default: Any = None, *, type: Any = None, description: str = "") -> Ref:  # noqa: A002
        """Declare param ``name`` (rendered as ``${params.name}``); ``type`` defaults to ``default``'s."""
        site = call_site()
        where = self._new(site, "params", name, self._data["params"])
        kind = _TYPE_NAMES.get(type, type) if type is not None else _TYPE_NAMES.get(default.__class__)
        entry: dict[str, Any] = {} if kind is None else {"type": kind}
        at = site.given("default", 1)
        entry["default"] = render(self, site, default, where + ("default",), at)
        if description:
            entry["description"] = description
        for key, pos in (("type", site.keyword("type")), ("default", at), ("description", site.keyword("description"))):
            self._smap.mark(site.file, where + (key,), pos)
        self._data["params"][name] = entry
        return Ref(self, name, "param")

    def input(self, name: str, source: str | None = None, **options: Any) -> Ref:
        """Add input ``name`` read from ``source`` (see ``flowgpu sources``) with its options."""
        site = call_site()
        where = self._new(site, "inputs", name, self._nodes())
        entry: dict[str, Any] = {}
        if source is not None and not isinstance(source, str):  # it failed later as "unknown source 'dask.array<...'"
            raise site.error(f"source is the name of a source (see `flowgpu sources`), not a "
                             f"{type(source).__module__}.{type(source).__qualname__}", where + ("source",),
                             hint="for data made in Python, source='python' with callable='module:function' "
                             "returning it (a spec holds names, not arrays)", at=site.given("source", 1))
        if source is not None:
            entry["source"] = source
            self._smap.mark(site.file, where + ("source",), site.given("source", 1))
        entry.update(self._options(site, where, options))
        self._data["inputs"][name] = entry
        return Ref(self, name, "input")

    def step(self, name: str, op: str, *inputs: Any, args: dict[str, Any] | None = None,
             expect: dict[str, Any] | None = None, description: str = "", **kwargs: Any) -> Ref:
        """Add step ``name`` applying ``op`` (see ``flowgpu ops``). Refs given by position are its
        inputs (a list); refs given by keyword, its inputs by name (a mapping); every other keyword is
        an argument of the op (``args=`` holds one whose name a keyword here cannot take)."""
        site = call_site()
        where = self._new(site, "steps", name, self._nodes())
        named = {k: v for k, v in kwargs.items()  # refs of inputs and steps, and functions made steps
                 if (v.kind != "param" if isinstance(v, Ref) else inspect.isfunction(v) and v in self._functions)}
        if inputs and named:
            raise site.error("give a step's inputs by position (a list) or by name (a mapping), not both",
                             where + ("inputs",), hint="name them all, e.g. x=x, mu=mu, for an op such as expr")
        entry: dict[str, Any] = {"op": op}
        self._smap.mark(site.file, where + ("op",), site.given("op", 1))
        self._smap.mark(site.file, where + ("inputs",), site.at)
        if inputs:
            entry["inputs"] = [self._input(site, where + ("inputs", i), r, site.arg(2 + i))
                               for i, r in enumerate(inputs)]
        elif named:
            entry["inputs"] = {k: self._input(site, where + ("inputs", k), r, site.keyword(k))
                               for k, r in named.items()}
        rest = {k: v for k, v in kwargs.items() if k not in named}
        entry.update(self._step_extras(site, where, {**(args or {}), **rest}, expect, description))
        self._data["steps"][name] = entry
        return Ref(self, name, "step")

    def uses(self, name: str, spec: str | os.PathLike, *, params: dict[str, Any] | None = None,
             description: str = "", **inputs: Ref) -> Ref:
        """Add step ``name`` that runs another spec file (``uses:``; its path relative to this script),
        its inputs bound by keyword to refs here; ``ref["out"]`` is its output ``out``."""
        site = call_site()
        where = self._new(site, "steps", name, self._nodes())
        entry: dict[str, Any] = {"uses": os.fspath(spec)}
        self._smap.mark(site.file, where + ("uses",), site.given("spec", 1))
        if inputs:
            entry["inputs"] = {k: self._input(site, where + ("inputs", k), r, site.keyword(k))
                               for k, r in inputs.items()}
        if params:
            entry["params"] = self._put(site, where + ("params",), dict(params), site.keyword("params"))
        if description:
            entry["description"] = description
        self._data["steps"][name] = entry
        return Ref(self, name, "step")

    def output(self, name: str, ref: Any, sink: str | None = None, **options: Any) -> None:
        """Write ``ref`` (an input or step) to ``sink`` (default: the run summary) with its options
        (``path=``, ...; see ``flowgpu sinks``)."""
        site = call_site()
        where = self._new(site, "outputs", name, self._data["outputs"])
        at = site.given("ref", 1)
        entry: dict[str, Any] = {"from": self._node(site, ref, where + ("from",), at)}
        self._smap.mark(site.file, where + ("from",), at)
        if sink is not None:
            entry["sink"] = sink
            self._smap.mark(site.file, where + ("sink",), site.given("sink", 2))
        entry.update(self._options(site, where, options))
        self._data["outputs"][name] = entry

    def foreach(self, **values: Any) -> None:
        """Run the pipeline once per value (several: per combination) of params: ``n=[100, 200]``
        (a list or ``range``), ``path={"glob": "data/*.npy"}`` or ``n={"range": "0:100:10"}``."""
        site = call_site()
        new = {}
        for key, value in values.items():
            if key in self._data["foreach"]:
                raise site.error(f"foreach param {key!r} is given twice", ("foreach", key), at=site.keyword(key),
                                 hint="give each param's values once")
            value = list(value) if isinstance(value, range) else value
            new[key] = render(self, site, value, ("foreach", key), site.keyword(key))
        for key in new:
            self._smap.mark(site.file, ("foreach", key), site.keyword(key))
        self._data["foreach"].update(new)
        self._spec = None

    def blocks(self, function: Callable | None = None, /, *, name: str | None = None, dtype: Any = None,
               drop_axis: Any = None, new_axis: Any = None, chunks: Any = None, kwargs: dict | None = None,
               expect: dict | None = None, description: str | None = None, **inputs: Ref) -> Any:
        """Decorator: the function becomes a ``map_blocks`` step named after it (or ``name``), whose
        inputs are the inputs or steps its parameters without defaults name (a keyword here binds one
        to another ref). It must be a module-level function of an importable module."""
        site = call_site()
        options = {"dtype": dtype, "drop_axis": drop_axis, "new_axis": new_axis, "chunks": chunks, "kwargs": kwargs}

        def add(func: Callable) -> Callable:
            self._add_function(site, func, name, options, expect, description, inputs)
            return func

        return add if function is None else add(function)

    def __getitem__(self, name: str) -> Ref:
        """The ref of input or step ``name``, or of param ``params.name``."""
        param = name[len("params."):] if isinstance(name, str) and name.startswith("params.") else None
        known = list(self._data["params"]) if param is not None else self._nodes()
        if (param or name) in known:
            kind = "param" if param is not None else "input" if name in self._data["inputs"] else "step"
            return Ref(self, param or name, kind)
        raise call_site().error(f"pipeline {self.name!r} has no {'param' if param else 'input or step'} "
                                        f"{name!r}", hint=did_you_mean(param or name, known, "it has: "
                                                                       f"{', '.join(map(str, known)) or 'none'}"))

    # -- using --------------------------------------------------------------------------------------
    @property
    def spec(self) -> Spec:
        if self._spec is None:
            self._spec = build(self.to_dict(), self._smap, self._overrides)
        return self._spec

    def to_dict(self) -> dict[str, Any]:
        """The spec as data, as a YAML file would hold it (``${params.name}`` not substituted)."""
        return copy.deepcopy({k: v for k, v in self._data.items() if v != {} and not (k == "description" and not v)})

    def to_yaml(self, path: str | os.PathLike | None = None, *, schema: str | None = None,
                overwrite: bool = False) -> str:
        """The spec as YAML text, checked first (it loads); written (atomically) to ``path`` when given.

        Never over the script, an input of the spec, or a folder; over a file that ``to_yaml`` did
        not write only with ``overwrite``. ``schema`` adds the editors' modeline, e.g.
        ``schema="./flowgpu-pipeline.schema.json"``."""
        spec = self.spec  # refuse to write a spec that would not load
        text = yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=110,
                              allow_unicode=True)
        text = SPEC_HEAD + (f"# yaml-language-server: $schema={schema}\n" if schema else "") + text
        if path is not None:
            path, fix = os.fspath(path), f"write it to a path of its own, e.g. {self.name}.yaml"
            if (hit := atomic.replaces_protected(path, protected_paths(spec))) is not None:
                raise ConfigError(f"to_yaml: {path!r} {hit}, which it never replaces; {fix}")
            if os.path.isdir(path):
                raise ConfigError(f"to_yaml: {path!r} is a folder; {fix}")
            atomic.write_text(path, text, head=None if overwrite else SPEC_HEAD.encode(), what="spec", public=True)
        return text

    def compile(self, params: dict[str, Any] | None = None, **kwargs: Any) -> Plan:
        """:func:`flowgpu.pipeline.compile` of this pipeline."""
        return compile(self.spec, params, **kwargs)

    def plan(self, params: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """What ``flowgpu plan`` shows (the callables it names checked in their source, not imported)."""
        with checking_only():
            return describe(self.compile(params, **kwargs))

    def run(self, **kwargs: Any) -> Any:
        """:func:`flowgpu.pipeline.run` of this pipeline (``session=``, ``overrides=``, ``foreach=``, ...)."""
        return api.run(self.spec, **kwargs)

    def status(self, **kwargs: Any) -> Any:
        """:func:`flowgpu.pipeline.status` of this pipeline: what a run would compute, without running."""
        return api.status(self.spec, **kwargs)

    def __repr__(self) -> str:
        counts = ", ".join(f"{len(self._data[s])} {s}" for s in ("params", "inputs", "steps", "outputs"))
        return f"<flowgpu.Pipeline {self.name!r}: {counts}>"

    # -- helpers ------------------------------------------------------------------------------------
    def _nodes(self) -> list[str]:
        return [*self._data["inputs"], *self._data["steps"]]

    def _new(self, site: Site, section: str, name: Any, taken: Any) -> tuple[str, str]:
        at = site.given("name", 0)
        if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
            raise site.error(f"{name!r} is not a valid name", (section,), at=at,
                             hint="names start with a letter or '_' and hold letters, digits and '_'")
        if name in taken:
            first = section if section in ("params", "outputs") else (
                "inputs" if name in self._data["inputs"] else "steps")
            err = self._smap.error("", (first, name), key=True)
            raise site.error(f"{name!r} is already defined ({first}.{name}, at {err.location})", (section, name),
                             at=at, hint="give each input and step a name of its own")
        self._smap.mark(site.file, (section, name), site.at, at)
        self._spec = None  # built again when asked for
        return section, name

    def _node(self, site: Site, value: Any, path: tuple, at: Pos) -> str:
        if inspect.isfunction(value) and value in self._functions:
            value = self._functions[value]
        if isinstance(value, Ref) and value.pipeline is not self:
            raise site.error(f"{value!r} belongs to another pipeline", path, at=at,
                             hint=f"refer to inputs and steps of {self.name!r}; to reuse another pipeline, "
                                  "write it with to_yaml() and add it with p.uses(...)")
        if isinstance(value, Ref) and value.kind == "param":
            raise site.error(f"{value!r} is a param, not an array", path, at=at,
                             hint="give params to an op by keyword, e.g. axis=n")
        if isinstance(value, Ref):
            return str(value)
        hint = f"{_NODE_HINT}, e.g. p[{value!r}]" if isinstance(value, str) else _NODE_HINT
        raise site.error(f"{type(value).__name__} {clip(repr(value), 50)} where an input or step is needed", path,
                         at=at, hint=hint + (" (other op arguments go by keyword)" if not callable(value) else ""))

    def _input(self, site: Site, path: tuple, ref: Any, at: Pos) -> str:
        self._smap.mark(site.file, path, at)
        return self._node(site, ref, path, at)

    def _put(self, site: Site, path: tuple, value: Any, at: Pos) -> Any:
        """``value`` rendered as spec data, its place recorded."""
        out = render(self, site, value, path, at)
        self._smap.mark(site.file, path, at)
        return out

    def _options(self, site: Site, where: tuple, options: dict[str, Any]) -> dict[str, Any]:
        return {k: self._put(site, where + (k,), value, site.keyword(k)) for k, value in options.items()}

    def _step_extras(self, site: Site, where: tuple, args: dict[str, Any], expect: Any, description: Any,
                     ats: dict[str, Pos] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        ats = ats or {}
        if args:
            self._smap.mark(site.file, where + ("args",), site.keyword("args"))
            out["args"] = {}
            for key, value in args.items():
                at = ats.get(key) or site.keywords.get(key) or site.keyword("args")
                out["args"][key] = self._put(site, where + ("args", key), value, at)
        if expect is not None:
            out["expect"] = self._put(site, where + ("expect",), expect, site.keyword("expect"))
        if description:
            out["description"] = description
        return out

    def _add_function(self, site: Site, func: Callable, name: str | None, options: dict[str, Any],
                      expect: Any, description: str | None, bound: dict[str, Ref]) -> None:
        what, module = step_function(func, site)
        step = name or func.__name__
        params = inspect.signature(func).parameters.values()
        inputs: list[str] = []
        for par in params:
            if par.kind in (par.VAR_POSITIONAL, par.VAR_KEYWORD) or (par.kind == par.KEYWORD_ONLY
                                                                      and par.default is par.empty):
                raise site.error(f"step function {what!r}: parameter {par.name!r} cannot name an input",
                                 ("steps", step), hint="give each input a parameter of its own; other parameters "
                                                       "take defaults, and values through kwargs={...}")
            if par.default is not par.empty:
                continue
            ref = bound.get(par.name)
            if ref is None and par.name not in self._nodes():
                raise site.error(f"step function {what!r}: parameter {par.name!r} names no input or step of "
                                 f"{self.name!r}", ("steps", step, "inputs"), hint=did_you_mean(
                                     par.name, self._nodes(),
                                     f"define {par.name!r} first, or bind it: @p.blocks({par.name}=ref)"))
            inputs.append(self._node(site, ref, ("steps", step, "inputs"), site.keyword(par.name)) if ref is not None
                          else par.name)
        extra = sorted(set(bound) - {par.name for par in params})
        if extra or not inputs:
            raise site.error(f"step function {what!r}: " + (f"it has no parameter {extra[0]!r}" if extra else
                             "it takes no inputs"), ("steps", step), at=site.keyword(extra[0]) if extra else None,
                             hint="its parameters without defaults name its inputs")
        where = self._new(site, "steps", step, self._nodes())
        args = {"function": f"{module}:{what}", **{k: v for k, v in options.items() if v is not None}}
        doc = (inspect.getdoc(func) or "").strip().splitlines()
        entry: dict[str, Any] = {"op": "map_blocks", "inputs": inputs}
        entry.update(self._step_extras(site, where, args, expect, description or (doc[0] if doc else ""),
                                       {"function": site.at}))
        self._data["steps"][step] = entry
        self._functions[func] = Ref(self, step, "step")

