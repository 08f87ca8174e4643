"""A batch of ITEMS items on the GPU, each a fused chain + reduction over a 2 GiB ``.npy``: does the
batch keep the GPU as busy as one item alone?

Each item reads its own file (hard links to one file written once, so the page cache holds it and
every item reads at host-memory speed, as a warm batch over cached inputs would), computes
``sum((x * 2 + 1) ** 2 - x)`` (one fused kernel per chunk) and returns the value. Reported: GB/s of
``.npy`` bytes read per second of wall time, for 1 item and for ITEMS items in one batch on one
warm Session, and each item's value checked against the single item's (the same bytes, the same sum).

    python -m benchmarks.batch.gpu_items --items 16 --gib 2
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

import flowgpu as fg
from benchmarks import harness
from flowgpu import pipeline

SPEC = {
    "name": "gpu-items",
    "params": {"input": "x.npy", "rows": 8192},
    "inputs": {"x": {"source": "npy", "path": "${params.input}", "chunks": ["${params.rows}", -1]}},
    "steps": {"y": {"op": "expr", "inputs": {"x": "x"}, "args": {"expression": "(x * 2 + 1) ** 2 - x"}},
              "total": {"op": "sum", "inputs": ["y"]}},
    "outputs": {"total": {"from": "total"}},
}


def write_input(folder: str, gib: float, cols: int = 16384) -> tuple[str, tuple[int, int]]:
    rows = int(gib * (1 << 30)) // 4 // cols
    path = os.path.join(folder, "x.npy")
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, cols))
    rng = np.random.default_rng(0)
    step = 4096
    for r in range(0, rows, step):
        out[r:r + step] = rng.random((min(step, rows - r), cols), dtype=np.float32)
    out.flush()
    del out
    return path, (rows, cols)


def links(path: str, n: int) -> list[str]:
    out = []
    for i in range(n):
        link = f"{path[:-4]}-{i}.npy"
        if not os.path.exists(link):
            os.link(path, link)
        out.append(link)
    return out


def batch(session, paths: list[str], rows: int) -> list[float]:
    result = pipeline.run(SPEC, session=session, progress=False, cache=False, overrides={"params.rows": rows},
                          foreach={"input": paths})
    assert result.ok
    return [float(r.outputs["total"]) for r in result.items]


def parser():
    p = harness.parser(__spec__.name, __doc__, repeats=3)
    p.add_argument("--items", type=int, default=16)
    p.add_argument("--gib", type=float, default=2.0, help="size of each item's .npy")
    p.add_argument("--rows", type=int, default=8192, help="rows per chunk (16384 float32 columns)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    with tempfile.TemporaryDirectory(prefix="flowgpu-bench-items-", dir=os.environ.get("TMPDIR")) as folder:
        path, shape = write_input(folder, args.gib)
        nbytes = shape[0] * shape[1] * 4
        paths = links(path, args.items)
        with fg.Session(dashboard_address=None) as s:
            one = batch(s, paths[:1], args.rows)
            many = batch(s, paths, args.rows)
            t_one = harness.timed(lambda: batch(s, paths[:1], args.rows), args.repeats)
            t_many = harness.timed(lambda: batch(s, paths, args.rows), args.repeats)
            where = f"{s.n_workers} {s.backend} worker(s)"
    ok = np.allclose(many, [one[0]] * len(many), rtol=1e-4)  # every item read the same bytes with k=1
    report.line(f"{args.items} items x {nbytes / 2**30:.2f} GiB .npy on {where}; every item's value agrees: "
                f"{'yes' if ok else 'NO'}")
    rows = [("1 item", round(t_one.median, 3), round(nbytes / t_one.median / 1e9, 2), 1.0),
            (f"{args.items} items, one batch", round(t_many.median, 3),
             round(args.items * nbytes / t_many.median / 1e9, 2),
             round(args.items * nbytes / t_many.median / (nbytes / t_one.median), 2))]
    report.finish(("what", "seconds", "GB/s read", "vs 1 item"), rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
