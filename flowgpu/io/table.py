"""Tables: small results, one row per batch item, as a CSV or Parquet file (``sink: table``).

A row holds the item's params, then each output: a scalar one column, a 1-D array of at most
:data:`MAX_VALUES` one column per value (``hist_0``, ...). Numbers are written as NumPy prints them
(shortest round-trip text). Parquet needs pyarrow. The file is written whole and atomically, and
left alone when it already holds the same bytes.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowgpu.io.atomic import atomic_output, written_by_flowgpu

__all__ = ["FORMATS", "MAX_VALUES", "KINDS", "table_format", "has_pyarrow", "column_names", "cells", "render",
           "write"]

FORMATS = {".csv": "csv", ".parquet": "parquet"}
MAX_VALUES = 64  # the most values of a 1-D table output (one column each)
KINDS = "biuf" + "U"  # dtype kinds a table holds: booleans, integers, floats, text


def table_format(path: str) -> str | None:
    """``"csv"`` or ``"parquet"`` from ``path``'s suffix (any case), or None."""
    return FORMATS.get(os.path.splitext(path)[1].lower())


def has_pyarrow() -> bool:
    """Whether pyarrow can be imported (found, not imported: a check stays fast)."""
    return importlib.util.find_spec("pyarrow") is not None


def column_names(name: str, shape: Sequence[int]) -> list[str]:
    """The columns of output ``name`` of ``shape``: ``[name]`` for a scalar, ``name_0 ...`` for a 1-D array."""
    return [name] if len(shape) == 0 else [f"{name}_{i}" for i in range(int(shape[0]))]


def cells(value: Any, dtype: Any, shape: Sequence[int]) -> list[Any]:
    """The cells of one output's value (a number, or a list as the summary holds it) as NumPy scalars of ``dtype``."""
    arr = np.asarray(value, dtype=np.dtype(dtype)).reshape(tuple(shape))
    return [arr[()]] if arr.ndim == 0 else list(arr)


def _csv(header: list[str], rows: list[list[Any]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[str(v) for v in row] for row in rows])  # NumPy scalars: the shortest round-trip text
    return out.getvalue().encode()


def _parquet(header: list[str], rows: list[list[Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = []
    for i in range(len(header)):
        values = [row[i] for row in rows]
        if values and all(isinstance(v, np.generic) for v in values):
            columns.append(pa.array(np.array(values, dtype=values[0].dtype)))
            continue
        try:
            columns.append(pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):  # params of mixed types: as text
            columns.append(pa.array([str(v) for v in values]))
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_arrays(columns, names=header), sink)
    return sink.getvalue().to_pybytes()


def render(path: str, header: list[str], rows: list[list[Any]]) -> bytes:
    """The bytes of the table at ``path`` (its format from its suffix)."""
    return _parquet(header, rows) if table_format(path) == "parquet" else _csv(header, rows)


def _same(path: str, data: bytes) -> bool:
    try:
        if not written_by_flowgpu(path) or os.path.getsize(path) != len(data):
            return False
        with open(path, "rb") as f:
            return f.read() == data
    except OSError:
        return False


def write(path: str, data: bytes, overwrite: bool = False) -> bool:
    """Write ``data`` to ``path`` atomically, with flowgpu's marker; False (nothing written) when the
    file flowgpu wrote there already holds it."""
    if _same(path, data):
        return False
    with atomic_output(path, overwrite, meta={"format": table_format(path) or "csv"}) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return True
