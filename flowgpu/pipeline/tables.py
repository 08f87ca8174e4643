"""Table outputs (``sink: table``): one row per batch item, written once every item is done.

Each is computed and cached like a ``summary`` output; the outputs that name one path are the
columns of that table, after the item's foreach params, so a rerun still writes every row (up to
date values from the cache). A table is written only when all its items succeeded, and not when
it already holds the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowgpu.io import sinks, table
from flowgpu.io.atomic import canonical
from flowgpu.io.paths import shown
from flowgpu.pipeline.loader import SourceMap
from flowgpu.pipeline.spec import Spec

__all__ = ["collects", "check_column", "check_path", "check_items", "write_tables"]


def collects(out: Any) -> bool:
    """Whether output ``out`` goes into a table."""
    return sinks.sink_entry(out.sink).has(sinks.COLLECTS)


def check_column(smap: SourceMap, name: str, x: Any) -> None:
    """Refuse a table output that is not a scalar or a short 1-D array of numbers, booleans or text."""
    dtype, shape = np.dtype(x.dtype), tuple(x.shape)
    where = ("outputs", name, "from")
    if dtype.kind not in table.KINDS:
        fix = "take its real and imaginary parts as two outputs (ops real, imag)" if dtype.kind == "c" else \
            "cast it (op astype) or write it with an array sink (npy, zarr)"
        raise smap.error(f"output {name!r} is {dtype}: a table holds numbers, booleans and text", where, hint=fix)
    if len(shape) > 1 or (len(shape) == 1 and not (shape[0] == shape[0] and shape[0] <= table.MAX_VALUES)):
        shown_shape = tuple(None if d != d else int(d) for d in shape)
        raise smap.error(f"output {name!r} has shape {shown_shape}: a table column holds a scalar, or a 1-D array of "
                         f"at most {table.MAX_VALUES} values (one column each)", where,
                         hint="reduce it to a few values (e.g. op: mean, max or std), or write it with an array "
                              "sink (npy, zarr)")


def check_path(spec: Spec, name: str, path: str) -> None:
    """Refuse a table path that is neither ``.csv`` nor ``.parquet`` (or Parquet without pyarrow)."""
    fmt = table.table_format(path)
    where = ("outputs", name, "path")
    if fmt is None:
        raise spec.error(f"output {name!r}: a table is written as CSV or Parquet, and {shown(path)!r} ends in neither "
                         ".csv nor .parquet", where, hint="e.g. path: out/stats.csv")
    if fmt == "parquet" and not table.has_pyarrow():
        raise spec.error(f"output {name!r}: writing a Parquet table needs pyarrow, which is not installed", where,
                         hint="install it (pip install pyarrow, here where the run starts), or write CSV: a path "
                              "ending in .csv")


@dataclass
class _Table:
    """One table file: its path, its header, and its items (with the plan each was compiled to)."""

    path: str
    header: list[str]
    first: Any  # the item that gave the header
    outputs: list[str]
    members: list[tuple[Any, Any]] = field(default_factory=list)  # (item, plan) or (job, plan)


def _params(item: Any) -> dict[str, Any]:
    """The param columns of ``item``'s row: its foreach params, and those pinned by ``--set``."""
    given = item.spec.origin.params
    pinned = {n: given[n] for n in item.spec.foreach if n not in item.values and n in given}
    return {**item.values, **pinned}


def _gather(pairs: list[tuple[Any, Any, Any]]) -> dict[str, _Table]:
    """The tables of a batch: ``pairs`` are ``(item, plan, what to keep)`` (what: the item or its job)."""
    found: dict[str, _Table] = {}
    for item, plan, what in pairs:
        mine: dict[str, list[str]] = {}
        for name, out in item.spec.outputs.items():
            if out.path is not None and collects(out):
                mine.setdefault(canonical(out.path), []).append(name)
        for key, outputs in mine.items():
            header = [*_params(item), *(c for n in outputs for c in table.column_names(n, plan.outputs[n].shape))]
            t = found.setdefault(key, _Table(item.spec.outputs[outputs[0]].path, header, item, outputs))
            if header != t.header:
                raise item.spec.error(
                    f"batch items {t.first.index + 1} ({t.first.label}) and {item.index + 1} ({item.label}) give the "
                    f"table {shown(t.path)!r} different columns: {', '.join(t.header)} and {', '.join(header)}",
                    ("outputs", outputs[0], "path"),
                    hint="the rows of a table have the same columns: give the items outputs of one shape, or a table "
                         "each (a foreach param in the path)")
            t.members.append((what, plan))
    return found


def check_items(items: list[Any], plans: list[Any]) -> None:
    """Refuse a table with two columns of one name, rows of different columns, or another output's path."""
    found = _gather([(item, plan, item) for item, plan in zip(items, plans)])
    files = {canonical(o.path): (item, n) for item in items for n, o in item.spec.outputs.items()
             if o.path is not None and not collects(o)}
    for key, t in found.items():
        item, first = t.first, t.outputs[0]
        if key in files:
            other, name = files[key]
            of = f" of batch item {other.index + 1} ({other.label})" if len(items) > 1 else ""
            raise item.spec.error(f"output {first!r} collects into the table {shown(t.path)!r}, which output {name!r}"
                                  f"{of} writes too", ("outputs", first, "path"), hint="give the table a path of its own")
        seen: set[str] = set()
        for column in t.header:
            if column in seen:
                raise item.spec.error(
                    f"the table {shown(t.path)!r} would have two columns {column!r} (its columns: the foreach params "
                    f"{', '.join(_params(item)) or '(none)'}, then the outputs {', '.join(t.outputs)})",
                    ("outputs", first, "path"), hint="rename the output, so each column has a name of its own")
            seen.add(column)


def write_tables(outcomes: list[Any], overwrite: bool = False) -> list[str]:
    """Write every table of a batch from its items' outcomes; returns a line to say of each."""
    said = []
    for t in _gather([(o.job.item, o.job.plan, o) for o in outcomes]).values():
        missing = [o for o, _ in t.members if o.status not in ("ok", "up-to-date")]
        if missing:
            said.append(f"table {shown(t.path)}: not written, {len(missing)} of {len(t.members)} items did not "
                        "complete (the file is as it was)")
            continue
        rows = []
        for o, plan in t.members:
            row = list(_params(o.job.item).values())
            for name in t.outputs:
                row += table.cells(o.outputs[name], plan.outputs[name].dtype, plan.outputs[name].shape)
            rows.append(row)
        wrote = table.write(t.path, table.render(t.path, t.header, rows), overwrite)
        said.append(f"table {shown(t.path)}: {len(rows)} row{'s' if len(rows) != 1 else ''}, "
                    f"{'written' if wrote else 'up to date'}")
    return said
