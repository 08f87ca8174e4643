"""Fused kernels compiled once per machine: a second process loads them from flowgpu.cache.kernels."""

from __future__ import annotations

import glob
import json
import logging
import os
import subprocess
import sys
import textwrap

import dask
import numba
import numpy as np
import pytest

from flowgpu.fusion import kernel_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _kernel(c: float) -> str:
    """The source of a small kernel of its own (``c`` is a fresh random constant: nothing cached has it)."""
    return f"def fg_fused_test(n, in0):\n    acc = 0.0\n    for i in range(n):\n        acc += abs(in0[i] - {c!r})\n    return acc\n"


def _run(src: str, x: np.ndarray) -> float:
    """Build the kernel as a new process would (a new dispatcher) and run it."""
    func = kernel_cache.python_namespace(src, "fg_fused_test", {})["fg_fused_test"]
    return kernel_cache.cached(numba.njit(func))(len(x), x)


def _delta(before: dict) -> dict:
    now = kernel_cache.stats()
    return {k: now[k] - before[k] for k in now}


@pytest.fixture
def kernels(tmp_path):
    folder = tmp_path / "kernels"
    with dask.config.set({"flowgpu.cache.kernels": str(folder)}):
        yield folder


def test_a_new_dispatcher_loads_the_machine_code(kernels, rng):
    x, c = rng.standard_normal(1000), float(rng.random())
    src, want = _kernel(c), np.abs(x - c).sum()
    before = kernel_cache.stats()
    assert _run(src, x) == pytest.approx(want, rel=1e-12)
    assert _delta(before) == {"compiled": 1, "loaded": 0}
    assert glob.glob(str(kernels / "numba" / "__pycache__" / "*.nbc"))
    assert _run(src, x) == pytest.approx(want, rel=1e-12)
    assert _delta(before) == {"compiled": 1, "loaded": 1}
    assert os.stat(kernels).st_mode & 0o077 == 0  # it holds code this user runs: only theirs


def test_a_ufunc_loads_from_the_cache(kernels, rng):
    x, c = rng.standard_normal(500), float(rng.random())
    src = f"def fg_fused_map(in0):\n    return in0 * 2.0 - {c!r}\n"
    before = kernel_cache.stats()
    for _ in range(2):
        func = kernel_cache.python_namespace(src, "fg_fused_map", {})["fg_fused_map"]
        ufunc = kernel_cache.vectorize(func, [numba.float64(numba.float64)])
        np.testing.assert_array_equal(ufunc(x), x * 2.0 - c)
    assert _delta(before) == {"compiled": 1, "loaded": 1}


def test_a_gufunc_wrapper_is_built_here_around_a_cached_kernel(kernels, rng):
    """The kernel's machine code comes from the cache; its gufunc loop wrapper is built in each process
    (numba's gufunc cache is not used: a cached wrapper calling a cached kernel crashed the next one)."""
    x, c = rng.standard_normal(500), float(rng.random())
    body = (f"def fg_fused(in0):\n    acc = 0.0\n    for i in range(in0.shape[0]):\n"
            f"        acc += in0[i] * {c!r}\n    return acc\n")
    before = kernel_cache.stats()
    for _ in range(2):
        kern = kernel_cache.cached(numba.njit(kernel_cache.python_namespace(body, "fg_fused", {})["fg_fused"]))
        wrapper = kernel_cache.python_namespace("def fg_fused_g(in0, out):\n    out[0] = _body(in0)\n",
                                                "fg_fused_g", {"_body": kern})["fg_fused_g"]
        gufunc = kernel_cache.guvectorize(wrapper, [(numba.float64[:], numba.float64[:])], "(n)->()")
        assert gufunc(x) == pytest.approx((x * c).sum(), rel=1e-12)
    assert _delta(before)["compiled"] == 1  # the kernel, once (in memory or from the cache after); wrappers not counted


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_entry_is_compiled_again(kernels, rng, caplog, damage):
    x, c = rng.standard_normal(1000), float(rng.random())
    src, want = _kernel(c), np.abs(x - c).sum()
    _run(src, x)
    files = glob.glob(str(kernels / "numba" / "__pycache__" / "*.nb[ic]"))
    assert len(files) == 2  # numba's index and the machine code
    for path in files:
        data = open(path, "rb").read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2] if damage == "truncated" else b"garbage")
    before = kernel_cache.stats()
    with caplog.at_level(logging.WARNING, logger="flowgpu.fusion"):
        assert _run(src, x) == pytest.approx(want, rel=1e-12)
    assert _delta(before) == {"compiled": 1, "loaded": 0}
    assert "could not be read" in caplog.text
    assert _run(src, x) == pytest.approx(want, rel=1e-12)  # written again: the next one loads it
    assert _delta(before) == {"compiled": 1, "loaded": 1}


def test_a_damaged_source_file_is_written_again(kernels, rng):
    x, c = rng.standard_normal(1000), float(rng.random())
    src = _kernel(c)
    _run(src, x)
    (path,) = glob.glob(str(kernels / "numba" / "*.py"))
    with open(path, "w") as f:
        f.write("import os; os.remove(__file__)\n")
    before = kernel_cache.stats()
    assert _run(src, x) == pytest.approx(np.abs(x - c).sum(), rel=1e-12)
    assert open(path).read() == src  # the kernel's own text again, so numba's entry for it still holds
    assert _delta(before) == {"compiled": 0, "loaded": 1}


