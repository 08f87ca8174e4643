"""Results stay deterministic: one spec run again and again gives the same bits.

The spec covers what a later change (task batching, fusion by default, other chunk placement) could
make order-dependent: counter-based random inputs, reductions over chunks (mean, std, sum), a
fused elementwise expression, a matmul, two Zarr outputs, an npy output and summary values. Every
run's output files (bytes on disk, flowgpu's marker files aside: they name the run) and summary
values (float64 bits) must equal the first run's.

On the CPU: 10 runs in this process on the shared 2-worker cluster, where tasks land on either
worker, and one ``python -m flowgpu run`` in a fresh process with a fresh cluster.

On the GPU (``@pytest.mark.gpu``): two runs on a GPU Session are compared with each other bit for
bit. Against the CPU's bits, only the random input is compared bit for bit (counter-based random
numbers are documented as identical on NumPy and CuPy); everything computed from it goes through
reductions and kernels whose rounding differs between NumPy and CuPy (summation order, fused
multiply-add), so it is compared within a few dozen float32 epsilons of the magnitudes rounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from flowgpu import pipeline
from tests.tolerance import assert_within_terms

ROOT = Path(__file__).resolve().parents[2]
RUNS = 10

pytestmark = pytest.mark.timeout(120)

SPEC = """
params:
  seed: {type: int, default: 0}
  out: {type: str, default: out}
inputs:
  x: {source: normal, shape: [600, 200], dtype: float32, seed: "${params.seed}", loc: 3.0, scale: 2.0,
      chunks: [100, -1]}
  w: {source: random, shape: [200, 48], dtype: float64, seed: "${params.seed}", chunks: [50, 48]}
steps:
  mu:     {op: mean, inputs: [x], args: {axis: 0, keepdims: true}}
  sigma:  {op: std, inputs: [x], args: {axis: 0, keepdims: true}}
  z:      {op: expr, inputs: {x: x, mu: mu, sigma: sigma}, args: {expression: "(x - mu) / sigma"}}
  z2:     {op: square, inputs: [z]}
  energy: {op: sum, inputs: [z2]}
  g:      {op: matmul, inputs: [z, w]}
  total:  {op: sum, inputs: [x]}
outputs:
  x: {from: x, sink: zarr, path: "${params.out}/x.zarr"}
  z: {from: z, sink: zarr, path: "${params.out}/z.zarr"}
  g: {from: g, sink: npy, path: "${params.out}/g.npy"}
  w: {from: w, sink: npy, path: "${params.out}/w.npy"}
  energy: {from: energy}
  total: {from: total}
cluster: {backend: cpu, n_workers: 2, threads_per_worker: 1}
"""
SUMMARY = ("energy", "total")


@pytest.fixture
def spec(tmp_path, rng) -> tuple[Path, int]:
    """The spec file and a fresh seed for it (the same seed for every run of one test)."""
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path, int(rng.integers(0, 2**31))


def fingerprint(out: Path, values: dict) -> dict[str, bytes]:
    """Every output file's bytes (by path under ``out``; flowgpu's markers name the run, so they are
    left out) and every summary value's float64 bits."""
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
             if p.is_file() and ".flowgpu-" not in p.name}
    assert {"x.zarr/zarr.json", "z.zarr/zarr.json", "g.npy", "w.npy"} <= set(files), sorted(files)
    return {**files, **{f"summary:{k}": np.asarray(values[k], dtype=np.float64).tobytes() for k in SUMMARY}}


def run_here(spec: tuple[Path, int], out: Path, session) -> dict[str, bytes]:
    path, seed = spec
    result = pipeline.run(str(path), overrides={"params.seed": seed, "params.out": str(out)}, session=session,
                          progress=False)
    return fingerprint(out, result.outputs)


