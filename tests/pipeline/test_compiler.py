"""compile(): pure, checked, the same results as NumPy, fused or not, composed or not."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import tests.pipeline.helpers as helpers
from flowgpu import pipeline
from flowgpu.errors import SpecError
from flowgpu.fusion import fusing
from flowgpu.io import sources


def _boom(*a, **k):
    raise AssertionError("compile must not compute anything")


@pytest.fixture
def data(tmp_path, rng):
    x = rng.standard_normal((40, 6)) * 3 + 1
    np.save(tmp_path / "x.npy", x)
    return x


def chain_spec(path):
    # steps deliberately out of order: the file order does not matter
    return {
        "inputs": {"x": {"source": "npy", "path": str(path), "chunks": [10, 6]}},
        "steps": {
            "total": {"op": "sum", "inputs": ["z2"], "args": {"axis": 0}},
            "z2": {"op": "square", "inputs": ["z"]},
            "z": {"op": "divide", "inputs": ["centered", "sd"]},
            "centered": {"op": "subtract", "inputs": ["x", "mu"]},
            "mu": {"op": "mean", "inputs": ["x"], "args": {"axis": 0, "keepdims": True}},
            "sd": {"op": "std", "inputs": ["x"], "args": {"axis": 0, "keepdims": True}},
        },
        "outputs": {"z": {"from": "z", "sink": "npy", "path": "z.npy"}, "total": {"from": "total"}},
    }


@pytest.mark.parametrize("fuse", [False, True])
def test_compile_is_pure_and_matches_numpy(tmp_path, data, fuse):
    with dask.config.set({"scheduler": _boom, "flowgpu.fuse-ufuncs": fuse}):
        plan = pipeline.compile(chain_spec(tmp_path / "x.npy"))
    assert plan.fused == fuse  # what a Session fuses is said, and nothing when fusion is off
    assert plan.outputs["z"].shape == data.shape and plan.outputs["z"].dtype == np.float64
    assert plan.order.index("mu") < plan.order.index("centered") < plan.order.index("z") < plan.order.index("total")
    z_ref = (data - data.mean(0)) / data.std(0)
    with fusing(enabled=fuse):  # computed as a Session computes it
        z, total = dask.compute(plan.outputs["z"], plan.outputs["total"])
    np.testing.assert_allclose(z, z_ref, rtol=1e-10)
    np.testing.assert_allclose(total, (z_ref ** 2).sum(0), rtol=1e-10)
    assert not (tmp_path / "z.npy").exists()


def test_elementwise_chains_fuse(tmp_path, data):
    spec = {
        "inputs": {"x": {"source": "npy", "path": str(tmp_path / "x.npy")}},
        "steps": {
            "a": {"op": "abs", "inputs": ["x"]},
            "b": {"op": "sqrt", "inputs": ["a"]},
            "c": {"op": "multiply", "inputs": ["b"], "args": {"b": 2.0}},
            "d": {"op": "add", "inputs": ["c", "x"]},
            "s": {"op": "sum", "inputs": ["d"], "args": {"axis": 1}},
            "e": {"op": "negative", "inputs": ["x"]},
            "f": {"op": "exp", "inputs": ["e"]},
            "g": {"op": "expr", "inputs": {"u": "x", "w": "b"}, "args": {"expression": "u * w + 1"}},
            "h": {"op": "max", "inputs": ["g"], "args": {"axis": 0}},
            "big": {"op": "greater", "inputs": ["x"], "args": {"b": 1.5}},
            "anybig": {"op": "any", "inputs": ["big"], "args": {"axis": 0}},
        },
        "outputs": {"s": {"from": "s"}, "f": {"from": "f"}, "a": {"from": "b"}, "h": {"from": "h"},
                    "anybig": {"from": "anybig"}},
    }
    plan = pipeline.compile(spec)
    assert plan.fused
    # the graph is dask's own: what the Session's rewrite fuses is what the plan says
    assert plan.fusion == {"b": "sqrt(abs(x))", "s": "((b * 2.0) + x) -> sum", "f": "exp((-x))",
                           "h": "(x * b + 1) -> max",  # an expr step is a chain like the others
                           "anybig": "(x > 1.5) -> any"}  # as written, not as the kernel reduces booleans
    assert plan.nodes["g"].fused_into == "h"
    assert plan.nodes["a"].fused_into == "b" and plan.nodes["c"].fused_into == "s" and plan.nodes["d"].fused_into == "s"
    assert plan.nodes["e"].fused_into == "f" and plan.nodes["s"].deps == ["b", "x"]
    b = np.sqrt(np.abs(data))
    with fusing():
        s, f, a, h = dask.compute(*(plan.outputs[k] for k in ("s", "f", "a", "h")))
    np.testing.assert_allclose(s, (b * 2 + data).sum(1), rtol=1e-12)
    np.testing.assert_allclose(f, np.exp(-data), rtol=1e-12)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(h, (data * b + 1).max(0), rtol=1e-12)
    rows = {r["name"]: r for r in pipeline.describe(plan)["steps"]}
    assert rows["s"]["fused"].endswith("-> sum") and rows["c"]["fused_into"] == "s"
    with dask.config.set({"flowgpu.fuse-ufuncs": False}):  # fusion off: nothing is said to be fused
        assert not pipeline.compile(spec).fused


def test_params_at_compile_time(tmp_path):
    spec = pipeline.from_dict({"params": {"n": 5},
                               "inputs": {"x": {"source": "arange", "stop": "${params.n}"}},
                               "steps": {"s": {"op": "sum", "inputs": ["x"]}},
                               "outputs": {"s": {"from": "s"}}})
    assert int(pipeline.compile(spec).outputs["s"].compute()) == 10
    assert int(pipeline.compile(spec, params={"n": 101}).outputs["s"].compute()) == 5050


def test_python_callable_and_tuple_results(rng):
    seed = int(rng.integers(1 << 30))
    spec = {
        "inputs": {"m": {"source": "python", "callable": "tests.pipeline.helpers:make_matrix",
                         "args": {"rows": 9, "cols": 4, "seed": seed}, "shape": [9, 4], "dtype": "float64"}},
        "steps": {"parts": {"op": "test_split", "inputs": ["m"], "args": {"at": 3}},
                  "head_sum": {"op": "sum", "inputs": ["parts.0"]}},
        "outputs": {"head": {"from": "head_sum"}, "tail": {"from": "parts.1"}},
    }
    plan = pipeline.compile(spec, for_run=True)  # as a run compiles it: the callable is called
    m = helpers.make_matrix(9, 4, seed)
    np.testing.assert_allclose(plan.outputs["head"].compute(), m[:3].sum())
    np.testing.assert_allclose(plan.outputs["tail"].compute(), m[3:])
    spec["steps"]["head_sum"]["inputs"] = ["parts.7"]
    with pytest.raises(SpecError, match="has no output '7'"):
        pipeline.compile(spec)


def test_zarr_source(tmp_path, rng):
    import zarr

    x = rng.random((12, 5)).astype("float32")
    z = zarr.create_array(str(tmp_path / "in.zarr"), shape=x.shape, chunks=(4, 5), dtype=x.dtype)
    z[:] = x
    plan = pipeline.compile({"inputs": {"x": {"source": "zarr", "path": str(tmp_path / "in.zarr")}},
                             "steps": {"m": {"op": "max", "inputs": ["x"], "args": {"axis": 0}}},
                             "outputs": {"m": {"from": "m"}}})
    assert plan.arrays["x"].chunks == ((4, 4, 4), (5,))
    np.testing.assert_array_equal(plan.outputs["m"].compute(), x.max(0))


def test_uses_binds_inputs_passes_params_and_exposes_outputs(tmp_path, rng):
    (tmp_path / "inner.yaml").write_text(
        "params: {k: 1.0}\n"
        "inputs:\n  a: {source: zeros, shape: [7]}\n  b: {source: ones, shape: [7]}\n"
        "steps:\n  scaled: {op: multiply, inputs: [a], args: {b: '${params.k}'}}\n"
        "  shifted: {op: add, inputs: [scaled, b]}\n"
        "outputs:\n  result: {from: shifted, sink: npy, path: never-written.npy}\n")
    v = rng.standard_normal(7)
    np.save(tmp_path / "v.npy", v)
    (tmp_path / "outer.yaml").write_text(
        f"inputs:\n  v: {{source: npy, path: '{tmp_path / 'v.npy'}'}}\n"
        "steps:\n  inner: {uses: inner.yaml, inputs: {a: v}, params: {k: 3.0}}\n"
        "  total: {op: sum, inputs: [inner.result]}\n"
        "outputs:\n  total: {from: total}\n  vec: {from: inner.result}\n")
    plan = pipeline.compile(tmp_path / "outer.yaml")
    np.testing.assert_allclose(plan.outputs["vec"].compute(), v * 3 + 1)
    np.testing.assert_allclose(plan.outputs["total"].compute(), (v * 3 + 1).sum())
    rows = pipeline.describe(plan)["steps"]
    assert [r["name"] for r in rows if r["name"].startswith("inner/")] == [
        "inner/a", "inner/b", "inner/scaled", "inner/shifted"]
    assert not (tmp_path / "never-written.npy").exists()
    # a shape the included spec declares is checked at the binding
    (tmp_path / "outer.yaml").write_text(
        "inputs:\n  v: {source: random, shape: [8]}\n"
        "steps:\n  inner: {uses: inner.yaml, inputs: {a: v}}\n")
    with pytest.raises(SpecError, match="shape mismatch") as e:
        pipeline.compile(tmp_path / "outer.yaml")
    assert (e.value.line, e.value.path) == (4, "steps.inner.inputs.a")


def test_a_part_of_a_result_that_has_none_is_refused_where_it_is_named(tmp_path):
    """``name.part`` names one output of a step with several (a ``uses`` step); on a step with one
    result, or a part it does not have, the spec is refused at that field, in a step's inputs, a
    ``uses`` binding and an output's ``from`` alike (``from`` once took the whole result, and a
    binding failed with an internal error)."""
    (tmp_path / "inner.yaml").write_text("inputs:\n  a: {source: random, shape: [7]}\n"
                                         "steps:\n  s: {op: sqrt, inputs: [a]}\noutputs:\n  r: {from: s}\n")
    head = "inputs:\n  v: {source: random, shape: [7], seed: 1}\nsteps:\n  first: {uses: inner.yaml, inputs: {a: v}}\n"
    cases = [
        ("  total: {op: sum, inputs: [v]}\noutputs:\n  t: {from: total.mean}\n", "outputs.t.from",
         "'total.mean': step 'total' has a single result"),
        ("  inner: {uses: inner.yaml, inputs: {a: first.r9}}\noutputs:\n  t: {from: inner.r}\n",
         "steps.inner.inputs.a", "'first.r9': step 'first' has no output 'r9'.*first.r"),
        ("  total: {op: sum, inputs: [first.r9]}\noutputs:\n  t: {from: total}\n", "steps.total.inputs[0]",
         "'first.r9': step 'first' has no output 'r9'"),
        ("  total: {op: sum, inputs: [first.r]}\noutputs:\n  t: {from: first.x}\n", "outputs.t.from",
         "'first.x': step 'first' has no output 'x'"),
    ]
    for body, path, message in cases:
        (tmp_path / "outer.yaml").write_text(head + body)
        with pytest.raises(SpecError, match=message) as e:
            pipeline.compile(tmp_path / "outer.yaml")
        assert e.value.path == path and e.value.line == (7 if path.startswith("outputs") else 5)
    (tmp_path / "outer.yaml").write_text(head + "  total: {op: sum, inputs: [first.r]}\noutputs:\n  t: {from: total}\n")
    plan = pipeline.compile(tmp_path / "outer.yaml")
    v = plan.arrays["v"].compute()
    np.testing.assert_allclose(plan.outputs["t"].compute(), np.sqrt(v).sum())


def test_errors_in_included_files_point_into_them(tmp_path):
    (tmp_path / "inner.yaml").write_text("steps:\n  s: {op: sqrtt, inputs: []}\n")
    (tmp_path / "outer.yaml").write_text("steps:\n  inner: {uses: inner.yaml}\n")
    with pytest.raises(SpecError, match="did you mean 'sqrt'") as e:
        pipeline.validate(tmp_path / "outer.yaml")
    assert e.value.file.endswith("inner.yaml") and (e.value.line, e.value.path) == (2, "steps.s.op")


def test_shared_intermediates_are_computed_once(tmp_path, rng):
    np.save(tmp_path / "x.npy", rng.random((20, 4)))
    spec = {"inputs": {"x": {"source": "npy", "path": str(tmp_path / "x.npy"), "chunks": [5, 4]}},
            "steps": {"c": {"op": "test_counted", "inputs": ["x"]},
                      "s": {"op": "sum", "inputs": ["c"]}, "m": {"op": "max", "inputs": ["c"]}},
            "outputs": {"s": {"from": "s"}, "m": {"from": "m"},
                        "c": {"from": "c", "sink": "npy", "path": str(tmp_path / "c.npy")}}}
    helpers.CALLS["count"] = 0
    pipeline.run(spec, session="local", progress=False)
    assert helpers.CALLS["count"] == 4  # four chunks, once each, for three outputs


def _exploding(n: int):
    raise RuntimeError("source exploded")


def _a_list(n: int):
    return list(range(n))


@pytest.fixture
def plugin_sources():
    sources.register_source("test_exploding", _exploding)
    sources.register_source("test_a_list", _a_list)
    yield
    sources.SOURCES.remove("test_exploding")
    sources.SOURCES.remove("test_a_list")


@pytest.mark.parametrize("source, said", [
    ("test_exploding", "input 'x': source 'test_exploding' (from tests.pipeline.test_compiler) failed: RuntimeError: "
                       "source exploded (hint: fix it in tests.pipeline.test_compiler, or check this input's options)"),
    ("test_a_list", "input 'x': source 'test_a_list' (from tests.pipeline.test_compiler) gave list, not an array"),
])
def test_a_plugin_source_that_fails_is_named_at_its_input(plugin_sources, source, said):
    """A plugin's exception was called a bug of flowgpu; a list it gave was blamed on the next step."""
    spec = {"inputs": {"x": {"source": source, "n": 4}}, "steps": {"s": {"op": "sum", "inputs": ["x"]}},
            "outputs": {"s": {"from": "s"}}}
    with pytest.raises(SpecError) as e:
        pipeline.validate(spec)
    assert e.value.path == "inputs.x" and said in str(e.value), str(e.value)
