"""Property-based tests of fusion: random elementwise programs against NumPy (issue 16).

Each example is a random expression tree (operators, comparisons, bitwise operators, the ufuncs of
:data:`flowgpu.fusion.FUNCTIONS`, ``where``, ``clip``, Python and NumPy scalars) over one to three
arrays of mixed dtypes and broadcastable shapes (0-d, empty, size-1 axes), cut into ragged chunks
(zero-size ones included), optionally followed by a reduction. It runs three ways on the same
chunks: NumPy itself (the reference), the same dask.array code inside :func:`flowgpu.fusion.fusing`,
and :func:`flowgpu.fuse`. Both fused results must have NumPy's dtype and values: exactly for
integers and booleans, NaN and infinities in the same places, and finite floats within the
rounding that the operations allow (:func:`_spread`). Where NumPy raises, both fused ways raise
the same exception type; NumPy's warnings (overflow, division by zero) are not required of kernels.

``test_dask_reductions_match_numpy_under_warnings_as_errors`` writes reductions as plain dask code
(``sum``, ``mean``, ``nanmean``, ``min``, ``max``, ``prod``, ``any``, ``all`` with ``axis``, ``keepdims``,
``dtype=``) over bool, small integer, float16 and float inputs with NaN, infinities and overflow-sized
values, warnings as errors: there NumPy's warnings are required of the kernels too.

The default run is bounded and deterministic (``derandomize``, a fixed number of examples per
test); ``FLOWGPU_HYPOTHESIS_EXAMPLES=2000`` runs that many random (not derandomized) examples.
"""

from __future__ import annotations

import operator
import os
import warnings

import dask.array as da
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import flowgpu as fg
from flowgpu.fusion import FUNCTIONS, chunk, fusing
from tests.tolerance import assert_within_terms

_EXAMPLES = os.environ.get("FLOWGPU_HYPOTHESIS_EXAMPLES")  # a longer, random run: FLOWGPU_HYPOTHESIS_EXAMPLES=2000
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("flowgpu-ci", max_examples=100, derandomize=True, deadline=None, database=None,
                          suppress_health_check=_QUIET)
if _EXAMPLES:
    settings.register_profile("flowgpu-long", max_examples=int(_EXAMPLES), derandomize=False, deadline=None,
                              database=None, print_blob=True, suppress_health_check=_QUIET)
PROFILE = settings.get_profile("flowgpu-long" if _EXAMPLES else "flowgpu-ci")
TIMEOUT = max(600, 3 * PROFILE.max_examples)  # seconds per test: a few numba compilations per example
pytestmark = pytest.mark.slow  # hundreds of random programs, each compiled: the full tier

DTYPES = [np.dtype(n) for n in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                "uint64", "float32", "float64")]
RESULT_DTYPES = [*DTYPES, np.dtype("float16")]  # NumPy's float functions of (u)int8 and bool
BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
          "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "&": operator.and_,
          "|": operator.or_, "^": operator.xor, "<": operator.lt, "<=": operator.le, ">": operator.gt,
          ">=": operator.ge, "==": operator.eq, "!=": operator.ne}
UNARY = {"-": operator.neg, "~": operator.invert, "abs": abs}
CALLS = sorted(f for f, (n, _) in FUNCTIONS.items() if n in (1, 2))
OPERATIONS = [*(("bin", op) for op in BINARY), *(("un", op) for op in UNARY), *(("call", f) for f in CALLS),
              ("where", "where"), ("clip", "clip")]
REDUCTIONS = ("sum", "prod", "min", "max", "mean")
ACCUMULATE = [np.dtype(n) for n in ("int8", "int64", "uint32", "float32", "float64")]  # sum(dtype=...)
INTS = [0, 1, 2, 3, -1, -2, 5, 7, 100, -100, 127, -128, 255, 2**15, 2**31, -2**31, 2**32, 2**63 - 1, -2**63,
        2**63, 2**64, -2**64, 2**53 + 1]
