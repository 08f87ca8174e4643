"""dask's reductions over plain dask.array code become one fused kernel per chunk, same values.

Each case is computed twice: with ``fusing()`` on dask's synchronous scheduler, and on a real
Session (whose hook is on by default). Values and dtypes equal NumPy's on fresh random data with
ragged chunks; the optimised graph really holds the fused chunk stage. Patterns that cannot be
fused leave the graph as dask built it.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from dask._task_spec import GraphNode, Task

import flowgpu as fg
from flowgpu.fusion import compiled, fusing
from flowgpu.fusion.chunk import FusedChunk
from flowgpu.fusion.graph import Fusing, rewrite_graph
from flowgpu.fusion.graph_reduce import FusedPartial
from tests.tolerance import assert_within_terms

pytestmark = pytest.mark.timeout(600)

SHAPE = (33, 26)
CHUNKS = ((10, 10, 13), (7, 7, 7, 5))  # ragged on both axes
AXES = [None, 0, 1, (0, 1), -1, (-2,)]
# name: the chain before the reduction (dask and NumPy alike), whether NaNs are put in
CHAINS = {
    "sum": lambda x, m: (x * 2 - 1) ** 2 - x * 0.5, "mean": lambda x, m: (x * 2 - 1) ** 2 - x * 0.5,
    "min": lambda x, m: m.sqrt(x + 1) - x, "max": lambda x, m: m.sqrt(x + 1) - x,
    "prod": lambda x, m: x * 0.5 + 0.75, "nanprod": lambda x, m: m.where(x > 0.9, np.nan, x * 0.5 + 0.75),
    "any": lambda x, m: x > 0.95, "all": lambda x, m: x > 0.02,
    "nansum": lambda x, m: m.where(x > 0.8, np.nan, x - 0.25), "nanmean": lambda x, m: m.where(x > 0.8, np.nan, x - 0.25),
    "nanmin": lambda x, m: m.where(x < 0.3, np.nan, x * 3), "nanmax": lambda x, m: m.where(x > 0.7, np.nan, x * 3),
}
TYPED = ("sum", "prod", "mean", "nansum", "nanprod", "nanmean")  # take dtype=


def _reduce(m, name, a, axis, keepdims, dtype=None):
    kw = {"dtype": dtype} if dtype is not None else {}
    return getattr(m, name)(a, axis=axis, keepdims=keepdims, **kw)


def _walk(node, seen):
    """Every function in a task of an optimised graph, nested ones (fused tasks, subgraphs) too."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, Task):
        yield node.func
        yield from _walk(node.func, seen)
        for a in (*node.args, *node.kwargs.values()):
            yield from _walk(a, seen)
    elif isinstance(node, (list, tuple, set, frozenset)):
        for a in node:
            yield from _walk(a, seen)
    elif isinstance(node, dict):
        for a in node.values():
            yield from _walk(a, seen)
    elif isinstance(node, GraphNode):
        for s in type(node).__slots__:
            yield from _walk(getattr(node, s, None), seen)
    elif type(node).__module__.startswith("dask") and hasattr(node, "__dict__") and not isinstance(node, type):
        yield from _walk(vars(node), seen)


def fused_in(arr) -> list:
    """The fused functions of the graph that computing ``arr`` would run (as optimised here)."""
    (opt,) = dask.optimize(arr)
    seen: set = set()
    return [f for t in dict(opt.__dask_graph__()).values() for f in _walk(t, seen)
            if isinstance(f, (FusedPartial, FusedChunk))]


def partials(arr) -> set[str]:
    """The kinds of fused chunk stages in ``arr``'s optimised graph (``{"sum"}``, ``{"mean"}``, ...)."""
    return {f.spec.mean or f.spec.kind for f in fused_in(arr) if isinstance(f, FusedPartial)}


def _kernel_kind(name: str) -> str:
    return {"any": "max", "all": "min"}.get(name, name)  # a partial's kind: any is a max over truth values


