"""Timing, checking and reporting shared by the benchmark workloads.

Every column is warmed up once, then timed ``repeats`` times; the median is reported. A column that
raises records its error and the run goes on. Each result is checked against a reference computed
in float64 (or by the library's own reference routine), and the check is reported next to the time.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

COLUMNS_GPU = ("floor", "raw CuPy", "CuPy fused", "dask-cuda", "flowgpu API", "flowgpu YAML")
COLUMNS_CPU = ("floor", "NumPy", "numba fused", "dask threaded", "flowgpu API", "flowgpu YAML")


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


@dataclass
class Workload:
    """One workload: the minimal bytes (or flops) it must move, and its columns' results."""

    name: str
    work: float  # bytes (unit GB/s) or flops (unit TFLOP/s)
    unit: str = "GB/s"
    floor_s: float | None = None
    results: list[Result] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def column(self, column: str, fn: Callable[[], Any], check: Callable[[Any], str] | None = None, *,
               repeats: int = 3, sync: Callable[[], None] | None = None, note: str = "") -> Result:
        """Time ``fn`` (warm-up, then median of ``repeats``), check its value, never raise."""
        res = Result(self.name, column, unit=self.unit, note=note)
        try:
            value = fn()
            if sync:
                sync()
            res.check = check(value) if check else "not checked"
            del value
            for _ in range(repeats):
                t0 = time.perf_counter()
                value = fn()
                if sync:
                    sync()
                res.times.append(time.perf_counter() - t0)
                del value
            res.time_s = statistics.median(res.times)
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


def environment() -> dict[str, Any]:
    import dask
    import numpy

    env = {"python": platform.python_version(), "machine": platform.machine(), "node": platform.node(),
           "dask": dask.__version__, "numpy": numpy.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    for mod in ("cupy", "dask_cuda", "distributed", "numba"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:
            pass
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        env["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:
        pass
    try:
        import os

        env["cpus"] = len(os.sched_getaffinity(0))
    except Exception:
        pass
    return env


def write(out_dir: str, name: str, workloads: list[Workload], columns: tuple[str, ...], extra: dict) -> str:
    import os

    os.makedirs(out_dir, exist_ok=True)
    table = markdown(workloads, columns)
    doc = {"environment": environment(), **extra,
           "workloads": [{"name": w.name, "work": w.work, "unit": w.unit, "floor_s": w.floor_s, "notes": w.notes,
                          "results": [asdict(r) for r in w.results]} for w in workloads]}
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(table + "\n")
    return table
