"""The chunk stage of dask's reductions, recognised in a graph (:func:`match`) and computed by one
fused kernel (:class:`FusedPartial`) as the same partial; dask's tree stays. ``std``/``var`` are
left alone (a one-pass sum of squares loses every digit when the mean is large against the
spread), and chunks no kernel takes run dask's own chunk function.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.array import chunk as dask_chunk
from dask.array import reductions as dask_reductions
from dask.blockwise import Blockwise

from flowgpu.backend import import_cupy, is_cupy
from flowgpu.errors import KernelError
from flowgpu.fusion.chunk import Chain, FusedChunk, kernel_blocks

__all__ = ["Reduction", "match", "FusedPartial", "graph_has_masked"]

# dask's chunk functions whose partial carries ``dtype=`` (the reduction's result dtype)
_TYPED = {dask_chunk.sum: "sum", dask_chunk.prod: "prod", dask_chunk.nansum: "nansum",
          dask_chunk.nanprod: "nanprod"}
# dask's chunk functions with no dtype: (kernel reduction, value dtype; None: the chain's own)
_UNTYPED = {dask_reductions.chunk_min: ("min", None), dask_reductions.chunk_max: ("max", None),
            dask_reductions._nanmin_skip: ("nanmin", None), dask_reductions._nanmax_skip: ("nanmax", None),
            dask_chunk.any: ("max", np.dtype(bool)), dask_chunk.all: ("min", np.dtype(bool))}
_KERNEL_KINDS = frozenset("biuf")


@dataclass(frozen=True)
class Reduction:
    """A recognised chunk stage: the reduction, over which input, as what partial."""

    kind: str  # the kernel's reduction: sum prod min max nansum nanprod nanmin nanmax
    axes: tuple[int, ...]
    # what the values are cast to before reducing, and the partial's dtype (None: the chain's dtype)
    dtype: np.dtype | None
    mean: str | None  # "mean" / "nanmean": the partial is dask's {"n", "total"}
    source: tuple[str, tuple]  # (input layer, its indices in this layer)

    @property
    def name(self) -> str:
        """The reduction as the code wrote it (``any``/``all`` are a max/min of booleans here)."""
        if self.mean:
            return self.mean
        return {"max": "any", "min": "all"}.get(self.kind, self.kind) if self.dtype == bool else self.kind


def _dtype(value: Any) -> np.dtype | None:
    try:
        dt = np.dtype(value)
    except TypeError:
        return None
    return dt if dt.kind in _KERNEL_KINDS and dt != np.float16 else None


def match(layer: Any) -> Reduction | None:
    """The reduction whose chunk stage ``layer`` is, or None (then it must be left as it is)."""
    if type(layer) is not Blockwise or layer.new_axes or layer.concatenate or getattr(layer, "io_deps", None):
        return None
    task = getattr(layer, "task", None)
    if task is None or len(task.args) != 1 or len(layer.indices) != 1 or set(task.kwargs) != {"axis", "keepdims"}:
        return None
    axis, keepdims = task.kwargs["axis"], task.kwargs["keepdims"]
    src, ind = layer.indices[0]
    if keepdims is not True or not isinstance(axis, tuple) or not axis or ind is None or not isinstance(src, str):
        return None
    if tuple(ind) != tuple(layer.output_indices) or getattr(task.args[0], "key", None) != "__dask_blockwise__0":
        return None
    ndim = len(ind)
    if not all(isinstance(a, int) and 0 <= a < ndim for a in axis):
        return None
    axes = tuple(sorted(set(axis)))
    func = task.func
    base, kw = (func.func, dict(func.keywords)) if isinstance(func, functools.partial) else (func, {})
    if base is dask_reductions.mean_chunk:
        dtype = _dtype(kw.pop("dtype", "f8"))
        nan = kw == {"sum": dask_chunk.nansum, "numel": dask_reductions.nannumel}
        if dtype is None or (kw and not nan) or func.args:
            return None
        return Reduction("nansum" if nan else "sum", axes, dtype, "nanmean" if nan else "mean", (src, tuple(ind)))
    if isinstance(func, functools.partial) and (func.args or set(kw) != {"dtype"}):
        return None
    if base in _TYPED and "dtype" in kw:
        dtype = _dtype(kw["dtype"])
        return None if dtype is None else Reduction(_TYPED[base], axes, dtype, None, (src, tuple(ind)))
    if base in _UNTYPED and not kw:
        kind, dtype = _UNTYPED[base]
        return Reduction(kind, axes, dtype, None, (src, tuple(ind)))
    return None


def graph_has_masked(layers: dict) -> bool:
    """Whether a layer calls numpy.ma / dask.array.ma: its reductions are then left to dask."""
    for layer in layers.values():
        func = getattr(getattr(layer, "task", None), "func", None)
        func = getattr(func, "func", func)
        if (getattr(func, "__module__", None) or "").startswith(("numpy.ma", "dask.array.ma")):
            return True
    return False


class FusedPartial:
    """The chunk stage of a dask reduction as one fused kernel; chunks no kernel takes run the task
    dask built, ``dask_func(chain(*blocks) or the block, **dask_kwargs)``."""

    def __init__(self, fused: FusedChunk, spec: Reduction, dask_func: Any, dask_kwargs: dict,
                 chain: Chain | None):
        self.fused = fused
        self.spec = spec
        self.dask_func = dask_func
        self.dask_kwargs = dask_kwargs
        self.chain = chain
        # nanmean counts its non-NaN values in a second fused pass (no temporary is written)
        self.count = None if spec.mean != "nanmean" else FusedChunk(
            f"logical_not(isnan({fused.text}))", fused.arrays, fused.scalars, np.dtype("int64"),
            reduction="sum", axes=fused.axes, quiet=True)

    def __dask_tokenize__(self):
        return ("flowgpu-fused-partial", self.fused.__dask_tokenize__(), self.spec)

    def __repr__(self) -> str:
        return f"fused_partial({self.fused.text!r}, {self.spec.mean or self.spec.kind})"

    def dask_partial(self, *blocks: Any) -> Any:
        value = self.chain(*blocks) if self.chain is not None else blocks[0]
        return self.dask_func(value, **self.dask_kwargs)

    def __call__(self, *blocks: Any) -> Any:
        if not kernel_blocks(blocks) or any(b.size == 0 for b in blocks):
            return self.dask_partial(*blocks)
        try:
            with warnings.catch_warnings():
                if self.spec.kind in ("nanmin", "nanmax"):  # as dask's own chunk function (NumPy's warns)
                    warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
                part = self.fused(*blocks)
            count = self.count(*blocks) if self.count is not None else None
        except KernelError:  # a chain no kernel takes: as dask built it
            return self.dask_partial(*blocks)
        spec, dtype = self.spec, self.spec.dtype
        if spec.mean is None:
            return part if dtype is None or part.dtype == dtype else part.astype(dtype)
        xp = import_cupy() if is_cupy(part) else np
        if count is None:
            shape = np.broadcast_shapes(*(b.shape for b in blocks))
            n = xp.full(part.shape, int(np.prod([shape[a] for a in spec.axes], dtype=np.int64)), dtype=dtype)
        else:
            n = count.astype(dtype)
        return {"n": n, "total": part.astype(dtype)}
