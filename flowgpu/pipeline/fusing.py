"""Fusing chains of elementwise steps into one kernel per chunk.

An elementwise op registers an ``expression`` template over its array parameters (``"a + b"``,
``"sqrt(x)"``, ``"clip(x, lo, hi)"`` with scalar arguments ``lo``/``hi``). A step whose result is
read only by one other elementwise step (and is not an output) is inlined into that step's
expression; the chain then runs as one :func:`flowgpu.fusion.fused_elementwise` call, with no
temporary array per step. A ``sum``/``mean``/``min``/``max``/``prod`` step reading a chain takes it
in as well. A chain longer than ``MAX_FUSED_STEPS`` is cut into kernels of that many steps: one
expression nests once per step, and Python's parser and recursion stop a few hundred levels deep.
Nothing here changes results: the unfused graph is built first, and the fused one must
match its shape and dtype or it is not used.
"""

from __future__ import annotations

import ast
import copy
import graphlib
import numbers
from dataclasses import dataclass, field
from typing import Any

from flowgpu.fusion import REDUCTIONS
from flowgpu.ops.registry import Op

__all__ = ["FusionPlan", "plan_fusion", "MAX_FUSED_STEPS"]

MAX_FUSED_STEPS = 32  # steps one fused expression nests at most (each adds a few levels of parentheses)


@dataclass
class FusionPlan:
    """Which steps are fused: ``roots[name]`` = (expression, leaf variable -> ref, reduction, steps)."""

    roots: dict[str, dict] = field(default_factory=dict)
    inlined: set[str] = field(default_factory=set)


def _scalar(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


class _Sub(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, ast.expr]):
        self.mapping = mapping

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self.mapping.get(node.id, node)

    def visit_Call(self, node: ast.Call) -> ast.AST:  # never replace function names
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [self.visit(k) for k in node.keywords]
        return node


def _template(op: Op, args: dict, arrays: list[str]) -> ast.expr | None:
    """The op's expression with scalar arguments filled in and array params as placeholder names."""
    if not op.expression or any(p.endswith("*") or p == "**" for p in op.inputs):
        return None
    try:
        tree = ast.parse(op.expression, mode="eval").body
    except SyntaxError:
        return None
    sig = op.signature.parameters
    mapping: dict[str, ast.expr] = {}
    for name in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}:
        if name in op.inputs and op.inputs.index(name) < len(arrays):
            mapping[name] = ast.Name(id=f"__in{op.inputs.index(name)}", ctx=ast.Load())
        elif name in args or (name in sig and sig[name].default is not sig[name].empty):
            value = args.get(name, sig[name].default if name in sig else None)
            if not _scalar(value):
                return None
            mapping[name] = ast.Constant(value=value)
    if set(args) - set(mapping):
        return None  # an argument the template does not show (e.g. dtype): keep the op unfused
    return _Sub(mapping).visit(tree)


def _named_template(op: Op, args: dict, names: list[str]) -> ast.expr | None:
    """``expr``-like ops (arrays by name, ``expression`` in args): the expression with placeholders."""
    text = args.get("expression")
    if op.inputs != ("**",) or set(args) != {"expression"} or not isinstance(text, str):
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    return _Sub({n: ast.Name(id=f"__in{i}", ctx=ast.Load()) for i, n in enumerate(names)}).visit(tree)


def plan_fusion(spec, ops: dict[str, Op], consumers: dict[str, list[str]], outputs: set[str]) -> FusionPlan:
    """Decide which elementwise chains (and reductions over them) become one fused kernel."""
    plan = FusionPlan()
    exprs: dict[str, tuple[ast.expr, dict[str, str], list[str]]] = {}  # name -> (expr, var->ref, steps)
    refs: dict[str, list[str]] = {}  # name -> the refs behind its placeholders __in0, __in1, ...
    for name, step in spec.steps.items():
        op = ops.get(name)
        if op is None or op.kind != "elementwise":
            continue
        if isinstance(step.inputs, dict):
            tree = _named_template(op, step.args, list(step.inputs))
            if tree is not None:
                exprs[name], refs[name] = (tree, {}, [name]), list(step.inputs.values())
            continue
        if len(step.inputs) > len(op.inputs) or any(p not in step.args for p in op.inputs[len(step.inputs):]):
            continue
        tree = _template(op, step.args, step.inputs)
        if tree is not None:
            exprs[name], refs[name] = (tree, {}, [name]), list(step.inputs)

    cut: set[str] = set()  # steps that end a segment of a long chain: read by the next one as a leaf

    def inlinable(ref: str, into: set | dict = exprs) -> bool:
        readers = consumers.get(ref, [])
        return ref in exprs and ref not in outputs and ref not in cut and len(readers) == 1 and readers[0] in into

    depth: dict[str, int] = {}  # steps nested in a step's expression, itself included
    for name in graphlib.TopologicalSorter({n: [r for r in refs[n] if r in exprs] for n in exprs}).static_order():
        depth[name] = 1 + max((depth[r] for r in refs[name] if inlinable(r)), default=0)
        if depth[name] >= MAX_FUSED_STEPS:
            cut.add(name)

    built: dict[str, tuple[ast.expr, dict[str, str], list[str]]] = {}

    def build(name: str) -> tuple[ast.expr, dict[str, str], list[str]]:
        if name in built:
            return built[name]
        tree, _, _ = exprs[name]
        leaves: dict[str, str] = {}
        steps = [name]
        mapping: dict[str, ast.expr] = {}
        for i, ref in enumerate(refs[name]):
            if inlinable(ref):
                sub, sub_leaves, sub_steps = build(ref)
                leaves.update(sub_leaves)
                steps = sub_steps + steps
                mapping[f"__in{i}"] = sub
            else:
                var = "in_" + ref.replace(".", "__")
                leaves[var] = ref
                mapping[f"__in{i}"] = ast.Name(id=var, ctx=ast.Load())
        out = (_Sub(mapping).visit(copy.deepcopy(tree)), leaves, steps)
        built[name] = out
        return out

    for name in exprs:
        if inlinable(name):
            continue
        tree, leaves, steps = build(name)
        if len(steps) > 1:
            plan.roots[name] = {"expression": ast.unparse(tree), "leaves": leaves, "reduction": None, "steps": steps}
    # reductions that read a chain (fused or a single elementwise step) take it in
    for name, step in spec.steps.items():
        op = ops.get(name)
        if op is None or op.name not in REDUCTIONS or not isinstance(step.inputs, list) or len(step.inputs) != 1:
            continue
        ref = step.inputs[0]
        if not inlinable(ref, into={name}) or set(step.args) - {"axis", "keepdims"}:
            continue
        tree, leaves, steps = build(ref)
        plan.roots[name] = {"expression": ast.unparse(tree), "leaves": leaves, "reduction": op.name,
                            "axis": step.args.get("axis"), "keepdims": bool(step.args.get("keepdims", False)),
                            "steps": steps + [name]}
        plan.roots.pop(ref, None)
    for root in plan.roots.values():
        plan.inlined.update(root["steps"][:-1])
    return plan
