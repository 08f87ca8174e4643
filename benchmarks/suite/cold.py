"""The first compute in a fresh process: what compiling costs, with an empty kernel cache and a warm one.

``python -m benchmarks.suite.run --cold`` runs, for each workload below (``--only`` picks), plain
dask.array code in new Python processes, one after another, each timing its first ``compute()`` and
then a second one, on the same data (``flowgpu.random``, made and persisted before the clock starts;
on the GPU a Session's start is not timed either):

1. unfused (``fuse-ufuncs`` off) with empty CuPy and flowgpu kernel caches;
2. unfused again, with what the first left in them (CuPy compiles its own ufuncs' kernels too);
3. fused (``fuse-ufuncs`` on: a Session, or ``fusion.fusing()`` on dask's threads with ``--cpu``)
   with empty caches: every fused kernel is compiled;
4. fused again in a new process: the kernels come from the disk caches (flowgpu.cache.kernels for
   numba, CUPY_CACHE_DIR for CuPy), compiled nothing.

Each workload gets caches of its own in a temporary folder (``DASK_FLOWGPU__CACHE__KERNELS`` and
``CUPY_CACHE_DIR`` are set for these processes only, and ``NUMBA_CACHE_DIR`` unset). The table gives
each first call, the fused second call (warm, as the suite's other columns are), the files each run
wrote into the caches (compiled kernels: numba's ``.nbc``, CuPy's ``.cubin``), and the value's check.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks import harness

__all__ = ["COLD", "run"]

SIGMA = 2.0


def _abs_max(x):
    return abs(x - 1).max()


def _chain_sum(x):
    return ((x * 2 + 1) ** 2 - x).sum()


def _transpose_sum(x):
    return (x + x.T).sum()


def _stencil(x):
    from flowgpu.ops.stencil import gaussian_filter

    return gaussian_filter(x, sigma=SIGMA).sum()


# name -> the dask.array code timed (on a square float32 array), as a user writes it
COLD: dict[str, Callable[[Any], Any]] = {"abs_max": _abs_max, "chain_sum": _chain_sum,
                                         "transpose_sum": _transpose_sum, "stencil": _stencil}
SIDE = {"cpu": {"small": 1024, "full": 4096}, "gpu": {"small": 4096, "full": 16384}}
COLUMNS = ("unfused, 1st call (empty cache)", "unfused, 1st call (warm cache)", "fused, 1st call (empty cache)",
           "fused, 1st call (warm cache)", "fused, 2nd call")


def _cache_files(folder: str) -> int:
    """Compiled kernels in the caches under ``folder``: numba's machine code and CuPy's binaries."""
    return sum(len(glob.glob(os.path.join(folder, "**", pattern), recursive=True)) for pattern in ("*.nbc", "*.cubin"))


def _child(args: argparse.Namespace) -> int:
    """In a fresh process: make the data, then time the first and second compute of one workload."""
    import dask

    import flowgpu as fg
    from flowgpu.fusion import kernel_cache

    code = COLD[args.child]
    n = SIDE["cpu" if args.cpu else "gpu"][args.size]
    session = None
    if args.cpu:
        dask.config.set(scheduler="threads")
    else:
        session = fg.Session(backend="gpu", fuse=args.fuse == "on", dashboard_address=None)
    try:
        x = fg.random((n, n), dtype="float32", seed=args.seed).persist()
        if session is not None:
            from distributed import wait

            wait(x)
        fusing = fg.fusion.fusing() if args.cpu and args.fuse == "on" else contextlib.nullcontext()
        times = []
        with fusing:
            for _ in range(2):
                t0 = time.perf_counter()
                value = float(code(x).compute())
                times.append(time.perf_counter() - t0)
        if session is not None:
            stats = list(session.client.run(kernel_cache.stats).values())
        else:
            stats = [kernel_cache.stats()]
        with dask.config.set({"flowgpu.fuse-ufuncs": False}):
            want = float(code(x.astype("float64")).compute())
    finally:
        if session is not None:
            session.close()
    print(json.dumps({"first_s": times[0], "second_s": times[1], "value": value, "want": want,
                      "compiled": sum(s["compiled"] for s in stats), "loaded": sum(s["loaded"] for s in stats)}))
    return 0


def _spawn(name: str, fuse: str, folder: str, args: argparse.Namespace, seed: int) -> dict:
    env = dict(os.environ, DASK_FLOWGPU__CACHE__KERNELS=os.path.join(folder, "kernels"),
               CUPY_CACHE_DIR=os.path.join(folder, "cupy"))
    env.pop("NUMBA_CACHE_DIR", None)
    cmd = [sys.executable, "-m", __spec__.name, "--child", name, "--fuse", fuse, "--size", args.size,
           "--seed", str(seed)] + (["--cpu"] if args.cpu else [])
    before = _cache_files(folder)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit {proc.returncode}: {tail[:300]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["written"] = _cache_files(folder) - before
    return out


def run(args: argparse.Namespace, report: harness.Report) -> int:
    """The cold table for ``args.only`` (default: every workload of :data:`COLD`); returns the exit status."""
    import secrets

    names = [n for n in (args.only or COLD) if n in COLD]
    skipped = [n for n in (args.only or ()) if n not in COLD]
    if skipped:
        report.line(f"no cold measurement for {', '.join(skipped)} (cold: {', '.join(COLD)})")
    rows = []
    for name in names:
        seed = secrets.randbits(31)
        report.line(f"== {name}")
        with tempfile.TemporaryDirectory(prefix="flowgpu-cold-") as folder:
            runs: list[dict | str] = []
            for fuse, sub in (("off", "plain"), ("off", "plain"), ("on", "fused"), ("on", "fused")):
                try:
                    runs.append(_spawn(name, fuse, os.path.join(folder, sub), args, seed))
                except Exception as e:  # one broken run must not stop the others
                    runs.append(f"{type(e).__name__}: {e}")
                r = runs[-1]
                report.line(f"  {COLUMNS[len(runs) - 1]:32s} " + (r if isinstance(r, str) else
                            f"{r['first_s']:8.2f} s (2nd {r['second_s']:.3f} s), compiled {r['compiled']}, "
                            f"loaded {r['loaded']}, cache files written {r['written']}"))
        ok = [r for r in runs if isinstance(r, dict)]
        check = "; ".join(r for r in runs if isinstance(r, str)) or \
            ("ok" if all(abs(r["value"] - r["want"]) <= 1e-5 * max(abs(r["want"]), 1e-300) for r in ok) else
             "FAIL (" + ", ".join(f"{r['value']!r} vs {r['want']!r}" for r in ok) + ")")
        cells = [r["first_s"] if isinstance(r, dict) else None for r in runs]
        cells.append(runs[3]["second_s"] if isinstance(runs[3], dict) else None)
        written = "/".join(str(r["written"]) if isinstance(r, dict) else "—" for r in runs)
        rows.append([name, *cells, written, check])
    headers = ["workload", *(f"{c} (s)" for c in COLUMNS), "cache files written (runs 1-4)", "check"]
    report.finish(headers, rows, title=f"cold start, {'cpu' if args.cpu else 'gpu'}, size {args.size}: "
                  "the first compute in a fresh process")
    return 0 if all(row[-1] == "ok" for row in rows) else 1


def child_main(argv: list[str] | None = None) -> int:
    """The entry of the processes :func:`run` starts (not a script of its own: ``python -m
    benchmarks.suite.run --cold`` is the command)."""
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=sorted(COLD), required=True)
    p.add_argument("--fuse", choices=("on", "off"), required=True)
    p.add_argument("--size", choices=harness.SIZES, default="full")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--cpu", action="store_true")
    return _child(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(child_main())
