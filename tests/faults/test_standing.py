"""A cluster that stays up between runs, with real processes: `python -m flowgpu cluster start`, `status`,
`run` against it, `stop`, and a `kill -9` of its daemon.

Each test has a cluster folder of its own (DASK_FLOWGPU__CLUSTER__DIRECTORY in tmp_path), and ends
with every process the cluster had (the daemon, its workers, and whatever else ran below it) gone:
checked with psutil by pid and start time, so a reused pid cannot pass for a live one.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
from distributed import Client
from distributed.security import Security

import flowgpu as fg

ROOT = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"

pytestmark = pytest.mark.timeout(240)

SPEC = """\
version: 1
name: standing
params:
  seed: {type: int, default: 0}
inputs:
  x: {source: random, shape: [SHAPE], seed: "${params.seed}", chunks: [CHUNK, -1]}
steps:
  total: {op: sum, inputs: [x]}
outputs:
  total: {from: total}
"""
SHAPE, CHUNK = (1200, 700), 300


def _env(folder: Path, fault: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FLOWGPU_TEST_FAULT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["DASK_FLOWGPU__CLUSTER__DIRECTORY"] = str(folder)
    if fault:
        env["FLOWGPU_TEST_FAULT"] = fault
    return env


def flowgpu(*args: str, folder: Path, cwd: Path, timeout: float = 150, fault: str | None = None
            ) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=_env(folder, fault),
                       capture_output=True, text=True, timeout=timeout)
    assert TRACEBACK not in r.stderr, r.stderr
    return r


# a GPU worker's process holds the CUDA context, CuPy and pinned staging on the host: at 1 GiB the nanny
# killed it on the H200 (the run said so and wrote nothing), so it gets 8 GiB
WORKERS = {"cpu": ("--backend", "cpu", "--workers", "2", "--threads-per-worker", "1", "--memory-limit", "1GiB"),
           "gpu": ("--backend", "gpu", "--gpus", "0", "--memory-limit", "8GiB")}


def start(folder: Path, cwd: Path, backend: str = "cpu", fault: str | None = None) -> dict:
    """Start a small cluster (its daemon under ``fault``); its state as `cluster status --json` gives it,
    with every process below the daemon now (``all_pids``)."""
    r = flowgpu("cluster", "start", *WORKERS[backend], "--dashboard-address",
                "127.0.0.1:0", folder=folder, cwd=cwd, fault=fault)
    assert r.returncode == 0, r.stderr
    state = status(folder, cwd)
    assert state["address"] in r.stdout and "flowgpu cluster stop" in r.stdout
    link = next(line.split(": ", 1)[1] for line in r.stdout.splitlines() if line.startswith("dashboard: "))
    assert link.endswith("/flowgpu")  # the flowgpu page is there before the first run
    said = flowgpu("cluster", "status", folder=folder, cwd=cwd).stdout
    assert f"dashboard: {link}\n" in said, said  # the same link as start printed, not Dask's /status
    assert "note: the dashboard is plain HTTP with no login: any user of this host can read its pages" in r.stderr
    assert "the scheduler itself speaks TLS" in r.stderr  # a cluster that stays up speaks TLS unless --no-tls
    with urllib.request.urlopen(link, timeout=60) as page:
        assert page.status == 200 and b"flowgpu" in page.read()
    daemon = psutil.Process(state["daemon"]["pid"])
    state["all_pids"] = {p.pid: p for p in [daemon, *daemon.children(recursive=True)]}
    state["names"] = {pid: _named(p) for pid, p in state["all_pids"].items()}
    assert set(state["worker_pids"]) <= set(state["all_pids"]), "the workers are the daemon's children"
    return state


def status(folder: Path, cwd: Path) -> dict:
    r = flowgpu("cluster", "status", "--json", folder=folder, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def runs(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE  # is_running also compares start times
    except psutil.NoSuchProcess:
        return False


def _named(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()[:4])
    except psutil.Error:
        return "(gone)"


def left_running(state: dict) -> list[int]:
    return [pid for pid, p in state["all_pids"].items() if runs(p)]


def stopped(folder: Path, cwd: Path) -> subprocess.CompletedProcess:
    return flowgpu("cluster", "stop", folder=folder, cwd=cwd)


@pytest.fixture
def places(tmp_path):
    folder, work = tmp_path / "cluster", tmp_path / "work"
    work.mkdir()
    yield folder, work
    if (folder / "cluster.json").exists():  # a failed test still stops its cluster
        stopped(folder, work)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_start_status_run_stop_leaves_no_process(places, rng, backend):
    folder, work = places
    state = start(folder, work, backend)
    n = 2 if backend == "cpu" else 1
    assert state["backend"] == backend and state["n_workers"] == n and len(state["worker_pids"]) == n
    assert state["address"].startswith("tls://") and state["answers"] == n
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("cluster.json", "tls-ca.pem", "tls-cert.pem", "tls-key.pem", "cluster.log"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    text = flowgpu("cluster", "status", folder=folder, cwd=work)
    assert text.returncode == 0 and state["address"] in text.stdout and f"workers: {n} x" in text.stdout

    seed = int(rng.integers(2**31))
    (work / "s.yaml").write_text(SPEC.replace("SHAPE", ", ".join(map(str, SHAPE))).replace("CHUNK", str(CHUNK)))
    r = flowgpu("run", "s.yaml", "--set", f"params.seed={seed}", "--summary", "summary.json", folder=folder, cwd=work)
    assert r.returncode == 0, r.stderr
    assert f"using the running cluster at {state['address']} (flowgpu cluster start" in r.stderr
    assert "--standalone for a cluster of its own" in r.stderr
    summary = json.loads((work / "summary.json").read_text())
    assert summary["session"]["address"] == state["address"]
    expected = fg.random(SHAPE, seed=seed, chunks=(CHUNK, -1)).compute().astype(np.float64).sum()
    assert abs(summary["outputs"]["total"]["value"] - expected) <= 1e-9 * expected
    cluster = [state["daemon"]["pid"], *state["worker_pids"]]  # not every descendant: some are short-lived
    ended = [f"{pid} {state['names'][pid]}" for pid in cluster if not runs(state["all_pids"][pid])]
    log = (folder / "cluster.log").read_text(errors="replace").splitlines()[-25:]
    assert not ended, f"the run took the cluster down: {ended} ended; cluster.log ends:\n" + "\n".join(log)

    r = stopped(folder, work)
    assert r.returncode == 0 and state["address"] in r.stdout, r.stderr
    assert left_running(state) == [], "stop returned with processes of the cluster still running"
    assert not (folder / "cluster.json").exists() and not (folder / "tls-key.pem").exists()
    r = flowgpu("cluster", "status", folder=folder, cwd=work)
    assert r.returncode == 1 and r.stdout.strip() == "no cluster running"


@pytest.mark.slow
def test_a_killed_daemon_leaves_no_worker_and_status_removes_its_state(places):
    folder, work = places
    state = start(folder, work)
    os.kill(state["daemon"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60  # nothing asks them to go: the workers see the daemon's pipe close
    while left_running(state) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left_running(state) == [], "workers outlived their killed daemon"
    assert (folder / "cluster.json").exists()
    r = flowgpu("cluster", "status", folder=folder, cwd=work)
    assert r.returncode == 1 and r.stdout.strip() == "no cluster running"
    assert "no longer running" in r.stderr and f"daemon pid {state['daemon']['pid']} is gone" in r.stderr
    assert not (folder / "cluster.json").exists() and not (folder / "tls-key.pem").exists()


@pytest.mark.slow
def test_a_daemon_that_does_not_close_is_killed_with_its_workers(places, tmp_path):
    folder, work = places
    state = start(folder, work, fault=f"cluster:stopping@pause={tmp_path}")  # told to stop, it hangs
    t0 = time.monotonic()
    r = flowgpu("cluster", "stop", "--timeout", "3", folder=folder, cwd=work)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "cluster-stopping.reached").exists()
    assert "did not exit within 3s; killing them" in r.stderr and str(state["daemon"]["pid"]) in r.stderr
    assert time.monotonic() - t0 < 60
    assert left_running(state) == [] and not (folder / "cluster.json").exists()


@pytest.mark.slow
def test_second_start_is_refused_and_plain_tcp_cannot_join(places):
    folder, work = places
    state = start(folder, work)
    r = flowgpu("cluster", "start", "--backend", "cpu", "--workers", "1", folder=folder, cwd=work)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"a cluster is already running at {state['address']}" in r.stderr and "flowgpu cluster stop" in r.stderr
    assert status(folder, work)["daemon"] == state["daemon"], "the refused start touched the running cluster"

    port = state["address"].rpartition(":")[2]
    with pytest.raises((OSError, TimeoutError)):
        Client(f"tcp://127.0.0.1:{port}", timeout=3, set_as_default=False)
    tls = state["tls"]
    sec = Security(tls_ca_file=tls["tls_ca_file"], tls_client_cert=tls["tls_cert"], tls_client_key=tls["tls_key"],
                   require_encryption=True)
    with Client(state["address"], security=sec, timeout=60, set_as_default=False) as c:
        clients = c.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.clients))
    assert len([k for k in clients if k != "fire-and-forget"]) == 2, clients  # the daemon's own and this one

    r = flowgpu("run", "--standalone", str(ROOT / "pipelines" / "quickstart.yaml"), "--set", "params.n=200",
                "--set", f"params.out={work / 'q'}", "--summary", "s.json", folder=folder, cwd=work)
    assert r.returncode == 0 and "using the running cluster" not in r.stderr, r.stderr
    assert json.loads((work / "s.json").read_text())["session"]["address"] != state["address"]
    assert stopped(folder, work).returncode == 0
    assert left_running(state) == []


def test_stop_and_status_with_no_cluster_say_so(places):
    folder, work = places
    r = stopped(folder, work)
    assert r.returncode == 1 and r.stderr.strip() == "error: no cluster running; nothing to stop"
    r = flowgpu("cluster", "status", "--json", folder=folder, cwd=work)
    assert r.returncode == 1 and json.loads(r.stdout) is None


USER_SPEC = """\
name: user-module
inputs:
  x: {source: random, shape: [400, 30], seed: SEED, chunks: [100, -1]}