def run_process(spec: tuple[Path, int], out: Path, *args: str) -> dict[str, bytes]:
    path, seed = spec
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    summary = out.parent / f"{out.name}.summary.json"
    done = subprocess.run([sys.executable, "-m", "flowgpu", "run", str(path), "--set", f"params.seed={seed}",
                           "--set", f"params.out={out}", "--summary", str(summary), "-q", *args],
                          cwd=path.parent, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    outputs = json.loads(summary.read_text())["outputs"]
    return fingerprint(out, {k: outputs[k]["value"] for k in SUMMARY})


def assert_same_bits(runs: list[dict[str, bytes]], what: str) -> None:
    first = runs[0]
    for i, run in enumerate(runs[1:], 1):
        assert run.keys() == first.keys(), f"{what}: run {i} wrote other files than run 0"
        differ = [k for k in first if run[k] != first[k]]
        assert not differ, f"{what}: run {i} differs from run 0 in {differ}: the same spec gave other bits"


@pytest.mark.slow
def test_ten_cpu_runs_and_a_fresh_process_give_the_same_bits(spec, tmp_path, cpu_session):
    runs = [run_here(spec, tmp_path / f"run{i}", cpu_session) for i in range(RUNS)]
    runs.append(run_process(spec, tmp_path / "process"))
    assert_same_bits(runs, "CPU")
    # the bits are also the right numbers: nothing lost or mixed up between chunks
    x = zarr.open_array(str(tmp_path / "run0" / "x.zarr"), mode="r")[...]
    assert x.dtype == np.float32 and x.shape == (600, 200) and 2.5 < float(x.mean()) < 3.5
    total = np.frombuffer(runs[0]["summary:total"], dtype=np.float64)[0]
    assert_within_terms(total, x.astype(np.float64).sum(), np.abs(x.astype(np.float64)).sum(), 64, np.float32)


def _cpu_reference(spec: tuple[Path, int], out: Path) -> dict[str, np.ndarray]:
    run_process(spec, out, "--backend", "cpu")
    with open(out.parent / f"{out.name}.summary.json") as f:
        summary = json.load(f)["outputs"]
    arrays = {k: zarr.open_array(str(out / f"{k}.zarr"), mode="r")[...] for k in ("x", "z")}
    return {**arrays, **{k: np.load(out / f"{k}.npy") for k in ("g", "w")},
            **{k: np.float64(summary[k]["value"]) for k in SUMMARY}}


@pytest.mark.gpu
def test_gpu_runs_give_the_same_bits_and_match_the_cpu(spec, tmp_path, gpu_session):
    """GPU vs GPU: bit for bit. GPU vs CPU: the random input bit for bit; what is computed from it
    within 64 float32 epsilons of the magnitudes it rounds (NumPy and CuPy sum in other orders)."""
    runs = [run_here(spec, tmp_path / f"gpu{i}", gpu_session) for i in range(2)]
    assert_same_bits(runs, "GPU")
    cpu = _cpu_reference(spec, tmp_path / "cpu")
    gpu_out = tmp_path / "gpu0"
    x = zarr.open_array(str(gpu_out / "x.zarr"), mode="r")[...]
    w = np.load(gpu_out / "w.npy")
    assert x.tobytes() == cpu["x"].tobytes(), "counter-based random numbers (float32 normal) differ on CuPy and NumPy"
    assert w.tobytes() == cpu["w"].tobytes(), "counter-based random numbers (float64 uniform) differ on CuPy and NumPy"
    x64 = x.astype(np.float64)
    mu, sigma = x64.mean(axis=0, keepdims=True), x64.std(axis=0, keepdims=True)
    z_exact = (x64 - mu) / sigma
    z_terms = (np.abs(x64) + np.abs(mu)) / sigma + np.abs(z_exact)  # what z's roundings scale with
    z = zarr.open_array(str(gpu_out / "z.zarr"), mode="r")[...]
    assert_within_terms(z, cpu["z"], z_terms, 64, np.float32)
    assert_within_terms(np.load(gpu_out / "g.npy"), cpu["g"], z_terms @ np.abs(w), 64, np.float32)
    energy, total = (np.frombuffer(runs[0][f"summary:{k}"], dtype=np.float64)[0] for k in SUMMARY)
    assert_within_terms(energy, cpu["energy"], float((2 * np.abs(z_exact) * z_terms + z_exact**2).sum()), 64,
                        np.float32)
    assert_within_terms(total, cpu["total"], float(np.abs(x64).sum()), 64, np.float32)
