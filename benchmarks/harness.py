"""What every benchmark shares: its options, timing, the environment block and its output.

Every script runs the same way, from the repository root::

    python -m benchmarks.<kind>.<name> [--cpu] [--size small|full] [--repeats N] [--json PATH] [...]

and builds its command line with :func:`parser`. Timing (:func:`timed`) runs a warm-up, then
``repeats`` timed runs, and reports their median. Output (:class:`Report`) is a markdown table on
stdout, last, after one line naming the machine and the versions (:func:`environment`); with
``--json PATH`` the same rows, the environment and the command go to ``PATH`` as JSON.

The side-by-side suite also uses :class:`Workload`: every column is warmed up once, then timed
``repeats`` times; a column that raises records its error and the run goes on. Each result is
checked against a reference computed in float64 (or by the library's own reference routine), and
the check is reported next to the time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import math
import os
import platform
import pstats
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
SIZES = ("small", "full")


# ------------------------------------------------------------------------------------------ options
def parser(module: str, doc: str | None, *, cpu: str | None = None, size: str | None = None,
           repeats: int | None = None) -> argparse.ArgumentParser:
    """The command line of ``python -m <module>``, with the shared options.

    ``cpu``: the help of ``--cpu`` (None: the script has no CPU mode). ``size``: the help of
    ``--size small|full`` (default full; None: no such option). ``repeats``: the default of
    ``--repeats`` (timed runs after one warm-up; None: no such option). ``--json PATH`` always.
    """
    doc = (doc or "").strip()
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0] if doc else None,
                                epilog="\n".join(doc.splitlines()[1:]).strip() or None,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if cpu is not None:
        p.add_argument("--cpu", action="store_true", help=cpu)
    if size is not None:
        p.add_argument("--size", choices=SIZES, default="full", help=size)
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats,
                       help=f"timed runs after one warm-up; the median is reported (default {repeats})")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="also write the results, the environment and the command to PATH as JSON")
    p.set_defaults(prog=p.prog)
    return p


def command(args: argparse.Namespace, argv: Sequence[str] | None = None) -> str:
    """The command line that produced ``args`` (``argv``: what ``main`` was given, else sys.argv)."""
    return " ".join([args.prog, *(sys.argv[1:] if argv is None else argv)])


def ints(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (for the comma-separated sweep options)."""
    return [int(t) for t in text.split(",") if t.strip()]


# ------------------------------------------------------------------------------------------- timing
@dataclass
class Timed:
    median: float  # seconds
    times: list[float]
    value: Any = None  # what the last timed run returned
    values: list[Any] = field(default_factory=list)  # what each timed run returned, with keep=True


def timed(fn: Callable[[], Any], repeats: int = 3, *, sync: Callable[[], None] | None = None,
          warmup: int = 1, keep: bool = False) -> Timed:
    """Run ``fn`` ``warmup`` times, then time ``repeats`` runs (``sync`` after each, inside the
    timing: a GPU's queue is drained); the median seconds, each run's, and the last value (with
    ``keep``, every timed run's value: for results that must agree from run to run)."""
    sync = sync or (lambda: None)
    value, values = None, []
    for _ in range(warmup):
        value = fn()
        sync()
    times = []
    for _ in range(repeats):
        value = None  # the previous result is freed before the next run, not during it
        t0 = time.perf_counter()
        value = fn()
        sync()
        times.append(time.perf_counter() - t0)
        if keep:
            values.append(value)
    return Timed(statistics.median(times) if times else math.nan, times, value, values)


def median_ms(fn: Callable[[], Any], repeats: int = 5, *, sync: Callable[[], None] | None = None) -> float:
    """:func:`timed` in milliseconds, for profile rows; a row that raises prints its error and
    gives NaN, so that one broken row does not hide the others."""
    try:
        return timed(fn, repeats, sync=sync).median * 1e3
    except Exception as e:
        print(f"  error: {type(e).__name__}: {e}", flush=True)
        return math.nan


