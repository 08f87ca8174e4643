"""One answer wherever it runs: every shipped spec and a spec per source and sink, run by `flowgpu run`
as users run it, on four kinds of cluster, give bit-identical values and written files.

(a) own:      the run's own local cluster (`flowgpu run --standalone`);
(b) standing: `flowgpu cluster start` started from another folder (its workers run in /);
(c) joined:   `dask scheduler` and `dask worker` started in another folder, with another HOME and
              TMPDIR (a stand-in for another host that mounts the same storage);
(d) slurm:    a real Slurm (`.ci/slurm start`) through `--cluster slurm --jobs 2`, the jobs' workers
              moved into another folder by jobqueue's job-script-prologue.

On a GPU host (a, b) are GPU clusters and (c) runs `dask cuda worker`: the GPU variant.

Every spec reads and writes by relative paths, from a copy of its folder per deployment; inputs are
fresh random data. Values are also checked against NumPy where the spec's answer is easy to state.
Where Slurm cannot run here, (d) skips saying why; with FLOWGPU_REQUIRE_SLURM=1 (CI) it fails instead.
"""

from __future__ import annotations

import hashlib
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
from distributed import Client
from scipy import ndimage

from tests.conftest import GPU

ROOT = Path(__file__).resolve().parents[2]
SPECS = Path(__file__).parent / "specs"
DEPLOYMENTS = ("own", "standing", "joined", "slurm")
START = 180  # seconds a cluster may take to start on a busy 2-core machine; only bounds a hang

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

# spec (in SHIPPED: pipelines/, else tests/deploy/specs/) -> the `flowgpu run` arguments after it
CASES = {
    "quickstart": ["--set", "params.n=400", "--set", "params.rows_per_chunk=100"],
    "quickstart_batch": ["--set", "params.n=120", "--set", "params.rows_per_chunk=40"],
    "standardize": ["--set", "params.rows=6000", "--set", "params.cols=48"],
    "transpose_sum": ["--set", "params.n=600", "--set", "params.chunk=150"],
    "denoise": ["--set", "params.input=data/stack.zarr"],
    "denoise_synthetic": ["--set", "params.frames=3", "--set", "params.size=64"],
    "sources": [],
    "files": [],
    "composed": [],
    "tiles": [],
}
SHIPPED = {"quickstart", "quickstart_batch", "standardize", "transpose_sum", "denoise", "denoise_synthetic"}


def _env(**more: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               **more)
    env["DASK_FLOWGPU__THREADS_PER_WORKER"] = "1"  # the same chunk sizing everywhere
    env["DASK_FLOWGPU__DASHBOARD_ADDRESS"] = "127.0.0.1:0"
    env.pop("DASK_FLOWGPU__CACHE__DIRECTORY", None)  # each copy its own cache, under its folder
    return env


def _data(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"a": rng.random((200, 16), dtype=np.float32), "b": rng.random((200, 16), dtype=np.float32),
            "stack": rng.random((3, 48, 40), dtype=np.float32),
            **{f"t{i}": rng.random((64, 48), dtype=np.float32) for i in range(3)},
            "h": rng.random((200, 16), dtype=np.float32), "pages": rng.integers(0, 1000, (5, 24, 20), dtype=np.uint16),
            "tiff": rng.integers(0, 1000, (5, 24, 20), dtype=np.uint16),
            "air": 250 + 40 * rng.random((12, 10), dtype=np.float32)}


def _workdir(base: Path, data: dict[str, np.ndarray]) -> Path:
    """A folder of every spec and its data, as a user's project folder: specs, modules, data/."""
    shutil.copytree(SPECS, base)
    for name in SHIPPED:
        shutil.copy(ROOT / "pipelines" / f"{name}.yaml", base / f"{name}.yaml")
    (base / "data" / "tiles").mkdir(parents=True)
    np.save(base / "data" / "a.npy", data["a"])
    for name, chunks in (("b", (50, 16)), ("stack", (1, 48, 40))):
        z = zarr.create_array(str(base / "data" / f"{name}.zarr"), shape=data[name].shape, chunks=chunks,
                              dtype=data[name].dtype)
        z[:] = data[name]
    for i in range(3):
        np.save(base / "data" / "tiles" / f"t{i}.npy", data[f"t{i}"])
    _format_files(base / "data", data)
    return base


