"""``compile(spec)``: the lazy Dask graph of a pipeline, checked before anything runs.

Compiling is pure: it opens the sources (metadata only) and calls each op on lazy arrays, so a
step whose op refuses its inputs, or whose result differs from its ``expect``, is a SpecError at
its place in the file. The graph is plain dask.array; fusing it is the Session's job
(:mod:`flowgpu.fusion.graph`), the plan only says what will fuse (:func:`fusion_of`). A ``uses``
step compiles its spec as part of this one (its outputs become ``<step>.<output>``; its sinks
are not written).
"""

from __future__ import annotations

import graphlib
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from flowgpu.errors import (ArgumentError, ConfigError, FlowgpuError, ImportPathError, KernelError, RunError, SpecError,
                            SpecLimitError, did_you_mean)
from flowgpu.arrays.labels import bare, is_labelled
from flowgpu.backend import Facts, current_backend, using
from flowgpu.fusion import graph as fusion_graph
from flowgpu.io import sinks, sources
from flowgpu.ops import labels, registry
from flowgpu.ops.signature import bind_arguments
from flowgpu.pipeline import tables
from flowgpu.pipeline.build import build, load_spec
from flowgpu.pipeline.loader import SourceMap, limit, read_yaml
from flowgpu.pipeline.spec import Spec

__all__ = ["Plan", "Node", "compile", "resolve_uses"]


@dataclass
class Node:
    """One input or step of a compiled pipeline."""

    name: str
    kind: str  # "input", "step" or "uses"
    what: str  # the source, op or included file
    array: da.Array | None
    deps: list[str] = field(default_factory=list)
    fused_into: str | None = None  # the step whose kernel computes this one
    fused: str | None = None  # the fused expression this node's kernel computes
    reads_files: bool = False


@dataclass
class Plan:
    """A compiled pipeline: every node's lazy array and the outputs to produce."""

    spec: Spec
    nodes: dict[str, Node]
    order: list[str]
    arrays: dict[str, da.Array]
    outputs: dict[str, da.Array]
    params: dict[str, Any]
    children: dict[str, "Plan"] = field(default_factory=dict)
    fusion: dict[str, str] = field(default_factory=dict)  # step -> the expression its fused kernel computes
    facts: Facts = field(default_factory=Facts)  # what its arrays were built for (backend, worker budget, threads)
    for_run: bool = False  # its python sources were called (not stood in for by their declared shape)
    labelled: dict[str, Any] = field(default_factory=dict)  # output -> its xarray.DataArray, where labelled

    @property
    def fused(self) -> bool:
        return bool(self.fusion)

    @property
    def file(self) -> str | None:
        return self.spec.origin.file

    def tree(self) -> Iterator["Plan"]:
        """This plan and every included spec's, depth first."""
        yield self
        for child in self.children.values():
            yield from child.tree()

    def reads(self) -> list[tuple[str, Spec, str]]:
        """``(path, spec, input name)`` of each local file this plan (or an included spec) reads."""
        return [(path, p.spec, name) for p in self.tree() for name, node in p.nodes.items()
                if node.kind == "input" and node.reads_files
                and isinstance(path := getattr(p.spec.inputs[name], "path", None), str) and path and "://" not in path]


# -- the dependency graph: references checked, cycles refused, steps put in order --------------------
def _step_refs(spec: Spec, name: str) -> list[tuple[tuple, str]]:
    step = spec.steps[name]
    if isinstance(step.inputs, dict):
        return [(("steps", name, "inputs", k), ref) for k, ref in step.inputs.items()]
    return [(("steps", name, "inputs", i), ref) for i, ref in enumerate(step.inputs)]


def _check_ref(spec: Spec, ref: str, where: tuple, smap: SourceMap) -> str:
    head, _, tail = ref.partition(".")
    known = list(spec.inputs) + list(spec.steps)
    if head not in known:
        hint = did_you_mean(head, known, f"known names: {', '.join(known) or 'none'}; declare it under inputs: or "
                            "steps:", n=3)
        raise smap.error(f"{ref!r} is not an input or step of this pipeline", where, hint=hint)
    if tail and head in spec.inputs:
        raise smap.error(f"{ref!r}: input {head!r} has no parts", where,
                         hint=f"refer to the input as {head!r}; 'name.part' is for steps with several outputs")
    return head


