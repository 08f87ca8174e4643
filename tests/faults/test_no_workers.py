"""A run whose cluster loses every worker, and none comes back, stops after flowgpu.run.no-workers-timeout
and says what happened to them (distributed alone waits for a worker for ever, silently)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}

SLOW = '''
import os, time
def slow(block, marker=""):
    open(os.path.join(marker, f"started-{os.getpid()}"), "w").close()
    time.sleep(600)
    return block
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_left_without_workers_stops_and_says_so(tmp_path):
    (tmp_path / "slowfuncs.py").write_text(SLOW)
    (tmp_path / "s.yaml").write_text(
        "inputs: {x: {source: random, shape: [40, 8], chunks: [10, 8], seed: 3}}\n"
        f"steps: {{y: {{op: map_blocks, inputs: [x], args: {{function: 'slowfuncs:slow', kwargs: {{marker: '{tmp_path}'}}}}}},"
        " s: {op: sum, inputs: [y]}}\n"
        "outputs: {s: {from: s}, y: {from: y, sink: npy, path: out/y.npy}}\n")
    sched_file = tmp_path / "scheduler.json"
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", str(sched_file),
                              "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"], env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [sched]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                   str(sched_file), "--no-nanny", "--nthreads", "1"], env=ENV,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # no nanny: none restarts it
        procs.append(worker)
        run = subprocess.Popen([sys.executable, "-m", "flowgpu", "run", "s.yaml", "--scheduler", str(sched_file),
                                "--quiet"], cwd=tmp_path, env={**ENV, "DASK_FLOWGPU__RUN__NO_WORKERS_TIMEOUT": "3s"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(run)
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("started-*")):
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.2)
        os.kill(worker.pid, signal.SIGKILL)  # the cluster's only worker, in the middle of a task
        started = time.monotonic()
        out, err = run.communicate(timeout=120)  # without the watch: no worker, and the run waits for ever
        assert run.returncode == 1, err
        assert time.monotonic() - started < 60
        said = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(said) == 1 and "Traceback" not in err, err
        assert "the cluster has had no worker for 3s, so the run was stopped: 1 worker(s) left it" in said[0]
        running = re.search(r"; (\d+) task\(s\) were running on them\) and none came back", said[0])
        assert running and int(running.group(1)) >= 1, said[0]  # the one it ran, and those queued on it
        assert said[0].endswith("Nothing was written")
        assert not (tmp_path / "out" / "y.npy").exists() and not list((tmp_path / "out").glob(".*tmp*"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=60)
