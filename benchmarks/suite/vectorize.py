"""``@flowgpu.vectorize`` against the equivalent CuPy (or NumPy) expression.

The op is ``a * b + 1`` on float32: written once as a scalar function compiled by numba
(numba-cuda on the GPU, one kernel per chunk), and as the array expression ``a * b + 1`` (two
kernels and a temporary in CuPy). The data sit in device memory; flowgpu's version runs chunk by
chunk over a dask array of 512 MiB chunks with dask's threaded scheduler, and its output chunks
are kept (persisted), so every variant reads ``a`` and ``b`` and writes one full result.

Rows: raw CuPy expression on the whole arrays (the reference), ``@flowgpu.vectorize`` on chunks,
the same dask.array expression on chunks. Target: vectorize within 1.3x of the CuPy expression.
Medians of ``--repeat`` runs after a warm-up; fresh random data; every result checked.

Run::

    python benchmarks/vectorize_bench.py              # GPU, 8 GiB per input, about 30 s
    python benchmarks/vectorize_bench.py --gib 2      # GPU, smaller
    python benchmarks/vectorize_bench.py --cpu        # CPU: NumPy instead of CuPy, 256 MiB

The markdown table comes last in the output.
"""

from __future__ import annotations

import argparse
import statistics
import time

import dask
import dask.array as da
import numpy as np

MiB = 1 << 20
GiB = 1 << 30
ONE = np.float32(1.0)


def make_op():
    import flowgpu

    @flowgpu.vectorize(["float32(float32, float32)"])
    def mul_add(a, b):
        return a * b + ONE

    return mul_add


def timed(fn, sync, repeat: int) -> tuple[float, object]:
    """Median seconds of ``repeat`` runs of ``fn`` after one warm-up; the last result."""
    out = fn()
    sync()
    times = []
    for _ in range(repeat):
        out = None
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def persist_blocks(x: da.Array) -> list:
    """Compute every chunk of ``x`` and keep them (like ``persist`` without a cluster)."""
    (blocks,) = dask.compute(list(x.to_delayed().ravel()), scheduler="threads")
    return blocks


def run(cpu: bool, gib: float, chunk_mib: int, repeat: int) -> list[dict]:
    if cpu:
        xp = np
        sync = lambda: None  # noqa: E731
    else:
        from flowgpu.backend import import_cupy

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
    t_ref, ref = timed(lambda: a * b + ONE, sync, repeat)
    rows.append(dict(name=f"{'NumPy' if cpu else 'CuPy'} expression `a * b + 1` (whole arrays)",
                     seconds=t_ref, ok=True))
    t_vec, blocks = timed(lambda: persist_blocks(mul_add(da_a, da_b)), sync, repeat)
    ok = bool(xp.allclose(xp.concatenate(blocks), ref, rtol=1e-6, atol=0))
    del blocks
    rows.append(dict(name="flowgpu `@vectorize` on chunks", seconds=t_vec, ok=ok))
    t_da, blocks = timed(lambda: persist_blocks(da_a * da_b + ONE), sync, repeat)
    ok = bool(xp.allclose(xp.concatenate(blocks), ref, rtol=1e-6, atol=0))
    del blocks
    rows.append(dict(name="dask.array expression on chunks", seconds=t_da, ok=ok))
    for r in rows:
        r["gbps"] = moved / r["seconds"] / 1e9
        r["ratio"] = r["seconds"] / t_ref
    return rows


def table(rows: list[dict], cpu: bool, gib: float, chunk_mib: int) -> str:
    ref = "NumPy" if cpu else "CuPy"
    lines = [f"### `@vectorize` vs the {ref} expression: float32 `a * b + 1`, {gib:g} GiB per input, "
             f"{chunk_mib} MiB chunks",
             "",
             f"| variant | median time | effective GB/s | vs {ref} | result |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['seconds'] * 1e3:.1f} ms | {r['gbps']:.1f} | "
                     f"{r['ratio']:.2f}x | {'ok' if r['ok'] else 'MISMATCH'} |")
    vec = rows[1]["ratio"]
    lines += ["", f"`@vectorize` / {ref}: {vec:.2f}x (target <= 1.3x: {'met' if vec <= 1.3 else 'NOT met'})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="NumPy chunks on the CPU instead of CuPy")
    p.add_argument("--gib", type=float, default=None, help="GiB per input array (8 on GPU, 0.25 on CPU)")
    p.add_argument("--chunk-mib", type=int, default=None, help="chunk size (512 MiB GPU, 32 MiB CPU)")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    gib = args.gib if args.gib is not None else (0.25 if args.cpu else 8.0)
    chunk_mib = args.chunk_mib or (32 if args.cpu else 512)
    t0 = time.perf_counter()
    rows = run(args.cpu, gib, chunk_mib, args.repeat)
    print(f"(total {time.perf_counter() - t0:.1f} s)\n")
    print(table(rows, args.cpu, gib, chunk_mib))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
