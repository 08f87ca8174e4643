"""Group-wise ops of labelled inputs (``source: xarray``, with a coordinate along ``dim``): xarray's own
``groupby`` and ``resample`` then the reduction ``how``, so the result is what the same xarray code gives.
"""

from __future__ import annotations

from typing import Any, Literal

from flowgpu.arrays.labels import is_labelled
from flowgpu.errors import ArgumentError, OpError
from flowgpu.ops._common import Array, defop
from flowgpu.ops.labels import axis_numbers

__all__ = ["groupby_reduce", "groupby_anomaly", "resample_reduce", "DATETIME_PARTS"]

How = Literal["mean", "sum", "min", "max", "std", "var", "median", "prod", "count", "first", "last"]
# the datetime components ``by`` may name (xarray's ``DataArray.dt`` accessors that group)
DATETIME_PARTS = ("year", "month", "day", "hour", "minute", "second", "dayofyear", "dayofweek", "weekofyear",
                  "season", "quarter", "date", "time")


def _labelled(op: str, x: Any, dim: str) -> None:
    if not is_labelled(x):
        raise OpError(f"op {op!r} needs a labelled input (from source: xarray, with a coordinate {dim!r}); "
                      "this one has no dimension names")
    axis_numbers(op, "dim", dim, x)  # a dimension of x, or the error naming x's dims
    if dim not in x.coords:
        raise ArgumentError(f"op {op!r}: dimension {dim!r} has no coordinate to group by; give the dataset one "
                            f"(its coordinates: {', '.join(map(str, x.coords)) or 'none'})", argument="dim")


@defop("groupby_reduce", labelled=True)
def groupby_reduce(x: Array, *, dim: str = "time", by: str = "month", how: How = "mean") -> Array:
    """A reduction per group of ``dim``, as xarray's ``x.groupby("time.month").mean()``.

    ``by``: a datetime component of ``dim``'s coordinate (``year``, ``month``, ``dayofyear``,
    ``season``, ...), or another coordinate along ``dim`` (read when the step is built: xarray needs
    its labels).

    Returns
    -------
    labelled array
        ``dim`` replaced by the group dimension (``month``: 1..12), attrs kept.
    """
    x, key = _group_key("groupby_reduce", x, dim, by)
    return getattr(x.groupby(key), how)()


def _group_key(op: str, x: Any, dim: str, by: str) -> tuple[Any, str]:
    """``x`` (its grouping coordinate read, when it is one) and the key xarray groups it by."""
    _labelled(op, x, dim)
    if by in x.coords and by != dim:
        if x.coords[by].dims != (dim,):
            raise ArgumentError(f"op {op!r}: coordinate {by!r} does not run along {dim!r}", argument="by")
        return x.assign_coords({by: x.coords[by].compute()}), by  # the group labels (1-D) are read now
    if by in DATETIME_PARTS:
        if x.coords[dim].dtype.kind != "M" and x.coords[dim].dtype != object:
            raise ArgumentError(f"op {op!r}: by {by!r} is a datetime component, but coordinate {dim!r} "
                                f"holds {x.coords[dim].dtype}, not datetimes", argument="by")
        return x, f"{dim}.{by}"
    raise ArgumentError(f"op {op!r}: by {by!r} is neither a datetime component "
                        f"({', '.join(DATETIME_PARTS)}) nor a coordinate along {dim!r}", argument="by")


@defop("groupby_anomaly", labelled=True)
def groupby_anomaly(x: Array, *, dim: str = "time", by: str = "month", how: Literal["mean", "median"] = "mean"
                    ) -> Array:
    """Each value minus its group's mean, as xarray's ``x.groupby("time.month") - clim``.

    ``dim`` and ``by`` as for ``groupby_reduce``; ``how``: the group value subtracted.

    Returns
    -------
    labelled array
        The shape, dims and coordinates of ``x`` (the group key as a coordinate along ``dim``).
    """
    x, key = _group_key("groupby_anomaly", x, dim, by)
    grouped = x.groupby(key)
    return grouped - getattr(grouped, how)()


@defop("resample_reduce", labelled=True)
def resample_reduce(x: Array, *, freq: str, dim: str = "time", how: How = "mean") -> Array:
    """A reduction per time bin of ``dim``, as xarray's ``x.resample(time="1MS").mean()``.

    ``freq``: the bins, a pandas offset alias (``1D``, ``7D``, ``1MS`` for month starts, ``QS-DEC``, ``6h``).

    Returns
    -------
    labelled array
        ``dim`` with one entry per bin (labelled by its start), attrs kept.
    """
    _labelled("resample_reduce", x, dim)
    if x.coords[dim].dtype.kind != "M" and x.coords[dim].dtype != object:
        raise ArgumentError(f"op 'resample_reduce': coordinate {dim!r} holds {x.coords[dim].dtype}, not datetimes",
                            argument="dim")
    try:
        grouped = x.resample({dim: freq})
    except (ValueError, TypeError) as e:
        raise ArgumentError(f"op 'resample_reduce': freq {freq!r} is not a frequency ({e}); use a pandas offset "
                            "alias such as '1D', '1MS' or '1YS'", argument="freq") from None
    return getattr(grouped, how)()
