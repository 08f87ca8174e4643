"""Session on the CPU: starts a local cluster, closes everything it started, joins clusters by address."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import urllib.request
import warnings
from urllib.parse import urlsplit

import dask
import dask.array as da
import numpy as np
import psutil
import pytest
from distributed import LocalCluster
from distributed.security import Security

import flowgpu as fg
from flowgpu import config
from flowgpu.arrays.chunks import target_chunk_bytes
from flowgpu.errors import SessionError
from tests.tolerance import assert_within_terms


def _children() -> set[int]:
    """Child processes, less multiprocessing's resource tracker (it lives as long as this process)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def _wait_gone(pids: set[int], timeout: float = 60) -> set[int]:
    deadline = time.time() + timeout
    alive = pids
    while alive and time.time() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.2)
    return alive


def _worker_facts() -> tuple:
    return config.get("worker.budget"), config.get("worker.threads")


def test_cpu_session_runs_and_leaves_no_process(rng):
    before = _children()
    facts_before = _worker_facts()
    data = rng.standard_normal((300, 200))
    with fg.Session(backend="cpu", n_workers=2, threads_per_worker=1, memory_limit="1GiB",
                    dashboard_address="127.0.0.1:0") as s:
        started = _children() - before
        assert len(s.workers) == 2 and s.backend == "cpu" and s.array_backend == "numpy"
        assert s.dashboard_link and s.dashboard_link.startswith("http://127.0.0.1:")
        assert s.client.scheduler.address.startswith("tcp://127.0.0.1:")
        assert fg.current_session() is s
        x = fg.from_array(data, chunks=(100, 50))
        got = float((x + x.T[:200, :300].T).sum().compute())
        # 60000 normals: the sum may be near zero, its rounding error follows sum(|2 * data|)
        assert_within_terms(got, float((2 * data).sum()), float(np.abs(2 * data).sum()), 64)
        # what a worker can fill before distributed pauses it (0.8 of its limit), less its process's memory
        budget = s.info()["worker_budget"]
        assert 0.8 * (1 << 30) - 300e6 < budget < 0.8 * (1 << 30)
        assert _worker_facts() == (budget, 1)  # published for chunks="auto" while open
    assert fg.current_session() is not s
    assert _worker_facts() == facts_before  # and put back on close
    assert started, "the session should have started worker processes"
    assert not _wait_gone(started), "worker processes outlived the session"


def _listening(pid: int) -> set[int]:
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_the_dashboard_off_means_no_http_server(rng):
    """``flowgpu cluster start --dashboard-address ''`` said "dashboard: off" while its scheduler served
    its /info pages on 8787 (its workers /metrics), and ``flowgpu convert`` (dashboard off) warned "Port
    8787 is already in use" beside a cluster that held it: now only the cluster's own comm ports listen."""
    held = socket.socket()
    with contextlib.suppress(OSError):  # 8787 taken, as by a standing cluster (or already is)
        held.bind(("127.0.0.1", 8787))
        held.listen()
    before = _listening(os.getpid())
    data = rng.random((300, 200))
    try:
        with warnings.catch_warnings(record=True) as said, fg.Session(
                backend="cpu", n_workers=1, threads_per_worker=1, memory_limit="1GiB", dashboard_address=None) as s:
            warnings.simplefilter("always")
            assert float(fg.from_array(data, chunks=(100, 200)).sum().compute()) == pytest.approx(data.sum())
            comms = {urlsplit(a).port for a in [s.client.scheduler.address, *s.workers,
                                                 *(n.address for n in s.cluster.workers.values())]}
            listening = (_listening(os.getpid()) - before).union(*(_listening(w["pid"]) for w in s.workers.values()))
            assert s.dashboard_link is None
    finally:
        held.close()
    assert listening == comms, f"ports other than the cluster's comms listen: {sorted(listening - comms)}"
    assert not [str(w.message) for w in said if "already in use" in str(w.message)]


@pytest.mark.parametrize("dashboard", [False, True])
def test_a_joined_scheduler_without_a_dashboard_gives_no_link(dashboard):
    """``flowgpu cluster start --dashboard-address ''``: its scheduler still serves /health over HTTP,
    and a run that joined it printed a dashboard link that answered 404."""
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0",
                      scheduler_kwargs={"dashboard": dashboard}) as cluster:
        with fg.Session(address=cluster.scheduler_address) as s:
            link = s.dashboard_link
            if not dashboard:
                assert link is None
            else:
                with urllib.request.urlopen(link, timeout=30) as page:
                    assert page.status == 200 and b"Dask" in page.read()