def _check(name, got, xn, axis, keepdims, dtype, in_dtype):
    """``got`` against NumPy: its dtype exactly, its value within the rounding of what was reduced."""
    ref_in = CHAINS[name](xn.astype(in_dtype), np)  # NumPy on the same data: the dtype to match
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = _reduce(np, name, ref_in, axis, keepdims, dtype)
        exact = _reduce(np, name, CHAINS[name](xn, np).astype(np.float64), axis, keepdims, None)
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    vals = np.abs(CHAINS[name](xn, np).astype(np.float64))
    n = vals.size if axis is None else np.prod([vals.shape[a] for a in np.atleast_1d(axis)])
    eps = np.float64 if dtype is None and in_dtype == np.float64 else np.float32
    if name in ("min", "max", "nanmin", "nanmax"):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        assert_within_terms(np.nan_to_num(got), np.nan_to_num(exact), np.abs(np.nan_to_num(exact)) + 1, 4, eps)
    elif name in ("prod", "nanprod"):
        assert_within_terms(got, exact, np.abs(exact), 4 * n + 8, eps)
    else:
        terms = np.nansum(vals, axis=axis, keepdims=keepdims)
        if name in ("mean", "nanmean"):
            terms = terms / np.sum(~np.isnan(vals), axis=axis, keepdims=keepdims)
        assert_within_terms(got, exact, terms, 4 * n + 8, eps)


@pytest.fixture
def data(rng):
    return rng.random(SHAPE)


def _compute(mode, y):
    if mode == "fusing":
        with fusing():
            return partials(y), y.compute(scheduler="sync")
    return partials(y), y.compute()


@pytest.fixture(params=["fusing", pytest.param("session", marks=pytest.mark.slow)])
def mode(request):
    if request.param == "session":
        request.getfixturevalue("cpu_session")
    return request.param


