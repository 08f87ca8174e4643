"""Record what the flowgpu dashboard page shows during an out-of-core pass, to draw it elsewhere.

``python -m benchmarks.probes.dashboard_record --out DIR [--gib 32] [--device-limit 8GB] [--cpu]``

A machine without a browser (the H200 host) records; :mod:`benchmarks.probes.dashboard_replay`
draws the recording in headless Chromium on another. The run: a ``random`` input of ``--gib`` GiB
(float32 on GPU, float64 on CPU), its mean, ``z = x - mean`` and ``sum(z**2)``, through
``flowgpu.pipeline.run`` on a fresh Session. ``z`` needs every chunk of ``x`` and the mean of
all of them, so all of ``x`` is held while the mean is made: above the device limit (GPU) or the
host tier (CPU) the store moves chunks down a tier and back up, which is what the page's
"moves between tiers" panel shows.

Meanwhile the board's view (what the page draws: steps, their states, bytes per tier over time,
GB/s; the same ``flowgpu_board`` call :mod:`flowgpu.diagnostics.monitor` makes) is read every
``--interval`` seconds into ``DIR/board.jsonl``, one ``{"t": epoch seconds, "view": ...}`` a
line; ``DIR/summary.json`` gets the machine (:func:`benchmarks.harness.environment`), the command,
the run summary (of the last of ``--passes`` runs) and the store's moves. The dashboard being off or the board not answering never
fails the run: the recording then has fewer lines. About a minute on one H200 at the defaults.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import dask

import flowgpu as fg
import flowgpu.config  # noqa: F401 - load flowgpu's defaults before setting one of them
from benchmarks import harness
from flowgpu import pipeline
from flowgpu.diagnostics import monitor
from flowgpu.diagnostics.dashboard import PLUGIN_NAME, DashboardPlugin
from flowgpu.memory import stats, summary

GiB = 1 << 30
COLUMNS = {"gpu": 131072, "cpu": 8192}  # row length: 512 KiB of float32 (GPU), 64 KiB of float64 (CPU)
CHUNK_ROWS = {"gpu": 512, "cpu": 256}  # 256 MiB chunks (GPU), 16 MiB (CPU)


def spec(gib: float, backend: str) -> dict:
    """The pipeline: ``x`` of ``gib`` GiB, ``mu = mean(x)``, ``total = sum((x - mu)**2)``."""
    dtype, item = ("float32", 4) if backend == "gpu" else ("float64", 8)
    cols, rows = COLUMNS[backend], CHUNK_ROWS[backend]
    n = max(rows, int(gib * GiB) // (cols * item) // rows * rows)
    return {
        "version": 1,
        "name": f"out-of-core-{backend}",
        "inputs": {"x": {"source": "random", "shape": [n, cols], "dtype": dtype, "seed": 42, "chunks": [rows, -1]}},
        "steps": {
            "mu": {"op": "mean", "inputs": ["x"]},
            "z": {"op": "expr", "inputs": {"x": "x", "mu": "mu"}, "args": {"expression": "x - mu"}},
            "z2": {"op": "square", "inputs": ["z"]},
            "total": {"op": "sum", "inputs": ["z2"]},
        },
        "outputs": {"mu": {"from": "mu"}, "total": {"from": "total"}},
    }


def session(a) -> fg.Session:
    """A Session whose store spills: flowgpu's store (as benchmarks/out_of_core/run.py), under a
    device limit (GPU) or a small worker memory limit (CPU: the host tier spills to disk)."""
    dashboard = None if a.dashboard.lower() in ("", "none", "off") else a.dashboard
    with dask.config.set({"flowgpu.spill.store": "flowgpu"}):
        if a.cpu:
            return fg.Session(backend="cpu", n_workers=1, threads_per_worker=2, memory_limit=a.memory_limit,
                              dashboard_address=dashboard)
        return fg.Session(backend="gpu", gpus=[0], device_memory_limit=a.device_limit, threads_per_worker=4,
                          dashboard_address=dashboard)


class Recorder:
    """Reads the board's view every ``interval`` seconds in a thread, one JSON line each."""

    def __init__(self, client, path: str, interval: float):
        self.client, self.path, self.interval = client, path, interval
        self.lines = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="board-recorder", daemon=True)

    def _view(self) -> dict | None:
        try:
            return self.client.sync(self.client.scheduler.flowgpu_board, action="view", run_id=None,
                                    callback_timeout=10)
        except Exception:  # noqa: BLE001 - no board (yet, or at all): this line is missing, the run goes on
            return None

    def _loop(self) -> None:
        with open(self.path, "w") as f:
            while True:
                t = time.time()
                view = self._view()
                if view is not None:
                    f.write(json.dumps({"t": t, "view": view}, default=str) + "\n")
                    f.flush()
                    self.lines += 1
                if self._stop.wait(max(self.interval - (time.time() - t), 0.0)):
                    break

    def __enter__(self) -> "Recorder":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(self.interval * 2)  # the board's samples of the run's end, and its finished state
        self._stop.set()
        self._thread.join(timeout=30)