def _order(spec: Spec, smap: SourceMap) -> list[str]:
    """Inputs and steps in an order where each comes after everything it reads."""
    deps: dict[str, set[str]] = {name: set() for name in spec.inputs}
    for name in spec.steps:
        deps[name] = {_check_ref(spec, ref, where, smap) for where, ref in _step_refs(spec, name)}
        if name in deps[name]:
            raise smap.error(f"step {name!r} reads its own result", ("steps", name, "inputs"),
                             hint="a step's inputs must be inputs or other steps")
    for out, o in spec.outputs.items():
        _check_ref(spec, o.from_, ("outputs", out, "from"), smap)
    sorter = graphlib.TopologicalSorter({k: sorted(v) for k, v in deps.items()})
    try:
        return list(sorter.static_order())
    except graphlib.CycleError as e:
        cycle = e.args[1]
        raise smap.error(f"steps form a cycle: {' -> '.join(cycle)}", ("steps", cycle[0], "inputs"),
                         hint="a step cannot depend on its own result; break the cycle") from None


# -- steps that use another spec ---------------------------------------------------------------------
_KERNEL_FILES = ("/proc/", "/sys/")  # what they hold is the system's (an environment, its state), never a spec


def resolve_uses(spec: Spec, name: str, smap: SourceMap, stack: tuple[str, ...]) -> str:
    """Absolute path of step ``name``'s included file; missing, self and cyclic includes fail."""
    origin = spec.origin
    path = os.path.abspath(os.path.join(origin.base_dir, os.path.expanduser(spec.steps[name].uses)))
    where = ("steps", name, "uses")
    if not os.path.exists(path):  # a FIFO or device is refused by read_yaml, by name
        here = os.path.dirname(path)
        hint = did_you_mean(os.path.basename(path), os.listdir(here) if os.path.isdir(here) else [],
                            "paths are relative to the spec file that uses them")
        raise smap.error(f"included spec {spec.steps[name].uses!r} does not exist ({path})", where, hint=hint)
    kernel = next((k for k in _KERNEL_FILES if os.path.realpath(path).startswith(k)), None)
    if kernel is not None:
        raise smap.error(f"included spec {spec.steps[name].uses!r} is a file the kernel makes up ({kernel}...), "
                         "not a spec", where, hint="give the path of a YAML spec file")
    me = os.path.abspath(origin.file) if origin.file else None
    if path == me:
        raise smap.error(f"step {name!r} includes the spec it is in", where,
                         hint="a spec cannot use itself; move the shared steps into another file")
    chain = [*stack, me] if me else list(stack)
    if path in chain:
        loop = " -> ".join(os.path.basename(p) for p in [*chain[chain.index(path):], path])
        raise smap.error(f"cyclic include: {loop}", where, hint="specs must not include each other in a loop")
    return path


def _check_binding(child: Spec, inner: str, x: Any, where: tuple, smap: SourceMap, step: str) -> None:
    if not isinstance(bare(x), da.Array):  # labelled (an xarray.DataArray) or bare
        raise smap.error(f"{inner!r} is bound to something that is not an array", where,
                         hint="bind it to an input or a step with one result")
    model = child.inputs[inner]
    fields = model.model_fields_set
    if "shape" in fields and list(model.shape) != list(x.shape):
        raise smap.error(f"shape mismatch: {step!r} binds {inner!r} to an array of shape {list(x.shape)}, but the "
                         f"included spec declares {list(model.shape)}", where,
                         hint="pass matching params to the included spec, or bind another array")
    if "dtype" in fields and model.dtype is not None and np.dtype(model.dtype) != x.dtype:
        raise smap.error(f"dtype mismatch: {step!r} binds {inner!r} to {x.dtype}, but the included spec declares "
                         f"{np.dtype(model.dtype)}", where, hint="add an astype step before it, or pass the dtype as "
                                                                 "a param of the included spec")


