"""``compile(spec)``: the lazy Dask graph of a pipeline, checked before anything runs.

Compiling is pure: it starts no cluster and computes nothing. It opens the sources (which reads
only metadata), calls each step's op on the lazy arrays of its inputs, and so learns every step's
shape, dtype and chunks from Dask's metadata. A step whose op refuses its inputs (shapes that do
not broadcast, a dtype it does not take) or whose result differs from its ``expect`` fails with a
:class:`~flowgpu.errors.SpecError` naming the step and its place in the file.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.errors import ArgumentError, ConfigError, FlowgpuError, ImportPathError, RunError, SpecError
from flowgpu.fusion import fused_elementwise
from flowgpu.io import sinks, sources
from flowgpu.ops import registry
from flowgpu.ops.signature import bind_arguments
from flowgpu.pipeline import compose
from flowgpu.pipeline.build import Origin, build, from_dict, load
from flowgpu.pipeline.fusing import FusionPlan, plan_fusion
from flowgpu.pipeline.graph import order, step_refs
from flowgpu.pipeline.loader import SourceMap
from flowgpu.pipeline.spec import Spec

__all__ = ["Plan", "Node", "compile"]


@dataclass
class Node:
    """One input or step of a compiled pipeline."""

    name: str
    kind: str  # "input", "step" or "uses"
    what: str  # the source, op or included file
    array: da.Array | None
    deps: list[str] = field(default_factory=list)
    fused_into: str | None = None
    fused: str | None = None  # the fused expression this node computes
    reads_files: bool = False


@dataclass
class Plan:
    """A compiled pipeline: every node's lazy array and the outputs to produce."""

    spec: Spec
    nodes: dict[str, Node]
    order: list[str]
    arrays: dict[str, da.Array]
    outputs: dict[str, da.Array]
    fusion: FusionPlan
    fused: bool
    params: dict[str, Any]
    children: dict[str, "Plan"] = field(default_factory=dict)

    @property
    def file(self) -> str | None:
        return self.spec._origin.file if self.spec._origin else None


def _origin(spec: Spec) -> Origin:
    if spec._origin is None:
        spec._origin = Origin(None, SourceMap(None), spec.model_dump(by_alias=True, exclude_defaults=True),
                              {})
    return spec._origin


def _open_input(spec: Spec, name: str, smap: SourceMap, for_run: bool) -> da.Array:
    model = spec.inputs[name]
    options = model.model_dump(exclude={"source"})
    try:
        return sources.open_source(model.source, call=for_run, **options)
    except RunError:
        raise  # the user's callable failed while a run compiled: not a problem of the spec
    except (FlowgpuError, ValueError, TypeError, OSError, ImportError) as e:
        raise smap.error(f"input {name!r} ({model.source}) cannot be opened: {e}", ("inputs", name),
                         hint="check its path, shape, dtype and chunks") from None


def _describe(x: Any) -> str:
    if isinstance(x, da.Array):
        return f"{list(x.shape)} {x.dtype}"
    return repr(x)


def _get_op(name: str, op_name: str, smap: SourceMap) -> registry.Op:
    if op_name not in registry.OPS:
        raise smap.error(f"unknown op {op_name!r}", ("steps", name, "op"), hint=registry.OPS.suggest(op_name))
    return registry.get(op_name)


