"""A worker that cannot see a path the client sees: an error before anything is computed, never fill values.

The worker runs in a private mount namespace (``unshare --mount``) with empty tmpfs mounted over the
folders it must not see: the same host, the same paths, other contents, as on a host that does not
mount the client's storage. Zarr reads a store that is not there as fill values, so without the
check such a run read zeros and said ok.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from flowgpu import Session, from_npy, from_zarr, to_numpy
from flowgpu.errors import PathNotVisibleError

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _namespaces_reason(probe_dir: Path) -> str | None:
    """Why a worker cannot be given a private mount namespace here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare(1) here"
    probe_dir.mkdir(exist_ok=True)
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f"mount -t tmpfs tmpfs {probe_dir}"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"cannot mount in a private namespace: {done.stderr.strip()[:200]}"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project folder (data the worker sees, data it does not, an output folder it does not) and a
    scheduler with one worker that sees only part of it; yields (folder, scheduler file, data)."""
    base = tmp_path_factory.mktemp("invisible")
    reason = _namespaces_reason(base / "probe")
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng(np.random.SeedSequence().entropy % (2**32))
    data = {"hidden": rng.random((120, 30), dtype=np.float32), "seen": rng.random((120, 30), dtype=np.float32)}
    for folder in ("private", "shared", "results", "elsewhere"):
        (base / folder).mkdir()
    for name, folder in (("hidden", "private"), ("seen", "shared")):
        z = zarr.create_array(str(base / folder / f"{name}.zarr"), shape=(120, 30), chunks=(40, 30), dtype="float32")
        z[:] = data[name]
    np.save(base / "private" / "hidden.npy", data["hidden"])
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    sched_file = base / "elsewhere" / "scheduler.json"
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", str(sched_file),
                              "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"],
                             cwd=base / "elsewhere", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hide = " && ".join(f"mount -t tmpfs tmpfs {base / f}" for f in ("private", "results"))
    worker = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               f"{hide} && exec {sys.executable} -m distributed.cli.dask_worker --scheduler-file "
                               f"{sched_file} --nworkers 1 --nthreads 1"],
                              cwd=base / "elsewhere", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not sched_file.exists():
            assert time.monotonic() < deadline and sched.poll() is None, "the scheduler did not start"
            time.sleep(0.2)
        with Session(str(sched_file)) as s:  # the worker is up
            assert s.n_workers == 1
        yield base, sched_file, data
    finally:
        for p in (worker, sched):
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def _spec(base: Path, name: str, inputs: dict, outputs: dict) -> Path:
    path = base / f"{name}.yaml"
    steps = {f"{k}_max": {"op": "max", "inputs": [k]} for k in inputs}
    path.write_text(json.dumps({"name": name, "inputs": inputs, "steps": steps,
                                "outputs": {**{f"{k}_max": {"from": f"{k}_max"} for k in inputs}, **outputs}}))
    return path


def _run(base: Path, spec: Path, sched_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowgpu", "run", spec.name, "--scheduler", str(sched_file)],
                          cwd=base, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=PYTHONPATH))


def _written(base: Path) -> list[str]:
    return sorted(str(p.relative_to(base)) for p in base.rglob("*")
                  if not str(p.relative_to(base)).startswith(("private", "shared", "elsewhere", "probe"))
                  and p.suffix != ".yaml" and p.name != "results")


@pytest.mark.parametrize("source, path", [("zarr", "private/hidden.zarr"), ("npy", "private/hidden.npy")])
def test_an_input_the_worker_does_not_see_fails_before_computing(project, source, path):
    base, sched_file, _ = project
    spec = _spec(base, f"hidden_{source}", {"x": {"source": source, "path": path}},
                 {"copy": {"from": "x", "sink": "zarr", "path": f"out_{source}/copy.zarr"}})
    done = _run(base, spec, sched_file)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    said = errors[0]
    assert f"input 'x' ({source}): {base / path}" in said
    assert "is not there for worker tcp://127.0.0.1:" in said and f"(working directory {base / 'elsewhere'})" in said
    assert "the workers do not see this path: put it on storage every host mounts" in said
    assert _written(base) == [], "a refused run wrote something"


def test_an_output_folder_the_worker_does_not_see_fails_before_computing(project):
    base, sched_file, data = project
    spec = _spec(base, "hidden_out", {"x": {"source": "zarr", "path": "shared/seen.zarr"}},
                 {"copy": {"from": "x", "sink": "zarr", "path": "results/copy.zarr"}})
    done = _run(base, spec, sched_file)
    assert done.returncode == 2, done.stderr
    assert f"output {str(base / 'results/copy.zarr')!r}" in done.stderr and "is not there for worker" in done.stderr
    assert list((base / "results").iterdir()) == [], "the staging of a refused run is left"


def test_a_run_the_worker_can_see_reads_the_data(project):
    base, sched_file, data = project
    spec = _spec(base, "seen", {"x": {"source": "zarr", "path": "shared/seen.zarr"}},
                 {"copy": {"from": "x", "sink": "npy", "path": "seen_out/copy.npy"}})
    done = _run(base, spec, sched_file)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(base / "seen_out" / "copy.npy"), data["seen"])
    shutil.rmtree(base / "seen_out")


def test_python_code_on_a_joined_session_fails_in_the_task_never_with_fill_values(project, monkeypatch):
    base, sched_file, data = project
    monkeypatch.chdir(base)
    with Session(str(sched_file)) as s:
        assert s.n_workers == 1
        np.testing.assert_array_equal(to_numpy(from_zarr("shared/seen.zarr")), data["seen"])  # relative, read right
        with pytest.raises(PathNotVisibleError, match="private/hidden.zarr' is not there for worker tcp://"):
            from_zarr("private/hidden.zarr").max().compute()


def test_a_npy_file_the_worker_does_not_see_fails_the_task_and_the_worker_lives(project, monkeypatch):
    """The reader opened the file while it was unpickled: the worker stopped and the compute hung."""
    base, sched_file, data = project
    monkeypatch.chdir(base)
    with Session(str(sched_file)) as s:
        (address,) = s.client.scheduler_info(n_workers=-1)["workers"]
        with pytest.raises(PathNotVisibleError, match=rf"\.npy file '{base / 'private/hidden.npy'}' is not there for worker "
                                                      rf"{address} on host .* \(working directory {base / 'elsewhere'}\); "
                                                      "the workers do not see this path"):
            s.client.compute(from_npy("private/hidden.npy").sum()).result(timeout=120)
        seen = s.client.compute(from_zarr("shared/seen.zarr").sum()).result(timeout=120)  # the same worker computes on
        np.testing.assert_allclose(float(seen), data["seen"].sum(dtype=np.float64), rtol=1e-5)
        assert list(s.client.scheduler_info(n_workers=-1)["workers"]) == [address]