def _compile_uses(spec: Spec, name: str, smap: SourceMap, values: dict[str, Any], stack: tuple[str, ...],
                  for_run: bool, count: list[int]) -> "Plan":
    """Compile step ``name``'s included spec. ``count``: the included specs and steps this compile has
    built (the top spec's first): includes of includes multiply, so past ``flowgpu.spec.max-includes``
    (or ``max-steps``) the compile stops rather than run for hours."""
    step = spec.steps[name]
    path = resolve_uses(spec, name, smap, stack)
    count[0] += 1
    if count[0] > (most := limit("max-includes")):
        raise smap.error(f"more than {most} included specs to compile (includes of includes multiply)",
                         ("steps", name, "uses"), kind=SpecLimitError,
                         hint="include each spec from fewer steps, or raise flowgpu.spec.max-includes")
    data, child_map = read_yaml(path)
    steps = data.get("steps") if isinstance(data, dict) else None
    count[1] = (count[1] or len(spec.steps)) + (len(steps) if isinstance(steps, dict) else 0)
    if count[1] > (most := limit("max-steps")):
        raise smap.error(f"the included specs would make {count[1]:,} steps to compile, more than {most:,}",
                         ("steps", name, "uses"), kind=SpecLimitError,
                         hint="include large specs from fewer steps, or raise flowgpu.spec.max-steps")
    declared = (data.get("params") or {}) if isinstance(data, dict) else {}
    for key in step.params:
        if key not in declared:
            raise smap.error(f"{os.path.basename(path)} has no param {key!r}", ("steps", name, "params", key),
                             hint=did_you_mean(key, declared, f"its params: {', '.join(declared) or 'none'}"),
                             key=True)
    child = build(data, child_map, {f"params.{k}": v for k, v in step.params.items()})
    bindings: dict[str, da.Array] = {}
    for inner, ref in (step.inputs or {}).items():
        where = ("steps", name, "inputs", inner)
        if inner not in child.inputs:
            raise smap.error(f"{os.path.basename(path)} has no input {inner!r}", where, key=True,
                             hint=did_you_mean(inner, child.inputs, f"its inputs: {', '.join(child.inputs) or 'none'}"))
        x = _resolve(values, ref, where, smap)
        _check_binding(child, inner, x, where, smap, name)
        bindings[inner] = x
    me = spec.origin.file
    return _compile(child, bindings, (*stack, os.path.abspath(me)) if me else stack, for_run, count)


def _open_input(spec: Spec, name: str, smap: SourceMap, for_run: bool) -> da.Array:
    model = spec.inputs[name]
    options = model.model_dump(exclude={"source"})
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = sources.open_source(model.source, call=for_run, **options)
        _warn_at(caught, ("inputs", name), smap)
    except RunError:
        raise  # the user's callable failed while a run compiled: not a problem of the spec
    except (FlowgpuError, ValueError, TypeError, OSError, ImportError) as e:
        option = getattr(e, "option", None)  # a SourceError names the option at fault
        raise smap.error(f"input {name!r} ({model.source}) cannot be opened: {e}",
                         ("inputs", name) + ((option,) if option else ()),
                         hint="check its path, shape, dtype and chunks") from None
    except Exception as e:  # a plugin's own error is the plugin's; a built-in's is a bug of flowgpu
        if (module := _plugin_module(model.source)) is None:
            raise
        raise smap.error(f"input {name!r}: source {model.source!r} (from {module}) failed: {type(e).__name__}: {e}",
                         ("inputs", name), hint=f"fix it in {module}, or check this input's options") from None
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):  # a dask, NumPy or labelled array
        module = _plugin_module(model.source) or "flowgpu"
        raise smap.error(f"input {name!r}: source {model.source!r} (from {module}) gave {type(x).__name__}, not an "
                         "array", ("inputs", name), hint=f"make it return a dask.array.Array ({module})")
    return x


def _plugin_module(source: str) -> str | None:
    """The module of source ``source`` when a plugin gave it (not flowgpu's own)."""
    module = getattr(sources.source_entry(source).func, "__module__", None) or "?"
    return None if module.split(".")[0] == "flowgpu" else module


def _describe(x: Any) -> str:
    if is_labelled(x):
        return f"{list(x.shape)} {x.dtype} ({', '.join(map(str, x.dims))})"
    if isinstance(x, da.Array):
        return f"{list(x.shape)} {x.dtype}"
    return repr(x)