@pytest.mark.parametrize("keepdims", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("name", list(CHAINS))
def test_reduction_of_a_chain_is_one_kernel(mode, data, name, axis, keepdims):
    x = da.from_array(data, chunks=CHUNKS)
    y = _reduce(da, name, CHAINS[name](x, da), axis, keepdims)
    kinds, got = _compute(mode, y)
    assert kinds == {_kernel_kind(name)}
    _check(name, got, data, axis, keepdims, None, np.float64)


@pytest.mark.parametrize("in_dtype", [np.float64, pytest.param(np.float32, marks=pytest.mark.slow)])
@pytest.mark.parametrize("dtype", [None, "float32", "float64", "int64"])
@pytest.mark.parametrize("axis", [None, 0], ids=str)
@pytest.mark.parametrize("name", TYPED + ("min", "max", "any", "nanmax"))
def test_dtypes_as_numpy(data, name, axis, dtype, in_dtype):
    if dtype is not None and name not in TYPED:
        pytest.skip("takes no dtype=")
    if dtype == "int64" and name in ("prod", "nanprod", "mean", "nanmean"):
        pytest.skip("values in (0, 2) truncate to 0 or 1: nothing to compare")
    x = da.from_array(data.astype(in_dtype), chunks=CHUNKS)
    chain = (lambda a, m: a * 10) if dtype == "int64" else CHAINS[name]
    y = _reduce(da, name, chain(x, da), axis, False, dtype)
    kinds, got = _compute("fusing", y)
    assert kinds == {_kernel_kind(name)}
    if dtype == "int64":
        want = _reduce(np, name, data.astype(in_dtype) * 10, axis, False, dtype)
        assert np.asarray(got).dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        return
    _check(name, got, data, axis, False, dtype, in_dtype)


def test_single_array_and_its_transpose(mode, data):
    """A chain over x and x.T is one kernel; a bare array (x.sum(), x.T.max()) is left to NumPy,
    whose reduction of a chunk is one pass already, unless array.backend is cupy."""
    sq = da.from_array(data[:26, :26], chunks=((9, 9, 8), (9, 9, 8)))
    xn = data[:26, :26]
    bare = [(sq.sum(), xn.sum()), (sq.T.max(axis=0), xn.T.max(axis=0)), (sq.T.mean(axis=1), xn.T.mean(axis=1))]
    chains = [((sq + sq.T * 2).sum(axis=0), (xn + xn.T * 2).sum(axis=0)), ((sq - sq.T).prod(), (xn - xn.T).prod()),
              ((-sq.T).max(axis=1), (-xn.T).max(axis=1))]
    for (y, want), fused in [(c, False) for c in bare] + [(c, True) for c in chains]:
        kinds, got = _compute(mode, y)
        assert len(kinds) == fused
        assert_within_terms(got, want, np.abs(want) + 26 * 3, 64)
    with fusing(), dask.config.set({"array.backend": "cupy"}):  # what a GPU Session sets: bare arrays fused too
        assert [partials(y) for y, _ in bare] == [{"sum"}, {"max"}, {"mean"}]


def test_nan_slices_and_values_as_numpy(data):
    """A column of NaN only: nanmin/nanmax/nanmean give NaN there, nansum 0, as NumPy; NaN in min
    propagates."""
    xn = data.copy()
    xn[:, 3] = np.nan
    xn[5, 7] = np.nan
    x = da.from_array(xn, chunks=CHUNKS)
    for name in ("nanmin", "nanmax", "nanmean", "nansum", "nanprod", "min", "max", "sum"):
        for axis in (0, 1):
            y = getattr(da, name)(x + 1, axis=axis)
            with warnings.catch_warnings(record=True) as plain:
                warnings.simplefilter("always")
                y.compute(scheduler="sync")
            with fusing(), warnings.catch_warnings(record=True) as fused:
                warnings.simplefilter("always")
                assert partials(y) == {name}
                got = y.compute(scheduler="sync")
            assert [str(w.message) for w in fused] == [str(w.message) for w in plain]  # no warning dask gives not
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = getattr(np, name)(xn + 1, axis=axis)
            np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)


def _outcome(y):
    try:
        return y.compute(scheduler="sync")
    except ValueError as e:
        return type(e)


def test_zero_size_chunks_compute_as_dask(rng):
    """Zero-size chunks take dask's own chunk functions: NumPy's values where dask gives them, and
    the same ValueError where dask's min/max trip over them (or NumPy refuses an empty min)."""
    xn = rng.random((12, 9))
    x = da.from_array(xn, chunks=((4, 0, 8), (5, 0, 4)))
    for name in ("sum", "min", "max", "mean", "prod", "nanmax", "nansum", "any"):
        for axis in (0, 1, None):
            y = getattr(da, name)(x * 2 + 0.5 > 1 if name == "any" else x * 2 + 0.5, axis=axis)
            plain = _outcome(y)
            with fusing():
                assert partials(y) == {_kernel_kind(name)}
                got = _outcome(y)
            if plain is ValueError:
                assert got is ValueError, (name, axis)
                continue
            want = getattr(np, name)(xn * 2 + 0.5 > 1 if name == "any" else xn * 2 + 0.5, axis=axis)
            np.testing.assert_allclose(got, want, rtol=1e-12)
    with fusing():
        assert _outcome((x[:0] * 2).min()) is ValueError  # over no values: NumPy raises, so does dask


def _layers(hlg):
    return [(name, type(layer).__name__) for name, layer in hlg.layers.items()]


