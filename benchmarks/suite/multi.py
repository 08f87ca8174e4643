"""The suite's columns on several GPUs (``--gpus 0,1``): flowgpu and dask-cuda, over TCP and UCX.

Each is a cluster of one worker per listed GPU, started once for the whole suite:

* ``flowgpu N GPU(s)``: ``flowgpu.Session(gpus=...)``;
* ``flowgpu N GPU(s) UCX``: the same with ``protocol="ucx"`` (distributed-ucxx);
* ``dask-cuda N GPU(s)`` and ``dask-cuda N GPU(s) UCX``: ``dask_cuda.LocalCUDACluster`` on the same
  GPUs (``CUDA_VISIBLE_DEVICES``), dask-cuda's defaults otherwise, ``protocol="ucx"`` for the second.

The data is made on the cluster (``flowgpu.random``: the same values for any chunking and any
worker) with the chunks of the one-GPU column it is set beside, so the graph is the same and its
result must be bit-identical to that column's: the check says so, or FAILs. ``--gpus 0`` runs
the same code on one GPU (a smoke test of these columns). A cluster that cannot start (UCX not
installed, a GPU missing) skips its columns with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np
from distributed import Client, wait

import flowgpu as fg
from benchmarks.harness import Workload

KINDS = (("flowgpu", "tcp"), ("flowgpu", "ucx"), ("dask-cuda", "tcp"), ("dask-cuda", "ucx"))


def _label(kind: str, protocol: str, n: int) -> str:
    return f"{kind} {n} GPU{'s' if n > 1 else ''}" + (" UCX" if protocol == "ucx" else "")


class MultiGPU:
    """The clusters of the several-GPU columns; ``gpus`` are the ordinals to spread over."""

    def __init__(self, gpus: list[int]):
        self.gpus = list(gpus)
        self.clients: dict[str, Client] = {}
        self.errors: dict[str, str] = {}
        self._owned: list[Any] = []

    @property
    def labels(self) -> list[str]:
        return [_label(k, p, len(self.gpus)) for k, p in KINDS]

    def start(self) -> None:
        for kind, protocol in KINDS:
            label = _label(kind, protocol, len(self.gpus))
            try:
                self.clients[label] = self._start(kind, protocol)
            except Exception as e:  # its columns say why
                self.errors[label] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                print(f"{label}: not started: {self.errors[label]}", flush=True)

    def _start(self, kind: str, protocol: str) -> Client:
        if kind == "flowgpu":
            session = fg.Session(backend="gpu", gpus=self.gpus, protocol=protocol, dashboard_address=None)
            self._owned.append(session)
            return session.client
        from dask_cuda import LocalCUDACluster  # noqa: PLC0415 - GPU-only

        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(map(str, self.gpus)), n_workers=len(self.gpus),
                                   protocol=protocol, dashboard_address=None)
        self._owned.append(cluster)
        client = Client(cluster, set_as_default=False)
        self._owned.append(client)
        return client

    def close(self) -> None:
        for thing in reversed(self._owned):
            with contextlib.suppress(Exception):
                thing.close()

    @contextlib.contextmanager
    def on(self, label: str):
        client = self.clients[label]
        with client.as_current(), dask.config.set(scheduler=client):
            yield client

    def columns(self, w: Workload, kind: str, shape: tuple, dtype: str, seed: int, chunks: Any,
                fn: Callable[[Any], Any], check: Callable[[Any], str], repeats: int, one_gpu: str) -> None:
        """The ``kind`` columns (flowgpu or dask-cuda, TCP and UCX) of ``w``: ``fn(x)`` on the data
        made on each cluster with ``chunks`` (None: dask's ``"auto"``, as the dask-cuda column's);
        checked with ``check`` and against column ``one_gpu``."""
        if chunks is None:
            chunks = da.core.normalize_chunks("auto", shape, dtype=np.dtype(dtype))
        base = next((r.value for r in w.results if r.column == one_gpu and r.value is not None), None)

        def against_one_gpu(value: Any) -> str:
            said = check(value)
            if base is None:
                return f"{said}; no {one_gpu} value to compare"
            same = float(value) == base
            return f"{said}; {'bit-identical to' if same else 'FAIL: differs from'} {one_gpu}" + \
                ("" if same else f" ({float(value)!r} vs {base!r})")

        for k, protocol in KINDS:
            if k != kind:
                continue
            label = _label(k, protocol, len(self.gpus))
            if label not in self.clients:
                w.skip(label, self.errors.get(label, "not started"))
                continue
            try:
                with self.on(label) as client:
                    x = client.persist(fg.random(shape, dtype=dtype, seed=seed, chunks=chunks))
                    wait(x)
                    spread = len({a for ws in client.who_has(x).values() for a in ws})
                    w.column(label, lambda: float(fn(x).compute()), against_one_gpu, repeats=repeats,  # noqa: B023
                             note=f"chunks on {spread} of {len(self.gpus)} worker(s)")
                    del x
            except Exception as e:
                w.skip(label, f"{type(e).__name__}: {e}".splitlines()[0][:300])