def _call_op(spec: Spec, name: str, op: registry.Op, values: dict[str, Any], smap: SourceMap):
    step = spec.steps[name]
    where = ("steps", name)
    if op.inputs == ("**",) and isinstance(step.inputs, list) and step.inputs:
        names = ", ".join(f"{r}: {r}" for r in step.inputs)
        raise smap.error(f"op {op.name!r} takes its inputs by name", where + ("inputs",),
                         hint=f"write inputs as a mapping, e.g. inputs: {{{names}}}")
    if isinstance(step.inputs, dict):
        args, kwargs = [], {k: values[r] for k, r in step.inputs.items()}
    else:
        args, kwargs = [values[r] for r in step.inputs], {}
    overlap = set(kwargs) & set(step.args)
    if overlap:
        raise smap.error(f"{sorted(overlap)[0]!r} is given both as an input and an argument", where + ("args",),
                         hint="give it once")
    kwargs.update(step.args)
    if op.inputs != ("**",):
        _check_args(name, op, args, kwargs, smap, step)
        try:
            op.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise smap.error(f"op {op.name!r} cannot take these inputs/args: {e}", where,
                             hint=f"its signature is {op.name}{op.signature}") from None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = labels.call(op, args, kwargs)
    except ImportPathError as e:  # point at the argument that names it (e.g. map_blocks' function)
        arg = next((k for k, v in step.args.items() if isinstance(v, str) and repr(v.strip()) in str(e)), None)
        raise smap.error(f"step {name!r} (op {op.name!r}): {e}", where + (("args", arg) if arg else ())) from None
    except (FlowgpuError, ValueError, TypeError, IndexError, NotImplementedError) as e:
        if isinstance(e, ArgumentError) and e.argument in step.args:  # e.g. an axis naming no dimension
            raise smap.error(f"step {name!r} (op {op.name!r}): {e}", where + ("args", e.argument),
                             hint=f"fix it under args ('flowgpu ops' shows what {op.name!r} takes)") from None
        if isinstance(e, KernelError) and isinstance(step.args.get("expression"), str):  # its text, not the inputs
            raise smap.error(f"step {name!r} (op {op.name!r}): {e}", where + ("args", "expression"),
                             hint="fix the expression: names of its inputs, numbers, operators and NumPy "
                                  "functions ('flowgpu ops' shows what it may use)") from None
        given = ", ".join(_describe(a) for a in (*args, *kwargs.values()) if isinstance(bare(a), da.Array))
        raise smap.error(f"step {name!r} (op {op.name!r}) fails on its inputs ({given}): {e}", where,
                         hint="check the shapes and dtypes of its inputs (flowgpu plan shows them)") from None
    _warn_at(caught, ("steps", name), smap)
    if isinstance(out, (tuple, list)):
        return {str(i): o for i, o in enumerate(out)}
    if not isinstance(bare(out), da.Array):
        raise smap.error(f"op {op.name!r} returned {type(out).__name__}, not a dask array", where,
                         hint="ops return dask arrays; wrap results with flowgpu.from_array")
    return out


_warned: set[tuple[str, int, str]] = set()


def _warn_at(caught: list[warnings.WarningMessage], where: tuple[str, str], smap: SourceMap) -> None:
    """The warnings an op (or a source) gave while its step (or input) was built, given again at its line in
    the spec, once a process: a run compiles a spec again for its workers, and the library's line says nothing."""
    file = smap.files.get(where, smap.file) or "<spec>"
    line = smap.locate(where)[0] or 0
    for w in caught:
        text = f"{where[0][:-1]} {where[1]!r}: {w.message}"
        if (file, line, text) not in _warned:
            _warned.add((file, line, text))
            warnings.warn_explicit(text, w.category, file, line)


def _check_args(name: str, op: registry.Op, args: list, kwargs: dict, smap: SourceMap, step: Any) -> None:
    try:
        bind_arguments(op, kwargs, n_inputs=len(args))
    except ArgumentError as e:
        key = e.argument
        if key in step.args:
            where: tuple = ("steps", name, "args", key)
        elif key is None or isinstance(step.inputs, dict):
            where = ("steps", name, "inputs")
        else:
            where = ("steps", name, "args")
        raise smap.error(str(e), where, hint=f"fix it under args ('flowgpu ops' shows what {op.name!r} takes)"
                         ) from None


