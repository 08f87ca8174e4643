"""``@flowgpu.guvectorize``: numba-style generalised ufuncs over the core dimensions of chunked arrays.

The function gets core-dimension slices and writes its outputs into the trailing arguments
(``res[0] = ...``); :func:`dask.array.apply_gufunc` maps it over the loop dimensions, numba's CPU
or CUDA target per chunk. Core dimensions must each be one chunk: split ones are rechunked with a
:class:`CoreRechunkWarning`, or refused with ``rechunk=False``.

>>> import numpy as np, flowgpu
>>> @flowgpu.guvectorize(["void(float64[:], float64[:], float64[:])"], "(n),(n)->()")
... def dot(a, b, res):
...     acc = 0.0
...     for i in range(a.shape[0]):
...         acc += a[i] * b[i]
...     res[0] = acc
>>> float(dot(np.arange(3.0), np.arange(3.0)))
5.0
"""

from __future__ import annotations

import functools
import re
import string
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.backend import empty_meta, import_cupy
from flowgpu.errors import KernelError
from flowgpu.kernels import _numba as nb

__all__ = ["guvectorize", "GUVectorized", "CoreRechunkWarning", "parse_layout"]

_GROUP = re.compile(r"\(([^()]*)\)")


class CoreRechunkWarning(UserWarning):
    """A core dimension split across chunks was rechunked into one chunk."""


def parse_layout(layout: str) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """``"(n),(n)->()"`` as core dimension names per input and per output."""
    def side(text: str) -> list[tuple[str, ...]]:
        groups = _GROUP.findall(text)
        rest = _GROUP.sub("", text).replace(",", "").strip()
        if not groups or rest:
            raise ValueError(text)
        out = []
        for g in groups:
            dims = tuple(d.strip() for d in g.split(",") if d.strip())
            if not all(d.isidentifier() for d in dims):
                raise ValueError(g)
            out.append(dims)
        return out

    try:
        left, right = layout.split("->")
        return side(left), side(right)
    except (ValueError, AttributeError):
        raise KernelError(f"guvectorize layout {layout!r} is not a gufunc signature; write it "
                          "like '(n),(n)->()' or '(m,n),(n)->(m)'") from None


