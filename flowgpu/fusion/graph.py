"""The graph optimisation: chains of NumPy ufuncs in a dask graph become one fused kernel per chunk.

dask's blockwise fusion makes ``(x * 2 + 1) ** 2 - x`` one task, but each operator in it still
writes a full temporary. Here each chain of elementwise ``Blockwise`` layers becomes ONE layer
whose task is a :class:`FusedChunk`; a chain (or bare array) feeding a dask reduction goes into the
reduction's chunk stage instead (``graph_reduce``, ``graph_tree``). dask's own optimisation runs after.
A Session installs :class:`Fusing` (``flowgpu.fuse-ufuncs``); without one, ``flowgpu.optimize(x)`` or
``with flowgpu.fusion.fusing():``.
"""

from __future__ import annotations

import collections
import contextlib
import graphlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask._task_spec import Task, TaskRef, convert_legacy_graph
from dask.array.optimization import optimize as dask_optimize
from dask.blockwise import Blockwise, blockwise_token
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph
from dask.utils import ensure_dict

from flowgpu.backend import is_cupy
from flowgpu.fusion import graph_reduce, graph_tree
from flowgpu.fusion.device import move_host_operands
from flowgpu.fusion.chunk import Chain, FusedChunk
from flowgpu.fusion.graph_reduce import graph_has_masked
from flowgpu.fusion.language import is_scalar, literal_text, template_of

__all__ = ["optimize", "rewrite_graph", "fusions", "Fusion", "array_optimize", "Fusing", "fusing", "CONFIG_KEY"]

CONFIG_KEY = "flowgpu.fuse-ufuncs"
MAX_FUSED_OPS = 32  # operations one fused layer nests at most: a longer chain becomes several kernels

_NAME = re.compile(r"(?<![0-9.])\b[A-Za-z_][A-Za-z_0-9]*")


def _fused_template(fc: FusedChunk, nargs: int) -> str | None:
    """An elementwise :class:`FusedChunk`'s text over ``{0}, {1}, ...``, scalars written in, so a chain
    through it (``fused_elementwise``, the ``expr`` op) fuses too."""
    if fc.reduction is not None or fc.cast or len(fc.arrays) != nargs:
        return None
    names = {n: "{%d}" % i for i, n in enumerate(fc.arrays)}
    for n, v in fc.scalars:
        text = literal_text(v)
        if text is None:
            return None  # NaN, infinities, NumPy scalars: the kernel keeps them as arguments
        names[n] = text
    return "(" + _NAME.sub(lambda m: names.get(m.group(0), m.group(0)), fc.text) + ")"


def _weight(layer: Any) -> int:
    """The operations a layer adds to a fused expression: one, or a fused layer's own operators and calls."""
    func = layer.task.func
    if isinstance(func, FusedChunk):
        return max(1, len(re.findall(r"\*\*|//|[-+*/%<>&|^~]|==|!=|\w+\(", func.text)))
    return 1


def _elementwise(layer: Any) -> tuple[str, list] | None:
    """``(template, operands)`` when ``layer`` is a plain elementwise Blockwise layer, else None."""
    if type(layer) is not Blockwise or layer.new_axes or layer.concatenate or getattr(layer, "io_deps", None):
        return None
    task = layer.task
    if not isinstance(task, Task) or task.kwargs:
        return None
    out = tuple(layer.output_indices)
    refs = {blockwise_token(i): i for i in range(len(layer.indices))}
    operands = []
    for arg in task.args:
        if not isinstance(arg, TaskRef) or arg.key not in refs:
            if is_scalar(arg):
                operands.append(("scalar", arg))
                continue
            return None
        value, ind = layer.indices[refs[arg.key]]
        if ind is None:
            if not is_scalar(value):
                return None
            operands.append(("scalar", value))
        else:
            ind = tuple(ind)
            if not isinstance(value, str) or not set(ind) <= set(out) or ind != out[len(out) - len(ind):]:
                return None
            operands.append(("array", value, ind))
    if isinstance(task.func, FusedChunk):
        template = _fused_template(task.func, len(operands))
    else:
        template = template_of(task.func, len(operands))
    return (template, operands) if template else None