@pytest.mark.parametrize("folder", ["a file", "open to others"])
def test_an_unusable_folder_compiles_in_memory(tmp_path, rng, caplog, folder):
    path = tmp_path / "kernels"
    if folder == "a file":
        path.write_text("not a folder")
    else:
        path.mkdir()
        path.chmod(0o777)
    x, c = rng.standard_normal(100), float(rng.random())
    before = kernel_cache.stats()
    with dask.config.set({"flowgpu.cache.kernels": str(path)}), caplog.at_level(logging.WARNING, "flowgpu.fusion"):
        assert _run(_kernel(c), x) == pytest.approx(np.abs(x - c).sum(), rel=1e-12)
    assert _delta(before) == {"compiled": 1, "loaded": 0}
    assert "in memory only" in caplog.text and str(path) in caplog.text
    if folder != "a file":
        assert os.listdir(path) == []


def test_the_folder_comes_from_config(tmp_path, monkeypatch):
    with dask.config.set({"flowgpu.cache.kernels": str(tmp_path / "k")}):
        assert kernel_cache.directory() == str(tmp_path / "k")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with dask.config.set({"flowgpu.cache.kernels": None}):
        assert kernel_cache.directory() == str(tmp_path / "xdg" / "flowgpu" / "kernels")


_SCRIPT = textwrap.dedent("""
    import json, logging, sys
    import numpy as np, dask.array as da
    from flowgpu.fusion import fusing, kernel_cache
    logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
    logging.getLogger("numba").setLevel(logging.WARNING)
    a = np.load(sys.argv[1])
    x = da.from_array(a, chunks=(100, 50))
    with fusing():
        out = {"max": float(abs(x - 1).max().compute()),
               "map": (x * 2 + 1).compute().tolist(),
               "sum": float((x.ravel() ** 2).sum().compute())}
    out["stats"] = kernel_cache.stats()
    print(json.dumps(out))
""")


def _pythonpath() -> str:
    """This checkout first, then what the tests run with (where the dependencies may be)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def _start(tmp_path, data):
    env = dict(os.environ, PYTHONPATH=_pythonpath(), DASK_FLOWGPU__CACHE__KERNELS=str(tmp_path / "kernels"))
    return subprocess.Popen([sys.executable, "-c", _SCRIPT, str(data)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, a):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    got = json.loads(out)
    assert got["max"] == np.abs(a - 1).max()
    np.testing.assert_array_equal(got["map"], a * 2 + 1)
    np.testing.assert_allclose(got["sum"], (a ** 2).sum(), rtol=1e-12)
    return got["stats"], err


@pytest.mark.slow
def test_a_second_process_compiles_nothing(tmp_path, rng):
    a = rng.standard_normal((300, 200))
    np.save(tmp_path / "a.npy", a)
    # two workers starting together on an empty cache: both compile, both write, neither reads half a file
    # (one may load a kernel the other has just written)
    first = [_finish(proc, a)[0] for proc in [_start(tmp_path, tmp_path / "a.npy") for _ in range(2)]]
    assert sum(s["compiled"] for s in first) >= 3
    stats, log = _finish(_start(tmp_path, tmp_path / "a.npy"), a)
    assert stats["compiled"] == 0 and stats["loaded"] >= 3, log
    assert "loaded from" in log and "compiled in" not in log


_CUDA_SCRIPT = textwrap.dedent("""
    import json, sys
    import cupy as cp, numpy as np, dask, dask.array as da
    from flowgpu.fusion import fusing
    a = np.load(sys.argv[1])
    x = da.from_array(cp.asarray(a), chunks=(100, 50))
    with fusing(), dask.config.set(scheduler="threads"):
        out = {"max": float(abs(x - 1).max().compute()),
               "map": cp.asnumpy((x * 2 + 1).compute()).tolist(),
               "sum": float((x.ravel() ** 2).sum().compute())}
    print(json.dumps(out))
""")


def _cubins(folder):
    """CuPy's cache files: name -> (inode, mtime): a kernel compiled again is written again (a new file
    moved into place), one loaded from the cache is only read."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.gpu
@pytest.mark.slow
def test_a_second_process_compiles_no_cuda_kernel(tmp_path, rng):
    """CUDA kernels are kept by CuPy's own cache (CUPY_CACHE_DIR): flowgpu's kernel sources are the same
    in every process, so a second one loads every kernel from it and writes nothing there."""
    a = rng.standard_normal((300, 200))
    np.save(tmp_path / "a.npy", a)
    env = dict(os.environ, PYTHONPATH=_pythonpath(), CUPY_CACHE_DIR=str(tmp_path / "cupy"))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _CUDA_SCRIPT, str(tmp_path / "a.npy")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got["max"] == np.abs(a - 1).max()
        np.testing.assert_array_equal(got["map"], a * 2 + 1)
        np.testing.assert_allclose(got["sum"], (a ** 2).sum(), rtol=1e-12)
        runs.append(_cubins(tmp_path / "cupy"))
    first, second = runs
    assert len(first) >= 3  # the fused map, the fused reductions' kernels
    assert second == first  # nothing compiled again, nothing new
