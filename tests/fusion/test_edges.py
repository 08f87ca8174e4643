"""NumPy's answers at the edges (issue 28, part 1): fused reductions accumulate in NumPy's dtype and
order, no fastmath flag changes a result, floating-point warnings are NumPy's, and the float16
CUDA templates compile for every pair of operands.

Each case runs the same dask code plain and fused (``fusing()`` on the plain graph, and ``fg.fuse``)
on fresh random data where the values allow, against NumPy and plain dask.
"""

from __future__ import annotations

import itertools
import re
import warnings

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.fusion import fusing
from flowgpu.fusion.codegen_cuda import CUDA_PREAMBLE, to_cuda
from flowgpu.fusion.language import parse

pytestmark = pytest.mark.timeout(180)


def _fused(lazy):
    with fusing():
        return lazy.compute(scheduler="sync")


def _same(got, want) -> None:
    """Same dtype, and the same values to the last bit (NaN where NumPy has NaN)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def _close(got, want) -> None:
    """Same dtype, NaN and infinities, and values within a few units in the last place (NumPy's own
    log, exp, ... are not the math library's a kernel calls: they differ in the last bit)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(want.dtype).eps if want.dtype.kind == "f" else 0,
                               equal_nan=True)


# ------------------------------------------------------------------ accumulation: dtype and order


def test_float32_sum_overflows_where_numpy_does():
    """The issue's case: float32 sums accumulated in float64 and were finite where NumPy's is inf."""
    xn = np.array([3e38, 3e38, -3e38, 1], dtype=np.float32)
    x = da.from_array(xn, chunks=4)
    with np.errstate(over="ignore"):
        want = (xn * 1).sum()
        assert np.isinf(want)
        _same(_fused((x * 1).sum()), want)
        _same(fg.fuse(lambda a: (a * 1).sum())(x).compute(scheduler="sync"), want)
        _same(_fused((x * 1).mean()), (xn * 1).mean())


def test_float32_sum_is_finite_where_numpy_pairs_the_values(rng):
    """NumPy's pairwise summation adds x[0] + x[8] before x[0] + x[1]: a sum in another order
    overflows where NumPy's does not."""
    xn = (rng.random(16) + 0.5).astype(np.float32)
    xn[[0, 1]], xn[[8, 9]] = 3e38, -3e38
    x = da.from_array(xn, chunks=16)
    want = (xn * 1).sum()
    assert np.isfinite(want)
    _same(_fused((x * 1).sum()), want)
    _same(fg.fuse(lambda a: (a * 1).sum())(x).compute(scheduler="sync"), want)


LAYOUTS = {  # how the chunks lie in memory: each reaches another kernel
    "contiguous": lambda a: a,
    "column blocks": lambda a: a,  # from_array's views of a row-major array: rows contiguous
    "transposed": lambda a: np.ascontiguousarray(a.T).T,  # F-ordered chunks
    "strided": lambda a: a[:, ::2],
}


_FAST = {("sum", "float32", layout) for layout in LAYOUTS} | {
    ("nanmean", "float64", "column blocks"), ("prod", "float64", "contiguous"), ("mean", "float32", "transposed")}


@pytest.mark.parametrize("reduction, dtype, layout", [
    pytest.param(*case, marks=() if case in _FAST else pytest.mark.slow)  # each compiles kernels: the rest are slow
    for case in itertools.product(["sum", "mean", "nansum", "nanmean", "prod"], ["float32", "float64"], LAYOUTS)])
def test_float_reductions_are_plain_dasks_to_the_last_bit(rng, layout, dtype, reduction):
    """On fresh data, in every chunk layout, the fused partials are NumPy's own: the same roundings,
    so the result is plain dask's to the last bit (a float64 accumulator or a reassociated loop
    differed in the last bits); a full reduction's partials go to dask's own tree, run in one task
    (a flat combine of the partials differed in the last bits from dask's tree of ``split_every``)."""
    shape = (300, 2 * 257) if layout == "strided" else (300, 257)
    xn = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)).astype(dtype)
    if reduction.startswith("nan"):
        xn[rng.random(shape) < 0.1] = np.nan
    if reduction == "prod":
        xn = (1 + rng.standard_normal(shape) * 0.01).astype(dtype)
    xn = LAYOUTS[layout](xn)
    chunks = (300, 257) if layout in ("contiguous", "transposed") else (60, 100)  # 5 x 3 chunks: a tree of 2 levels
    x = da.from_array(xn, chunks=chunks)
    for lazy in (getattr(da, reduction)(x * 2 - 1), getattr(da, reduction)(x * 2 - 1, axis=1),
                 getattr(da, reduction)(x * 2 - 1, split_every=3)):
        _same(_fused(lazy), lazy.compute(scheduler="sync"))