@dataclass(frozen=True)
class Fusion:
    """One fused layer: the layer it replaces (``root``), those it took in (``members``), its ``text``
    over the layers ``leaves`` (``v<i>`` reads ``leaves[i]``) and its reduction (None: elementwise)."""

    root: str
    members: frozenset[str]
    text: str
    leaves: tuple[str, ...]
    reduction: str | None


def rewrite_graph(hlg: Any, keep: set[str] = frozenset(), reductions: bool = True, bare: bool | None = None) -> Any:
    """``hlg`` with each chain of elementwise layers replaced by one fused layer.

    ``keep``: layers whose output must stay; ``reductions``: fuse chains into dask reductions' chunk
    stage; ``bare``: fuse a reduction of a bare array too (None: when ``array.backend`` is cupy).
    """
    return _rewrite(hlg, keep, reductions, bare)[0]


def fusions(hlg: Any, keep: set[str] = frozenset(), reductions: bool = True, bare: bool | None = None) -> list[Fusion]:
    """What :func:`rewrite_graph` fuses in ``hlg``, without using the result (a plan shows it)."""
    return _rewrite(hlg, keep, reductions, bare)[1]


def _rewrite(hlg: Any, keep: set[str], reductions: bool, bare: bool | None) -> tuple[Any, list[Fusion]]:
    layers = dict(hlg.layers)
    deps = {k: set(v) for k, v in hlg.dependencies.items()}
    elem = {name: info for name, layer in layers.items() if (info := _elementwise(layer)) is not None}
    reds = {}
    if reductions and not graph_has_masked(layers):
        reds = {name: spec for name, layer in layers.items() if (spec := graph_reduce.match(layer)) is not None}
    if not elem and not reds:
        return hlg, []
    dependents: dict[str, set[str]] = collections.defaultdict(set)
    for k, ds in deps.items():
        for d in ds:
            dependents[d].add(k)

    cut: set[str] = set()  # layers that end a segment of a long chain (each nests one level deeper)

    def inlinable(name: str) -> bool:
        users = dependents[name]
        return name in elem and name not in keep and name not in cut and len(users) == 1 \
            and (next(iter(users)) in elem or next(iter(users)) in reds)

    srcs = {name: {op[1] for op in operands if op[0] == "array" and op[1] in elem}
            for name, (_, operands) in elem.items()}
    depth: dict[str, int] = {}  # layers nested in a layer's expression, itself included
    for name in graphlib.TopologicalSorter(srcs).static_order():
        depth[name] = _weight(layers[name]) + max((depth[s] for s in srcs[name] if inlinable(s)), default=0)
        if depth[name] >= MAX_FUSED_OPS:
            cut.add(name)

    # a reduction of a bare array is one pass in NumPy already: fused on CuPy chunks only (tiles read a
    # transposed input); on CPU workers it would import numba, ~150 MB, for nothing
    if bare is None:
        bare = dask.config.get("array.backend", "numpy") == "cupy"
    done: list[Fusion] = []
    for root in [r for r in elem if not inlinable(r)] + list(reds):
        spec = reds.get(root)
        info = elem[root] if spec is None else ("{0}", [("array", *spec.source)])
        text, chain, leaves, scalars, numblocks, n_ops, members = _expression(root, info, layers, elem, inlinable)
        if n_ops < 2 and (spec is None or not bare):
            continue
        root_layer = layers[root]
        names = tuple(leaves.values())
        if spec is None:
            fn: Any = FusedChunk(text, names, tuple(scalars), None, fallback=chain)
        else:
            fused = FusedChunk(text, names, tuple(scalars), spec.dtype, reduction=spec.kind, axes=spec.axes)
            fn = graph_reduce.FusedPartial(fused, spec, root_layer.task.func, dict(root_layer.task.kwargs),
                                           chain.args[0][1] if chain.args[0][0] == "call" else None)
        task = Task(root, fn, *[TaskRef(blockwise_token(i)) for i in range(len(leaves))])
        layers[root] = Blockwise(root, root_layer.output_indices, task, list(leaves), numblocks,
                                 output_blocks=root_layer.output_blocks, annotations=root_layer.annotations)
        deps[root] = {src for src, _ in leaves}
        done.append(Fusion(root, frozenset(members | {root}), text, tuple(src for src, _ in leaves),
                           spec.name if spec is not None else None))
        if spec is not None and len(spec.axes) == len(root_layer.output_indices):  # one value per chunk
            graph_tree.flatten_tree(layers, deps, root, keep)
    if not done:
        return hlg, done
    out = HighLevelGraph(layers, deps)
    return (out.cull_layers(keep & layers.keys()) if keep else out), done  # the inlined layers dropped