def profiled(fn: Callable[[], Any], repeats: int, top: int) -> str:
    """The top ``top`` functions, by cumulative time, of a cProfile of ``repeats`` calls of ``fn``."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


COLUMNS_GPU = ("floor", "raw CuPy", "CuPy fused", "dask-cuda", "dask, flowgpu's chunks", "flowgpu API",
               "plain dask on a Session", "flowgpu YAML")
COLUMNS_CPU = ("floor", "NumPy", "numba fused", "dask threaded", "dask, flowgpu's chunks", "flowgpu API",
               "plain dask on a Session", "flowgpu YAML")


@dataclass
class Result:
    workload: str
    column: str
    time_s: float | None = None
    times: list[float] = field(default_factory=list)
    rate: float | None = None  # GB/s (or TFLOP/s for matmul), from the workload's minimal traffic
    unit: str = "GB/s"
    floor_fraction: float | None = None  # floor time / this time (1.0 = at the physical floor)
    vs_raw: float | None = None  # this time / raw library time
    vs_dask: float | None = None  # this time / dask time
    check: str = ""
    error: str | None = None
    note: str = ""
    value: float | None = None  # the checked result, where it is a number


@dataclass
class Workload:
    """One workload: the minimal bytes (or flops) it must move, and its columns' results."""

    name: str
    work: float  # bytes (unit GB/s) or flops (unit TFLOP/s)
    unit: str = "GB/s"
    floor_s: float | None = None
    results: list[Result] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)  # how to make the data again (shape, dtype, seed)
    reference: float | None = None  # the float64 value every column is checked against

    def column(self, column: str, fn: Callable[[], Any], check: Callable[[Any], str] | None = None, *,
               repeats: int = 3, sync: Callable[[], None] | None = None, note: str = "") -> Result:
        """Time ``fn`` (warm-up, then median of ``repeats``), check its value, never raise."""
        res = Result(self.name, column, unit=self.unit, note=note)
        try:
            checked: list[str] = []

            def first() -> Any:  # the warm-up's value is the one checked
                value = fn()
                if not checked:
                    if sync:
                        sync()
                    checked.append(check(value) if check else "not checked")
                    if isinstance(value, (int, float)):
                        res.value = float(value)
                return value

            t = timed(first, repeats, sync=sync)
            del t.value
            res.check, res.times, res.time_s = checked[0], t.times, t.median
        except Exception as e:  # one broken column must not stop the suite
            res.error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            res.note = (res.note + " " if res.note else "") + traceback.format_exc(limit=-3).splitlines()[-1][:200]
        self.results.append(res)
        print(f"  {self.name:22s} {column:14s} " + (f"{res.time_s * 1e3:10.2f} ms  {res.check}" if res.time_s
              is not None else f"ERROR {res.error}"), flush=True)
        return res

    def skip(self, column: str, why: str) -> None:
        self.results.append(Result(self.name, column, unit=self.unit, error=why))
        print(f"  {self.name:22s} {column:14s} skipped: {why}", flush=True)

    def finish(self, raw: str, dask: str) -> None:
        """Fill rates and ratios once every column has run."""
        by = {r.column: r for r in self.results}
        t_raw = by.get(raw).time_s if raw in by else None
        t_dask = by.get(dask).time_s if dask in by else None
        if self.floor_s:
            self.results.insert(0, Result(self.name, "floor", time_s=self.floor_s, unit=self.unit,
                                          check="measured copy rate", note="minimal traffic / copy bandwidth"))
        for r in self.results:
            if r.time_s:
                scale = 1e9 if self.unit == "GB/s" else 1e12
                r.rate = self.work / r.time_s / scale
                if self.floor_s:
                    r.floor_fraction = self.floor_s / r.time_s
                if t_raw:
                    r.vs_raw = r.time_s / t_raw
                if t_dask:
                    r.vs_dask = r.time_s / t_dask


def rel_check(got: Any, want: float, tol: float) -> str:
    """``"ok (rel err 1e-08)"`` or ``"FAIL (...)"`` for a scalar result."""
    got = float(got)
    err = abs(got - want) / max(abs(want), 1e-300)
    return f"{'ok' if err <= tol else 'FAIL'} (rel err {err:.1e})"


