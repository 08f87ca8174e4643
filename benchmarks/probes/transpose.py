"""Kernel time of one chunk pair of ``(x + x.T).sum()``: a block and the transpose of another.

``python benchmarks/profile_transpose.py [--n 20000]`` prints one markdown table: how long the fused
map + reduce kernel takes when one input is a transposed (strided) view, against the alternatives.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_fused import _median_ms  # noqa: E402  (run as a script, beside it)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, default=20000)
    args = p.parse_args()

    import cupy as cp
    import numpy as np

    from flowgpu.kernels import fusion

    n = args.n
    a = cp.random.random((n, n), dtype=cp.float32)
    b = cp.random.random((n, n), dtype=cp.float32)
    bt = b.T
    sync = cp.cuda.Device().synchronize
    call = fusion._Chunk("a + b", ("a", "b"), (), np.dtype("float32"), "sum", (0, 1))
    want = float(a.sum(dtype=cp.float64) + b.sum(dtype=cp.float64))
    got = float(call(a, bt).sum())
    rows = [
        ("fused map + reduce, b transposed (strided view)", _median_ms(lambda: (call(a, bt), sync()))),
        ("fused map + reduce, both contiguous", _median_ms(lambda: (call(a, b), sync()))),
        ("cupy.ascontiguousarray(b.T) alone", _median_ms(lambda: (cp.ascontiguousarray(bt), sync()))),
        ("copy b.T contiguous, then fused", _median_ms(lambda: (call(a, cp.ascontiguousarray(bt)), sync()))),
        ("raw CuPy (a + b.T).sum()", _median_ms(lambda: (float((a + bt).sum()), sync()))),
    ]
    gb = 2 * n * n * 4 / 1e9
    print(f"\n| one chunk pair, {n}² float32 ({gb:.1f} GB read) | median ms | GB/s |\n|---|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} | {gb / ms * 1e3:.0f} |")
    print(f"\ncheck: fused {got:.6e} vs float64 {want:.6e}, rel err {abs(got - want) / abs(want):.1e}")


if __name__ == "__main__":
    main()
