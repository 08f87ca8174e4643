"""Kernel time of one chunk pair of ``(x + x.T).sum()``: a block and the transpose of another.

How long the fused map + reduce kernel takes when one input is a transposed (strided) view, against
the alternatives. GPU only.

    python -m benchmarks.probes.transpose --n 20000
"""

from __future__ import annotations

import sys

import numpy as np

from benchmarks import harness
from flowgpu.backend import import_cupy
from flowgpu.fusion.chunk import FusedChunk


def parser():
    p = harness.parser(__spec__.name, __doc__, repeats=5)
    p.add_argument("--n", type=int, default=20000, help="side of the square float32 chunks")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    cp = import_cupy()
    n = args.n
    a = cp.random.random((n, n), dtype=cp.float32)
    b = cp.random.random((n, n), dtype=cp.float32)
    bt = b.T
    sync = cp.cuda.Device().synchronize
    call = FusedChunk("a + b", ("a", "b"), (), np.dtype("float32"), "sum", (0, 1))
    want = float(a.sum(dtype=cp.float64) + b.sum(dtype=cp.float64))
    got = float(call(a, bt).sum())

    def ms(fn):
        return harness.median_ms(fn, args.repeats, sync=sync)

    rows = [
        ("fused map + reduce, b transposed (strided view)", ms(lambda: call(a, bt))),
        ("fused map + reduce, both contiguous", ms(lambda: call(a, b))),
        ("cupy.ascontiguousarray(b.T) alone", ms(lambda: cp.ascontiguousarray(bt))),
        ("copy b.T contiguous, then fused", ms(lambda: call(a, cp.ascontiguousarray(bt)))),
        ("raw CuPy (a + b.T).sum()", ms(lambda: float((a + bt).sum()))),
    ]
    gb = 2 * n * n * 4 / 1e9
    report.finish((f"one chunk pair, {n}² float32 ({gb:.1f} GB read)", "median ms", "GB/s"),
                  [(name, round(v, 2), round(gb / v * 1e3)) for name, v in rows],
                  title=f"check: fused {got:.6e} vs float64 {want:.6e}, rel err {abs(got - want) / abs(want):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
