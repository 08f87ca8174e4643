"""flowgpu.runtime.standing from Python: what a run is told about the cluster that stays up, stale and
unsafe folders, and start/run/stop through the library (a real daemon process, plain TCP here; the
CLI and TLS are tests/faults/test_standing.py's)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import dask.config
import numpy as np
import psutil
import pytest
from rich.console import Console

import flowgpu as fg
from flowgpu import pipeline, runtime
from flowgpu.errors import ClusterError, ClusterRunningError, ConfigError
from flowgpu.io import lock
from flowgpu.runtime import standing


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "cluster"
    with dask.config.set({"flowgpu.cluster.directory": str(path)}):
        yield path


def _fake_state(folder, daemon: dict, **facts) -> dict:
    """A state as the daemon writes it, owned by ``daemon`` (a :func:`lock.owner` record)."""
    folder.mkdir(mode=0o700, exist_ok=True)
    state = {"address": "tcp://127.0.0.1:1", "dashboard": None, "backend": "cpu", "n_workers": 2,
             "threads_per_worker": 1, "gpus": [], "daemon": daemon, "workers": {}, "worker_pids": [],
             "started": 0.0, "flowgpu": fg.__version__, "tls": None, "log": str(folder / "cluster.log"),
             "options": {"backend": "cpu", "n_workers": 2, "threads_per_worker": 1}, **facts}
    standing.record(str(folder), state)
    return state


def test_no_cluster_no_join(folder):
    assert standing.status() is None and standing.session_kwargs() is None and standing.stop() is None
    with pytest.raises(ClusterError, match=r"no cluster started with 'flowgpu cluster start' is running .*fg.Session\(\)"):
        fg.Session.running()


def test_join_says_what_the_running_cluster_lacks(folder):
    _fake_state(folder, lock.owner())  # "alive": this process stands in for the daemon
    kwargs, line = standing.join({"n_workers": 4, "backend": "gpu", "threads_per_worker": 1, "connect_timeout": 3})
    assert kwargs == {"address": "tcp://127.0.0.1:1", "connect_timeout": 3}
    assert line == ("using the running cluster at tcp://127.0.0.1:1 (flowgpu cluster start; cpu, 2 worker(s); not "
                    "the n_workers=4, backend=gpu asked for); --standalone for a cluster of its own")
    _, plain = standing.join({})
    assert "asked for" not in plain
    assert standing.join({"address": "tcp://elsewhere:8786"}) is None  # a scheduler of its own wins
    with dask.config.set({"flowgpu.scheduler-address": "tcp://elsewhere:8786"}):
        assert standing.join({}) is None


def test_a_state_whose_daemon_is_gone_is_removed_and_said(folder):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    record = {"pid": dead.pid, "host": lock.owner()["host"], "start": psutil.Process(dead.pid).create_time()}
    dead.wait()
    _fake_state(folder, record)
    said = []
    assert standing.status(notify=said.append) is None
    assert len(said) == 1 and f"daemon pid {dead.pid} is gone" in said[0]
    assert not (folder / standing.STATE).exists()


def test_a_stale_state_takes_the_workers_its_daemon_left_with_it(folder):
    """The safety net behind distributed's own (a worker exits when its daemon dies): a recorded worker
    still running when status finds the daemon gone is killed."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    daemon = {"pid": dead.pid, "host": lock.owner()["host"], "start": psutil.Process(dead.pid).create_time()}
    dead.wait()
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    worker = {"pid": left.pid, "host": daemon["host"], "start": psutil.Process(left.pid).create_time()}
    _fake_state(folder, daemon, workers={"tcp://127.0.0.1:2": worker}, worker_pids=[left.pid])
    said = []
    assert standing.stop(notify=said.append) is None
    assert not lock.alive(worker), "the worker its daemon left still runs"  # killed and reaped
    left.wait(timeout=60)
    assert "killed 1 process(es) it left" in said[0]


def test_a_folder_others_may_open_is_refused(folder):
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o755)
    with pytest.raises(ConfigError, match="open to others .*chmod 700"):
        standing.status()


@pytest.mark.timeout(180)
def test_start_run_stop_from_python(folder, rng, monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "current_session", lambda: None)  # as if no other test had left a Session open
    state = standing.start(tls=False, backend="cpu", n_workers=1, threads_per_worker=2, memory_limit="1GiB",
                           dashboard_address="", notify=None)
    try:
        assert state["address"].startswith("tcp://") and state["tls"] is None
        with pytest.raises(ClusterRunningError, match="already running"):
            standing.start(backend="cpu", notify=None)
        seed = int(rng.integers(2**31))
        spec = {"name": "p", "inputs": {"x": {"source": "random", "shape": [900, 40], "seed": seed, "chunks": [300, -1]}},
                "steps": {"m": {"op": "max", "inputs": ["x"]}}, "outputs": {"m": {"from": "m"}}}
        out = io.StringIO()
        result = pipeline.run(spec, console=Console(file=out, width=300), cluster={"n_workers": 3})
        assert "using the running cluster at tcp://" in out.getvalue() and "not the n_workers=3" in out.getvalue()
        assert result.summary["session"]["address"] == state["address"]
        assert result.outputs["m"] == float(np.max(fg.random((900, 40), seed=seed, chunks=(300, -1)).compute()))
        # from Python: the same cluster, joined explicitly; a relative path is the client's, not the daemon's
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        want = np.random.default_rng(seed).standard_normal((120, 30)).astype("float32")
        with fg.Session.running(backend="cpu") as s:
            assert s.client.scheduler.address == state["address"] and s.cluster is None  # joined, not started
            fg.to_zarr(fg.from_array(want, chunks=(40, 30)), "rel.zarr")
            back = fg.from_zarr("rel.zarr").compute()
        np.testing.assert_array_equal(back, want)
        assert (work / "rel.zarr").is_dir()
        # what the running cluster cannot be is said, as `flowgpu run` says it; what no join takes is refused
        with pytest.warns(UserWarning, match=r"was not started with n_workers=4, threads_per_worker=8; it is used "
                                             r"as it is"), fg.Session.running(n_workers=4, threads_per_worker=8) as s:
            assert len(s.client.scheduler_info(n_workers=-1)["workers"]) == 1
        with pytest.raises(ConfigError, match="Session got keyword 'bogus_kw', which no Session joining a cluster"):
            fg.Session.running(bogus_kw=1)
    finally:
        stopped = standing.stop(notify=None)
    assert stopped["daemon"] == state["daemon"]
    procs = [psutil.Process(r["pid"]) for r in [state["daemon"], *state["workers"].values()] if lock.alive(r)]
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in procs), "a process of the stopped cluster runs"
    assert standing.status() is None
    assert "stopped" in (folder / "cluster.log").read_text()  # the log stays, for what happened