def _format_files(folder: Path, data: dict[str, np.ndarray]) -> None:
    """files.yaml's inputs: an HDF5 dataset, TIFF pages (p0.tif ...), a multi-page TIFF file, and one
    labelled variable (time, lat) as xarray writes it to NetCDF and to Zarr."""
    import h5py
    import tifffile
    import xarray as xr

    with h5py.File(folder / "fields.h5", "w") as f:
        f.create_dataset("/fields/h", data=data["h"], chunks=(25, 16), compression="gzip")
    (folder / "pages").mkdir()
    for i, page in enumerate(data["pages"]):
        tifffile.imwrite(folder / "pages" / f"p{i}.tif", page)
    tifffile.imwrite(folder / "stack.tif", data["tiff"])
    air = xr.Dataset({"air": (("time", "lat"), data["air"], {"units": "K"})},
                     coords={"time": np.arange(12), "lat": np.linspace(-45.0, 45.0, 10)})
    air.to_netcdf(folder / "air.nc", engine="h5netcdf")
    air.chunk({"time": 3}).to_zarr(folder / "air.zarr", mode="w", zarr_format=3, consolidated=False)


def _wait_file(path: Path, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + START
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (exit {proc.poll()})")
        time.sleep(0.2)


def _slurm_reason() -> str | None:
    """Why Slurm cannot run jobs here, or None."""
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        return "no Slurm here (sbatch/srun not found; `.ci/slurm start` installs and starts one as root)"
    try:
        out = subprocess.run(["srun", "-N1", "-t", "1", "hostname"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "srun hostname did not answer within 60 s"
    return None if out.returncode == 0 else f"srun hostname failed: {out.stderr.strip()[:200]}"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """The clusters of (b) and (c), started once from folders of their own, and (d)'s settings; yields
    deployment -> (extra `flowgpu run` arguments, environment) or a skip reason."""
    base = tmp_path_factory.mktemp("deploy")
    out: dict[str, object] = {"own": (["--standalone", "--workers", "2"], _env())}
    procs: list[subprocess.Popen] = []
    # (b) a cluster that stays up, started from another folder
    cluster_dir = base / "standing-state"
    elsewhere_b = base / "elsewhere-standing"
    elsewhere_b.mkdir()
    env_b = _env(DASK_FLOWGPU__CLUSTER__DIRECTORY=str(cluster_dir))
    started = subprocess.run([sys.executable, "-m", "flowgpu", "cluster", "start", "--workers", "2",
                              "--threads-per-worker", "1", "--memory-limit", "4GiB", "--dashboard-address", ""],
                             cwd=elsewhere_b, env=env_b, capture_output=True, text=True, timeout=START)
    assert started.returncode == 0, started.stderr
    out["standing"] = ([], env_b)
    # (c) a scheduler and workers in another folder, with another HOME and TMPDIR
    elsewhere_c = base / "elsewhere-joined"
    for sub in ("home", "tmp"):
        (elsewhere_c / sub).mkdir(parents=True)
    env_c = dict(_env(), HOME=str(elsewhere_c / "home"), TMPDIR=str(elsewhere_c / "tmp"))
    scheduler_file = elsewhere_c / "scheduler.json"
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
                              str(scheduler_file), "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"],
                             cwd=elsewhere_c, env=env_c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(sched)
    _wait_file(scheduler_file, sched, "dask scheduler")
    worker = (["-m", "dask", "cuda", "worker"] if GPU else ["-m", "distributed.cli.dask_worker", "--nworkers", "2"])
    procs.append(subprocess.Popen([sys.executable, *worker, "--scheduler-file", str(scheduler_file), "--nthreads", "1",
                                   "--memory-limit", "4GiB"],
                                  cwd=elsewhere_c, env=env_c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    out["joined"] = (["--scheduler", str(scheduler_file)], _env())
    # (d) Slurm jobs, whose workers move to another folder before they start
    reason = _slurm_reason()
    if reason is None:
        elsewhere_d = base / "elsewhere-slurm"
        (elsewhere_d / "logs").mkdir(parents=True)
        env_d = _env(DASK_JOBQUEUE__SLURM__CORES="1", DASK_JOBQUEUE__SLURM__PROCESSES="1",
                     DASK_JOBQUEUE__SLURM__MEMORY="4GiB", DASK_JOBQUEUE__SLURM__WALLTIME="00:30:00",
                     DASK_JOBQUEUE__SLURM__LOG_DIRECTORY=str(elsewhere_d / "logs"),
                     DASK_JOBQUEUE__SLURM__JOB_SCRIPT_PROLOGUE=repr([f"cd {elsewhere_d}"]),
                     DASK_FLOWGPU__JOB_TIMEOUT="180s")
        out["slurm"] = (["--cluster", "slurm", "--jobs", "2"], env_d)
    else:
        out["slurm"] = reason
    try:
        # the joined workers are up before the first run joins
        deadline = time.monotonic() + START
        with Client(scheduler_file=str(scheduler_file), timeout=START) as c:
            c.wait_for_workers(1 if GPU else 2, timeout=max(deadline - time.monotonic(), 1))
        yield out
    finally:
        subprocess.run([sys.executable, "-m", "flowgpu", "cluster", "stop"], env=env_b, capture_output=True,
                       timeout=120)
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def _run(workdir: Path, spec: str, args: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "flowgpu", "run", f"{spec}.yaml", *CASES[spec], *args,
                           "--summary", "summary.json", "--quiet"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{spec} in {workdir}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return json.loads((workdir / "summary.json").read_text())


def _digest_tree(path: Path) -> dict[str, str]:
    """Every file of an output (a file or a store) by its bytes; flowgpu's marker (who wrote it, when) aside."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)) if p != path else ".": hashlib.blake2b(p.read_bytes()).hexdigest()
            for p in files if not p.name.endswith("flowgpu-output.json")}


def _results(summary: dict, workdir: Path) -> dict:
    """What a run produced, comparable across folders: values as they are, files by their bytes."""
    def outputs(outs: dict) -> dict:
        found = {}
        for name, o in outs.items():
            if o.get("location"):
                where = Path(o["location"])
                assert where.is_relative_to(workdir), f"output {name} written outside the run's folder: {where}"
                found[name] = (str(where.relative_to(workdir)), _digest_tree(where))
            else:
                found[name] = o["value"]
        return found

    if "items" in summary:
        return {json.dumps(i["params"], sort_keys=True): outputs(i["outputs"]) for i in summary["items"]}
    return outputs(summary["outputs"])


def _numpy_checks(spec: str, data: dict[str, np.ndarray], result: dict, workdir: Path) -> None:
    """The answers that are easy to state, against NumPy on the same data (float64 where it sums)."""
    if spec == "sources":
        np.testing.assert_allclose(result["a_mean"], data["a"].astype(np.float64).mean(), rtol=1e-5)
        np.testing.assert_allclose(result["b_mean"], data["b"].astype(np.float64).mean(), rtol=1e-5)
        assert result["b_max"] == float(data["b"].max())  # read, not the fill value: a max is exact
        abr = np.load(workdir / "out/sources/abr.npy")
        assert abr.shape == (200, 16) and np.isfinite(abr).all() and abr.std() > 0
    if spec == "files":
        np.testing.assert_allclose(result["h_mean"], data["h"].astype(np.float64).mean(), rtol=1e-5)
        assert result["h_max"] == float(data["h"].max())
        assert result["pages_sum"] == int(data["pages"].astype(np.int64).sum())
        np.testing.assert_array_equal(np.load(workdir / "out/files/projection.npy"),
                                      (data["pages"] + data["tiff"]).max(axis=0))
        assert result["air_z_max"] == float(data["air"].max())
        import xarray as xr
        with xr.open_dataset(workdir / "out/files/air_lat_mean.nc", engine="h5netcdf") as got:
            assert got["air_mean"].dims == ("lat",) and got["air_mean"].attrs["units"] == "K"
            np.testing.assert_allclose(got["lat"].values, np.linspace(-45.0, 45.0, 10))
            np.testing.assert_allclose(got["air_mean"].values, data["air"].astype(np.float64).mean(axis=0), rtol=1e-5)
    if spec == "denoise":
        want = ndimage.gaussian_filter(data["stack"].astype(np.float64), sigma=(0, 2.0, 2.0), mode="reflect")
        got = zarr.open_array(str(workdir / "flowgpu-output/denoise/denoised.zarr"), mode="r")[:]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(result["frame_means"], want.mean(axis=(1, 2)), rtol=1e-4)
    if spec == "tiles":
        for i in range(3):
            want = ndimage.gaussian_filter(data[f"t{i}"].astype(np.float64), sigma=1.5, mode="reflect")
            got = np.load(workdir / f"out/tiles/t{i}.smooth.npy")
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            row = (workdir / "out/tiles/peaks.csv").read_text().splitlines()[i + 1]
            assert row.startswith(f"data/tiles/t{i}.npy,") and np.float32(row.split(",")[1]) == np.float32(got.max())


@pytest.fixture(scope="module")
def data():
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"deployment matrix data seed: {seed}")
    return _data(np.random.default_rng(seed))


@pytest.mark.parametrize("spec", list(CASES))
def test_every_deployment_gives_the_same_bits(spec, clusters, data, tmp_path):
    ran: dict[str, dict] = {}
    skipped = {}
    for where in DEPLOYMENTS:
        setup = clusters[where]
        if isinstance(setup, str):
            skipped[where] = setup
            continue
        args, env = setup
        workdir = _workdir(tmp_path / where, data)
        summary = _run(workdir, spec, args, env)
        assert summary["status"] == "ok"
        ran[where] = _results(summary, workdir)
        _numpy_checks(spec, data, ran[where] if "items" not in summary else {}, workdir)
    first = ran["own"]
    for where, result in ran.items():
        assert result == first, f"{spec}: {where} differs from own"
    if skipped:
        if os.environ.get("FLOWGPU_REQUIRE_SLURM"):
            pytest.fail(f"deployments not run: {skipped}")
        pytest.skip(f"ran {sorted(ran)}; not run: {skipped}")