FLOATS = [0.5, -2.0, 2.5, 3.0, 1e10, -1e-3, 1e300, -1e-300, 0.0, -0.0, float("nan"), float("inf"), -float("inf")]
NUMPY_SCALARS = [np.float32(1.5), np.float64(-0.25), np.int16(3), np.uint8(200), np.int64(-7), np.bool_(True)]
SCALARS = st.one_of(st.sampled_from(INTS), st.integers(-10, 10), st.sampled_from(FLOATS),
                    st.floats(-100, 100, allow_subnormal=False), st.booleans(), st.sampled_from(NUMPY_SCALARS))


# -- programs: trees of ("in", i) | ("const", v) | ("bin", op, a, b) | ("un", op, a) | ("call", f, *args)

def evaluate(node, inputs, post=None):
    """The program applied to ``inputs`` with Python operators and NumPy functions, so the same code
    runs on NumPy arrays, dask arrays and ``fg.fuse``'s tracers; ``post`` sees each NumPy value."""
    kind = node[0]
    if kind == "in":
        return inputs[node[1]]
    if kind == "const":
        return node[1]
    args = [evaluate(c, inputs, post) for c in node[2:]]
    if kind == "bin":
        value = BINARY[node[1]](*args)
    elif kind == "un":
        value = UNARY[node[1]](*args)
    else:
        value = getattr(np, node[1])(*args)
    return post(value) if post is not None else value


def show(node) -> str:
    kind = node[0]
    if kind == "in":
        return f"x{node[1]}"
    if kind == "const":
        return repr(node[1])
    args = [show(c) for c in node[2:]]
    if kind == "bin":
        return f"({args[0]} {node[1]} {args[1]})"
    if kind == "un":
        return f"abs({args[0]})" if node[1] == "abs" else f"({node[1]}{args[0]})"
    return f"np.{node[1]}({', '.join(args)})"


def _sample(fn, *args):
    """``fn`` on 1-element samples (dtype-only stand-ins), or None where NumPy refuses the types."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fn(*args)
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        return None
    return out if isinstance(out, np.ndarray) and out.dtype in RESULT_DTYPES else None


@st.composite
def trees(draw, samples, depth, top=False, root=None):
    """``(tree, sample)``: a program over arrays whose 1-element samples are ``samples``; every
    operation has an array operand, and each is one NumPy accepts for those dtypes. ``root``, a
    pair of :data:`OPERATIONS`, fixes the outermost operation."""
    leaf = st.integers(0, len(samples) - 1).map(lambda i: (("in", i), samples[i]))
    if depth == 0 or (not top and draw(st.integers(0, 5)) == 0):
        return draw(leaf)
    kind = root[0] if root else draw(st.sampled_from(["bin", "bin", "bin", "un", "call", "call", "call", "where",
                                                      "clip"]))
    a, sa = draw(trees(samples, depth - 1))
    def pick(names: list):  # the root's own op, or any that the samples allow (None: none does)
        if root:
            assume(root[1] in names)
            names = [root[1]]
        return draw(st.sampled_from(names)) if names else None

    if kind == "un":
        op = pick([op for op in UNARY if _sample(UNARY[op], sa) is not None])
        return (("un", op, a), _sample(UNARY[op], sa)) if op else (a, sa)

    def operand():
        if draw(st.booleans()):
            v = draw(SCALARS)
            return ("const", v), v
        return draw(trees(samples, depth - 1))

    if kind == "where":
        (c, sc), (b, sb) = draw(trees(samples, depth - 1)), operand()
        args = [(c, sc), (a, sa), (b, sb)] if draw(st.booleans()) else [(c, sc), (b, sb), (a, sa)]
        out = _sample(np.where, *[s for _, s in args])
        assume(out is not None or not root)
        return (("call", "where", *[n for n, _ in args]), out) if out is not None else (a, sa)
    if kind == "clip":
        (lo, slo), (hi, shi) = operand(), operand()
        out = _sample(np.clip, sa, slo, shi)
        assume(out is not None or not root)
        return (("call", "clip", a, lo, hi), out) if out is not None else (a, sa)
    b, sb = operand()
    left, right = ((a, sa), (b, sb)) if draw(st.booleans()) else ((b, sb), (a, sa))
    if kind == "bin":
        op = pick([op for op in BINARY if _sample(BINARY[op], left[1], right[1]) is not None])
        return (("bin", op, left[0], right[0]), _sample(BINARY[op], left[1], right[1])) if op else (a, sa)
    f = root[1] if root else draw(st.sampled_from(CALLS))
    args = [left, right] if FUNCTIONS[f][0] == 2 else [(a, sa)]
    out = _sample(getattr(np, f), *[s for _, s in args])
    assume(out is not None or not root)
    return (("call", f, *[n for n, _ in args]), out) if out is not None else (a, sa)


def _values(rng, dtype, shape):
    """Fresh values of ``dtype``: mostly small (powers and products stay interesting), with zeros,
    the dtype's extremes and, for floats, NaN, infinities, signed zeros and halves (rounding ties)."""
    size = int(np.prod(shape, dtype=np.int64))
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo = max(info.min, -6)
        out = rng.integers(lo, 7, size=size, endpoint=False).astype(dtype)
        extreme = rng.random(size) < 0.05
        out[extreme] = rng.choice(np.array([info.min, info.max, 0], dtype=dtype), size=int(extreme.sum()))
        return out.reshape(shape)
    out = (rng.standard_normal(size) * 10.0 ** rng.uniform(-1, 2, size)).astype(dtype)
    special = rng.random(size) < 0.08
    pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -1.5, 2.0, -3.0, 1.0], dtype=dtype)
    out[special] = rng.choice(pool, size=int(special.sum()))
    return out.reshape(shape)