def test_unfusable_patterns_leave_the_graph(rng):
    xn = rng.random((20, 15))
    x = da.from_array(xn, chunks=(7, 6))
    xcn = xn + 1j * rng.random((20, 15))
    xc = da.from_array(xcn, chunks=(7, 6))
    masked = da.ma.masked_greater(x, 0.7)
    custom = da.reduction(x * 2, lambda a, axis, keepdims: np.sum(a ** 3, axis=axis, keepdims=keepdims),
                          np.sum, axis=0, dtype=x.dtype)
    cases = {
        "complex sum": ((xc * 2).sum(), (xcn * 2).sum()),
        "std": (x.std(axis=0), None), "var": (da.nanvar(x), None), "argmin": (x.argmin(axis=0), None),
        "masked": (masked.sum(axis=0), np.ma.masked_greater(xn, 0.7).sum(axis=0)), "custom": (custom, None),
        "cumsum": (x.cumsum(axis=0), None), "sum of 0-d": (da.from_array(np.float64(2.5)).sum(), None),
    }
    for label, (y, want) in cases.items():
        hlg = y.__dask_graph__()
        assert _layers(rewrite_graph(hlg, keep={y.name})) == _layers(hlg), label
        with fusing():
            assert partials(y) == set(), label
            got = y.compute(scheduler="sync")
        if want is not None:
            np.testing.assert_allclose(np.ma.filled(got, 0), np.ma.filled(want, 0), rtol=1e-12)


def test_masked_data_behind_a_plain_layer_stays_masked(rng):
    """A masked NumPy array wrapped by from_array: the graph cannot say so, the chunks can. The
    kernel is not used on them; values are NumPy's masked ones. flowgpu.optimize sees the meta."""
    xn = np.ma.masked_greater(rng.random((20, 15)), 0.6)
    x = da.from_array(xn, chunks=(7, 6), asarray=False)
    y = (x * 2 + 1).sum(axis=0)
    with fusing():
        got = y.compute(scheduler="sync")
    np.testing.assert_allclose(np.ma.filled(got, -1), np.ma.filled((xn * 2 + 1).sum(axis=0), -1), rtol=1e-12)
    s = x.sum()
    assert fg.optimize(s).__dask_graph__() is s.__dask_graph__()


