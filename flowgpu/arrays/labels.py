"""Labelled arrays (``xarray.DataArray`` over a dask array) told apart without importing xarray."""

from __future__ import annotations

from typing import Any

__all__ = ["is_labelled", "bare"]


def is_labelled(x: Any) -> bool:
    """Whether ``x`` is an ``xarray.DataArray`` (checked without importing xarray)."""
    return any(c.__name__ == "DataArray" and c.__module__.startswith("xarray.") for c in type(x).__mro__)


def bare(x: Any) -> Any:
    """The array under a labelled value (its dask array); anything else as it is."""
    return x.data if is_labelled(x) else x