def _check_expect(spec: Spec, name: str, x: da.Array, smap: SourceMap) -> None:
    expect = spec.steps[name].expect
    if expect is None:
        return
    if expect.shape is not None:
        ok = len(expect.shape) == x.ndim and all(e is None or e == s for e, s in zip(expect.shape, x.shape))
        if not ok:
            raise smap.error(f"shape mismatch: step {name!r} makes shape {list(x.shape)}, expected "
                             f"{expect.shape}", ("steps", name, "expect", "shape"),
                             hint="fix the step's inputs or args, or the expected shape")
    if expect.dtype is not None and np.dtype(expect.dtype) != x.dtype:
        raise smap.error(f"dtype mismatch: step {name!r} makes {x.dtype}, expected {np.dtype(expect.dtype)}",
                         ("steps", name, "expect", "dtype"),
                         hint="add an astype step, or fix the expected dtype")


def _build_graph(spec: Spec, smap: SourceMap, names: list[str], bindings: dict[str, da.Array],
                 stack: tuple[str, ...], for_run: bool, count: list[int]) -> tuple[dict, dict, dict]:
    values: dict[str, Any] = {}
    nodes: dict[str, Node] = {}
    children: dict[str, Plan] = {}
    for name in names:
        if name in spec.inputs:
            src = spec.inputs[name].source
            x = bindings[name] if name in bindings else _open_input(spec, name, smap, for_run)
            values[name] = x
            nodes[name] = Node(name, "input", "bound" if name in bindings else src, bare(x),
                               reads_files=name not in bindings and sources.reads_files(src))
            continue
        step = spec.steps[name]
        deps = sorted({ref.split(".")[0] for _, ref in _step_refs(spec, name)})
        if step.uses is not None:
            child = _compile_uses(spec, name, smap, values, stack, for_run, count)
            children[name] = child
            values[name] = {**child.outputs, **child.labelled}
            nodes[name] = Node(name, "uses", step.uses, None, deps)
            continue
        if step.op not in registry.OPS:
            raise smap.error(f"unknown op {step.op!r}", ("steps", name, "op"), hint=registry.OPS.suggest(step.op))
        op = registry.get(step.op)
        for where, ref in _step_refs(spec, name):
            values[ref] = _resolve(values, ref, where, smap)
        out = _call_op(spec, name, op, values, smap)
        values[name] = out
        nodes[name] = Node(name, "step", step.op, bare(out) if isinstance(bare(out), da.Array) else None, deps)
        if isinstance(bare(out), da.Array):
            _check_expect(spec, name, out, smap)
    return values, nodes, children


def _resolve(values: dict, ref: str, where: tuple, smap: SourceMap) -> Any:
    """The value ``ref`` names: a step's or input's result, or ``step.part`` of a step with several."""
    head, _, part = ref.partition(".")
    value = values[head]
    if isinstance(value, dict):
        if part not in value:
            raise smap.error(f"{ref!r}: step {head!r} has no output {part!r}", where,
                             hint=f"its outputs: {', '.join(f'{head}.{k}' for k in value)}")
        return value[part]
    if part:
        raise smap.error(f"{ref!r}: step {head!r} has a single result", where, hint=f"refer to it as {head!r}")
    return value


def _output_arrays(spec: Spec, values: dict, smap: SourceMap) -> tuple[dict[str, da.Array], dict[str, Any]]:
    outs, labelled = {}, {}
    for out_name, out in spec.outputs.items():
        value = _resolve(values, out.from_, ("outputs", out_name, "from"), smap)
        if is_labelled(value):
            labelled[out_name], value = value, value.data
        if not isinstance(value, da.Array):
            raise smap.error(f"{out.from_!r} is not an array", ("outputs", out_name, "from"),
                             hint="name a single result, e.g. 'step.output' for a uses step")
        if sinks.sink_entry(out.sink).has(sinks.IN_SUMMARY) and value.size > sinks.SUMMARY_MAX_ELEMENTS:
            raise smap.error(f"output {out_name!r} has {value.size} values; a {out.sink} output holds at most "
                             f"{sinks.SUMMARY_MAX_ELEMENTS}", ("outputs", out_name),
                             hint="write it to a file: a sink that writes a path (see `flowgpu sinks`)")
        if tables.collects(out):
            tables.check_column(smap, out_name, value)
        try:
            sinks.check_write(out.sink, value, **out.sink_options())
        except ConfigError as e:  # e.g. zarr shards that are not whole chunks: at the option it names
            said = {f" {e} ".find(f" {k} "): k for k in out.sink_options() if f" {k} " in f" {e} "}
            field = said[min(said)] if said else None  # the option the message names first
            raise smap.error(f"output {out_name!r}: {e}", ("outputs", out_name) + ((field,) if field else ()),
                             hint="fix the output's options (flowgpu sinks lists them)") from None
        outs[out_name] = value
    return outs, labelled


