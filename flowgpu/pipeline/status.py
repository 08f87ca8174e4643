"""What a run would do, without running: every item compiled and checked, each output up to date or why not.

:func:`status` is ``flowgpu status SPEC``; :func:`plan_items` and :func:`judge` are the first steps
of every run too (:mod:`flowgpu.pipeline.runner`), so both say the same.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from flowgpu.backend import Facts
from flowgpu.errors import SpecError
from flowgpu.io.atomic import canonical
from flowgpu.io.paths import shown
from flowgpu.pipeline import cache as outputs_cache
from flowgpu.pipeline import recipe, tables
from flowgpu.pipeline.batch import Job
from flowgpu.pipeline.build import build, from_dict, load, read_params_file
from flowgpu.pipeline.checks import check_outputs
from flowgpu.pipeline.compiler import Plan, compile
from flowgpu.pipeline.foreach import Item, expand, in_item
from flowgpu.pipeline.spec import PARAM_REF, Spec

__all__ = ["judge", "line", "load_spec", "plan_items", "status"]


def plan_items(items: list[Item], overwrite: bool, params_file: str | None, facts: Facts | None = None,
               for_run: bool = False) -> list[Plan]:
    """Compile (for ``facts``: a Session's, else this machine's; calling python sources if ``for_run``)
    and check every item before anything runs; an invalid item refuses the batch, named."""
    plans, seen = [], {}
    protect = {params_file: f"the params file {params_file!r}"} if params_file else None
    for item in items:
        try:
            plans.append(compile(item.spec, facts=facts, for_run=for_run))
            check_outputs(item.spec, overwrite, protect)
        except SpecError as e:
            raise in_item(e, item) from None
        for name, out in item.spec.outputs.items():
            if out.path is None or tables.collects(out):  # every item writes a row of the table
                continue
            path = canonical(out.path)  # one file, also when a linked folder gives it two names
            if path in seen:
                other, first = seen[path]
                through = "" if first == os.path.abspath(out.path) else f" (through a linked folder: both are {path})"
                raise item.spec.error(
                    f"batch items {other.index + 1} ({other.label}) and {item.index + 1} ({item.label}) both write "
                    f"output {name!r} to {shown(out.path)!r}{through}", ("outputs", name, "path"),
                    hint=_distinct_hint(item, name))
            seen[path] = item, os.path.abspath(out.path)
    tables.check_items(items, plans)
    _refuse_reading_another_items_output(items, plans)
    return plans


def _distinct_hint(item: Item, output: str) -> str:
    """How to give each item's output a path of its own: a foreach param in it, or (a path param's
    part, such as ``.stem``, is the same for two items) more of that param's path."""
    raw = item.spec.origin.raw if item.spec.origin is not None else {}
    given = (raw.get("outputs") or {}).get(output, {}).get("path")  # as written: ${params...} not substituted
    refs = PARAM_REF.finditer(given) if isinstance(given, str) else ()
    part = next((m for m in refs if m.group(2) and m.group(1) in item.values), None)
    if part is not None:
        name = part.group(1)
        return (f"their {name}s differ in a part that ${{params.{name}{part.group(2)}}} drops: keep more of it, e.g. "
                f"${{params.{name}.parent.name}}_${{params.{name}.stem}} (folder and name)")
    return "put a foreach param in the path, e.g. path: out/${params.%s}.zarr" % next(iter(item.values))


def _reads(plan: Plan) -> list[tuple[str, Spec, str]]:
    """The files ``plan`` reads: ``(path, the spec whose input names it, that input)``, its included specs' too."""
    found = []
    for name, node in plan.nodes.items():
        path = getattr(plan.spec.inputs[name], "path", None) if node.kind == "input" and node.reads_files else None
        if isinstance(path, str) and path and "://" not in path:
            found.append((path, plan.spec, name))
    for child in plan.children.values():
        found += _reads(child)
    return found


def _above(path: str) -> list[str]:
    """``path`` and every folder it is in."""
    out = [path]
    while os.path.dirname(out[-1]) != out[-1]:
        out.append(os.path.dirname(out[-1]))
    return out


