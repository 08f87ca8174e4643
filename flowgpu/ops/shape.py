"""Ops that move, select or regroup elements: transpose, slice, reshape, rechunk, concatenate, stack,
squeeze. None of them computes new values; most are cheap metadata changes in the graph."""

from __future__ import annotations

from typing import Any

import dask.array as da
from dask.array.core import normalize_chunks
from dask.utils import parse_bytes

from flowgpu.arrays.chunks import resolve_chunks
from flowgpu.errors import OpError
from flowgpu.ops._common import Array, Axis, axis_arg, defop, same_backend

__all__ = ["transpose", "slice_", "parse_index", "reshape", "rechunk", "concatenate", "stack", "squeeze"]

Index = str | int | list | tuple | None


@defop("transpose")
def transpose(x: Array, *, axes: list[int | str] | tuple[int | str, ...] | None = None) -> Array:
    """Axes permuted: reversed by default, or in the order given by ``axes``.

    ``axes`` is a permutation of ``0 .. ndim-1`` (or of a labelled input's dimension names).

    Returns
    -------
    dask.array.Array
        The chunks transposed; no data is copied until computed.
    """
    (x,) = same_backend(x)
    if axes is not None:
        axes = tuple(int(a) % x.ndim if -x.ndim <= a < x.ndim else a for a in axes)
        if sorted(axes) != list(range(x.ndim)):
            raise OpError(f"op 'transpose': axes={list(axes)!r} is not a permutation of 0..{x.ndim - 1} "
                          f"for an array of {x.ndim} dimension(s)")
    return da.transpose(x, axes)


