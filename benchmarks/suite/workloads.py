"""The workloads, each run side by side on the same data in one process.

GPU columns: floor, raw CuPy, CuPy fused by hand (``cupy.fuse``), dask.array on dask-cuda (dask's
own ``chunks="auto"``, and flowgpu's chunks), flowgpu's Python API and the plain dask.array code on
a flowgpu Session, flowgpu YAML (``pipeline.run`` on that Session with ``force=True``: every run
computes). ``--cpu``: NumPy, numba, dask threaded, flowgpu's columns on dask's threaded scheduler.

Data is the same everywhere: ``flowgpu.random`` is a counter-based generator, so the same seed gives
the same values for any chunking, in this process and on the workers. Seeds are fresh every run.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

import flowgpu as fg
from benchmarks.harness import Workload, rel_check
from benchmarks.suite import data
from benchmarks.suite.columns import PLAIN, chunks_chosen_column
from benchmarks.suite.context import Context
from flowgpu.arrays import target_chunk_bytes
from flowgpu.backend import is_cupy
from flowgpu.ops.stencil import gaussian_filter

GiB = 1 << 30
SIGMA = 2.0


def chain(x):
    return (x * 2 + 1) ** 2 - x


def chain_sum(x):
    return ((x * 2 + 1) ** 2 - x).sum()


def _seed() -> int:
    return secrets.randbits(31)


def _numba_chain_sum():
    import numba

    @numba.njit(parallel=True, cache=False)
    def f(x):
        flat = x.reshape(-1)
        acc = 0.0
        for i in numba.prange(flat.size):
            v = flat[i]
            acc += (v * np.float32(2) + np.float32(1)) ** 2 - v
        return acc

    return f


def _numba_chain():
    import numba

    @numba.vectorize(["float32(float32)"], target="parallel")
    def f(v):
        return (v * np.float32(2) + np.float32(1)) ** 2 - v

    return f


def _yaml_inputs(name: str, x: Any) -> dict:
    """A python source for the shared array ``x``, declaring its shape and dtype (specs never call it to find out)."""
    return {"source": "python", "callable": "benchmarks.suite.data:shared", "args": {"name": name},
            "shape": list(x.shape), "dtype": str(x.dtype)}


# ====================================================================== workloads


def run_chain_sum(ctx: Context, gib: float) -> Workload:
    """``((x * 2 + 1) ** 2 - x).sum()`` on float32 data held in memory (device memory on GPU)."""
    n = int(gib * GiB) // 4
    cols = 1 << 14 if n >= (1 << 24) else 1 << 10
    shape = (n // cols, cols)
    seed = _seed()
    label = f"chain_sum {gib:g} GiB" if gib >= 1 else f"chain_sum {gib * 1024:g} MiB"
    w = Workload(label, work=n * 4.0)
    w.floor_s = n * 4.0 / ctx.copy_rate  # read x once at the copy rate (which counts read + written bytes)
    xp = ctx.xp
    x = ctx.host_array(shape, "float32", seed)
    want = 0.0
    for start in range(0, shape[0], max(1, shape[0] // 16)):
        slab = x[start:start + max(1, shape[0] // 16)].astype(np.float64)
        want += float(((slab * 2 + 1) ** 2 - slab).sum())
        del slab
    w.inputs, w.reference = {"shape": shape, "dtype": "float32", "seed": seed}, want
    check = lambda v: rel_check(v, want, 1e-5)  # noqa: E731
    raw, fused, dask_col = ("NumPy", "numba fused", "dask threaded") if ctx.cpu else \
        ("raw CuPy", "CuPy fused", "dask-cuda")
    w.column(raw, lambda: float(chain_sum(x)), check, repeats=ctx.repeats)
    if ctx.cpu:
        f = _numba_chain_sum()
        w.column(fused, lambda: float(f(x)), check, repeats=ctx.repeats, note="numba prange, float64 accumulator")
    else:
        f = xp.fuse(kernel_name="chain_sum")(lambda v: xp.sum((v * 2 + 1) ** 2 - v))  # a lambda is no kernel name
        w.column(fused, lambda: float(f(x)), check, repeats=ctx.repeats)
    if not ctx.cpu:
        del x
        ctx.free()
    _cluster_columns(ctx, w, shape, seed, check, dask_col, x if ctx.cpu else None)
    w.finish(raw, dask_col)
    return w


def _yaml_column(ctx: Context, w: Workload, arrays: dict, name: str, steps: dict, output: str,
                 check, note: str = "") -> None:
    """The "flowgpu YAML" column: ``steps`` over ``arrays`` (python sources), reporting ``output``."""
    why = ctx.pipeline_available()
    if why:
        w.skip("flowgpu YAML", why)
        return
    spec = {"version": 1, "name": name, "inputs": {k: _yaml_inputs(k, v) for k, v in arrays.items()},
            "steps": steps, "outputs": {output: {"from": output}}}
    data.ARRAYS.update(arrays)
    try:
        with ctx.on_flowgpu():
            w.column("flowgpu YAML", lambda: float(ctx.run_yaml(spec).outputs[output]), check,
                     repeats=ctx.repeats, note=note)
    finally:
        data.ARRAYS.clear()


def _cluster_columns(ctx: Context, w: Workload, shape, seed, check, dask_col, x) -> None:

    try:
        xd = ctx.dask_array(x, shape, "float32", seed)
        w.notes.append(f"dask.array chunks {xd.chunksize} ({xd.npartitions} chunks, dask's auto)")
        with ctx.on_dask():
            w.column(dask_col, lambda: float(chain_sum(xd).compute()), check, repeats=ctx.repeats)
        del xd
    except Exception as e:
        w.skip(dask_col, f"{type(e).__name__}: {e}")
    ctx.free()
    ctx.several_gpus(w, "dask-cuda", shape, "float32", seed, None, chain_sum, check, ctx.repeats, dask_col)
    xf = ctx.flowgpu_array(x, shape, "float32", seed)
    w.notes.append(f"flowgpu chunks {xf.chunksize} ({xf.npartitions} chunks, flowgpu's auto)")
    chunks_chosen_column(ctx, w, xf, lambda a: chain_sum(a), check, dask_col)
    fused = fg.fuse(chain_sum)
    with ctx.on_flowgpu():
        w.column("flowgpu API", lambda: float(fused(xf).compute()), check, repeats=ctx.repeats)
        w.column(PLAIN, lambda: float(chain_sum(xf).compute()), check, repeats=ctx.repeats,
                 note="the same dask.array code as the dask column, on the Session's data")
    _yaml_column(ctx, w, {"x": xf}, "chain_sum", {
        "y": {"op": "expr", "inputs": {"x": "x"}, "args": {"expression": "(x * 2 + 1) ** 2 - x"}},
        "total": {"op": "sum", "inputs": ["y"]}}, "total", check)
    chunks = xf.chunks
    del xf
    ctx.free()
    ctx.several_gpus(w, "flowgpu", shape, "float32", seed, chunks, fused, check, ctx.repeats, "flowgpu API")


def run_transpose_sum(ctx: Context, n: int) -> Workload:
    """``(x + x.T).sum()`` on an n x n float32 matrix (dask-cuda's transpose_sum)."""
    seed = _seed()
    shape = (n, n)
    w = Workload(f"transpose_sum {n}²", work=2 * n * n * 4.0)
    w.floor_s = 2 * n * n * 4.0 / ctx.copy_rate  # read x twice (x and x.T)
    x = ctx.host_array(shape, "float32", seed)
    want = 2 * float(x.astype(np.float64).sum()) if ctx.cpu else 2 * float(ctx.xp.sum(x, dtype=np.float64))
    w.inputs, w.reference = {"shape": shape, "dtype": "float32", "seed": seed}, want
    check = lambda v: rel_check(v, want, 1e-5)  # noqa: E731
    raw, fused, dask_col = ("NumPy", "numba fused", "dask threaded") if ctx.cpu else \
        ("raw CuPy", "CuPy fused", "dask-cuda")
    w.column(raw, lambda: float((x + x.T).sum()), check, repeats=ctx.repeats)
    if ctx.cpu:
        import numba

        @numba.njit(parallel=True)
        def tsum(a):
            acc = 0.0
            for i in numba.prange(a.shape[0]):
                for j in range(a.shape[1]):
                    acc += a[i, j] + a[j, i]
            return acc

        w.column(fused, lambda: float(tsum(x)), check, repeats=ctx.repeats)
    else:
        f = ctx.xp.fuse(kernel_name="tsum")(lambda a, b: ctx.xp.sum(a + b))
        w.column(fused, lambda: float(f(x, x.T)), check, repeats=ctx.repeats)
        del x
        ctx.free()
        x = None
    try:
        xd = ctx.dask_array(x, shape, "float32", seed)
        w.notes.append(f"dask.array chunks {xd.chunksize}")
        with ctx.on_dask():
            w.column(dask_col, lambda: float((xd + xd.T).sum().compute()), check, repeats=ctx.repeats)
        del xd
    except Exception as e:
        w.skip(dask_col, f"{type(e).__name__}: {e}")
    ctx.free()
    ctx.several_gpus(w, "dask-cuda", shape, "float32", seed, None, lambda a: (a + a.T).sum(), check, ctx.repeats,
                     dask_col)
    xf = ctx.flowgpu_array(x, shape, "float32", seed)
    w.notes.append(f"flowgpu chunks {xf.chunksize} (chunks='auto')")
    chunks_chosen_column(ctx, w, xf, lambda a: (a + a.T).sum(), check, dask_col)
    f2 = fg.fuse(lambda a, b: (a + b).sum())
    with ctx.on_flowgpu():
        w.column("flowgpu API", lambda: float(f2(xf, xf.T).compute()), check, repeats=ctx.repeats)
        w.column(PLAIN, lambda: float((xf + xf.T).sum().compute()), check, repeats=ctx.repeats,
                 note="the same dask.array code as the dask column, on the Session's data")
    _yaml_column(ctx, w, {"x": xf}, "transpose_sum", {
        "xt": {"op": "transpose", "inputs": ["x"]}, "both": {"op": "add", "inputs": ["x", "xt"]},
        "total": {"op": "sum", "inputs": ["both"]}}, "total", check)
    chunks = xf.chunks
    del xf
    ctx.free()
    ctx.several_gpus(w, "flowgpu", shape, "float32", seed, chunks, lambda a: f2(a, a.T), check, ctx.repeats,
                     "flowgpu API")
    w.finish(raw, dask_col)
    return w


def run_matmul(ctx: Context, n: int, dtype: str) -> Workload:
    """``x @ y`` for n x n matrices, checked through ``sum(x @ y) == colsum(x) . rowsum(y)``."""
    seed_x, seed_y = _seed(), _seed()
    shape = (n, n)
    w = Workload(f"matmul {n}² {dtype}", work=2.0 * n ** 3, unit="TFLOP/s")
    xp = ctx.xp
    x = ctx.host_array(shape, dtype, seed_x)
    y = ctx.host_array(shape, dtype, seed_y)
    want = float(xp.dot(x.astype(np.float64).sum(axis=0), y.astype(np.float64).sum(axis=1)))
    tol = 1e-4 if dtype == "float32" else 1e-10

    def check(z):
        return rel_check(z.sum(dtype=np.float64) if not isinstance(z, da.Array) else z.sum(dtype=np.float64).compute(),
                         want, tol)

    raw, dask_col = ("NumPy", "dask threaded") if ctx.cpu else ("raw CuPy", "dask-cuda")
    w.column(raw, lambda: x @ y, check, repeats=ctx.repeats, sync=ctx.sync, note="BLAS" if ctx.cpu else "cuBLAS")
    w.skip("numba fused" if ctx.cpu else "CuPy fused", "not applicable (a matmul is one library call)")
    if not ctx.cpu:
        del x, y
        ctx.free()
        x = y = None
    try:
        xd = ctx.dask_array(x, shape, dtype, seed_x)
        yd = ctx.dask_array(y, shape, dtype, seed_y)
        w.notes.append(f"dask.array chunks {xd.chunksize}")
        with ctx.on_dask():
            w.column(dask_col, lambda: _persisted(ctx, xd @ yd), check, repeats=ctx.repeats)
        del xd, yd
    except Exception as e:
        w.skip(dask_col, f"{type(e).__name__}: {e}")
    ctx.free()
    # flowgpu: rows of x times all of y, so each output block is ONE GEMM with no partial sums

    rows = max(1, min(n, target_chunk_bytes() // (n * np.dtype(dtype).itemsize)))
    xf = ctx.flowgpu_array(x, shape, dtype, seed_x, chunks=(rows, n))
    yf = ctx.flowgpu_array(y, shape, dtype, seed_y, chunks=(n, n))
    w.notes.append(f"flowgpu: x in row blocks {xf.chunksize}, y whole: one GEMM per block")
    with ctx.on_flowgpu():
        w.column("flowgpu API", lambda: _persisted(ctx, xf @ yf), check, repeats=ctx.repeats)
    _yaml_column(ctx, w, {"x": xf, "y": yf}, "matmul", {
        "z": {"op": "matmul", "inputs": ["x", "y"]},
        "total": {"op": "sum", "inputs": ["z"], "args": {"dtype": "float64"}}}, "total",
        lambda v: rel_check(v, want, tol), note="matmul then sum")
    del xf, yf
    ctx.free()
    w.finish(raw, dask_col)
    return w


_fresh = itertools.count()


def _same(block):
    return block


def _persisted(ctx: Context, arr: da.Array) -> da.Array:
    # new output keys every call: the scheduler may still hold the previous call's results (their
    # release is asynchronous), and persisting the same keys again would then cost nothing
    arr = arr.map_blocks(_same, dtype=arr.dtype, token=f"fresh-{next(_fresh)}")
    if ctx.cpu:
        return arr.persist()
    from distributed import default_client, wait

    out = default_client().persist(arr)
    wait(out)
    return out


def _gaussian(block, sigma=SIGMA):

    if is_cupy(block):
        from cupyx.scipy import ndimage
    else:
        from scipy import ndimage
    return ndimage.gaussian_filter(block, sigma)


def run_stencil(ctx: Context, n: int) -> Workload:
    """2-D gaussian filter (sigma 2, mode reflect) of an n x n float32 image."""
    seed = _seed()
    shape = (n, n)
    w = Workload(f"gaussian {n}²", work=2 * n * n * 4.0)
    w.floor_s = 2 * n * n * 4.0 / ctx.copy_rate
    x = ctx.host_array(shape, "float32", seed)
    ref = _gaussian(x)
    # rows and columns around every plausible chunk boundary, plus a stride through the image
    picks = sorted({i for b in range(0, n, max(1, n // 64)) for i in (b - 1, b, b + 1) if 0 <= i < n})
    idx = np.asarray(picks)
    want = ref[ctx.xp.asarray(idx)][:, ctx.xp.asarray(idx)]
    want = want.get() if hasattr(want, "get") else want
    want_mean = float(ref.mean(dtype=np.float64))
    del ref

    def check(z):
        ix = idx if isinstance(z, da.Array) or ctx.cpu else ctx.xp.asarray(idx)
        got = z[ix][:, ix]
        got = got.compute() if isinstance(got, da.Array) else got
        got = got.get() if hasattr(got, "get") else np.asarray(got)
        err = float(np.max(np.abs(got - want)))
        return f"{'ok' if err < 1e-5 else 'FAIL'} (max abs err {err:.1e} at {len(idx)}² samples)"

    raw, dask_col = ("NumPy", "dask threaded") if ctx.cpu else ("raw CuPy", "dask-cuda")
    w.column(raw, lambda: _gaussian(x), check, repeats=ctx.repeats, sync=ctx.sync,
             note="scipy.ndimage" if ctx.cpu else "cupyx.scipy.ndimage")
    w.skip("numba fused" if ctx.cpu else "CuPy fused", "not applicable (the library filter is already one pass per axis)")
    if not ctx.cpu:
        del x
        ctx.free()
        x = None
    depth = int(4 * SIGMA + 0.5)
    try:
        xd = ctx.dask_array(x, shape, "float32", seed)
        w.notes.append(f"dask.array chunks {xd.chunksize}, map_overlap depth {depth}, boundary reflect")
        with ctx.on_dask():
            w.column(dask_col, lambda: _persisted(ctx, xd.map_overlap(_gaussian, depth=depth, boundary="reflect",
                                                                       dtype=np.float32)), check, repeats=ctx.repeats)
        del xd
    except Exception as e:
        w.skip(dask_col, f"{type(e).__name__}: {e}")
    ctx.free()
    xf = ctx.flowgpu_array(x, shape, "float32", seed)
    w.notes.append(f"flowgpu chunks {xf.chunksize}")
    with ctx.on_flowgpu():
        w.column("flowgpu API", lambda: _persisted(ctx, gaussian_filter(xf, sigma=SIGMA)), check, repeats=ctx.repeats)
    _yaml_column(ctx, w, {"x": xf}, "gaussian", {
        "smooth": {"op": "gaussian_filter", "inputs": ["x"], "args": {"sigma": SIGMA}},
        "m": {"op": "mean", "inputs": ["smooth"]}}, "m",
        lambda v: rel_check(v, want_mean, 1e-5), note="filter then mean")
    del xf
    ctx.free()
    w.finish(raw, dask_col)
    return w


def run_zarr(ctx: Context, n: int) -> Workload:
    """Read an n x n float32 Zarr array, apply the chain, write Zarr (compressed, default codecs)."""
    import zarr


    seed = _seed()
    shape = (n, n)
    w = Workload(f"zarr chain {n}²", work=2 * n * n * 4.0)
    w.notes.append("floor: not measured (disk and codec bound); rate counts bytes read + written")
    src = os.path.join(ctx.tmp, "in.zarr")
    rows = max(1, min(n, (64 << 20) // (n * 4)))
    x_host = ctx.host_array(shape, "float32", seed)
    x_np = x_host.get() if hasattr(x_host, "get") else x_host
    del x_host
    z = zarr.create_array(src, shape=shape, chunks=(rows, n), dtype="float32", overwrite=True)
    z[...] = x_np
    picks = np.unique(np.linspace(0, n - 1, 64).astype(int))
    want = chain(x_np[picks].astype(np.float64))
    del x_np
    out_path = os.path.join(ctx.tmp, "out.zarr")

    def check(path):
        got = zarr.open_array(path, mode="r").oindex[picks, :]
        err = float(np.max(np.abs(got - want) / np.abs(want)))
        return f"{'ok' if err < 1e-6 else 'FAIL'} (rel err {err:.1e} on {len(picks)} rows)"

    xp = ctx.xp
    raw, fused, dask_col = ("NumPy", "numba fused", "dask threaded") if ctx.cpu else \
        ("raw CuPy", "CuPy fused", "dask-cuda")

    def raw_fn(kernel):
        def run():
            a = xp.asarray(zarr.open_array(src, mode="r")[...])
            y = kernel(a)
            y = y.get() if hasattr(y, "get") else y
            out = zarr.create_array(out_path, shape=shape, chunks=(rows, n), dtype="float32", overwrite=True)
            out[...] = y
            return out_path
        return run

    w.column(raw, raw_fn(chain), check, repeats=ctx.repeats)
    w.column(fused, raw_fn(_numba_chain() if ctx.cpu else xp.fuse(chain)), check, repeats=ctx.repeats)

    def dask_run():
        a = da.from_zarr(src)
        if not ctx.cpu:
            a = a.map_blocks(xp.asarray)
        y = chain(a)
        if not ctx.cpu:
            y = y.map_blocks(lambda b: b.get(), meta=np.empty((0, 0), np.float32))
        y.to_zarr(out_path, overwrite=True)
        return out_path

    try:
        with ctx.on_dask():
            w.column(dask_col, dask_run, check, repeats=ctx.repeats)
    except Exception as e:
        w.skip(dask_col, f"{type(e).__name__}: {e}")

    fused_chain = fg.fuse(chain)

    def flow_run():
        y = fused_chain(fg.from_zarr(src))
        fg.to_zarr(y, out_path, overwrite=True)
        return out_path

    with ctx.on_flowgpu():
        w.column("flowgpu API", flow_run, check, repeats=ctx.repeats)
    why = ctx.pipeline_available()
    if why:
        w.skip("flowgpu YAML", why)
    else:
        spec = {"version": 1, "name": "zarr_chain", "inputs": {"x": {"source": "zarr", "path": src}},
                "steps": {"y": {"op": "expr", "inputs": {"x": "x"}, "args": {"expression": "(x * 2 + 1) ** 2 - x"}}},
                "outputs": {"y": {"from": "y", "sink": "zarr", "path": out_path}}}
        with ctx.on_flowgpu():
            w.column("flowgpu YAML", lambda: (ctx.run_yaml(spec), out_path)[1], check, repeats=ctx.repeats)
    w.finish(raw, dask_col)
    return w


WORKLOADS: dict[str, Callable[[Context], list[Workload]]] = {
    "chain_sum": lambda ctx: [run_chain_sum(ctx, g) for g in ctx.sizes["chain"]],
    "transpose_sum": lambda ctx: [run_transpose_sum(ctx, ctx.sizes["tsum"])],
    "matmul": lambda ctx: [run_matmul(ctx, ctx.sizes["matmul"], d) for d in ("float32", "float64")],
    "stencil": lambda ctx: [run_stencil(ctx, ctx.sizes["stencil"])],
    "zarr": lambda ctx: [run_zarr(ctx, ctx.sizes["zarr"])],
}