def _refuse_reading_another_items_output(items: list[Item], plans: list[Plan]) -> None:
    """Refuse a batch in which an item reads what another item writes (the path, a file in it, or a
    folder holding it): the items run at the same time, so what it read would depend on which ran first."""
    if len(items) < 2:
        return
    written: dict[str, tuple[Item, str]] = {}  # an output's real path -> who writes it
    holding: dict[str, list[tuple[Item, str]]] = {}  # a folder -> two items writing in it, at most
    for item in items:
        for name, out in item.spec.outputs.items():
            if out.path is None or "://" in out.path:
                continue
            real = os.path.realpath(os.path.abspath(out.path))
            written.setdefault(real, (item, name))
            for folder in _above(real)[1:]:
                writers = holding.setdefault(folder, [])
                if len(writers) < 2 and all(w is not item for w, _ in writers):
                    writers.append((item, name))
    for item, plan in zip(items, plans):
        for path, spec, name in _reads(plan):
            real = os.path.realpath(os.path.abspath(path))
            found = [written[p] for p in _above(real) if p in written] + holding.get(real, [])
            other = next(((w, o) for w, o in found if w is not item), None)
            if other is None:
                continue
            writer, output = other
            message = (f"batch item {item.index + 1} ({item.label}) reads {shown(path)!r} (input {name!r}), which batch "
                       f"item {writer.index + 1} ({writer.label}) writes (output {output!r}): the items of a batch run "
                       "at the same time, so what it read would depend on which ran first")
            hint = ("let no item read what another writes: make that output in a batch of its own first, "
                    "or give the items' outputs paths none of them reads")
            raise spec.error(message, ("inputs", name, "path"), hint=hint)


def judge(jobs: list[Job], store: Any, force: bool, checksum: bool) -> list[Job]:
    """The jobs, each saying which of its outputs are up to date (kept, with their cached value or location)."""
    judged = []
    for job in jobs:
        recipes = recipe.recipes(job.plan, checksum=checksum)
        verdicts = store.check(job.plan, recipes, item=job.item.values, checksum=checksum, force=force)
        todo = tuple(n for n in job.plan.outputs if not verdicts[n].up_to_date)
        cached = {n: v.value if v.location is None else v.location for n, v in verdicts.items() if v.up_to_date}
        judged.append(replace(job, todo=todo, reasons={n: verdicts[n].reason for n in todo}, cached=cached,
                              verdicts=verdicts, recipes=recipes))
    return judged


def line(jobs: list[Job]) -> str:
    """What a run says of its outputs, all items together: ``3 up to date, 1 to compute (...)``."""
    return outputs_cache.summarize({f"{j.item.index}:{n}": v for j in jobs for n, v in j.verdicts.items()})


def load_spec(spec: Spec | str | os.PathLike | dict, overrides: dict[str, Any] | None = None,
              params_file: str | None = None) -> Spec:
    """A spec from a path, a dict or a Spec, with ``overrides`` and the params file applied."""
    if isinstance(spec, (str, os.PathLike)):
        return load(spec, overrides, params_file)
    if isinstance(spec, dict):
        return from_dict(spec, {**(read_params_file(params_file) if params_file else {}), **(overrides or {})})
    if overrides or params_file:
        merged = {**spec.origin.overrides, **(read_params_file(params_file) if params_file else {}),
                  **(overrides or {})} if spec.origin else dict(overrides or {})
        return build(spec.origin.raw, spec.origin.smap, merged)
    return spec


def status(spec: Spec | str | os.PathLike | dict, *, overrides: dict[str, Any] | None = None,
           params_file: str | None = None, foreach: dict[str, Any] | None = None, checksum: bool = False,
           force: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """What ``run`` would do now, without running: ``{"name", "file", "line", "items": [{"index",
    "params", "outputs": {name: {"up_to_date", "reason", "value"/"location"}}}]}``; ``line`` is the
    sentence a run prints (``3 up to date, 1 to compute (inputs changed: data/b.npy)``). Starts no
    cluster, calls no user code, takes no lock."""
    spec = load_spec(spec, overrides, params_file)
    items = expand(spec, foreach)
    plans = plan_items(items, overwrite, params_file)
    jobs = judge([Job(item, plan, tuple(plan.outputs)) for item, plan in zip(items, plans)], outputs_cache.Cache(),
                 force, checksum)
    entries = [{"index": job.item.index, "params": job.item.values, "outputs": {
        name: {"up_to_date": v.up_to_date, "reason": v.reason,
               **({"location": v.location} if v.location is not None else {"value": v.value})}
        for name, v in job.verdicts.items()}} for job in jobs]
    return {"name": spec.name, "file": spec.origin.file if spec.origin else None, "line": line(jobs), "items": entries}