def _call_op(spec: Spec, name: str, op: registry.Op, values: dict[str, Any], smap: SourceMap):
    step = spec.steps[name]
    where = ("steps", name)
    if op.inputs == ("**",) and isinstance(step.inputs, list) and step.inputs:
        names = ", ".join(f"{r}: {r}" for r in step.inputs)
        raise smap.error(f"op {op.name!r} takes its inputs by name", where + ("inputs",),
                         hint=f"write inputs as a mapping, e.g. inputs: {{{names}}}")
    if isinstance(step.inputs, dict):
        args, kwargs = [], {**{k: values[r] for k, r in step.inputs.items()}}
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
        out = op(*args, **kwargs)
    except ImportPathError as e:  # point at the argument that names it (e.g. map_blocks' function)
        arg = next((k for k, v in step.args.items() if isinstance(v, str) and repr(v.strip()) in str(e)), None)
        raise smap.error(f"step {name!r} (op {op.name!r}): {e}", where + (("args", arg) if arg else ())) from None
    except (FlowgpuError, ValueError, TypeError, IndexError, NotImplementedError) as e:
        given = ", ".join(_describe(a) for a in (*args, *kwargs.values()) if isinstance(a, da.Array))
        raise smap.error(f"step {name!r} (op {op.name!r}) fails on its inputs ({given}): {e}", where,
                         hint="check the shapes and dtypes of its inputs (flowgpu plan shows them)") from None
    if isinstance(out, (tuple, list)):
        return {str(i): o for i, o in enumerate(out)}
    if not isinstance(out, da.Array):
        raise smap.error(f"op {op.name!r} returned {type(out).__name__}, not a dask array", where,
                         hint="ops return dask arrays; wrap results with flowgpu.from_array")
    return out


def _check_args(name: str, op: registry.Op, args: list, kwargs: dict, smap: SourceMap, step: Any) -> None:
    """The step's arguments against the op's signature: a bad one is located at ``steps.<name>.args.<arg>``."""
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


def _lookup(values: dict[str, Any], ref: str) -> Any:
    head, _, part = ref.partition(".")
    value = values[head]
    return value[part] if part and isinstance(value, dict) else value


def _build_graph(spec: Spec, smap: SourceMap, names: list[str], bindings: dict[str, da.Array],
                 stack: tuple[str, ...], fusion: FusionPlan | None, fused_fn, opened: dict[str, da.Array],
                 for_run: bool) -> tuple[dict, dict, dict]:
    """``opened``: inputs opened by an earlier build of the same spec (a source is opened once)."""
    values: dict[str, Any] = {}
    nodes: dict[str, Node] = {}
    children: dict[str, Plan] = {}
    for name in names:
        if name in spec.inputs:
            src = spec.inputs[name].source
            if name not in bindings and name not in opened:
                opened[name] = _open_input(spec, name, smap, for_run)
            x = bindings[name] if name in bindings else opened[name]
            values[name] = x
            nodes[name] = Node(name, "input", "bound" if name in bindings else src, x,
                               reads_files=name not in bindings and sources.reads_files(src))
            continue
        step = spec.steps[name]
        deps = sorted({ref.split(".")[0] for _, ref in step_refs(spec, name)})
        if step.uses is not None:
            child = compose.compile_uses(spec, name, smap, values, stack,
                                         compile_spec=functools.partial(_compile, for_run=for_run))
            children[name] = child
            values[name] = dict(child.outputs)
            nodes[name] = Node(name, "uses", step.uses, None, deps)
            continue
        op = _get_op(name, step.op, smap)
        if fusion is not None and name in fusion.inlined:
            nodes[name] = Node(name, "step", step.op, None, deps)
            continue
        for where, ref in step_refs(spec, name):
            head, _, part = ref.partition(".")
            if fusion is not None and head in fusion.inlined:
                continue
            value = values[head]
            if isinstance(value, dict):
                if part not in value:
                    raise smap.error(f"{ref!r}: step {head!r} has no output {part!r}", where,
                                     hint=f"its outputs: {', '.join(f'{head}.{k}' for k in value)}")
                values[ref] = value[part]
            elif part:
                raise smap.error(f"{ref!r}: step {head!r} has a single result", where, hint=f"refer to it as {head!r}")
        if fusion is not None and name in fusion.roots:
            root = fusion.roots[name]
            leaves = {v: _lookup(values, r) for v, r in root["leaves"].items()}
            out = fused_fn(root["expression"], leaves,
                           **({"reduction": root["reduction"], "axis": root["axis"], "keepdims": root["keepdims"]}
                              if root["reduction"] else {}))
        else:
            out = _call_op(spec, name, op, values, smap)
        values[name] = out
        nodes[name] = Node(name, "step", step.op, out if isinstance(out, da.Array) else None, deps)
        if isinstance(out, da.Array) and fusion is None:
            _check_expect(spec, name, out, smap)
    return values, nodes, children


