"""What the suite's columns share: the array module, the clusters and Session, the data, the copy rate."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any

import dask
import dask.array as da
import numpy as np

import flowgpu as fg
from benchmarks import harness
from benchmarks.suite.multi import MultiGPU
from flowgpu import pipeline
from flowgpu.arrays import resolve_chunks

GiB = 1 << 30

SIZES = {
    # workload -> {mode: parameter}
    "gpu": {
        "full": {"chain": [8, 32], "tsum": 40000, "matmul": 20000, "stencil": 32768, "zarr": 16384},
        "small": {"chain": [0.5, 2], "tsum": 10000, "matmul": 4096, "stencil": 8192, "zarr": 4096},
    },
    "cpu": {
        "full": {"chain": [0.25, 1], "tsum": 8000, "matmul": 2000, "stencil": 4096, "zarr": 4096},
        "small": {"chain": [1 / 64, 1 / 16], "tsum": 1000, "matmul": 400, "stencil": 512, "zarr": 512},
    },
}



class Context:
    """What the columns share: the array module, schedulers/clusters, timing settings."""
    def __init__(self, cpu: bool, repeats: int, size: str, gpus: list[int] | None = None):
        self.cpu = cpu
        self.gpus = gpus  # --gpus: the one-GPU columns on the first, the several-GPU columns on all
        self.multi = MultiGPU(gpus) if gpus and not cpu else None
        self.repeats = repeats
        self.size = size
        self.sizes = SIZES["cpu" if cpu else "gpu"][size]
        self.dask_client = None
        self.session = None
        self.cluster = None
        self.tmp = tempfile.mkdtemp(prefix="flowgpu-bench-")
        if cpu:
            self.xp = np
        else:
            import cupy

            self.xp = cupy
        self.copy_rate = None

    # -------------------------------------------------------------- setup and teardown
    def start(self) -> None:
        if self.cpu:
            return
        from distributed import Client


        dask.config.set({"array.backend": "cupy"})
        try:
            from dask_cuda import LocalCUDACluster

            one = {"CUDA_VISIBLE_DEVICES": str(self.gpus[0])} if self.gpus else {}
            self.cluster = LocalCUDACluster(n_workers=1, dashboard_address=None, **one)
            self.dask_client = Client(self.cluster, set_as_default=False)
        except Exception as e:  # the dask-cuda columns then report this
            self.dask_error = f"{type(e).__name__}: {e}"
            print(f"dask-cuda cluster not started: {self.dask_error}", flush=True)
        self.session = fg.Session(backend="gpu", gpus=[self.gpus[0] if self.gpus else 0], dashboard_address=None)
        if self.multi:
            self.multi.start()

    def close(self) -> None:
        if self.multi:
            self.multi.close()
        for thing in (self.session, self.dask_client, self.cluster):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def several_gpus(self, *args: Any, **kwargs: Any) -> None:
        """The several-GPU columns of a workload (:meth:`MultiGPU.columns`), with ``--gpus`` only."""
        if self.multi:
            self.multi.columns(*args, **kwargs)

    def sync(self) -> None:
        if not self.cpu:
            self.xp.cuda.Device().synchronize()

    def free(self) -> None:
        """Give cached device memory back (in this process and on the workers)."""
        if self.cpu:
            return

        def _free():
            import gc

            import cupy

            gc.collect()
            cupy.get_default_memory_pool().free_all_blocks()

        _free()
        for c in (self.dask_client, self.session.client if self.session else None,
                  *(self.multi.clients.values() if self.multi else ())):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.run(_free)

    @contextlib.contextmanager
    def on_dask(self):
        if self.cpu:
            with dask.config.set(scheduler="threads"):
                yield
        else:
            if self.dask_client is None:
                raise RuntimeError(getattr(self, "dask_error", "no dask-cuda cluster"))
            with self.dask_client.as_current(), dask.config.set(scheduler=self.dask_client):
                yield

    @contextlib.contextmanager
    def on_flowgpu(self):
        if self.cpu:  # the threaded scheduler with the graph optimisation a Session installs
            with dask.config.set(scheduler="threads"), fg.fusion.fusing():
                yield
        else:
            with self.session.client.as_current(), dask.config.set(scheduler=self.session.client):
                yield

    # -------------------------------------------------------------- data
    def host_array(self, shape, dtype, seed) -> Any:
        """The data in this process (NumPy or CuPy), filled slab by slab from flowgpu.random."""
        out = self.xp.empty(shape, dtype=dtype)
        rows = max(1, (256 << 20) // (int(np.prod(shape[1:])) * np.dtype(dtype).itemsize))
        lazy = fg.random(shape, dtype=dtype, seed=seed, chunks=(rows,) + tuple(shape[1:]))
        start = 0
        with dask.config.set(scheduler="sync"):
            for i in range(lazy.numblocks[0]):
                block = lazy.blocks[i].compute()
                out[start:start + block.shape[0]] = self.xp.asarray(block)
                start += block.shape[0]
        return out

    def dask_array(self, x, shape, dtype, seed) -> da.Array:
        """The data for dask.array with dask's own default chunks."""
        chunks = da.core.normalize_chunks("auto", shape, dtype=np.dtype(dtype))
        if self.cpu:
            return da.from_array(x, chunks=chunks)

        with self.on_dask():
            arr = fg.random(shape, dtype=dtype, seed=seed, chunks=chunks)
            return self._persist(self.dask_client, arr)

    def flowgpu_array(self, x, shape, dtype, seed, chunks: Any = "auto") -> da.Array:
        """The data for flowgpu's columns with flowgpu's ``chunks="auto"`` (or the given chunks)."""
        if self.cpu:
            return da.from_array(x, chunks=resolve_chunks(chunks, shape, dtype))
        with self.on_flowgpu():
            return self._persist(self.session.client, fg.random(shape, dtype=dtype, seed=seed, chunks=chunks))

    @staticmethod
    def _persist(client, arr):
        from distributed import wait

        arr = client.persist(arr)
        wait(arr)
        return arr

    def measure_copy_rate(self) -> float:
        """Bytes read plus written per second by a device (or host) copy, as the floor's unit."""
        n = (1 * GiB if not self.cpu else 256 << 20) if self.size == "full" else 128 << 20
        src = self.xp.asarray(np.random.default_rng().random(n // 8))
        dst = self.xp.empty_like(src)
        self.sync()
        t = harness.timed(lambda: self.xp.copyto(dst, src), self.repeats + 1, sync=self.sync)
        self.copy_rate = 2 * src.nbytes / t.median
        del src, dst
        self.free()
        return self.copy_rate

    def pipeline_available(self) -> str | None:
        return None if callable(getattr(pipeline, "run", None)) else "flowgpu.pipeline.run is not available"

    def run_yaml(self, spec: dict) -> Any:
        """``spec`` run as the Python API runs its graph: computed every time (``force``: the output
        cache would otherwise answer every run after the first, with the warm-up's value), its
        cache entries written in the suite's temporary folder."""
        session = "local" if self.cpu else self.session
        with dask.config.set({"flowgpu.cache.directory": os.path.join(self.tmp, "cache")}):
            return pipeline.run(spec, session=session, progress=False, overwrite=True, force=True)