steps:
  y: {op: map_blocks, inputs: [x], args: {function: "myfns:scaled"}}
  total: {op: sum, inputs: [y]}
outputs:
  total: {from: total}
"""


@pytest.mark.slow
def test_a_module_beside_the_spec_reaches_the_running_clusters_workers_as_it_is_now(places, rng):
    """The standing workers never had the spec's folder on their path, and would keep a module they
    imported once: the function travels with the tasks, so the second run sees the edited code."""
    folder, work = places
    seed = int(rng.integers(1 << 30))
    (work / "spec.yaml").write_text(USER_SPEC.replace("SEED", str(seed)))
    (work / "myfns.py").write_text("def scaled(block):\n    return block * 2.0\n")
    start(folder, work)
    x = fg.random((400, 30), seed=seed, chunks=(100, -1)).compute()
    first = flowgpu("run", "spec.yaml", "--json", folder=folder, cwd=work)
    assert first.returncode == 0, first.stderr
    assert "using the running cluster" in first.stderr
    np.testing.assert_allclose(json.loads(first.stdout)["outputs"]["total"]["value"], 2 * x.sum())
    (work / "myfns.py").write_text("def scaled(block):\n    return block * -3.0\n")
    second = flowgpu("run", "spec.yaml", "--json", folder=folder, cwd=work)
    assert second.returncode == 0, second.stderr
    assert "recipe changed" in second.stderr  # the module's code is part of the output's recipe
    np.testing.assert_allclose(json.loads(second.stdout)["outputs"]["total"]["value"], -3 * x.sum())
    assert stopped(folder, work).returncode == 0


@pytest.mark.slow
def test_a_cluster_stopped_during_a_run_is_said_in_one_line_and_the_old_output_stays(places, rng):
    """`flowgpu cluster stop` during a run ended it with distributed's 'Failed to reconnect to scheduler
    after 10.00 seconds' log line and "pipeline ... was cancelled: cancelled"."""
    folder, work = places
    seed = int(rng.integers(1 << 30))
    (work / "spec.yaml").write_text(USER_SPEC.replace("SEED", str(seed)).replace("[400, 30]", "[4000, 30]")
                                    + "  y: {from: y, path: out/y.npy}\n")
    (work / "myfns.py").write_text("def scaled(block):\n    return block * 2.0\n")
    state = start(folder, work)
    assert flowgpu("run", "spec.yaml", folder=folder, cwd=work).returncode == 0
    old = np.load(work / "out" / "y.npy")
    np.testing.assert_array_equal(old, 2 * fg.random((4000, 30), seed=seed, chunks=(100, -1)).compute())
    (work / "myfns.py").write_text("import time\n\ndef scaled(block):\n    time.sleep(1.0)\n    return block * -3.0\n")
    run = subprocess.Popen([sys.executable, "-m", "flowgpu", "run", "spec.yaml"], cwd=work, env=_env(folder, None),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = []
    while not said or not said[-1].startswith("flowgpu running"):  # the run joined; its 40 blocks take 20 s
        said.append(run.stderr.readline())
        assert said[-1], "".join(said)
    time.sleep(3)
    assert stopped(folder, work).returncode == 0
    out, err = run.communicate(timeout=120)
    lines = [line for line in "".join(said).splitlines() + err.splitlines() if line.strip()]
    assert run.returncode == 1 and not out
    assert lines[-1] == (
        f"error: pipeline 'user-module' stopped: the cluster (scheduler at {state['address']}) went away during "
        "the run (stopped, or its machine or network failed); no output was written or replaced (not written: "
        "out/y.npy, as they were before the run). Start it again ('flowgpu cluster start', or your scheduler) "
        "and run again, or run with --standalone for a cluster of the run's own"), err
    assert not [line for line in lines if "distributed" in line or TRACEBACK in line], err
    np.testing.assert_array_equal(np.load(work / "out" / "y.npy"), old)