def _fmt(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def cell(row: dict, key: str, template: str) -> str:
    """``row[key]`` through ``template`` (``"{:.2f}"``) when it is a number; else the value or ""."""
    v = row.get(key)
    return template.format(v) if isinstance(v, (int, float)) else (v or "")


def markdown(workloads: list[Workload], columns: tuple[str, ...]) -> str:
    lines = ["| workload | column | time (ms) | rate | fraction of floor | vs raw | vs dask | check |",
             "|---|---|---|---|---|---|---|---|"]
    for w in workloads:
        order = {c: i for i, c in enumerate(columns)}
        for r in sorted(w.results, key=lambda r: order.get(r.column, 99)):
            if r.error:
                lines.append(f"| {w.name} | {r.column} | — | — | — | — | — | {r.error} |")
                continue
            lines.append(
                f"| {w.name} | {r.column} | {r.time_s * 1e3:.2f} | {_fmt(r.rate, '.1f')} {r.unit} | "
                f"{_fmt(r.floor_fraction, '.2f')} | {_fmt(r.vs_raw, '.2f')}x | {_fmt(r.vs_dask, '.2f')}x | {r.check} |")
    notes = [f"- {w.name}: {n}" for w in workloads for n in w.notes]
    return "\n".join((["Notes:"] + notes + [""] if notes else []) + lines)  # the table comes last


# ------------------------------------------------------------------------------ environment, output
def environment() -> dict[str, Any]:
    """Date, machine, GPU and the versions that matter; never raises, never needs a GPU."""
    env: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "node": platform.node(),
                           "machine": platform.machine(), "python": platform.python_version()}
    try:
        env["cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        env["cpus"] = os.cpu_count()
    try:
        with open("/proc/meminfo") as f:
            env["memory_GiB"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    for mod, name in (("numpy", "numpy"), ("cupy", "cupy"), ("dask", "dask"), ("distributed", "distributed"),
                      ("dask_cuda", "dask-cuda"), ("numba", "numba"), ("zarr", "zarr")):
        try:
            env[name] = __import__(mod).__version__
        except Exception:
            pass
    if "cupy" in env:
        try:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(0)
            name = props["name"]
            env["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
            env["gpu_memory_GiB"] = round(props["totalGlobalMem"] / GiB, 1)
            env["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        except Exception:
            env["gpu"] = None
    return env


def environment_line(env: dict[str, Any]) -> str:
    """The environment block in one line: date | machine | GPU | versions."""
    machine = f"{env.get('machine')}, {env.get('cpus')} CPUs" + (
        f", {env['memory_GiB']:g} GiB" if "memory_GiB" in env else "")
    gpu = f"{env['gpu']} ({env.get('gpu_memory_GiB')} GiB)" if env.get("gpu") else "no GPU"
    versions = ", ".join(f"{k} {env[k]}" for k in ("python", "numpy", "cupy", "dask", "distributed", "dask-cuda",
                                                   "numba") if k in env)
    return f"{env['date']} | {env.get('node')}: {machine} | {gpu} | {versions}"


def _cell(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats get 4 significant digits, None and NaN a dash."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


class Report:
    """A script's output: free-form lines as it goes (:meth:`line`), a markdown table last
    (:meth:`finish`), the environment line above it, and with ``--json PATH`` all of it as JSON."""

    def __init__(self, args: argparse.Namespace, argv: Sequence[str] | None = None):
        self.args = args
        self.command = command(args, argv)
        self.lines: list[str] = []
        self.t0 = time.perf_counter()

    def line(self, text: str = "") -> None:
        """Print ``text`` now, and keep it for the JSON."""
        print(text, flush=True)
        self.lines.append(text)

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Inside, what is printed goes to stdout and, line by line, to the JSON (for probes that
        print one line per measurement)."""
        report = self

        class Tee(io.TextIOBase):
            def __init__(self, out):
                self.out, self.part = out, ""

            def write(self, text: str) -> int:
                self.out.write(text)
                *done, self.part = (self.part + text).split("\n")
                report.lines.extend(done)
                return len(text)

            def flush(self) -> None:
                self.out.flush()

        tee = Tee(sys.stdout)
        with contextlib.redirect_stdout(tee):
            try:
                yield
            finally:
                if tee.part:
                    report.lines.append(tee.part)

    def finish(self, headers: Sequence[str] = (), rows: Sequence[Sequence[Any]] = (), *, title: str = "",
               text: str | None = None, **extra: Any) -> str:
        """Print the environment line, ``title`` and the table (or ``text``, a table already
        rendered); write the JSON if asked. Returns what was printed last."""
        env = environment()
        out = text if text is not None else table(headers, rows) if headers else ""
        print(f"\n{environment_line(env)}\n" + (f"\n{title}\n" if title else "") + (f"\n{out}" if out else ""),
              flush=True)
        if self.args.json:
            doc = {"command": self.command, "environment": env, "wall_s": time.perf_counter() - self.t0,
                   **extra, "title": title, "headers": list(headers),
                   "rows": [dict(zip(headers, row)) for row in rows], "lines": self.lines}
            if text is not None:
                doc["table"] = text
            write_json(self.args.json, doc)
        return out


def write_json(path: str, doc: dict) -> None:
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)


def workloads_json(workloads: list[Workload]) -> list[dict]:
    return [{"name": w.name, "work": w.work, "unit": w.unit, "floor_s": w.floor_s, "notes": w.notes,
             "inputs": w.inputs, "reference": w.reference, "results": [asdict(r) for r in w.results]}
            for w in workloads]


def captured_main(make_parser: Callable[[], argparse.ArgumentParser], probe: Callable[[Any], None],
                  argv: Sequence[str] | None = None) -> int:
    """``main`` of a probe that prints line by line: parse, run ``probe(args)`` with its output
    captured into the report (``--json``), finish the report."""
    args = make_parser().parse_args(argv)
    report = Report(args, argv)
    with report.capture():
        probe(args)
    report.finish()
    return 0