def record(a, argv=None) -> dict:
    os.makedirs(a.out, exist_ok=True)
    backend = "cpu" if a.cpu else "gpu"
    gib = a.gib if a.gib is not None else (0.5 if a.cpu else 32.0)
    doc = {"command": harness.command(a, argv), "backend": backend, "gib": gib, "passes": a.passes,
           "device_limit": None if a.cpu else a.device_limit, "memory_limit": a.memory_limit if a.cpu else None,
           "started": time.time()}
    with session(a) as s:
        try:  # sample the workers' memory more often than the page needs: a short pass gets a curve
            s.client.register_plugin(DashboardPlugin(interval=a.interval), name=PLUGIN_NAME)
        except Exception as e:  # noqa: BLE001 - without the page the run still runs
            print(f"the dashboard plugin could not be registered: {e}", file=sys.stderr, flush=True)
        monitor.install(s.client)
        with Recorder(s.client, os.path.join(a.out, "board.jsonl"), a.interval) as rec:
            t0 = time.perf_counter()
            try:
                for _ in range(a.passes):
                    result = pipeline.run(spec(gib, backend), session=s, cache=False, progress=False)
                doc.update(status="ok", summary=result.summary, outputs=result.outputs)
            except Exception as e:  # noqa: BLE001 - the recording of a failed run is still worth keeping
                doc.update(status="failed", error=f"{type(e).__name__}: {e}")
            doc["seconds"] = time.perf_counter() - t0
        doc["store"] = summary(s.client.run(stats))
    doc["lines"] = rec.lines
    doc["environment"] = harness.environment()  # after the run: on GPU it makes a CUDA context here
    harness.write_json(os.path.join(a.out, "summary.json"), doc)
    if a.json:
        harness.write_json(a.json, doc)
    if doc["status"] != "ok":
        print(f"error: the run failed: {doc['error']}", file=sys.stderr, flush=True)
    moved = sum(m["bytes"] for m in doc["store"]["moves"].values())
    print(f"{doc['status']} in {doc['seconds']:.1f} s; {rec.lines} board views in {a.out}/board.jsonl; "
          f"the store moved {moved / GiB:.2f} GiB between tiers", flush=True)
    return doc


def parser():
    p = harness.parser(__spec__.name if __spec__ else "benchmarks.probes.dashboard_record", __doc__,
                       cpu="a small CPU run (one worker, its host tier spilling to disk) instead of the GPU")
    p.add_argument("--out", default="dashboard-recording",
                   help="folder of the recording (board.jsonl, summary.json; default dashboard-recording)")
    p.add_argument("--gib", type=float, default=None, help="GiB of input (default 32 on GPU, 0.5 on CPU)")
    p.add_argument("--device-limit", default="8GB", help="GPU: the worker's device memory limit (default 8GB)")
    p.add_argument("--memory-limit", default="600MB", help="CPU: the worker's memory limit (default 600MB)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between board views (default 0.5)")
    p.add_argument("--passes", type=int, default=1, help="runs of the pipeline, one after another (default 1)")
    p.add_argument("--dashboard", default="127.0.0.1:0",
                   help="where the dashboard listens (default: any free port; 'none': off, and then a run does not follow the page: nothing is recorded)")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    return 0 if record(a, argv)["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