def test_other_dtypes_compute_as_dask(rng):
    """Complex and datetime values reach dask's own chunk functions (min/max take no dtype=, so
    the graph cannot tell): the same values as unfused."""
    zn = rng.random(40) + 1j * rng.random(40)
    z = da.from_array(zn, chunks=11)
    tn = np.datetime64("2026-01-01") + rng.integers(0, 10**6, 40).astype("timedelta64[s]")
    t = da.from_array(tn, chunks=11)
    with fusing():
        assert complex((z * 2).prod().compute(scheduler="sync")) == pytest.approx(complex((zn * 2).prod()))
        assert t.min().compute(scheduler="sync") == tn.min()
        assert t.max().compute(scheduler="sync") == tn.max()
        np.testing.assert_allclose((z + 1).mean().compute(scheduler="sync"), (zn + 1).mean())
    hn = rng.random((20, 9)).astype(np.float16)  # numba has no float16: NumPy's own, and no warning
    h = da.from_array(hn, chunks=(7, 4))
    with fusing(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for y, want in (((h * 2).max(axis=0), (hn * 2).max(axis=0)), ((h > 0.5).any(), (hn > 0.5).any()),
                        ((h * 2 + 1).min(), (hn * 2 + 1).min())):
            got = y.compute(scheduler="sync")
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_session_installs_the_hook_and_false_turns_it_off(cpu_session, rng):
    xn = rng.random((30, 20))
    x = da.from_array(xn, chunks=(8, 7))
    y = ((x * 2 + 1) ** 2 - x).sum()
    assert isinstance(dask.config.get("array_optimize"), Fusing) and cpu_session.fuse
    assert partials(y) == {"sum"}
    assert float(y.compute()) == pytest.approx(float(((xn * 2 + 1) ** 2 - xn).sum()), rel=1e-12)
    with dask.config.set({"flowgpu.fuse-ufuncs": False}):
        assert fused_in(y) == []
        with dask.config.set({"array_optimize": None}):
            (plain,) = dask.optimize(y)
        (off,) = dask.optimize(y)
        assert _layers(off.__dask_graph__()) == _layers(plain.__dask_graph__())
        assert float(y.compute()) == pytest.approx(float(((xn * 2 + 1) ** 2 - xn).sum()), rel=1e-12)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_session_fuse_true_fuses_where_the_config_says_false(rng):
    """``Session(fuse=True)`` fuses even under ``flowgpu.fuse-ufuncs: false`` (the hook used to be
    installed but did nothing, since it reads that option)."""
    xn = rng.random((30, 20))
    x = da.from_array(xn, chunks=(8, 7))
    y = ((x * 2 + 1) ** 2 - x).sum()
    with dask.config.set({"flowgpu.fuse-ufuncs": False}), \
            fg.Session(backend="cpu", n_workers=1, threads_per_worker=1, dashboard_address=None, fuse=True) as s:
        assert s.fuse and partials(y) == {"sum"}
        assert float(y.compute()) == pytest.approx(float(((xn * 2 + 1) ** 2 - xn).sum()), rel=1e-12)


@pytest.mark.slow
def test_session_fuse_false_and_env_leave_graphs_alone():
    """Session(fuse=False) does not install the hook; neither does DASK_FLOWGPU__FUSE_UFUNCS=false
    (in a real process); the default one does, and puts back what was there when it closes."""
    script = (
        "import dask, dask.array as da, numpy as np\n"
        "from flowgpu import Session\n"
        "from flowgpu.fusion.graph import Fusing\n"
        "if __name__ == '__main__':\n"
        "    kw = dict(backend='cpu', n_workers=1, threads_per_worker=1, dashboard_address=None)\n"
        "    with Session(fuse=False, **kw) as s:\n"
        "        print('explicit', s.fuse, isinstance(dask.config.get('array_optimize', None), Fusing))\n"
        "    with Session(**kw) as s:\n"
        "        x = da.from_array(np.arange(12.0), chunks=5)\n"
        "        print('config', s.fuse, isinstance(dask.config.get('array_optimize', None), Fusing),\n"
        "              float((x * 2 + 1).sum().compute()))\n"
        "    print('after', isinstance(dask.config.get('array_optimize', None), Fusing))\n"
    )
    for env, want in ((None, "config True True 144.0"), ("false", "config False False 144.0")):
        environ = {**os.environ, **({"DASK_FLOWGPU__FUSE_UFUNCS": env} if env else {})}
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=environ)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines == ["explicit False False", want, "after False"], out.stdout


def test_the_sessions_hook_takes_its_decisions_to_the_scheduler(rng):
    """dask calls the hook where the graph is materialized: a remote scheduler, with its own config. A GPU
    Session's hook says 'CuPy chunks' itself, so a reduction of a bare array is fused there as on the run's
    own cluster (a joined dask-cuda cluster fused less, and gave other last bits); it pickles as it is."""
    xn = rng.random((30, 20))
    y = da.from_array(xn, chunks=(8, 7)).sum(axis=0)  # a bare reduction: fused on CuPy chunks only
    hook = pickle.loads(pickle.dumps(Fusing(enabled=True, bare=True)))
    with dask.config.set({"array.backend": "numpy", "array_optimize": hook}):  # a scheduler's config
        assert partials(y) == {"sum"}
        np.testing.assert_allclose(dask.compute(y, scheduler="sync")[0], xn.sum(axis=0), rtol=1e-12)
    with dask.config.set({"array.backend": "numpy", "array_optimize": Fusing(enabled=True, bare=False)}):
        assert partials(y) == set()
    with dask.config.set({"array.backend": "cupy", "array_optimize": Fusing(enabled=False, bare=True)}):
        assert fused_in(y) == []


