"""Discrete Fourier transforms along one axis (fft, ifft, rfft, irfft) or several (fft2, ifft2, rfft2,
irfft2, fftn, ifftn), each block with its own module's FFT (``numpy.fft``, or cuFFT on CuPy chunks).

A transformed axis must be whole in one chunk: a split one is rechunked (with a warning, since that
moves data); the other axes keep their chunks, so a stack of images transforms chunk by chunk.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import numpy as np

from flowgpu.backend import array_module
from flowgpu.errors import OpError
from flowgpu.ops._common import Array, defop, meta_like, same_backend

__all__ = ["fft", "ifft", "rfft", "irfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn"]

Norm = Literal["backward", "ortho", "forward"] | None


class FFTRechunkWarning(UserWarning):
    """A transformed axis was split into several chunks and had to be rechunked into one."""


def _fft_block(block, kind: str, lengths, axes, norm):
    xp = array_module(block)
    if xp is not np:
        # The block's device made current in this thread first: cuFFT's multi-axis R2C (rfft2, rfftn)
        # fails with CUFFT_EXEC_FAILED in a thread that has made no CUDA runtime call yet (measured on
        # CuPy 14.2 / CUDA 13; a dask pool's or a worker's new threads are such threads).
        block.device.use()
    fn = getattr(xp.fft, kind)
    if kind in ("fft", "ifft", "rfft", "irfft"):
        return fn(block, n=None if lengths is None else lengths[0], axis=axes[0], norm=norm)
    return fn(block, s=lengths, axes=axes, norm=norm)


def _transform(kind: str, x: Any, lengths: Any, axes: Any, norm: Any) -> Array:
    (x,) = same_backend(x)
    if x.ndim == 0:
        raise OpError(f"op {kind!r}: the input is a number (0-d); give an array")
    axes = [int(a) + x.ndim if int(a) < 0 else int(a) for a in axes]  # the signature admits whole numbers
    if any(not 0 <= a < x.ndim for a in axes) or len(set(axes)) != len(axes):
        raise OpError(f"op {kind!r}: axes {axes} are out of range or repeated for an array of {x.ndim} dimension(s)")
    if lengths is not None:
        lengths = [int(n) for n in ([lengths] if np.isscalar(lengths) else lengths)]
        if len(lengths) != len(axes) or any(n < 1 for n in lengths):
            raise OpError(f"op {kind!r}: give one positive length per transformed axis ({len(axes)}), got {lengths}")
    split = [a for a in axes if len(x.chunks[a]) > 1]
    if split:
        warnings.warn(f"op {kind!r}: axis {split} of the input is split into several chunks; rechunking it into one "
                      "chunk per transform (chunk the input whole along the transformed axes to avoid this)",
                      FFTRechunkWarning, stacklevel=4)
        x = x.rechunk({a: -1 for a in split})
    chunks = list(x.chunks)
    for i, a in enumerate(axes):
        n = lengths[i] if lengths is not None else None
        if i == len(axes) - 1 and kind.startswith("rfft"):  # the last axis: its non-negative frequencies
            n = (n or x.shape[a]) // 2 + 1
        elif i == len(axes) - 1 and kind.startswith("irfft"):
            n = n or 2 * (x.shape[a] - 1)
        if n is not None:
            chunks[a] = (n,)
    sample = np.ones((4,) * x.ndim, dtype=x.dtype)
    dtype = _fft_block(sample, kind, None, tuple(axes), norm).dtype
    return x.map_blocks(_fft_block, kind, None if lengths is None else tuple(lengths), tuple(axes), norm,
                        chunks=tuple(chunks), dtype=dtype, meta=meta_like(x, dtype))


_ONE_AXIS_DOC = """{summary}

``n``: {n_doc}
``axis`` (default -1): the axis transformed; ``norm`` as in ``numpy.fft``.

Returns
-------
dask.array.Array
    Equal to ``numpy.fft.{kind}`` on the whole array (float32 input gives complex64, as NumPy 2 and
    CuPy do).
"""

_MANY_AXES_DOC = """{summary}

``s``: output lengths along the transformed ``axes`` ({axes_default}), cropping or zero-padding the
input; ``norm`` as in ``numpy.fft``.

Returns
-------
dask.array.Array
    Equal to ``numpy.fft.{kind}`` on the whole array.
"""


def _one_axis(kind: str, summary: str, n_doc: str) -> Any:
    def func(x: Array, *, n: int | None = None, axis: int | str = -1, norm: Norm = None) -> Array:
        return _transform(kind, x, None if n is None else [n], [axis], norm)

    return defop(kind, _ONE_AXIS_DOC.format(summary=summary, kind=kind, n_doc=n_doc))(func)


def _many_axes(kind: str, summary: str, default_axes: tuple[int, ...] | None) -> Any:
    def func(x: Array, *, s: list[int] | None = None, axes: list[int | str] | tuple[int | str, ...] | None = None,
             norm: Norm = None) -> Array:
        if axes is None:
            axes = default_axes if default_axes is not None else (
                range(x.ndim) if s is None else range(x.ndim - len(s), x.ndim))
        return _transform(kind, x, s, list(axes), norm)

    axes_default = f"default {list(default_axes)}" if default_axes else "default all axes"
    return defop(kind, _MANY_AXES_DOC.format(summary=summary, kind=kind, axes_default=axes_default))(func)


fft = _one_axis("fft", "One-dimensional discrete Fourier transform along an axis.",
                "Length of the transform (the input is cropped or zero-padded); default the axis length.")
ifft = _one_axis("ifft", "One-dimensional inverse discrete Fourier transform along an axis.",
                 "Length of the transform; default the axis length.")
rfft = _one_axis("rfft", "Fourier transform of real input along an axis (non-negative frequencies only).",
                 "Length of the real input to transform; the output has n // 2 + 1 values.")
irfft = _one_axis("irfft", "Inverse of rfft: real output from non-negative frequencies.",
                  "Length of the real output; default 2 * (m - 1) for m input values.")
fft2 = _many_axes("fft2", "Two-dimensional discrete Fourier transform (the last two axes by default).", (-2, -1))
ifft2 = _many_axes("ifft2", "Two-dimensional inverse discrete Fourier transform.", (-2, -1))
rfft2 = _many_axes("rfft2", "Two-dimensional Fourier transform of real input.", (-2, -1))
irfft2 = _many_axes("irfft2", "Inverse of rfft2: real output.", (-2, -1))
fftn = _many_axes("fftn", "N-dimensional discrete Fourier transform (all axes by default).", None)
ifftn = _many_axes("ifftn", "N-dimensional inverse discrete Fourier transform.", None)
