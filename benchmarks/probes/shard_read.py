"""How fast does one compressed shard's worth of bytes reach the device through flowgpu's staging?

The device Zarr path reads each shard (about 300 MB of zstd for a 1 GiB shard) with
``file_rows_to_device(path, offset, (nbytes,), uint8)``; in the first measurement the storage
counters gave 0.9 GB/s per task. This writes a file of ``--mib`` MiB x 4 (page cache), then times,
in this process: one read of each piece on one thread, the four pieces on four threads at once,
the same as 2-D rows of 1 MiB, and a plain ``os.preadv`` into pageable memory (no device).

    python -m benchmarks.probes.shard_read --mib 300
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks import harness
from flowgpu.transfer import staging
from flowgpu.transfer.staging import file_rows_to_device


def main(argv=None) -> int:
    p = harness.parser(__spec__.name, __doc__, repeats=3)
    p.add_argument("--mib", type=int, default=300, help="MiB per piece (default 300)")
    args = p.parse_args(argv)
    import cupy as cp

    n = args.mib << 20
    rng = np.random.default_rng()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "shards.bin")
        with open(path, "wb") as f:
            for _ in range(4):
                f.write(rng.integers(0, 255, n, dtype=np.uint8).tobytes())
        cp.cuda.Device().synchronize()

        def one(i, shape=(n,)):
            a = file_rows_to_device(path, i * n, shape, np.uint8)
            cp.cuda.get_current_stream().synchronize()
            return a

        def timed(fn):
            fn()
            ts = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return sorted(ts)[len(ts) // 2]

        pool = ThreadPoolExecutor(4)
        rows = [
            ("one piece, 1 thread, 1-D", timed(lambda: one(0)), n),
            ("one piece, 1 thread, 1 MiB rows", timed(lambda: one(0, (n >> 20, 1 << 20))), n),
            ("4 pieces, 4 threads at once", timed(lambda: list(pool.map(one, range(4)))), 4 * n),
        ]
        for mib, depth in ((16, 4), (16, 8), (8, 16), (32, 8)):
            staging.DEPTH = depth
            budget = mib << 20
            rows.append((f"4 pieces, 4 threads at once, {mib} MiB slices, depth {depth}",
                         timed(lambda: list(pool.map(lambda i: (file_rows_to_device(path, i * n, (n,), np.uint8,
                                                                                     budget=budget),  # noqa: B023
                                                                 cp.cuda.get_current_stream().synchronize()),
                                                      range(4)))), 4 * n))
        staging.DEPTH = 4
        buf = np.empty(n, np.uint8)
        fd = os.open(path, os.O_RDONLY)
        rows.append(("os.preadv into pageable memory, 1 thread", timed(lambda: os.preadv(fd, [buf], 0)), n))
        import cupyx

        pinned = cupyx.empty_pinned(4 * n, np.uint8)
        piece = 16 << 20
        for threads in (1, 4, 8, 16):
            with ThreadPoolExecutor(threads) as ex:
                def par(ex=ex):
                    view = memoryview(pinned)
                    list(ex.map(lambda o: os.preadv(fd, [view[o:o + piece]], o), range(0, 4 * n, piece)))
                rows.append((f"os.preadv into pinned memory, 16 MiB pieces, {threads} threads",
                             timed(par), 4 * n))
        os.close(fd)
        for name, s, nbytes in rows:
            print(f"{name}: {s * 1e3:.1f} ms, {nbytes / s / 1e9:.1f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