def test_session_refuses_a_fuse_that_is_no_bool():
    with pytest.raises(fg.errors.ConfigError, match="fuse='yes'"):
        fg.Session(fuse="yes")


# -- GPU (CuPy chunks): the lead runs these on an H200 ------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)], ids=str)
@pytest.mark.parametrize("name", list(CHAINS))
def test_gpu_reduction_of_a_chain(data, name, axis):
    import cupy as cp

    x = da.from_array(cp.asarray(data), chunks=CHUNKS)
    y = _reduce(da, name, CHAINS[name](x, da), axis, False)
    kinds, got = _compute("fusing", y)
    assert kinds == {_kernel_kind(name)} and isinstance(got, cp.ndarray)
    _check(name, cp.asnumpy(got), data, axis, False, None, np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sum", "mean", "max", "nansum", "nanmin", "prod", "any"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_transposed_input_through_the_tiled_kernel(rng, name, dtype):
    """x + x.T on 1024² chunks (F-ordered views of x.T reach the kernel, read in tiles)."""
    import cupy as cp

    xn = rng.random((2048, 2048)).astype(dtype)
    xn[rng.random(xn.shape) > 0.999] = np.nan if name.startswith("nan") else 0.5
    x = da.from_array(cp.asarray(xn), chunks=1024)
    scale = 1e-6 if name == "prod" else 1e-3  # a product of 4M values near 1 stays finite
    chain = (lambda a: (a + a.T) > 1.9) if name == "any" else (lambda a: (a + a.T * 0.5) * scale + 1)
    y = getattr(da, name)(chain(x))
    with fusing():
        assert partials(y) == {_kernel_kind(name)}
        got = cp.asnumpy(y.compute(scheduler="sync"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = getattr(np, name)(chain(xn))
        exact = getattr(np, name)(chain(xn.astype(np.float64)))
    assert got.dtype == want.dtype
    if want.dtype.kind == "b":
        assert got == want
    else:
        terms = np.nansum(np.abs(chain(xn.astype(np.float64))))
        terms = abs(exact) * xn.size if name == "prod" else terms / xn.size if name == "mean" else terms
        assert_within_terms(got, exact, terms if name not in ("max", "nanmin") else abs(exact), 64, dtype)


@pytest.mark.gpu
def test_gpu_session_fuses_plain_code(gpu_session, rng):
    import cupy as cp

    xn = rng.random((4096, 3000), dtype=np.float32)
    x = da.from_array(cp.asarray(xn), chunks=(1024, 1000))
    y = ((x * 2 + 1) ** 2 - x).sum()
    assert partials(y) == {"sum"}
    exact = ((xn.astype(np.float64) * 2 + 1) ** 2 - xn).sum()
    assert_within_terms(float(y.compute()), exact, abs(exact), 64, np.float32)


def test_a_nan_scalar_compiles_once_however_often_it_is_unpickled(rng):
    """Each task arrives unpickled, its NaN a new float equal to no other: the kernel cache must
    still find the kernel (it compiled per chunk on a cluster, 10 s for a small nanmean)."""
    xn = rng.random(1000)
    fn = FusedChunk("where(v0 > 0.5, s0, v0)", ("v0",), (("s0", float("nan")),), np.dtype("float64"),
                    reduction="nansum", axes=(0,))
    sizes = []
    for _ in range(3):
        got = pickle.loads(pickle.dumps(fn))(xn)
        sizes.append(len(compiled._cache))
        assert float(got[0]) == pytest.approx(float(xn[xn <= 0.5].sum()), rel=1e-12)
    assert sizes[0] == sizes[1] == sizes[2]


@pytest.mark.slow
def test_integer_boolean_broadcast_and_3d_inputs(rng):
    """Integer and boolean chains (exact, NumPy's dtypes: int32 sums to int64, bool sums count),
    a row broadcast against a matrix, and a 3-D array reduced over two of its axes."""
    an = rng.integers(-50, 50, (17, 11)).astype(np.int32)
    un = rng.integers(0, 200, (17, 11)).astype(np.uint8)
    row = rng.random(11)
    cube = rng.random((6, 5, 7))
    a, u = da.from_array(an, chunks=(5, 4)), da.from_array(un, chunks=(6, 5))
    r, c = da.from_array(row, chunks=4), da.from_array(cube, chunks=(4, 2, 3))
    cases = [
        (lambda m, a, u: (a * 3 - 7).sum(axis=0), True), (lambda m, a, u: (a * 3 - 7).max(), True),
        (lambda m, a, u: (a % 5 + 1).prod(axis=1), True), (lambda m, a, u: (a > 10).sum(), True),
        (lambda m, a, u: (a < -45).any(axis=1), True), (lambda m, a, u: (u + 1).mean(axis=0), False),
        (lambda m, a, u: (u // 3).min(axis=(0, 1), keepdims=True), True),
        (lambda m, a, u: m.nansum(u * 2, axis=1), True), (lambda m, a, u: m.nanmax(a - u, axis=0), True),
    ]
    for f, exact in cases:
        y, want = f(da, a, u), f(np, an, un)
        with fusing():
            assert len(partials(y)) == 1
            got = y.compute(scheduler="sync")
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        (np.testing.assert_array_equal if exact else np.testing.assert_allclose)(got, want)
    with fusing():
        y = ((a * 0.5 + r) ** 2).sum(axis=0)
        assert partials(y) == {"sum"}
        np.testing.assert_allclose(y.compute(scheduler="sync"), ((an * 0.5 + row) ** 2).sum(axis=0), rtol=1e-12)
        y = da.mean(c * 2 - 1, axis=(0, 2), keepdims=True)
        assert partials(y) == {"mean"}
        np.testing.assert_allclose(y.compute(scheduler="sync"), np.mean(cube * 2 - 1, axis=(0, 2), keepdims=True),
                                   rtol=1e-12)


def _tasks(arr) -> int:
    (opt,) = dask.optimize(arr)
    return len(dict(opt.__dask_graph__()))


@pytest.mark.parametrize("how", ["sum", "mean", "max", "nanmean", "prod", "any"])
def test_a_full_reduction_of_a_fused_chain_combines_its_partials_in_one_task_as_fuse_does(rng, how):
    """dask's tree (2 partials per task on a 2-D array) becomes one aggregate over every partial:
    the task count of ``flowgpu.fuse``, and NumPy's answer."""
    xn = rng.random((90, 40)) + 0.5
    x = da.from_array(xn, chunks=(10, 20))  # 9 x 2 chunks

    def chain(v):
        if how == "any":
            return (v * 2 - 0.5) > 3.2
        if how == "prod":  # near 1: a product of 3,600 values elsewhere goes subnormal and loses its digits
            return 1 + ((v * 2 - 0.5) ** 2 - v * 0.9) * 1e-3
        return (v * 2 - 0.5) ** 2 - v * 0.9

    e, want = chain(x), getattr(np, how)(chain(xn))
    with fusing(False):  # dask's own graph (also while a test's Session is open)
        plain = _tasks(getattr(da, how)(e))
    with fusing():
        got = getattr(da, how)(e)
        assert _tasks(got) == _tasks(x) + 18 + 1 < plain  # the chunks, 18 fused partials, one aggregate
        np.testing.assert_allclose(got.compute(), want, rtol=1e-12)


def test_a_reduction_over_some_axes_keeps_dasks_tree(rng):
    xn = rng.random((90, 40))
    x = da.from_array(xn, chunks=(10, 20))
    with fusing():
        got = ((x * 2 - 0.5) ** 2).sum(axis=0)
        assert _tasks(got) > _tasks(x) + 18 + 2
        np.testing.assert_allclose(got.compute(), ((xn * 2 - 0.5) ** 2).sum(axis=0), rtol=1e-12)