def calls_user_code(plan: Plan) -> bool:
    """Whether running ``plan`` calls user code to open an input (a run then compiles it in its session)."""
    return any(sources.calls_user_code(n.what) for p in plan.tree() for n in p.nodes.values()
               if n.kind == "input" and n.what in sources.SOURCES)


def _owners(nodes: dict[str, Node], names: list[str]) -> dict[str, str]:
    """``{layer name: node}``: the first node (in plan order) whose array holds the layer."""
    owner: dict[str, str] = {}
    for name in names:
        x = nodes[name].array
        if isinstance(x, da.Array):
            for layer in x.__dask_graph__().layers:
                owner.setdefault(layer, name)
    return owner


def fusion_of(nodes: dict[str, Node], names: list[str], outputs: dict[str, da.Array]) -> dict[str, str]:
    """Which steps a Session's fusion runs as one kernel: marks each fused step's ``fused_into`` and
    the kernel root's ``fused`` expression; returns ``{root step: expression}``."""
    arrays = [x for x in outputs.values() if isinstance(x, da.Array)]
    if not arrays or not dask.config.get(fusion_graph.CONFIG_KEY, True):
        return {}
    graph = HighLevelGraph.merge(*(x.__dask_graph__() for x in arrays))
    found = fusion_graph.fusions(graph, keep={x.name for x in arrays}, bare=current_backend() == "cupy")
    owner = _owners(nodes, names)
    fused: dict[str, str] = {}
    for f in found:
        root = owner.get(f.root)
        if root is None or nodes[root].kind != "step":
            continue
        steps = {owner[m] for m in f.members if m in owner and nodes[owner[m]].kind == "step"}
        if len(steps) < 2 and f.reduction is None:
            continue  # the ops of one step (scale's multiply and add): that step, as it is
        leaves = [owner.get(leaf, leaf) for leaf in f.leaves]
        text = re.sub(r"\bv(\d+)\b", lambda m: leaves[int(m.group(1))], f.text)
        inner = steps - {root}
        for s in inner:
            nodes[s].fused_into = root
        nodes[root].fused = fused[root] = text + (f" -> {f.reduction}" if f.reduction else "")
        deps, todo = set(), list(nodes[root].deps)  # what the kernel reads: the fused steps' own inputs
        while todo:
            d = todo.pop()
            if d in inner:
                todo.extend(nodes[d].deps)
            else:
                deps.add(d)
        nodes[root].deps = sorted(deps)
    return fused


def _compile(spec: Spec, bindings: dict[str, da.Array] | None, stack: tuple[str, ...], for_run: bool,
             count: list[int]) -> Plan:
    origin = spec.origin
    smap = origin.smap
    names = _order(spec, smap)
    values, nodes, children = _build_graph(spec, smap, names, bindings or {}, stack, for_run, count)
    outputs, labelled = _output_arrays(spec, values, smap)
    arrays = {k: bare(v) for k, v in values.items()}
    return Plan(spec, nodes, names, arrays, outputs, dict(origin.params), children, fusion_of(nodes, names, outputs),
                Facts.here(), for_run, labelled=labelled)


def compile(spec: Spec | str | os.PathLike | dict, params: dict[str, Any] | None = None, *,
            overrides: dict[str, Any] | None = None, for_run: bool = False, facts: Facts | None = None
            ) -> Plan:  # noqa: A001
    """Build and check the lazy graph of ``spec`` (a Spec, a YAML path or a dict); computes nothing.

    ``params``: param values, e.g. ``{"n": 1000}``; ``overrides``: other dotted keys, as ``--set``.
    ``for_run``: ``python`` sources call their callable (else they stand for their declared shape and
    dtype). ``facts``: the workers it is built for (a Session's; default: ``Facts.here()``).
    """
    spec = load_spec(spec, {**{f"params.{k}": v for k, v in (params or {}).items()}, **(overrides or {})})
    try:
        with using(facts):
            return _compile(spec, None, (), for_run, [0, 0])
    except ConfigError as e:  # e.g. bad chunks
        raise SpecError(str(e), file=spec.origin.file, line=1, col=1, path="<document>",
                        hint="check the spec's inputs and args") from None
