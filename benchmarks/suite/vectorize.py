"""``@flowgpu.vectorize`` against the equivalent CuPy (or NumPy) expression.

The op is ``a * b + 1`` on float32: written once as a scalar function compiled by numba
(numba-cuda on the GPU, one kernel per chunk), and as the array expression ``a * b + 1`` (two
kernels and a temporary in CuPy). The data sit in device memory; flowgpu's version runs chunk by
chunk over a dask array of 512 MiB chunks with dask's threaded scheduler, and its output chunks
are kept (persisted), so every variant reads ``a`` and ``b`` and writes one full result.

Rows: raw CuPy expression on the whole arrays (the reference), ``@flowgpu.vectorize`` on chunks,
the same dask.array expression on chunks. Target: vectorize within 1.3x of the CuPy expression.
Medians of ``--repeats`` runs after a warm-up; fresh random data; every result checked.

Run::

    python -m benchmarks.suite.vectorize              # GPU, 8 GiB per input, about 30 s
    python -m benchmarks.suite.vectorize --gib 2      # GPU, smaller
    python -m benchmarks.suite.vectorize --cpu        # CPU: NumPy instead of CuPy, 256 MiB
    python -m benchmarks.suite.vectorize --cpu --size small   # CPU: 16 MiB, a smoke run

The markdown table comes last in the output.
"""

from __future__ import annotations

import sys
import time

import dask
import dask.array as da
import numpy as np

import flowgpu
from benchmarks import harness
from flowgpu.backend import import_cupy

MiB = 1 << 20
GiB = 1 << 30
ONE = np.float32(1.0)


def make_op():
    @flowgpu.vectorize(["float32(float32, float32)"])
    def mul_add(a, b):
        return a * b + ONE

    return mul_add


def persist_blocks(x: da.Array) -> list:
    """Compute every chunk of ``x`` and keep them (like ``persist`` without a cluster)."""
    (blocks,) = dask.compute(list(x.to_delayed().ravel()), scheduler="threads")
    return blocks


def run(cpu: bool, gib: float, chunk_mib: int, repeats: int) -> list[dict]:
    if cpu:
        xp = np
        sync = lambda: None  # noqa: E731
    else:
        xp = import_cupy()
        sync = xp.cuda.Device().synchronize
    n = int(gib * GiB) // 4
    chunk = max(chunk_mib * MiB // 4, 1)
    rng = xp.random.default_rng()
    a = rng.random(n, dtype=np.float32)
    b = rng.random(n, dtype=np.float32)
    da_a = da.from_array(a, chunks=chunk, asarray=False)
    da_b = da.from_array(b, chunks=chunk, asarray=False)
    mul_add = make_op()
    moved = 3 * n * 4  # bytes read (a, b) and written (result)

    rows = []
    ref_t = harness.timed(lambda: a * b + ONE, repeats, sync=sync)
    t_ref, ref = ref_t.median, ref_t.value
    rows.append(dict(name=f"{'NumPy' if cpu else 'CuPy'} expression `a * b + 1` (whole arrays)",
                     seconds=t_ref, ok=True))
    t = harness.timed(lambda: persist_blocks(mul_add(da_a, da_b)), repeats, sync=sync)
    t_vec, blocks = t.median, t.value
    del t
    ok = bool(xp.allclose(xp.concatenate(blocks), ref, rtol=1e-6, atol=0))
    del blocks
    rows.append(dict(name="flowgpu `@vectorize` on chunks", seconds=t_vec, ok=ok))
    t = harness.timed(lambda: persist_blocks(da_a * da_b + ONE), repeats, sync=sync)
    t_da, blocks = t.median, t.value
    del t
    ok = bool(xp.allclose(xp.concatenate(blocks), ref, rtol=1e-6, atol=0))
    del blocks
    rows.append(dict(name="dask.array expression on chunks", seconds=t_da, ok=ok))
    for r in rows:
        r["gbps"] = moved / r["seconds"] / 1e9
        r["ratio"] = r["seconds"] / t_ref
    return rows


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    report = harness.Report(args, argv)
    small = args.size == "small"
    gib = args.gib if args.gib is not None else (1 / 64 if small else 0.25) if args.cpu else (1.0 if small else 8.0)
    chunk_mib = args.chunk_mib or (32 if args.cpu else 512)
    rows = run(args.cpu, gib, chunk_mib, args.repeats)
    report.line(f"(total {time.perf_counter() - report.t0:.1f} s)")
    ref = "NumPy" if args.cpu else "CuPy"
    vec = rows[1]["ratio"]
    title = (f"`@vectorize` vs the {ref} expression: float32 `a * b + 1`, {gib:g} GiB per input, {chunk_mib} MiB "
             f"chunks; `@vectorize` / {ref}: {vec:.2f}x (target <= 1.3x: {'met' if vec <= 1.3 else 'NOT met'})")
    report.finish(("variant", "median (ms)", "effective GB/s", f"vs {ref}", "result"),
                  [(r["name"], round(r["seconds"] * 1e3, 1), round(r["gbps"], 1), f"{r['ratio']:.2f}x",
                    "ok" if r["ok"] else "MISMATCH") for r in rows], title=title)
    return 0 if all(r["ok"] for r in rows) else 1


def parser():
    p = harness.parser(__spec__.name, __doc__, cpu="NumPy chunks on the CPU instead of CuPy",
                       size="small: 1 GiB per input on GPU, 16 MiB on CPU", repeats=5)
    p.add_argument("--gib", type=float, default=None, help="GiB per input array (8 on GPU, 0.25 on CPU)")
    p.add_argument("--chunk-mib", type=int, default=None, help="chunk size (512 MiB GPU, 32 MiB CPU)")
    return p


if __name__ == "__main__":
    sys.exit(main())