def _output_arrays(spec: Spec, values: dict, smap: SourceMap) -> dict[str, da.Array]:
    outs = {}
    for out_name, out in spec.outputs.items():
        head, _, part = out.from_.partition(".")
        value = values[head]
        if isinstance(value, dict):
            if part not in value:
                raise smap.error(f"{out.from_!r}: step {head!r} has no output {part!r}", ("outputs", out_name, "from"),
                                 hint=f"its outputs: {', '.join(f'{head}.{k}' for k in value)}")
            value = value[part]
        if not isinstance(value, da.Array):
            raise smap.error(f"{out.from_!r} is not an array", ("outputs", out_name, "from"),
                             hint="name a single result, e.g. 'step.output' for a uses step")
        if sinks.sink_entry(out.sink).has(sinks.IN_SUMMARY) and value.size > sinks.SUMMARY_MAX_ELEMENTS:
            raise smap.error(f"output {out_name!r} has {value.size} values; a {out.sink} output holds at most "
                             f"{sinks.SUMMARY_MAX_ELEMENTS}", ("outputs", out_name),
                             hint="write it to a file: a sink that writes a path (see `flowgpu sinks`)")
        outs[out_name] = value
    return outs


def calls_user_code(plan: Plan) -> bool:
    """Whether running ``plan`` calls user code to open an input (a ``python`` source), so a run
    compiles it again, for real, inside its session."""
    return any(sources.calls_user_code(n.what) for n in plan.nodes.values()
               if n.kind == "input" and n.what in sources.SOURCES) or any(
        calls_user_code(child) for child in plan.children.values())


def _mark_fused(nodes: dict[str, Node], fusion: FusionPlan) -> None:
    for root_name, root in fusion.roots.items():
        for s in root["steps"]:
            nodes[s].fused_into = root_name
        nodes[root_name].fused = root["expression"] + (f" -> {root['reduction']}" if root["reduction"] else "")
        nodes[root_name].deps = sorted({r.split(".")[0] for r in root["leaves"].values()})


def _matching(fused: dict[str, da.Array], unfused: dict[str, da.Array]) -> dict[str, da.Array]:
    """The fused outputs, each of the unfused one's dtype; a ValueError if a shape differs."""
    out = {}
    for k, x in fused.items():
        want = unfused[k]
        if x.shape != want.shape:
            raise ValueError("fused result differs in shape from the unfused one")
        out[k] = x if x.dtype == want.dtype else x.astype(want.dtype)
    return out


def _fused_from(spec: Spec, smap: SourceMap, names: list[str], stack: tuple[str, ...], reference: Plan,
                opened: dict[str, da.Array], for_run: bool) -> Plan | None:
    """``spec``'s fused plan built at once, ``reference`` (the same spec compiled before, e.g. its
    draft) standing for the unfused build: its fusion, its outputs' shapes and dtypes, its inlined
    steps' arrays. None when the fused build fails: the caller compiles in full (the inputs opened here
    are not opened again)."""
    for name in names:
        if name in spec.inputs and name not in opened:
            opened[name] = _open_input(spec, name, smap, for_run)
    fusion = reference.fusion
    try:
        values, nodes, children = _build_graph(spec, smap, names, {}, stack, fusion, fused_elementwise, opened,
                                               for_run)
        outputs = _matching(_output_arrays(spec, values, smap), reference.outputs)
    except Exception:  # noqa: BLE001 - the full compile says what is wrong, or falls back to unfused
        return None
    for name in fusion.inlined:
        nodes[name].array = reference.nodes[name].array
    _mark_fused(nodes, fusion)
    return Plan(spec, nodes, names, values, outputs, fusion, True, dict(_origin(spec).params), children)


