"""The dependency graph of a spec: references checked, cycles refused, steps put in order."""

from __future__ import annotations

import graphlib

from flowgpu.errors import did_you_mean
from flowgpu.pipeline.loader import SourceMap
from flowgpu.pipeline.spec import Spec

__all__ = ["step_refs", "order", "check_ref"]


def step_refs(spec: Spec, name: str) -> list[tuple[tuple, str]]:
    """``(field path, reference)`` for each input of step ``name``."""
    step = spec.steps[name]
    if isinstance(step.inputs, dict):
        return [(("steps", name, "inputs", k), ref) for k, ref in step.inputs.items()]
    return [(("steps", name, "inputs", i), ref) for i, ref in enumerate(step.inputs)]


def check_ref(spec: Spec, ref: str, where: tuple, smap: SourceMap) -> str:
    """The node a reference depends on; an unknown name fails with close matches."""
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


def order(spec: Spec, smap: SourceMap) -> list[str]:
    """Inputs and steps in an order where each comes after everything it reads."""
    deps: dict[str, set[str]] = {name: set() for name in spec.inputs}
    for name in spec.steps:
        deps[name] = {check_ref(spec, ref, where, smap) for where, ref in step_refs(spec, name)}
        if name in deps[name]:
            raise smap.error(f"step {name!r} reads its own result", ("steps", name, "inputs"),
                             hint="a step's inputs must be inputs or other steps")
    for out, o in spec.outputs.items():
        check_ref(spec, o.from_, ("outputs", out, "from"), smap)
    sorter = graphlib.TopologicalSorter({k: sorted(v) for k, v in deps.items()})
    try:
        return list(sorter.static_order())
    except graphlib.CycleError as e:
        cycle = e.args[1]
        first = cycle[0]
        raise smap.error(f"steps form a cycle: {' -> '.join(cycle)}", ("steps", first, "inputs"),
                         hint="a step cannot depend on its own result; break the cycle") from None
