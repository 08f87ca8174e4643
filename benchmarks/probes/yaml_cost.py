"""What a YAML run costs over the Python API for the same graph, and where the pipeline runner spends it.

On one Session (or dask's threaded scheduler with ``--local``), small data so that the fixed cost
per run dominates, for each workload: the median of ``--repeats`` runs of ``fg.fuse(f)(x).compute()``
and of ``pipeline.run(spec, session=s, force=True)`` on the same in-memory array, in turn (what the suite's
YAML column does, ``force``: every run computes, as the Python API does; the cache lives in a
temporary folder). Then the runner's time per run by section (perf_counter around its steps,
inclusive: a section's time holds the sections it calls; the workers' memory accounting is asked
for on the client's event loop, so what counts is what the run waits for their answers)
and the blocking calls to the cluster each makes (the round trips a loaded machine makes slow),
and with ``--profile`` the top of a cProfile of the YAML runs. Last, the check: YAML / Python per
workload against the target 1.1x.

    python -m benchmarks.probes.yaml_cost --cpu [--local] [--repeats 15] [--profile 30]
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

import dask
import dask.array as da
import numpy as np
from distributed import Client

import flowgpu as fg
from benchmarks import harness
from benchmarks.suite import data
from flowgpu import pipeline
from flowgpu.backend import import_cupy
from flowgpu.diagnostics import monitor
from flowgpu.pipeline import batch, checks, runner
from flowgpu.runtime import session as session_module

TARGET = 1.1

# where the runner spends its time: (label, module, attribute); methods as "Class.method"
SECTIONS = (
    ("load + validate the spec", runner, "load_spec"),
    ("compile + check outputs (pure)", runner, "plan_items"),
    ("cache: recipes + verdicts", runner, "judge"),
    ("output locks", runner.sinks, "hold_outputs"),
    ("execute (all below)", runner, "execute"),
    ("  compile in the session + stage", batch._Batch, "start"),
    ("  dashboard page: follow", monitor.Follower, "_follow"),
    ("  dashboard page: finish", monitor.Tracked, "finish"),
    ("  spill watch: start", batch.watch_spill, "__enter__"),
    ("  compute + gather (distributed)", batch._Batch, "distributed"),
    ("  compute (local)", batch._Batch, "local"),
    ("    commit + cache record", batch, "_commit"),
    ("session.memory_summary (the watch's)", session_module.Session, "memory_summary"),
    ("  the run waits for their answers", None, None),
    ("session options", checks, "session_options"),
    ("summary", runner, "_single_result"),
)


WAITED = "  the run waits for their answers"  # the main thread's waits (the calls run on threads of their own)


def chain_sum(x):
    return ((x * 2 + 1) ** 2 - x).sum()


def add_sum(a, b):
    return (a + b).sum()


def _spec(name: str, x, steps: dict, output: str) -> dict:
    return {"version": 1, "name": name,
            "inputs": {"x": {"source": "python", "callable": "benchmarks.suite.data:shared", "args": {"name": "x"},
                             "shape": list(x.shape), "dtype": str(x.dtype)}},
            "steps": steps, "outputs": {output: {"from": output}}}


WORKLOADS = {
    # name: (the Python API's function of x, the spec of x, its output)
    "chain_sum": (fg.fuse(chain_sum), lambda x: _spec("chain_sum", x, {
        "y": {"op": "expr", "inputs": {"x": "x"}, "args": {"expression": "(x * 2 + 1) ** 2 - x"}},
        "total": {"op": "sum", "inputs": ["y"]}}, "total"), "total"),
    "transpose_sum": (lambda x, _f=fg.fuse(add_sum): _f(x, x.T), lambda x: _spec("transpose_sum", x, {
        "xt": {"op": "transpose", "inputs": ["x"]}, "both": {"op": "add", "inputs": ["x", "xt"]},
        "total": {"op": "sum", "inputs": ["both"]}}, "total"), "total"),
}


@contextlib.contextmanager
def sections():
    """Inside, the runner's steps (:data:`SECTIONS`) add their seconds to the dict it yields."""
    spent: dict[str, float] = defaultdict(float)
    undo = []
    for label, owner, attr in SECTIONS:
        original = owner.__dict__.get(attr) if owner is not None else None
        if original is None:
            continue

        def timed(*args, _f=original, _label=label, **kwargs):
            t0 = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_label] += time.perf_counter() - t0

        setattr(owner, attr, functools.wraps(original)(timed))
        undo.append((owner, attr, original))
    soon = session_module.Session.__dict__["memory_summary_soon"]  # asked for now, answered when the run waits

    def asked(session, _soon=soon):
        answer = _soon(session)

        def waited():
            t0 = time.perf_counter()
            try:
                return answer()
            finally:
                if threading.current_thread() is threading.main_thread():
                    spent[WAITED] += time.perf_counter() - t0
        return waited

    session_module.Session.memory_summary_soon = asked
    undo.append((session_module.Session, "memory_summary_soon", soon))
    try:
        yield spent
    finally:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)