def _compile(spec: Spec, bindings: dict[str, da.Array] | None = None, stack: tuple[str, ...] = (),
             fuse: bool = True, for_run: bool = False, draft: bool = False, reference: Plan | None = None) -> Plan:
    origin = _origin(spec)
    smap = origin.smap
    names = order(spec, smap)
    bindings = bindings or {}
    opened: dict[str, da.Array] = {}
    if fuse and reference is not None and reference.fusion.roots and not bindings and not reference.children:
        plan = _fused_from(spec, smap, names, stack, reference, opened, for_run)
        if plan is not None:
            return plan
    values, nodes, children = _build_graph(spec, smap, names, bindings, stack, None, None, opened, for_run)
    outputs = _output_arrays(spec, values, smap)
    plan = Plan(spec, nodes, names, values, outputs, FusionPlan(), False, dict(origin.params), children)
    fused_fn = fused_elementwise if fuse else None
    if fused_fn is None:
        return plan
    ops = {n: registry.get(s.op) for n, s in spec.steps.items() if s.op is not None}
    consumers: dict[str, list[str]] = {}
    for n in spec.steps:
        for _, ref in step_refs(spec, n):
            consumers.setdefault(ref.split(".")[0], []).append(n)
    fusion = plan_fusion(spec, ops, consumers, {o.from_.split(".")[0] for o in spec.outputs.values()})
    if not fusion.roots:
        return plan
    if draft and not for_run and calls_user_code(plan):  # the run compiles it again: its fused graph is built then
        _mark_fused(nodes, fusion)
        plan.fusion = fusion
        return plan
    try:
        f_values, f_nodes, _ = _build_graph(spec, smap, names, bindings, stack, fusion, fused_fn, opened, for_run)
        f_outputs = _matching(_output_arrays(spec, f_values, smap), outputs)
    except Exception as e:  # fusion is an optimisation: never let it break a pipeline
        warnings.warn(f"running {spec.name!r} unfused: {e}", stacklevel=2)
        return plan
    _mark_fused(nodes, fusion)
    for root_name in fusion.roots:
        nodes[root_name].array = f_values[root_name]
    for n, node in f_nodes.items():
        if node.array is not None and n not in fusion.inlined:
            nodes[n].array = node.array
    plan.arrays, plan.outputs, plan.fusion, plan.fused = f_values, f_outputs, fusion, True
    return plan


def compile(spec: Spec | str | os.PathLike | dict, params: dict[str, Any] | None = None, *,
            overrides: dict[str, Any] | None = None, fuse: bool = True, for_run: bool = False,
            draft: bool = False, reference: Plan | None = None) -> Plan:  # noqa: A001
    """Build and check the lazy graph of ``spec``; starts no cluster, computes nothing, calls no user code.

    Parameters
    ----------
    spec : a :class:`Spec`, the path of a YAML spec, or a spec as a Python dict.
    params : param values to use instead of the spec's defaults, e.g. ``{"n": 1000}``.
    overrides : other dotted keys to set, as ``--set`` does.
    fuse : fuse chains of elementwise steps into one kernel per chunk.
    for_run : compile for a run: ``python`` sources call their callable (only ``run`` passes True;
        otherwise they stand for their declared shape and dtype, unless ``plan_call: true``).
    draft : the plan is for checks, recipes and the summary of a run that compiles it again inside
        its session (it calls user code to open an input): the fusion is planned and marked on the
        nodes, but its fused graph is left to that second compile (the arrays are the unfused ones).
    reference : a plan of the same spec compiled before (that draft): its fusion is built at once,
        without building the unfused graph again (which it stands for), unless that fails.

    Returns
    -------
    Plan, whose ``outputs`` maps each output name to its lazy dask array.
    """
    extra = {f"params.{k}": v for k, v in (params or {}).items()}
    extra.update(overrides or {})
    if isinstance(spec, (str, os.PathLike)):
        spec = load(spec, extra)
    elif isinstance(spec, dict):
        spec = from_dict(spec, extra)
    elif extra:
        origin = _origin(spec)
        spec = build(origin.raw, origin.smap, {**origin.overrides, **extra})
    try:
        with compose.counting_includes():
            return _compile(spec, fuse=fuse, for_run=for_run, draft=draft, reference=reference)
    except ConfigError as e:  # e.g. bad chunks
        raise SpecError(str(e), file=_origin(spec).file, line=1, col=1, path="<document>",
                        hint="check the spec's inputs and args") from None
