"""Stencil filters over chunked arrays: gaussian, uniform (box) and median, through ``map_overlap``.

Each chunk is extended by the filter's reach from its neighbours (``int(truncate * sigma + 0.5)``,
scipy's radius, for the gaussian; ``size // 2`` for the others), filtered with ``scipy.ndimage`` or
``cupyx.scipy.ndimage`` and trimmed back, so the result equals the filter on the whole array. At the
array's outer edges nothing is added (``boundary="none"``): the filter applies ``mode`` itself, as on
the whole array (``mode="wrap"`` needs the far edge, so it uses ``boundary="periodic"``). An axis
whole in every block takes no overlap; one shorter than the reach is made whole first.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal, get_args

from flowgpu.backend import is_cupy
from flowgpu.errors import OpError
from flowgpu.ops._common import Array, defop, meta_like, same_backend

__all__ = ["gaussian_filter", "uniform_filter", "median_filter", "MODES"]

Mode = Literal["reflect", "constant", "nearest", "mirror", "wrap", "grid-mirror", "grid-constant", "grid-wrap"]
MODES = get_args(Mode)
# for filters scipy treats the grid-* modes as synonyms; cupyx's filters take only the plain names
_SYNONYMS = {"grid-mirror": "reflect", "grid-constant": "constant", "grid-wrap": "wrap"}
Sizes = int | float | list | tuple


def _filter_block(block, name: str, kwargs: dict):
    if is_cupy(block):
        from cupyx.scipy import ndimage
    else:
        from scipy import ndimage
    return getattr(ndimage, name)(block, **kwargs)


def _per_axis_values(name: str, arg: str, value: Any, ndim: int, axes: Any, neutral: Any) -> tuple:
    """One value per axis from a scalar or a per-axis sequence; with ``axes``, those axes take the
    values and the others ``neutral``."""
    axes = range(ndim) if axes is None else [axes] if isinstance(axes, int) else list(axes)
    if any(not -ndim <= a < ndim for a in axes):
        raise OpError(f"op {name!r}: axes={list(axes)!r} out of range for an array of {ndim} dimension(s)")
    many = isinstance(value, Sequence) and not isinstance(value, str)
    values = tuple(value) if many else (value,) * len(axes)
    if len(values) != len(axes):
        raise OpError(f"op {name!r}: {arg}={list(value)!r} has {len(value)} values but the array has "
                      f"{len(axes)} dimension(s); give one value, or one per axis")
    out = [neutral] * ndim
    for a, v in zip(axes, values):
        out[a % ndim] = v
    return tuple(out)


def _apply(name: str, x: Any, depth: tuple[int, ...], mode: str, filter_kwargs: dict) -> Array:
    # mode is one of MODES: the op's signature is checked on every call (ops._common.defop)
    (x,) = same_backend(x)
    mode = _SYNONYMS.get(mode, mode)
    boundary = "periodic" if mode == "wrap" else "none"
    kwargs = dict(filter_kwargs, mode=mode)
    block_fn = functools.partial(_filter_block, name=name, kwargs=kwargs)
    # an axis whole in each block needs no overlap (the filter sees its true edges); an axis shorter
    # than the reach is made whole, since dask refuses a depth beyond the array (a 3-page stack, sigma 2)
    whole = {i for i, d in enumerate(depth) if d and (x.numblocks[i] == 1 or d >= x.shape[i])}
    if whole:
        x = x.rechunk({i: -1 for i in whole if x.numblocks[i] > 1})
        depth = tuple(0 if i in whole else d for i, d in enumerate(depth))
    if not any(depth):
        return x.map_blocks(block_fn, dtype=x.dtype, meta=meta_like(x))
    return x.map_overlap(block_fn, depth=dict(enumerate(depth)), boundary={i: boundary for i in range(x.ndim)},
                         dtype=x.dtype, meta=meta_like(x))


@defop("gaussian_filter")
def gaussian_filter(x: Array, *, sigma: Sizes, mode: Mode = "reflect", cval: float = 0.0,
                    truncate: float = 4.0, axes: int | str | list[int | str] | None = None) -> Array:
    """Gaussian smoothing, equal to scipy.ndimage.gaussian_filter on the whole array.

    ``sigma``: the kernel's standard deviation in elements, one for all axes or one per axis (0
    leaves an axis alone: ``[0, 2, 2]`` smooths each image of a stack). ``mode``: how the array is
    extended beyond its edges, as in ``scipy.ndimage`` (``cval`` for ``constant``). The kernel, and the
    overlap between chunks, reaches ``int(truncate * sigma + 0.5)`` elements each side. ``axes``:
    smooth only these (``sigma`` then gives one value, or one per listed axis).

    Returns
    -------
    dask.array.Array
        Same shape, chunks and dtype as ``x``.
    """
    sigmas = _per_axis_values("gaussian_filter", "sigma", sigma, x.ndim, axes, 0.0)
    if any(s < 0 for s in sigmas) or truncate < 0:
        raise OpError(f"op 'gaussian_filter': sigma={sigma!r} and truncate={truncate!r} must not be negative")
    depth = tuple(int(truncate * float(s) + 0.5) for s in sigmas)
    return _apply("gaussian_filter", x, depth, mode,
                  {"sigma": tuple(float(s) for s in sigmas), "cval": float(cval), "truncate": float(truncate)})


_BOX_DOC = """{summary}

``size``: the box length along every axis, or one per axis (1 leaves an axis alone); the overlap
between chunks is ``size // 2``. ``mode`` and ``cval`` as for ``gaussian_filter``; ``axes``: filter
only these.

Returns
-------
dask.array.Array
    Same shape, chunks and dtype as ``x``.
"""


def _box_filter(name: str, summary: str) -> Any:
    """The op ``name``: scipy.ndimage's filter of that name over a box, chunk by chunk with overlap."""

    def func(x: Array, *, size: Sizes = 3, mode: Mode = "reflect", cval: float = 0.0,
             axes: int | str | list[int | str] | None = None) -> Array:
        sizes = _per_axis_values(name, "size", size, x.ndim, axes, 1)
        if any(isinstance(s, bool) or int(s) != s or s < 1 for s in sizes):
            raise OpError(f"op {name!r}: size={size!r} must be whole numbers >= 1")
        sizes = tuple(int(s) for s in sizes)
        return _apply(name, x, tuple(s // 2 for s in sizes), mode, {"size": sizes, "cval": float(cval)})

    return defop(name, _BOX_DOC.format(summary=summary))(func)


uniform_filter = _box_filter("uniform_filter", "Moving average over a box of the given size, equal to "
                                               "scipy.ndimage.uniform_filter.")
median_filter = _box_filter("median_filter", "Median over a box of the given size, equal to "
                                             "scipy.ndimage.median_filter; removes salt-and-pepper noise.")