def _expression(root: str, info: tuple, layers: dict, elem: dict, inlinable: Any) -> tuple:
    """``(text, Chain, leaves, scalars, numblocks, n_ops, members)`` of the chain ending at ``root``;
    ``leaves`` maps each (input layer, indices) to its name in the text."""
    leaves: dict[tuple, str] = {}
    members: set[str] = set()
    scalars: list[tuple[str, Any]] = []
    numblocks: dict[str, Any] = {}
    n_ops = 0

    def build(name: str, template: str, operands: list, rename: dict) -> tuple[str, Chain]:
        nonlocal n_ops
        n_ops += 1
        members.add(name)
        parts = []
        calls = []  # dask's own function of this layer, over the same operands
        for op in operands:
            if op[0] == "scalar":
                value = op[1]
                calls.append(("value", value))
                text = literal_text(value)
                if text is not None:
                    parts.append(text)
                else:
                    sname = f"s{len(scalars)}"
                    scalars.append((sname, value))
                    parts.append(sname)
                continue
            _, src, ind = op
            ind = tuple(rename.get(i, i) for i in ind)
            if inlinable(src):
                child = dict(zip(layers[src].output_indices, ind))
                code, call = build(src, *elem[src], child)
                parts.append(code)
                calls.append(("call", call))
                continue
            key = (src, ind)
            if key not in leaves:
                leaves[key] = f"v{len(leaves)}"
                numblocks[src] = layers[name].numblocks[src]
            parts.append(leaves[key])
            calls.append(("block", list(leaves).index(key)))
        return template.format(*parts), Chain(layers[name].task.func, tuple(calls))

    text, chain = build(root, *info, {})
    return text, chain, leaves, scalars, numblocks, n_ops, members


def optimize(*arrays: da.Array) -> Any:
    """The same dask array(s), with chains of ufuncs rewritten into one fused kernel per chunk."""
    out = []
    for a in arrays:
        if not isinstance(a, da.Array):
            out.append(a)
            continue
        plain = type(a._meta) is np.ndarray or is_cupy(a._meta)  # not masked, sparse, ...: their reductions stay dask's
        hlg = rewrite_graph(a.__dask_graph__(), keep={a.name}, reductions=plain)
        out.append(da.Array(hlg, a.name, a.chunks, meta=a._meta))
    return out[0] if len(out) == 1 else tuple(out)


@dataclass(frozen=True)
class Fusing:
    """dask's ``array_optimize`` hook carrying the decisions of the process that set it (a Session's).

    dask calls the hook on the scheduler, whose config may not be the client's (a joined cluster
    then fused other steps, with other last bits); this carries the client's answers along.
    """

    enabled: bool = True
    bare: bool | None = False  # CuPy chunks: a reduction of a bare array is fused too (None: rewrite_graph's)
    device: bool = False  # a GPU session: host NumPy operands of device chunks go to the device (fusion.device)

    def __call__(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        if self.enabled and dask.config.get(CONFIG_KEY, True) and isinstance(dsk, HighLevelGraph):
            names = {k[0] if isinstance(k, tuple) else k for k in flatten(keys)}
            dsk = rewrite_graph(dsk, keep=names, bare=self.bare)
        dsk = dask_optimize(dsk, keys, **kwargs)
        if self.device:
            dsk = move_host_operands(convert_legacy_graph(ensure_dict(dsk)))
        return dsk


def array_optimize(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """dask's ``array_optimize`` hook: rewrite ufunc chains (when ``flowgpu.fuse-ufuncs``), then dask's
    own optimisation."""
    return Fusing(dask.config.get(CONFIG_KEY, False), bare=None)(dsk, keys, **kwargs)


@contextlib.contextmanager
def fusing(enabled: bool = True) -> Iterator[None]:
    """Within the block, every dask array computation fuses its ufunc chains into kernels."""
    with dask.config.set({"array_optimize": array_optimize, CONFIG_KEY: enabled}):
        yield
