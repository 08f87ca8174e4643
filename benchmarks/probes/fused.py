"""Where the time of a fused chain + sum goes on a GPU: kernel alone, dask alone, distributed, stores.

Each row adds one layer on top of the previous one, so the differences between rows say what each
layer costs. GPU only.

    python -m benchmarks.probes.fused --gib 8 --chunk-mib 1024
"""

from __future__ import annotations

import sys

import dask
import numpy as np
from distributed import wait

import flowgpu as fg
from benchmarks import harness
from flowgpu.backend import import_cupy
from flowgpu.fusion.chunk import FusedChunk


def parser():
    p = harness.parser(__spec__.name, __doc__, repeats=5)
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--chunk-mib", type=int, default=1024)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    cp = import_cupy()

    def ms(fn):
        return harness.median_ms(fn, args.repeats)

    n_chunk = args.chunk_mib * (1 << 20) // 4
    n_total = int(args.gib * (1 << 30)) // 4
    cols = 1 << 14
    chunk = (n_chunk // cols, cols)
    rows = []
    x1 = cp.random.random(n_chunk, dtype=cp.float32).reshape(chunk)
    sync = cp.cuda.Device().synchronize
    hand = cp.fuse(kernel_name="chain_sum")(lambda v: cp.sum((v * 2 + 1) ** 2 - v))
    rows.append(("one chunk: cupy.fuse", ms(lambda: (hand(x1), sync()))))
    call = FusedChunk("(x * 2 + 1) ** 2 - x", ("x",), (), np.dtype("float32"), "sum", (0, 1))
    rows.append(("one chunk: flowgpu fused reduce_chunk", ms(lambda: (call(x1), sync()))))
    ew = FusedChunk("(x * 2 + 1) ** 2 - x", ("x",), (), np.dtype("float32"))
    rows.append(("one chunk: flowgpu fused elementwise (writes)", ms(lambda: (ew(x1), sync()))))
    del x1
    chain = fg.fuse(lambda v: ((v * 2 + 1) ** 2 - v).sum())
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads", "num_workers": 1}):
        x = fg.random((n_total // cols, cols), dtype="float32", seed=1, chunks=chunk).persist()
        rows.append((f"{args.gib:g} GiB: fg.fuse on dask threads (1 thread)", ms(lambda: float(chain(x).compute()))))
        del x
    for store in ("flowgpu", "dask-cuda"):
        with dask.config.set({"flowgpu.spill.store": store}):
            with fg.Session(dashboard_address=None) as s:
                x = s.client.persist(fg.random((n_total // cols, cols), dtype="float32", seed=1, chunks=chunk))
                wait(x)
                rows.append((f"{args.gib:g} GiB: fg.fuse on a Session, store={store}",
                             ms(lambda: float(chain(x).compute()))))  # noqa: B023
                del x
    report.finish((f"what ({args.chunk_mib} MiB chunks)", "median ms"), [(n, round(v, 2)) for n, v in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