def _chunks(draw, size):
    """A ragged cut of ``size``, zero-size chunks included now and then."""
    if size <= 1:
        return (size,)
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=3)))
    bounds = [0, *cuts, size]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


@st.composite
def programs(draw, reduce: bool, root=None):
    """``(tree, numpy inputs, chunks of each, reduction or None)``."""
    ndim = draw(st.integers(0, 3))
    base = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, 7]), min_size=ndim, max_size=ndim)))
    n = draw(st.integers(1, 3))
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(n)]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shapes = []
    for i in range(n):
        k = ndim if i == 0 else draw(st.integers(0, ndim))  # the first input has every axis
        shapes.append(tuple(1 if draw(st.integers(0, 3)) == 0 else s for s in base[ndim - k:]))
    arrays = [_values(rng, d, s) for d, s in zip(dtypes, shapes)]
    chunks = [tuple(_chunks(draw, s) for s in shape) for shape in shapes]
    tree, sample = draw(trees([np.ones(1, dtype=d) for d in dtypes], draw(st.integers(2, 5) if root is None else st.integers(1, 3)), top=True,
                                root=root))
    reduction = None
    if reduce:
        out_ndim = max(len(s) for s in shapes)
        axes = st.one_of(st.none(), st.integers(-out_ndim, out_ndim - 1) if out_ndim else st.none(),
                         st.sets(st.integers(0, out_ndim - 1), max_size=out_ndim).map(tuple) if out_ndim else st.none())
        name = draw(st.sampled_from(REDUCTIONS))
        # not tested: NumPy's mean(dtype=int) (it wraps its sum), and sums of floats in an integer
        # dtype, whose cast of values beyond the dtype's range is the platform's (C leaves it undefined)
        floats = name == "mean" or sample.dtype.kind == "f"
        dtype = None if name in ("min", "max") else draw(st.sampled_from(
            [None, None, None, *(d for d in ACCUMULATE if not floats or d.kind == "f")]))
        reduction = (name, draw(axes), draw(st.booleans()), dtype)
    return tree, arrays, chunks, reduction


# -- the three ways, and the comparison ------------------------------------------------------------