def test_float64_product_is_not_reassociated():
    """The issue's case: numba's fastmath ``reassoc`` multiplied in another order, finite where NumPy's is inf."""
    xn = np.array([1e200, 1e200, 1e-200, 1e-200, 1, 1, 1, 1])
    x = da.from_array(xn, chunks=8)
    with np.errstate(over="ignore"):
        want = (xn * 1).prod()
        assert np.isinf(want)
        _same(_fused((x * 1).prod()), want)
        _same(fg.fuse(lambda a: (a * 1).prod())(x).compute(scheduler="sync"), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_multiply_add_is_not_contracted(rng, device, dtype):
    """``x * y - z`` where ``x * y`` just overflows and ``z`` brings it back: NumPy rounds the product
    to inf first. A fused multiply-add (nvrtc's default ``--fmad=true``, LLVM's ``contract``) rounds
    once and gives a finite value."""
    big = np.finfo(dtype).max
    xn = (big / 10 * (1.03 + 0.02 * rng.random(200))).astype(dtype)
    zn = np.full(200, big / 4, dtype=dtype)
    if device == "gpu":
        import cupy as cp

        x, z = (da.from_array(cp.asarray(a), chunks=64) for a in (xn, zn))
    else:
        x, z = (da.from_array(a, chunks=64) for a in (xn, zn))
    with np.errstate(over="ignore"):
        want = xn * 10 - zn
        assert np.isinf(want).all()
        for lazy, expected in ((x * 10 - z, want), ((x * 10 - z).max(), want.max())):
            got = _fused(lazy)
            _same(got if device == "cpu" else got.get(), expected)


@pytest.mark.parametrize("dtype, reduction, acc", [
    ("float32", "sum", "float32"), ("float32", "mean", "float32"), ("float64", "prod", "float64"),
    ("int8", "sum", "int64"), ("uint8", "prod", "uint64"), ("int16", "mean", "float64"), ("bool", "sum", "int64"),
])
def test_accumulator_is_numpys(rng, dtype, reduction, acc):
    """The partial of each chunk has the dtype NumPy accumulates in (np.add.reduce's)."""
    from flowgpu.fusion.compiled import reduction_dtypes

    assert reduction_dtypes(reduction, dtype)[0] == np.dtype(acc)
    xn = rng.integers(0, 3, (40, 30)).astype(dtype) if dtype != "float32" else rng.random((40, 30), dtype=np.float32)
    x = da.from_array(xn, chunks=(15, 30))
    lazy = getattr(x * 1, reduction)()
    _same(_fused(lazy), lazy.compute(scheduler="sync"))


# ------------------------------------------------------------------ floating-point warnings


@pytest.fixture
def nan_data(rng):
    xn = rng.standard_normal((60, 40)) * 4
    xn[rng.random(xn.shape) < 0.1] = np.nan
    return xn, da.from_array(xn, chunks=(25, 40))


def test_comparison_of_nan_does_not_warn(nan_data):
    """The issue's case: a vectorised comparison raised "invalid" in the kernel, which NumPy turned
    into a RuntimeWarning that neither NumPy nor plain dask gives: an error under -W error."""
    xn, x = nan_data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = (xn > 0) & (xn < 5)
        _same(_fused((x > 0) & (x < 5)), want)
        _same(_fused(((x > 0) & (x < 5)).sum()), want.sum())
        _same(_fused(((x > 0) & (x < 5)).any(axis=0)), want.any(axis=0))
        _same(fg.fuse(lambda a: (a > 0) & (a < 5))(x).compute(scheduler="sync"), want)


WARNING_CASES = {  # dask code, the warning NumPy gives
    "log of a negative": (lambda x: da.log(x - 1) * 2, "invalid value encountered in log"),
    "log in a reduction": (lambda x: (da.log(x - 1) * 2).sum(), "invalid value encountered in log"),
    "where computes both": (lambda x: da.where(x > 1, da.log(x - 1), 0) + 1, "invalid value encountered in log"),
    "float division by zero": (lambda x: (1 / da.floor(x / 100)).max(), "divide by zero encountered in divide"),
    "integer floor division by zero": (lambda x: (x.astype("int64") // da.floor(x / 100).astype("int64")) + 1,
                                       "divide by zero encountered in floor_divide"),
    "integer remainder by zero": (lambda x: ((x.astype("int64") % da.floor(x / 100).astype("int64")) * 3).sum(),
                                  "divide by zero encountered in remainder"),
    "float32 sum overflow": (lambda x: (x.astype("float32") * 1e37).sum(), "overflow encountered in"),
}


@pytest.mark.parametrize("case", list(WARNING_CASES))
def test_warnings_are_numpys(rng, case):
    """Where NumPy warns, fused code warns the same warning, raises under -W error and under
    np.errstate(all="raise") as NumPy does, and is silent under np.errstate(all="ignore")."""
    build, message = WARNING_CASES[case]
    x = da.from_array(rng.random((50, 30)) * 40, chunks=(20, 30))
    lazy = build(x)
    with pytest.warns(RuntimeWarning, match=message):
        want = lazy.compute(scheduler="sync")
    with pytest.warns(RuntimeWarning, match=message):
        got = _fused(lazy)
    _close(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match=message):
            _fused(lazy)
        with np.errstate(all="raise"), pytest.raises(FloatingPointError):
            _fused(lazy)
        with np.errstate(all="ignore"):
            _close(_fused(lazy), want)


def test_no_warning_where_numpy_gives_none(rng):
    """Clean data through every operation that can warn: no warning, under -W error."""
    xn = rng.random((50, 30)) * 40 + 2
    x = da.from_array(xn, chunks=(20, 30))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lazy = (da.log(x - 1) + 1 / x + (x.astype("int64") // 3) % 2 + da.sqrt(x) * 1e300).sum()
        _close(_fused(lazy), lazy.compute(scheduler="sync"))


# ------------------------------------------------------------------ float16 CUDA templates

_OPERATORS = ["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "<", "<=", ">", ">=", "==", "!="]
_FUNCTIONS = ["minimum", "maximum", "fmin", "fmax", "arctan2", "hypot", "power"]
_DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint64", "float16", "float32", "float64"]
_OPERANDS = ["a", "arccos(a)", "sqrt(abs(a))", "abs(a)"]  # CUDA's math functions return float for float16
_HALF = ("bool", "int8", "uint8", "float16")  # NumPy's math functions of these give float16
_MATH = ("acos", "asin", "atan", "sqrt", "cbrt", "exp", "log", "sin", "cos", "tan", "floor", "ceil", "pow", "atan2",
         "hypot", "fabs")


def _pairs(dtypes=_DTYPES):
    for op, (da_, db), (x, y) in itertools.product(_OPERATORS + _FUNCTIONS, itertools.product(dtypes, dtypes),
                                                   [("a", "b"), ("arccos(a)", "a"), ("b", "sqrt(abs(a))"),
                                                    ("abs(a)", "arccos(b)")]):
        text = f"{op}({x}, {y})" if op in _FUNCTIONS else f"({x}) {op} ({y})"
        yield text, {"a": np.dtype(da_), "b": np.dtype(db)}


def _cuda_or_none(text, types):
    try:
        return to_cuda(parse(text), types, ["a", "b"])
    except Exception:  # noqa: BLE001 - NumPy refuses these types (float & float, ...): nothing to generate
        return None


def test_cuda_source_calls_only_templates_it_defines(dtypes=_DTYPES):
    """Every binary operation of every pair of dtypes (float16 and float16 of a math function among
    them) calls each helper with its type given, and the preamble defines it as a template taking
    that many arguments; every float16 math function is cast back to float16. Without the fix,
    ``arccos(a) // a`` on float16 called ``_fg_ffloordiv(float, float16)``, which nvrtc refused."""
    templates = {m.group(1): m.group(2).count(",") + 1
                 for m in re.finditer(r"template <typename T> __device__ __forceinline__ T (_fg_\w+)\(([^)]*)\)",
                                      CUDA_PREAMBLE)}
    assert {"_fg_ffloordiv", "_fg_min", "_fg_fmod", "_fg_clip"} <= set(templates)
    generated = 0
    for text, types in _pairs(dtypes):
        out = _cuda_or_none(text, types)
        if out is None:
            continue
        code, dtype = out
        generated += 1
        for call in re.finditer(r"(_fg_\w+)(<[^>(]+>)?\(", code):
            name, given = call.group(1), call.group(2)
            assert name in templates, f"{text} {types}: {name} is not in CUDA_PREAMBLE"
            assert given, f"{text} {types}: {name} called without its type: {code}"
            assert given[1:-1] in ("bool", "signed char", "unsigned char", "short", "unsigned short", "int",
                                   "unsigned int", "long long", "unsigned long long", "float16", "float", "double")
        if all(t.name in _HALF for t in types.values()):  # every float value here is float16 in NumPy
            for m in re.finditer(r"\b(%s)\(" % "|".join(_MATH), code):
                assert code[:m.start()].endswith("((float16)"), f"{text} {types}: {m.group(1)} not cast back: {code}"
    assert generated > 20 * len(dtypes) ** 2


_SHARDS = 32  # about 8,000 kernels compile one by one (over 500 s on the H200): shards that xdist spreads


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("shard", range(_SHARDS))
def test_cuda_kernels_compile_and_match_numpy_for_every_pair(rng, shard):
    """Every pair above compiles (a fused kernel that falls back says so in a warning, made an
    error here) and gives NumPy's values: exactly for integers and booleans, within float16's or the
    math library's last bits for floats. Each shard takes every 32nd pair."""
    import cupy as cp

    from flowgpu.fusion import fused_elementwise
    from flowgpu.fusion.chunk import _warned

    an = {d: (rng.standard_normal(64) * 3).astype(d) if d[0] == "f" else
          rng.integers(0, 2, 64).astype(d) if d == "bool" else rng.integers(1, 9, 64).astype(d) for d in _DTYPES}
    checked = 0
    for text, types in itertools.islice(_pairs(), shard, None, _SHARDS):
        if _cuda_or_none(text, types) is None:
            continue
        a, b = an[types["a"].name], an[types["b"].name][::-1].copy()
        with np.errstate(all="ignore"):
            try:
                want = parse(text).evaluate({"a": a, "b": b}, np)
            except Exception:  # noqa: BLE001 - NumPy raises for these values (int ** negative)
                continue
        _warned.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lazy = fused_elementwise(text, {"a": da.from_array(cp.asarray(a), chunks=32),
                                            "b": da.from_array(cp.asarray(b), chunks=32)})
            got = cp.asnumpy(lazy.compute(scheduler="sync"))
        assert got.dtype == want.dtype, (text, types)
        if want.dtype.kind in "biu":
            np.testing.assert_array_equal(got, want, err_msg=f"{text} {types}")
        else:
            # a float64 result of a float32 (or float16) operand's math keeps that precision's last bits
            low = min((t.itemsize for t in types.values() if t.kind == "f"), default=8)
            rtol = 2e-3 if want.dtype == np.float16 or low == 2 else 1e-5 if want.dtype == np.float32 or low == 4 \
                else 1e-12
            finite = np.abs(want[np.isfinite(want)])  # a difference near zero: the operands' last bits
            atol = rtol * float(finite.max()) if finite.size else 0.0
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"{text} {types}")
        checked += 1
    assert checked > 2000 // _SHARDS


def _PROD(a):
    return (a - 0.5).prod(axis=1)


@pytest.mark.parametrize("f", [lambda a: (a * 1.1 + 1).sum(), lambda a: a.sum(), lambda a: (a * 3 - 1).sum(axis=0),
                               lambda a: a.mean(), _PROD],
                         ids=["chain-sum", "sum", "sum-axis0", "mean", "prod-axis1"])
def test_fg_fuse_reductions_are_plain_dasks_over_many_column_blocks(rng, f):
    """fg.fuse combined a full reduction's partials flat (and an axis's in one level), where dask's
    tree nests them in groups of split_every: 1 ulp apart on a 4 x 3 grid; and a reduction of the
    bare input emulated NumPy's order for a contiguous array on strided column blocks."""
    xn = rng.standard_normal((640, 300)).astype(np.float32)
    xn = (1 + xn * 0.01).astype(np.float32) if f is _PROD else xn  # a product of 300 values near 1 stays normal
    x = da.from_array(xn, chunks=(80, 100))  # 8 x 3 column blocks of a row-major array: not contiguous
    _same(fg.fuse(f)(x).compute(scheduler="sync"), f(x).compute(scheduler="sync"))


def test_fg_fuse_reduces_a_0d_array():
    """A 0-d input (hypothesis found np.False_) made the tree's split 16 ** (1/0): ZeroDivisionError."""
    for value in (np.False_, np.float32(2.5), np.int8(-7)):
        x = da.from_array(np.asarray(value), chunks=())
        _same(fg.fuse(lambda a: (a + a).sum())(x).compute(scheduler="sync"), (np.asarray(value) * 2).sum()
              if value.dtype != np.bool_ else np.asarray(value + value).sum())
