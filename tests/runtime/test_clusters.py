"""Any Dask cluster: a cluster object the caller made (Session(cluster=...)), and batch jobs through
dask-jobqueue (Session(kind="slurm"), flowgpu run --cluster slurm): what flowgpu asks of them and
what it leaves to them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import dask
import numpy as np
import pytest
from dask_jobqueue import SLURMCluster
from distributed import Client, LocalCluster

import flowgpu as fg
from flowgpu import pipeline
from flowgpu.errors import ConfigError, SessionError, SpecError
from flowgpu.runtime import hpc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHONPATH = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])


def test_a_cluster_object_is_used_as_it_is_and_left_running(rng, tmp_path, monkeypatch):
    data = rng.random((300, 40))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with fg.Session(cluster=cluster) as s:
            assert s.backend == "cpu" and s.n_workers == 2 and s.cluster is None and s.given is cluster
            assert {w["cwd"] for w in s.info()["workers"]} == {os.getcwd()}
            x = fg.from_array(data, chunks=(100, 40))
            np.testing.assert_allclose(float((x * 2 + 1).sum().compute()), (data * 2 + 1).sum(), rtol=1e-12)
            monkeypatch.chdir(tmp_path)
            result = pipeline.run({"name": "obj", "inputs": {"x": {"source": "normal", "shape": [50, 4], "seed": 3}},
                                   "steps": {"m": {"op": "mean", "inputs": ["x"]}}, "outputs": {"m": {"from": "m"}}},
                                  progress=False)  # the current Session: the caller's cluster
            assert result.summary["session"]["n_workers"] == 2
            assert [w["host"] for w in result.summary["session"]["workers"]] == [os.uname().nodename] * 2
        with Client(cluster) as c:  # still there: it is the caller's to close
            assert len(c.scheduler_info(n_workers=-1)["workers"]) == 2


def test_one_cluster_at_a_time():
    with pytest.raises(ConfigError, match="give one of address=, cluster= and kind="):
        fg.Session("tcp://127.0.0.1:1", cluster=object())


def test_gpu_jobs_ask_slurm_for_gpus_and_run_dask_cuda_workers(monkeypatch):
    kwargs = hpc.cluster_kwargs("slurm", gpus_per_job=2, threads_per_worker=None, memory_limit="auto",
                                local_directory="/scratch/me", dashboard_address=None, security=None)
    assert kwargs["processes"] == 2 and kwargs["cores"] == 8 and kwargs["memory"] == 2 * hpc.DEFAULT_MEMORY
    with SLURMCluster(**kwargs) as cluster:  # made, never scaled: no job is submitted
        script = cluster.job_script()
    assert "#SBATCH --gres=gpu:2" in script
    command = script.strip().splitlines()[-1]
    assert " -m dask cuda worker " in command
    assert "--nthreads 4" in command and "--memory-limit 4.00GiB" in command and "--local-directory /scratch/me" in command


def test_jobqueue_config_wins_where_flowgpu_is_not_told_otherwise(monkeypatch):
    with dask.config.set({"jobqueue.slurm.cores": 6, "jobqueue.slurm.memory": "12GiB", "jobqueue.slurm.processes": 3}):
        kw = hpc.cluster_kwargs("slurm", gpus_per_job=0, threads_per_worker=None, memory_limit="auto",
                                local_directory=None, dashboard_address=None, security=None)
        assert (kw["cores"], kw["memory"], kw["processes"]) == (6, "12GiB", 3) and "worker_command" not in kw
        kw = hpc.cluster_kwargs("slurm", gpus_per_job=0, threads_per_worker=2, memory_limit=2 << 30,
                                local_directory=None, dashboard_address=None, security=None)
        assert (kw["cores"], kw["memory"], kw["processes"]) == (6, 6 << 30, 3)


def test_without_dask_jobqueue_the_message_says_what_to_install(monkeypatch):
    monkeypatch.setattr(hpc, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"needs dask-jobqueue, which is not installed: pip install \"flowgpu\[hpc\]\""):
        fg.Session(kind="slurm")


def test_a_spec_sending_its_run_to_batch_jobs_needs_confirming(tmp_path):
    spec = {"name": "hpc", "inputs": {"x": {"source": "random", "shape": [4]}}, "outputs": {"x": {"from": "x"}},
            "cluster": {"kind": "slurm", "jobs": 4}}
    with pytest.raises(SpecError, match=r"sends this run, and its data, to batch jobs of 'slurm'.*--cluster slurm"):
        pipeline.validate(spec)
    pipeline.validate(spec, cluster={"kind": "slurm"})
    pipeline.validate(spec, allow_spec_address=True)
    pipeline.validate({**spec, "cluster": {"kind": "local"}})


def _slurm_reason() -> str | None:
    if shutil.which("srun") is None:
        return "no Slurm here (`.ci/slurm start` installs and starts one, as root)"
    done = subprocess.run(["srun", "-N1", "-t", "1", "hostname"], capture_output=True, text=True, timeout=60)
    return None if done.returncode == 0 else f"srun hostname failed: {done.stderr.strip()[:200]}"


@pytest.fixture
def slurm(monkeypatch, tmp_path):
    reason = _slurm_reason()
    if reason:
        if os.environ.get("FLOWGPU_REQUIRE_SLURM"):
            pytest.fail(reason)
        pytest.skip(reason)
    monkeypatch.setenv("PYTHONPATH", PYTHONPATH)  # the jobs' workers import this flowgpu
    with dask.config.set({"jobqueue.slurm.walltime": "00:10:00", "jobqueue.slurm.log-directory": str(tmp_path)}):
        yield


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_session_of_slurm_jobs_computes_and_gives_its_jobs_back(slurm, rng):
    data = rng.random((400, 30))
    with fg.Session(kind="slurm", jobs=2, memory_limit="2GiB", dashboard_address=None) as s:
        assert s.n_workers == 2 and s.backend == "cpu" and s.info()["kind"] == "slurm"
        assert str(s.client.scheduler.address).startswith("tls://")  # the jobs span hosts: TLS by default
        jobs = {j for j in s.cluster.workers.values()}
        assert len(jobs) == 2
        x = fg.from_array(data, chunks=(100, 30))
        np.testing.assert_allclose(float(abs(x - 0.5).max().compute()), np.abs(data - 0.5).max(), rtol=0)
        ids = [j.job_id for j in jobs]
    deadline = time.monotonic() + 60  # scancel was sent at close; Slurm ends the jobs (state CG, then gone)
    while True:
        left = subprocess.run(["squeue", "-h", "-t", "PD,R", "-j", ",".join(ids), "-o", "%i"], capture_output=True,
                              text=True).stdout.split()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert left == [], f"jobs still pending or running a minute after the Session closed: {left}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_flowgpu_run_cluster_slurm(slurm, tmp_path, rng):
    data = rng.random((64, 8)).astype("f4")
    np.save(tmp_path / "a.npy", data)
    (tmp_path / "s.yaml").write_text(
        "name: s\ninputs: {a: {source: npy, path: a.npy}}\nsteps: {m: {op: max, inputs: [a]}}\n"
        "outputs: {m: {from: m}, c: {from: a, sink: npy, path: out/c.npy}}\n")
    done = subprocess.run([sys.executable, "-m", "flowgpu", "run", "s.yaml", "--cluster", "slurm", "--jobs", "1",
                           "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, DASK_JOBQUEUE__SLURM__MEMORY="2GiB"))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["outputs"]["m"]["value"] == float(data.max())
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "c.npy"), data)
    assert summary["session"]["n_workers"] == 1


@pytest.mark.timeout(180)
def test_workers_without_flowgpu_are_said_in_one_message(tmp_path):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", str(sched_file),
                               "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                       str(sched_file), "--preload", os.path.join(ROOT, "tests", "runtime",
                                                                                  "no_flowgpu_preload.py")],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(scheduler_file=str(sched_file), timeout=60) as c:
            c.wait_for_workers(1, timeout=60)
        with pytest.raises(SessionError, match=r"cannot run flowgpu's code \(.*flowgpu.*\): install flowgpu .* in the "
                                               r"workers' environment too"):
            fg.Session(str(sched_file))
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