class GUVectorized(nb.NumbaUfunc):
    """A generalised-ufunc-like callable made by :func:`guvectorize`."""

    KIND = "guvectorize"

    def __init__(self, pyfunc: Callable, signatures: Sequence[Any] | str, layout: str, *,
                 name: str | None = None, rechunk: bool = True):
        super().__init__(pyfunc, name, "guvectorized")
        self.layout = layout
        self.in_core, self.out_core = parse_layout(layout)
        self.nin, self.nout = len(self.in_core), len(self.out_core)
        if not signatures:
            raise KernelError(f"guvectorize {self.__name__!r}: give numba signatures, e.g. "
                              "['void(float64[:], float64[:], float64[:])']")
        self.signatures = self.parse_signatures(signatures, self.nout, f"layout {layout!r} has")
        self.__signature__ = nb.describe(pyfunc, drop_last=self.nout)
        self.rechunk = rechunk
        known = {d for dims in self.in_core for d in dims}
        missing = {d for dims in self.out_core for d in dims} - known
        if missing:  # numba's gufuncs size outputs from the inputs only
            raise KernelError(f"guvectorize {self.__name__!r}: output dimension(s) "
                              f"{', '.join(sorted(missing))} appear in no input; numba needs every "
                              "output dimension in an input (pass an array of that length)")

    def __repr__(self) -> str:
        return f"<flowgpu.guvectorize {self.__name__} {self.layout}>"

    def __call__(self, *args: Any, rechunk: bool | None = None) -> Any:
        if len(args) != self.nin:
            raise KernelError(f"{self.__name__}() takes {self.nin} inputs ({self.layout}), "
                              f"got {len(args)}")
        sig = nb.select_signature(self.signatures, args, self.__name__)
        self._core_sizes(args)  # fail clearly on mismatched core lengths, dask arrays' too
        if any(isinstance(a, da.Array) for a in args):
            return self._gufunc(sig, args, self.rechunk if rechunk is None else rechunk)
        return self.apply(sig, *args)

    def _gufunc(self, sig: nb.Signature, args: Sequence[Any], rechunk: bool) -> Any:
        dargs = nb.as_dask_args(args)
        for i, (a, dims) in enumerate(zip(dargs, self.in_core)):
            if not isinstance(a, da.Array) or not dims:
                continue
            if a.ndim < len(dims):
                raise KernelError(f"{self.__name__}(): input {i} has {a.ndim} dimension(s) but "
                                  f"layout {self.layout!r} gives it core dimensions {dims}")
            axes = range(a.ndim - len(dims), a.ndim)
            split = [ax for ax in axes if len(a.chunks[ax]) > 1]
            if not split:
                continue
            what = (f"{self.__name__}(): input {i} has its core dimension(s) "
                    f"{', '.join(dims[ax - a.ndim + len(dims)] for ax in split)} (axis "
                    f"{', '.join(map(str, split))}) split across chunks")
            if not rechunk:
                raise KernelError(f"{what}; rechunk it first, e.g. x.rechunk({{{split[0]}: -1}}), "
                                  "or call with rechunk=True")
            warnings.warn(f"{what}; rechunking into one chunk along those axes (pass rechunk=False "
                          "to refuse instead)", CoreRechunkWarning, stacklevel=3)
            dargs[i] = a.rechunk({ax: -1 for ax in split})
        cupy = nb.any_cupy(dargs)
        loop_ndim = max((a.ndim - len(d) for a, d in zip(dargs, self.in_core)
                         if isinstance(a, da.Array)), default=0)
        self._unify_loop_chunks(dargs, loop_ndim)
        metas = tuple(empty_meta(cupy, dt, loop_ndim + len(dims))
                      for dt, dims in zip(sig.outputs, self.out_core))
        func = functools.partial(self.apply, sig)
        try:
            return da.apply_gufunc(
                func, self.layout, *dargs,
                vectorize=False, allow_rechunk=False,
                meta=metas if self.nout > 1 else metas[0])
        except ValueError as e:
            raise KernelError(f"{self.__name__}(): {e}") from None

    def _unify_loop_chunks(self, dargs: list, loop_ndim: int) -> None:
        """Give the loop dimensions of all inputs the same chunks (apply_gufunc insists)."""
        letters = iter(string.ascii_letters)
        loop = [next(letters) for _ in range(loop_ndim)]
        core = {d: next(letters) for dims in self.in_core for d in dims}
        where, pairs = [], []
        for i, (a, dims) in enumerate(zip(dargs, self.in_core)):
            if isinstance(a, da.Array):
                nloop = a.ndim - len(dims)
                where.append(i)
                pairs += [a, "".join(loop[loop_ndim - nloop:] + [core[d] for d in dims])]
        if len(where) > 1:
            _, arrays = da.core.unify_chunks(*pairs)
            for i, a in zip(where, arrays):
                dargs[i] = a

    def _core_sizes(self, chunks: Sequence[Any]) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for i, (c, dims) in enumerate(zip(chunks, self.in_core)):
            shape = np.shape(c)
            if len(shape) < len(dims):
                raise KernelError(f"{self.__name__}(): input {i} has {len(shape)} dimension(s), "
                                  f"layout {self.layout!r} needs at least {len(dims)}")
            for d, n in zip(dims, shape[len(shape) - len(dims):]):
                if n != n:  # a dask array's unknown length: not known to differ
                    continue
                if sizes.setdefault(d, n) != n:
                    raise KernelError(f"{self.__name__}(): core dimension {d!r} is {sizes[d]} "
                                      f"in one input and {n} in input {i}")
        return sizes

    def numba_args(self, sig: nb.Signature) -> tuple:
        return ([sig.source], self.layout)

    def _apply_cuda(self, sig: nb.Signature, chunks: Sequence[Any]) -> Any:
        cp = import_cupy()
        sizes = self._core_sizes(chunks)
        loop = np.broadcast_shapes(*(np.shape(c)[:np.ndim(c) - len(d)]
                                     for c, d in zip(chunks, self.in_core)))
        outs = [cp.empty(loop + tuple(sizes[d] for d in dims), dtype=dt)
                for dims, dt in zip(self.out_core, sig.outputs)]
        n = int(np.prod(loop))
        if n > 0 and all(o.size for o in outs):
            # one flat loop dimension of contiguous arrays: what numba-cuda launches without copies
            ins = [nb.dense(c, loop + np.shape(c)[np.ndim(c) - len(d):], dt, cp)
                   .reshape((n,) + np.shape(c)[np.ndim(c) - len(d):])
                   for c, d, dt in zip(chunks, self.in_core, sig.inputs)]
            flat = [o.reshape((n,) + o.shape[len(loop):]) for o in outs]
            gufunc = self.compiled("cuda", sig)
            gufunc(*(nb.numba_view(a) for a in ins), *(nb.numba_view(o) for o in flat),
                   stream=nb.numba_stream())
        return tuple(outs) if self.nout > 1 else outs[0]


def guvectorize(signatures: Sequence[Any] | str, layout: str, *, name: str | None = None,
                rechunk: bool = True) -> Callable[[Callable], GUVectorized]:
    """Decorator: a numba-style generalised ufunc over chunked (dask) arrays, GPU or CPU.

    ``signatures``: numba's, inputs then outputs (``"void(float64[:], float64[:], float64[:])"``),
    the first the inputs cast to safely is used; ``layout``: over core dimensions (``"(n),(n)->()"``);
    ``rechunk``: join a core dimension split across chunks (with a :class:`CoreRechunkWarning`) or
    refuse it (False; also per call). Lazy for dask arrays, computed at once for NumPy or CuPy.
    """
    return lambda pyfunc: GUVectorized(pyfunc, signatures, layout, name=name, rechunk=rechunk)
