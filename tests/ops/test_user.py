"""map_blocks with a user function by import path, and the errors for paths that do not resolve."""

from __future__ import annotations

import numpy as np
import pytest

from flowgpu.backend import array_module
from flowgpu.errors import ImportPathError, OpError, RunError
from flowgpu.ops import get
from flowgpu.registry import import_object
from tests.ops.conftest import chunked, computed
from tests.tolerance import assert_within_terms


def soft_threshold(block, t=0.1):
    """A user function that works on NumPy and CuPy blocks."""
    xp = array_module(block)
    return xp.sign(block) * xp.maximum(xp.abs(block) - t, 0)


def row_norms(block):
    xp = array_module(block)
    return xp.sqrt((block * block).sum(axis=1))


def where_am_i(block, block_info=None, block_id=None, scale=1.0):
    """Asks dask where its block lies: each value becomes its global row index plus the block's id."""
    xp = array_module(block)
    (r0, _), (c0, _) = block_info[0]["array-location"]
    rows = xp.arange(r0, r0 + block.shape[0], dtype=block.dtype)[:, None] + xp.zeros_like(block)
    return scale * rows + 1000 * block_id[0] + 100 * block_id[1] + 0 * block


def blend(a, b, w=0.5):
    return w * a + (1 - w) * b


def _ref_soft(a, t):
    return np.sign(a) * np.maximum(np.abs(a) - t, 0)


@pytest.mark.parametrize("path", ["tests.ops.test_user:soft_threshold", "tests.ops.test_user.soft_threshold"])
def test_map_blocks_by_path(path, rng, backend):
    a = rng.normal(size=(14, 9))
    t = float(rng.random())
    out = get("map_blocks")(chunked(a, (5, 4), backend), function=path, kwargs={"t": t})
    np.testing.assert_allclose(computed(out, backend), _ref_soft(a, t), rtol=1e-12)


def test_map_blocks_passes_block_info_and_block_id_as_dask_does(rng, backend):
    a = rng.normal(size=(11, 9))
    out = get("map_blocks")(chunked(a, (4, 5), backend), function="tests.ops.test_user:where_am_i",
                            kwargs={"scale": 2.0})
    rows = np.arange(11)[:, None] * np.ones((1, 9))
    ids = np.add.outer(1000 * (np.arange(11) // 4), 100 * (np.arange(9) // 5))
    np.testing.assert_array_equal(computed(out, backend), 2.0 * rows + ids)


def test_map_blocks_drop_axis_and_dtype(rng, backend):
    a = rng.normal(size=(12, 7)).astype(np.float32)
    out = get("map_blocks")(chunked(a, (5, 7), backend), function="tests.ops.test_user:row_norms",
                            drop_axis=1, dtype="float32")
    assert out.shape == (12,) and out.dtype == np.float32
    np.testing.assert_allclose(computed(out, backend), np.linalg.norm(a, axis=1), rtol=1e-6)


def test_map_blocks_new_axis_and_two_inputs(rng, backend):
    a, b = rng.normal(size=(2, 10))
    w = float(rng.random())
    out = get("map_blocks")(chunked(a, 4, backend), chunked(b, 4, backend), function="tests.ops.test_user:blend",
                            kwargs={"w": w})
    assert_within_terms(computed(out, backend), w * a + (1 - w) * b, np.abs(w * a) + np.abs((1 - w) * b), 4)
    out = get("map_blocks")(chunked(a, 4, backend), function="numpy:atleast_2d", new_axis=0, dtype="float64")
    assert out.shape == (1, 10)
    np.testing.assert_array_equal(computed(out, backend), a[None, :])


@pytest.mark.parametrize("path, message", [
    ("no_such_package.mod:f", "function 'no_such_package.mod:f': no module named 'no_such_package.mod'"),
    ("tests.ops.test_user:soft_treshold", "'tests.ops.test_user' has no attribute 'soft_treshold'; "
                                          "did you mean 'soft_threshold'"),
    ("tests.ops.test_user.nothing_here", "has no attribute 'nothing_here'"),
    ("soft_threshold", "is not an import path"),
    ("a:b:c", "is not an import path"),
    (":f", "is not an import path"),
])
def test_bad_import_paths_say_what_is_missing(path, message, rng):
    import dask.array as da

    with pytest.raises(ImportPathError, match=message):
        get("map_blocks")(da.from_array(rng.random(4)), function=path)


def test_a_module_that_fails_inside_is_reported_as_such(tmp_path, monkeypatch):
    (tmp_path / "broken_user_mod.py").write_text("import not_installed_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportPathError, match="importing 'broken_user_mod' failed: .*not_installed_dependency_xyz"):
        import_object("broken_user_mod:f")


def test_not_callable(rng):
    import dask.array as da

    with pytest.raises(OpError, match="not a function"):
        get("map_blocks")(da.from_array(rng.random(4)), function="math:pi")


CALLED = {"n": 0}


def counted_half(block):
    CALLED["n"] += 1
    return (block / 2).astype("float32")


def test_map_blocks_never_calls_the_function_to_build_the_graph(rng, backend):
    a = rng.normal(size=(11, 6))
    CALLED["n"] = 0
    out = get("map_blocks")(chunked(a, (4, 6), backend), function="tests.ops.test_user:counted_half", dtype="float32")
    assert CALLED["n"] == 0 and out.dtype == np.float32  # dask took dtype and meta from the step
    np.testing.assert_allclose(computed(out, backend), a / 2, rtol=1e-6)
    assert CALLED["n"] == 3


def test_map_blocks_takes_its_inputs_dtype_by_default_and_refuses_blocks_of_another(rng):
    import dask.array as da

    a = rng.normal(size=(9,))
    CALLED["n"] = 0
    out = get("map_blocks")(da.from_array(a, chunks=4), function="tests.ops.test_user:counted_half")
    assert out.dtype == np.float64 and CALLED["n"] == 0
    with pytest.raises(RunError, match="returned a block of dtype float32 .* the step declares dtype float64"):
        out.compute(scheduler="sync")


def test_an_exception_of_the_function_names_it(rng):
    import dask.array as da

    out = get("map_blocks")(da.from_array(rng.random(4), chunks=2), function="numpy:reshape", kwargs={"shape": 7})
    with pytest.raises(ValueError, match="cannot reshape") as e:
        out.compute(scheduler="sync")
    assert "in map_blocks function 'numpy:reshape'" in "".join(getattr(e.value, "__notes__", []))


def test_kwargs_the_function_does_not_take_are_refused_when_the_graph_is_built(rng):
    """A typo in ``kwargs`` passed validate and failed the run on the workers, with no line in the spec."""
    import dask.array as da

    from flowgpu.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"kwargs \['newshap'\]: .*; did you mean 'shape'\?") as e:
        get("map_blocks")(da.from_array(rng.random(4), chunks=2), function="numpy:reshape", kwargs={"newshap": 7})
    assert e.value.argument == "kwargs"