def _program(tree, reduction):
    def fn(*xs):
        value = evaluate(tree, xs)
        if reduction is None:
            return value
        return getattr(value, reduction[0])(**_reduce_kwargs(reduction))
    return fn


def _reduce_kwargs(reduction):
    name, axis, keepdims, dtype = reduction
    return {"axis": axis, "keepdims": keepdims, **({"dtype": dtype} if dtype is not None else {})}


def _quiet(fn, warn=False):
    """``fn()`` with NumPy's warnings silenced (and any other unless ``warn``): ``("ok", value)`` or
    ``("raises", exception type)``."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            if not warn:
                warnings.simplefilter("ignore")
            return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return "raises", type(e)


def _perturbed(scale):
    """A ``post`` for :func:`evaluate`: every float value moved by ``scale`` epsilons (per element)."""
    def post(v):
        v = np.asarray(v)
        if v.dtype.kind != "f":
            return v
        s = np.asarray(scale(v.shape), dtype=v.dtype)
        return (v * (1 + s * np.finfo(v.dtype).eps)).astype(v.dtype)
    return post


def _spread(tree, reduction, arrays, want, seed):
    """How far another order of roundings moves NumPy's own answer, per element (>= 0; inf where a
    few epsilons on the way change a NaN, an infinity, a comparison or a rounding)."""
    rng, want = np.random.default_rng(seed), np.asarray(want)
    out = np.zeros(want.shape)
    for scale in (lambda s: 4.0, lambda s: -4.0, lambda s: rng.choice([-4.0, 4.0], size=s),
                  lambda s: rng.choice([-4.0, 4.0], size=s)):
        status, other = _quiet(lambda: _reduce(evaluate(tree, arrays, _perturbed(scale)), reduction))
        if status != "ok":
            return np.full(want.shape, np.inf)
        other = np.asarray(other)
        with np.errstate(all="ignore"):
            diff = np.abs(other.astype(np.float64) - want.astype(np.float64))
        same_special = (np.isnan(other) & np.isnan(want)) | ((other == want) & ~np.isfinite(want.astype(np.float64)))
        diff = np.where(same_special, 0.0, np.where(np.isnan(diff), np.inf, diff))
        out = np.maximum(out, diff)
    return out


def _reduce(value, reduction):
    return value if reduction is None else getattr(np.asarray(value), reduction[0])(**_reduce_kwargs(reduction))


def _terms(tree, reduction, arrays, want):
    """The magnitudes rounded on the way to each element: the largest finite intermediate value (and,
    for sums and means, the sum of the reduced magnitudes, as tests/tolerance.py asks)."""
    biggest = []

    def post(v):
        v = np.asarray(v)
        if v.dtype.kind == "f":
            biggest.append(np.where(np.isfinite(v), np.abs(v.astype(np.float64)), 0.0))
        return v

    with np.errstate(all="ignore"):
        value = np.asarray(post(evaluate(tree, arrays, post)))
    mags = np.zeros(value.shape)
    for b in biggest:
        mags = np.maximum(mags, np.broadcast_to(b, value.shape))
    if reduction is None:
        return mags
    name, axis, keepdims, _ = reduction
    count = max(1, value.size // max(1, np.asarray(want).size))
    if name in ("sum", "mean"):
        total = mags.sum(axis=axis, keepdims=keepdims) * (count + 2)
        return total / count if name == "mean" else total
    if name == "prod":
        return np.abs(np.asarray(want, dtype=np.float64)) * (count + 2)
    return mags.max(axis=axis, keepdims=keepdims, initial=0.0) if mags.size else np.zeros(np.shape(want))


def check_equal(got, want, tree, reduction, arrays, seed, where: str):
    got, want = np.asarray(got), np.asarray(want)
    label = f"{where}: {show(tree)} {reduction or ''}"
    assert got.dtype == want.dtype, f"{label}: dtype {got.dtype}, NumPy gives {want.dtype}"
    assert got.shape == want.shape, f"{label}: shape {got.shape}, NumPy gives {want.shape}"
    if want.dtype.kind != "f":
        bad = got != want
        if bad.any():  # an exact result may only differ where a few epsilons on the way change it
            unstable = _spread(tree, reduction, arrays, want, seed) > 0
            assert not (bad & ~unstable).any(), f"{label}: {got[bad & ~unstable][:5]} != {want[bad & ~unstable][:5]}"
        return
    wf, gf = want.astype(np.float64), got.astype(np.float64)
    same = (np.isnan(wf) & np.isnan(gf)) | (wf == gf)
    if same.all():
        return
    spread = _spread(tree, reduction, arrays, want, seed)
    loose = ~np.isfinite(spread)
    special = ~np.isfinite(wf) | ~np.isfinite(gf)
    bad = special & ~same & ~loose
    assert not bad.any(), f"{label}: {got[bad][:5]} where NumPy gives {want[bad][:5]}"
    keep = np.isfinite(wf) & np.isfinite(gf) & ~loose
    terms = _terms(tree, reduction, arrays, want)
    eps = np.finfo(want.dtype).eps
    allowed = np.broadcast_to(spread, wf.shape) * 2 + 8 * eps * np.broadcast_to(terms, wf.shape)
    assert_within_terms(np.where(keep, gf, 0.0), np.where(keep, wf, 0.0),
                        np.where(keep, allowed / (8 * eps) + np.finfo(np.float64).tiny, 1.0), 8, want.dtype)


def run_three_ways(tree, arrays, chunks, reduction, to_device=None, to_host=np.asarray, seed=0):
    """NumPy, ``fusing()`` and ``fg.fuse`` on the same chunks; asserts the fused two give NumPy's answer."""
    fn = _program(tree, reduction)
    status, want = _quiet(lambda: fn(*arrays))
    device = [to_device(a) if to_device else a for a in arrays]
    lazy = [da.from_array(a, chunks=c) for a, c in zip(device, chunks)]

    def under_fusing():
        with fusing():
            return fn(*lazy).compute(scheduler="sync")

    def fused():
        return fg.fuse(fn)(*lazy).compute(scheduler="sync")

    plain = None
    getattr(chunk, "_warned", set()).clear()  # it warns once per expression: every example sees its warning
    for where, way in (("fusing()", under_fusing), ("fg.fuse", fused)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = _quiet(way, warn=True)
        ours = [str(w.message) for w in seen if "flowgpu" in str(w.message)]
        assert not ours, f"{where}: {show(tree)} {reduction or ''}: {ours[0]}"
        why = _differs(got, (status, want), tree, reduction, arrays, seed, where, to_host)
        if why is None:
            continue
        # where dask's own graph differs from NumPy (an empty min, ...), fusion leaves it as dask built it
        plain = plain or _quiet(lambda: fn(*lazy).compute(scheduler="sync"), warn=True)
        plain_host = (plain[0], to_host(plain[1])) if plain[0] == "ok" else plain
        if _differs(plain, (status, want), tree, reduction, arrays, seed, "dask", to_host) is None or \
                _differs(got, plain_host, tree, reduction, arrays, seed, where, to_host) is not None:
            raise AssertionError(why)


def _differs(got, want, tree, reduction, arrays, seed, where, to_host):
    """Why ``got`` (``(status, value or exception type)``) is not ``want``, or None."""
    label = f"{where}: {show(tree)} {reduction or ''}"
    if want[0] == "raises":
        if got[0] == "raises" and issubclass(got[1], want[1]):
            return None
        return f"{label}: NumPy raises {want[1].__name__}, this gives {got[1]!r}"
    if got[0] != "ok":
        return f"{label}: raises {got[1].__name__}, NumPy does not"
    try:
        check_equal(to_host(got[1]), want[1], tree, reduction, arrays, seed, where)
    except AssertionError as e:
        return str(e)
    return None


@pytest.mark.timeout(TIMEOUT)
@PROFILE
@given(programs(reduce=False))
def test_elementwise_programs_match_numpy(case):
    tree, arrays, chunks, _ = case
    run_three_ways(tree, arrays, chunks, None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda o: o[1])
@settings(PROFILE, max_examples=max(3, PROFILE.max_examples // 33))
@given(data=st.data())
def test_every_operation_matches_numpy(operation, data):
    """Each operation a few times at the root of a small program (the random programs above meet
    some of them only now and then)."""
    tree, arrays, chunks, _ = data.draw(programs(reduce=False, root=operation))
    run_three_ways(tree, arrays, chunks, None)


@pytest.mark.timeout(TIMEOUT)
@PROFILE
@given(programs(reduce=True))
def test_reduced_programs_match_numpy(case):
    tree, arrays, chunks, reduction = case
    run_three_ways(tree, arrays, chunks, reduction)


# -- the same on CuPy chunks (the lead runs these on an H200) ---------------------------------------

GPU_PROFILE = settings(PROFILE, max_examples=max(10, PROFILE.max_examples // 3))


def _on_gpu(case, reduction):
    import cupy as cp

    tree, arrays, chunks, _ = case

    def to_host(v):
        return cp.asnumpy(v) if isinstance(v, cp.ndarray) else np.asarray(v)

    # where CuPy differs from NumPy (int ** negative int gives values), fused must equal CuPy's graph
    run_three_ways(tree, arrays, chunks, reduction, to_device=cp.asarray, to_host=to_host)


@pytest.mark.gpu
@pytest.mark.timeout(TIMEOUT)
@GPU_PROFILE
@given(programs(reduce=False))
def test_gpu_elementwise_programs_match_numpy(case):
    _on_gpu(case, None)


@pytest.mark.gpu
@pytest.mark.timeout(TIMEOUT)
@GPU_PROFILE
@given(programs(reduce=True))
def test_gpu_reduced_programs_match_numpy(case):
    _on_gpu(case, case[3])


# -- reductions written as plain dask code, under warnings-as-errors (issue 28) ---------------------

CHAINS = {  # elementwise code before the reduction, as a user writes it
    "x * 1": lambda x: x * 1,
    "x * 2 - 1": lambda x: x * 2 - 1,
    "abs(x) + x": lambda x: abs(x) + x,
    "(x > 0) & (x < 5)": lambda x: (x > 0) & (x < 5),
    "where(x > 0, x, 0)": lambda x: np.where(x > 0, x, 0),
    "sqrt(abs(x))": lambda x: np.sqrt(abs(x)),
}
DASK_REDUCTIONS = ("sum", "mean", "nanmean", "min", "max", "prod", "any", "all")
REDUCED_DTYPES = [np.dtype(n) for n in ("bool", "int8", "uint8", "int64", "float16", "float32", "float64")]


@st.composite
def dask_reductions(draw):
    """``(chain, values, chunks, reduction, axis, keepdims, dtype)``: fresh values of one dtype (NaN,
    infinities and, now and then, values near the dtype's largest), cut into ragged chunks."""
    dtype = draw(st.sampled_from(REDUCED_DTYPES))
    ndim = draw(st.integers(1, 3))  # sizes past NumPy's pairwise blocks of 8 and 128 values, a few thousand in all
    shape = tuple(draw(st.lists(st.sampled_from([1, 3, 8, 17, 40, 300] if ndim < 3 else [1, 2, 5, 13, 20]),
                                min_size=ndim, max_size=ndim)))
    values = _values(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), dtype, shape)
    huge = dtype.kind == "f" and draw(st.booleans())
    if huge:  # overflow-sized: sums and products of a few overflow
        with np.errstate(over="ignore"):
            values = values * np.asarray(np.finfo(dtype).max / 4, dtype=dtype)
    chunks = tuple(_chunks(draw, s) for s in shape)
    name = draw(st.sampled_from(DASK_REDUCTIONS))
    ndim = len(shape)
    axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                          st.sets(st.integers(0, ndim - 1), min_size=1, max_size=ndim).map(tuple)))
    dtypes = {"sum": [None, None, "int64", "float32", "float64"], "prod": [None, None, "float64"],
              "mean": [None, None, "float32", "float64"]}.get(name, [None])
    acc = draw(st.sampled_from(dtypes))
    if acc is not None and np.dtype(acc).kind != "f" and dtype.kind == "f":
        acc = None  # a float's cast to an integer is the platform's beyond the range (and warns there)
    return draw(st.sampled_from(sorted(CHAINS))), values, chunks, name, axis, draw(st.booleans()), acc, huge


def _as_errors(fn):
    """``fn()`` with every warning an error (as ``pytest -W error``): ``("ok", value)`` or ``("raises", type)``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return "raises", type(e)


@pytest.mark.timeout(TIMEOUT)
@settings(PROFILE, max_examples=max(10, PROFILE.max_examples // 2))
@given(dask_reductions())
def test_dask_reductions_match_numpy_under_warnings_as_errors(case):
    """A chain and one of dask's reductions, plain and fused on the same chunks, warnings as errors:
    fused gives plain dask's answer exactly (value to the last bit, NaN and infinities, dtype, and the
    same warning raised), and NumPy's dtype and values (within the rounding a sum's other grouping
    allows; where values near the largest float are summed, the grouping also decides what
    overflows, so there only plain dask is the reference)."""
    chain, values, chunks, name, axis, keepdims, acc, huge = case
    kwargs = {"axis": axis, "keepdims": keepdims, **({"dtype": acc} if acc is not None else {})}
    x = da.from_array(values, chunks=chunks)

    def program(xp, v):
        return getattr(xp, name)(CHAINS[chain](v), **kwargs)

    label = f"{name}({chain}, {kwargs}) over {values.dtype} {values.shape} in {chunks}"
    plain = _as_errors(lambda: program(da, x).compute(scheduler="sync"))
    with fusing():
        fused = _as_errors(lambda: program(da, x).compute(scheduler="sync"))
    assert fused[0] == plain[0], f"{label}: fused {fused}, plain dask {plain}"
    if plain[0] == "raises":
        assert fused[1] is plain[1], f"{label}: fused raises {fused[1]}, plain dask {plain[1]}"
        return
    got, want = np.asarray(fused[1]), np.asarray(plain[1])
    assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{label}: {got.dtype} {got.shape}, dask {want.dtype}"
    same = (got == want) | (np.isnan(got) & np.isnan(want)) if got.dtype.kind == "f" else got == want
    assert same.all(), f"{label}: fused {got[~same][:5]}, plain dask {want[~same][:5]}"
    reference = _as_errors(lambda: program(np, values))
    if huge:
        return
    assert reference[0] == "ok" or reference[1] is not RuntimeWarning, f"{label}: NumPy warns, fused does not"
    if reference[0] != "ok":
        return
    ref = np.asarray(reference[1])
    assert got.dtype == ref.dtype and got.shape == ref.shape, f"{label}: {got.dtype}, NumPy {ref.dtype}"
    if ref.dtype.kind != "f":
        assert (got == ref).all(), f"{label}: {got}, NumPy {ref}"
        return
    finite = np.isfinite(ref)
    assert ((got == ref) | (np.isnan(got) & np.isnan(ref)) | finite).all(), f"{label}: {got}, NumPy {ref}"
    n = max(1, values.size // max(1, ref.size))
    with np.errstate(all="ignore"):
        scale = getattr(np, "nansum" if "nan" in name else "sum")(
            np.abs(CHAINS[chain](values).astype(np.float64)), axis=axis, keepdims=keepdims)
        scale = scale / n if "mean" in name else scale if name == "sum" else np.abs(ref.astype(np.float64))
        tol = 4 * n * np.finfo(ref.dtype).eps * np.where(np.isfinite(scale), scale, 0) + np.finfo(ref.dtype).tiny
        err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    assert (~finite | (err <= tol)).all(), f"{label}: {got}, NumPy {ref}"