def test_join_existing_cluster_leaves_it_running():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        facts_before = _worker_facts()
        with fg.Session(cluster.scheduler_address) as s:
            assert s.cluster is None and s.backend == "cpu"
            assert _worker_facts() == (s.worker_budget, 1)
            assert s.memory_summary() is None  # the workers keep dask's own store
            x = fg.random((100, 100), seed=3, chunks=50)
            assert 0 < float(x.mean().compute()) < 1
        assert _worker_facts() == facts_before
        assert cluster.scheduler.status.name == "running"
        assert len(cluster.scheduler.workers) == 1


def test_join_a_tls_cluster_with_its_credentials(rng):
    data = rng.standard_normal((200, 100))
    with fg.Session(backend="cpu", n_workers=1, threads_per_worker=1, memory_limit="1GiB", dashboard_address=None,
                    security="temporary") as owner:
        address = owner.client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        with fg.Session(address, security=owner.cluster.security) as s:  # a Security of the caller's own
            assert s.cluster is None and s.info()["address"] == address
            got = float(fg.from_array(data, chunks=50).sum().compute())
            assert_within_terms(got, data.sum(), np.abs(data).sum(), 64)
        with pytest.raises(SessionError, match="could not reach .* TLS certificate"):
            fg.Session(address, security=Security.temporary(), connect_timeout="2s")  # another key: refused
        assert owner.client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.workers)) == 1


def test_unreachable_address_fails_within_timeout():
    t = time.time()
    with pytest.raises(SessionError) as info:
        fg.Session("tcp://127.0.0.1:9", connect_timeout="2s")
    assert "tcp://127.0.0.1:9" in str(info.value)
    assert time.time() - t < 60  # connect_timeout ends the wait: no hang (speed is for benchmarks/)


def test_chunks_that_cannot_fit_a_worker(cpu_session):
    with pytest.raises(fg.FlowgpuError, match="largest chunk"):
        fg.random((40_000, 40_000), chunks=(40_000, 40_000))


def test_auto_chunks_follow_the_worker_budget(cpu_session):

    target = target_chunk_bytes()
    assert target <= cpu_session.worker_budget // 8
    x = fg.random((20_000, 20_000), dtype="float32", chunks="auto")
    assert max(x.chunks[0]) * max(x.chunks[1]) * 4 <= target * 1.01


def test_failed_start_leaves_no_process():
    before = _children()
    with pytest.raises(SessionError, match="203.0.113.7"):
        fg.Session(backend="cpu", n_workers=1, host="203.0.113.7", dashboard_address=None)  # not our address
    assert not _wait_gone(_children() - before)


@pytest.mark.slow
def test_memory_summary_reports_what_the_workers_spilled(rng):
    seed = int(rng.integers(2**31))
    # a worker holds ~300 MB of imports where xarray and pandas are installed (dask.array imports them)
    x = da.random.default_rng(seed).standard_normal(2**26, chunks=2**20)  # 512 MiB in 8 MiB chunks
    with fg.Session(backend="cpu", n_workers=1, threads_per_worker=1, memory_limit="500MB",
                    dashboard_address=None) as s:
        first = s.memory_summary()
        assert first == {"stores": ["flowgpu"], "moves": {}, "events": {}, "errors": [],
                         "workers": {w: {"moves": {}, "events": {}} for w in first["workers"]}}
        assert len(first["workers"]) == 1
        xp = x.persist()
        got = float(xp.sum().compute())
        summary = s.memory_summary()
    np.testing.assert_allclose(got, float(x.sum().compute(scheduler="threads")), rtol=1e-9)
    assert summary["stores"] == ["flowgpu"] and not summary["errors"]
    # the host tier holds 60% of 500 MB: the rest of the 512 MiB went to disk
    assert summary["moves"]["host_to_disk"]["bytes"] >= 2**29 - 0.6 * 500e6


def _probe_var():
    return os.environ.get("FLOWGPU_PROBE_VAR")


def test_a_clusters_worker_environment_neither_leaks_nor_is_overridden_by_an_earlier_one(monkeypatch):
    """distributed's nanny writes pre-spawn-environ into this process's environment and prefers what
    it finds there: flowgpu sets the variables itself while workers spawn, and puts them back."""
    from distributed import Client

    from flowgpu.runtime.session import spawn_environ

    monkeypatch.setenv("FLOWGPU_PROBE_VAR", "1")  # what an earlier Session's workers left behind
    with dask.config.set({"distributed.nanny.pre-spawn-environ.FLOWGPU_PROBE_VAR": "0"}), \
            spawn_environ({"FLOWGPU_PROBE_VAR": "0"}):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        with Client(cluster) as c:
            assert set(c.run(_probe_var).values()) == {"0"}
    finally:
        cluster.close()
    assert os.environ["FLOWGPU_PROBE_VAR"] == "1"