@contextlib.contextmanager
def round_trips():
    """Inside, each blocking call of this thread to the cluster (``Client.sync``: a gather, a
    ``client.run``, an RPC to the scheduler) is counted, by the name of what it called."""
    seen: Counter = Counter()
    original = Client.sync

    def counted(self, func, *args, **kwargs):
        if threading.current_thread() is threading.main_thread() and not kwargs.get("asynchronous"):
            seen[getattr(func, "__name__", None) or getattr(func, "name", None) or repr(func)] += 1
        return original(self, func, *args, **kwargs)

    Client.sync = counted
    try:
        yield seen
    finally:
        Client.sync = original


def calls_per_run(fn, repeats: int) -> str:
    with round_trips() as seen:
        for _ in range(repeats):
            fn()
    total = sum(seen.values()) / repeats
    return f"{total:g} ({', '.join(f'{k} {v / repeats:g}' for k, v in sorted(seen.items()))})"


def interleaved(fns, repeats: int) -> tuple[list[float], list[float]]:
    """The median ms of each of ``fns``, run in turn ``repeats`` times (so that a machine that slows
    down or speeds up meanwhile weighs on all of them alike): wall time, and the CPU time of this
    thread (what the run costs the caller whatever else the machine does)."""
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, w, c in zip(fns, wall, cpu):
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            w.append(time.perf_counter() - t0)
            c.append(time.thread_time() - c0)
    return [statistics.median(t) * 1e3 for t in wall], [statistics.median(t) * 1e3 for t in cpu]


def parser():
    p = harness.parser(__spec__.name, __doc__, cpu="a CPU Session (NumPy chunks); else one GPU", repeats=15)
    p.add_argument("--local", action="store_true", help="dask's threaded scheduler, no Session (session='local')")
    p.add_argument("--rows", type=int, default=1024, help="rows (and columns) of the square float32 input")
    p.add_argument("--chunks", type=int, default=4, help="chunks per axis")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N of a cProfile of the YAML runs")
    return p


def probe(args) -> None:
    n = args.rows
    rows_per_chunk = max(1, n // args.chunks)
    host = np.random.default_rng().random((n, n), dtype=np.float32)
    ratios = {}
    with contextlib.ExitStack() as stack:
        cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="flowgpu-yaml-cost-"))
        stack.enter_context(dask.config.set({"flowgpu.cache.directory": cache}))
        if args.local:
            session, client = "local", None
            stack.enter_context(dask.config.set(scheduler="threads"))
        else:
            workers = {"backend": "cpu", "n_workers": 1} if args.cpu else {"backend": "gpu", "gpus": [0]}
            session = stack.enter_context(fg.Session(**workers, dashboard_address=None))  # as the suite's
            client = session.client
            stack.enter_context(client.as_current())
            stack.enter_context(dask.config.set(scheduler=client))
        x = da.from_array(host, chunks=(rows_per_chunk, rows_per_chunk))
        if not args.cpu:
            x = x.map_blocks(import_cupy().asarray)
        if client is not None:
            x = client.persist(x)
        data.ARRAYS["x"] = x
        want = None
        where = "dask threads" if args.local else f"a {'CPU' if args.cpu else 'GPU'} Session"
        print(f"{n}x{n} float32 in {args.chunks}x{args.chunks} chunks, on {where}; medians of {args.repeats}")
        for name, (func, make_spec, output) in WORKLOADS.items():
            spec = make_spec(host)
            want = float(func(da.from_array(host.astype(np.float64))).compute(scheduler="sync"))

            def python():
                return float(func(x).compute())

            def yaml():
                result = pipeline.run(spec, session=session, progress=False, overwrite=True, force=True)
                return float(result.outputs[output])

            for fn in (python, yaml):
                got = fn()
                if abs(got - want) > 1e-4 * abs(want):
                    raise SystemExit(f"{name} {fn.__name__}: {got} != {want}")
            (t_py, t_yaml), (c_py, c_yaml) = interleaved((python, yaml), args.repeats)
            ratios[name] = t_yaml / t_py
            print(f"\n{name}: Python API {t_py:.2f} ms, YAML {t_yaml:.2f} ms, YAML/Python {t_yaml / t_py:.2f}x, "
                  f"extra {t_yaml - t_py:+.2f} ms per run")
            print(f"  this thread's CPU per run: Python API {c_py:.2f} ms, YAML {c_yaml:.2f} ms, "
                  f"extra {c_yaml - c_py:+.2f} ms")
            if client is not None:
                print(f"  blocking calls to the cluster per run: Python {calls_per_run(python, 3)}; "
                      f"YAML {calls_per_run(yaml, 3)}")
            with sections() as spent:
                for _ in range(args.repeats):
                    yaml()
            for label, _, _ in SECTIONS:
                if label in spent:
                    print(f"  {label:38s} {spent[label] / args.repeats * 1e3:7.2f} ms")
            if args.profile:
                print(harness.profiled(yaml, args.repeats, args.profile))
        data.ARRAYS.clear()
    print()
    for name, ratio in ratios.items():
        verdict = "ok" if ratio <= TARGET else "OVER"
        print(f"check {name}: YAML/Python {ratio:.2f}x (target <= {TARGET}x): {verdict}")


def main(argv=None) -> int:
    return harness.captured_main(parser, probe, argv)


if __name__ == "__main__":
    sys.exit(main())