def _int_or_none(text: str, where: str) -> int | None:
    text = text.strip()
    if text == "" or text.lower() in ("none", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        raise OpError(f"op 'slice': {text!r} in {where!r} is not a whole number; write e.g. '0:100, ::2'") from None


def _parse_part(part: Any, where: str) -> Any:
    if part is None:
        return slice(None)
    if isinstance(part, bool):
        raise OpError(f"op 'slice': {part!r} in {where!r} is not an index")
    if isinstance(part, int):
        return part
    if isinstance(part, (list, tuple)):
        if not 1 <= len(part) <= 3 or not all(p is None or (isinstance(p, int) and not isinstance(p, bool))
                                              for p in part):
            raise OpError(f"op 'slice': {list(part)!r} in {where!r} should be [start, stop] or [start, stop, step] "
                          "of whole numbers or null")
        return slice(*part) if len(part) > 1 else slice(part[0], None)
    if isinstance(part, str):
        text = part.strip()
        if text == "...":
            return Ellipsis
        if ":" in text:
            pieces = text.split(":")
            if len(pieces) > 3:
                raise OpError(f"op 'slice': {text!r} has more than two ':'; write start:stop:step")
            return slice(*(_int_or_none(p, where) for p in pieces))
        value = _int_or_none(text, where)
        return slice(None) if value is None else value
    raise OpError(f"op 'slice': {part!r} in {where!r} is not an index; use a whole number, null, "
                  "[start, stop, step] or a string such as '0:100'")


def parse_index(index: Any) -> tuple:
    """A spec's slice description (see the ``slice`` op) as a Python index tuple.

    >>> parse_index("0:100, ::2")
    (slice(0, 100, None), slice(None, None, 2))
    >>> parse_index([[0, 100], None, 3])
    (slice(0, 100, None), slice(None, None, None), 3)
    """
    if isinstance(index, str):
        parts: list[Any] = index.split(",")
        if len(parts) > 1 and not parts[-1].strip():
            parts.pop()  # a trailing comma
    else:
        parts = list(index) if isinstance(index, (list, tuple)) else [index]
    return tuple(_parse_part(p, str(index)) for p in parts)


@defop("slice")
def slice_(x: Array, *, index: Index) -> Array:
    """A sub-array selected by start:stop:step ranges or single positions along each axis.

    ``index`` is NumPy syntax as a string (``"0:100, ::2"``, ``"..., -1"``), or one item per axis: a
    whole number (one position; the axis is dropped), ``null`` (the whole axis), ``[start, stop]`` or
    ``[start, stop, step]`` (null for an open end), ``"..."`` or ``"a:b:c"``. Missing trailing axes
    are kept whole.

    Returns
    -------
    dask.array.Array
    """
    (x,) = same_backend(x)
    idx = parse_index(index)
    try:
        return x[idx]
    except (IndexError, ValueError, TypeError, NotImplementedError) as e:
        raise OpError(f"op 'slice': index {index!r} does not fit an array of shape {x.shape}: {e}") from None


@defop("reshape")
def reshape(x: Array, *, shape: int | list[int] | tuple[int, ...]) -> Array:
    """The same elements in a new shape (C order); one length may be -1 to be inferred.

    Returns
    -------
    dask.array.Array
        dask may merge chunks along the reshaped axes to keep the reshape blockwise; a reshape that
        splits axes unevenly goes through a 1-D array, which moves more data.
    """
    (x,) = same_backend(x)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    try:
        try:
            return x.reshape(shape)
        except NotImplementedError:  # dims split unevenly: go through 1-D (merge, then split)
            return x.reshape(-1).reshape(shape)
    except ValueError as e:
        raise OpError(f"op 'reshape': cannot reshape an array of shape {x.shape} into {shape}: {e}") from None


@defop("rechunk")
def rechunk(x: Array, *, chunks: Any = "auto") -> Array:
    """The same array cut into different chunks.

    ``chunks`` as dask takes them: one size for every axis (``1000``), one per axis (``[1000, -1]``,
    -1: the whole axis), a byte size (``"256MiB"``) or ``"auto"`` (sized for the workers).

    Returns
    -------
    dask.array.Array
    """
    (x,) = same_backend(x)
    if isinstance(chunks, dict):
        return x.rechunk(chunks)
    if isinstance(chunks, str) and chunks != "auto":
        try:
            limit = parse_bytes(chunks)
        except ValueError:
            raise OpError(f"op 'rechunk': chunks={chunks!r} is neither 'auto' nor a byte size like '256MiB'") from None
        return x.rechunk(normalize_chunks("auto", x.shape, limit=limit, dtype=x.dtype))
    return x.rechunk(resolve_chunks(chunks, x.shape, x.dtype))


def _join(name: str, func, arrays: tuple, axis: int, extra_dim: int) -> da.Array:
    if not arrays:
        raise OpError(f"op {name!r}: give at least one input array")
    arrays = tuple(same_backend(*arrays))
    axis_arg(name, axis, arrays[0].ndim + extra_dim)
    try:
        return func(list(arrays), axis=axis)
    except ValueError as e:
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise OpError(f"op {name!r}: cannot join arrays of shapes {shapes} along axis {axis}: {e}") from None


@defop("concatenate")
def concatenate(*arrays: Array, axis: int | str = 0) -> Array:
    """Arrays joined end to end along an existing axis.

    The arrays have the same shape except along ``axis`` (a number, or a labelled input's dimension name).

    Returns
    -------
    dask.array.Array
    """
    return _join("concatenate", da.concatenate, arrays, axis, 0)


@defop("stack")
def stack(*arrays: Array, axis: int | str = 0) -> Array:
    """Arrays of one shape stacked along a new axis.

    ``axis`` is the position of the new axis in the result.

    Returns
    -------
    dask.array.Array
    """
    return _join("stack", da.stack, arrays, axis, 1)


@defop("squeeze")
def squeeze(x: Array, *, axis: Axis = None) -> Array:
    """Axes of length 1 removed (all of them, or those given).

    Returns
    -------
    dask.array.Array
    """
    (x,) = same_backend(x)
    ax = axis_arg("squeeze", axis, x.ndim)
    try:
        return da.squeeze(x, axis=ax)
    except ValueError as e:
        raise OpError(f"op 'squeeze': {e} (shape {x.shape})") from None
