"""Pipelines built in Python (flowgpu.Pipeline): the same spec, plan and results as the YAML a user
writes by hand, a YAML round trip, and errors that point at the Python line that made them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import dask.array as da
import numpy as np
import pytest
import zarr

import flowgpu as fg
from flowgpu import pipeline
from flowgpu.errors import ConfigError, OutputExistsError, SpecError
from flowgpu.pipeline.builder import SPEC_HEAD
from flowgpu.pipeline.spec import Spec
import tests.pipeline.helpers  # noqa: F401  (registers the test ops)
from tests.pipeline import builder_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.abspath(__file__)

YAML = """\
# yaml-language-server: $schema=./flowgpu-pipeline.schema.json
version: 1
name: standardise
description: standardise a synthetic matrix, add a matrix read from a file
params:
  n: {type: int, default: 40, description: rows}
  seed: {type: int, default: 0}
  out: {type: str, default: flowgpu-output/builder}
inputs:
  x: {source: normal, shape: ["${params.n}", 6], dtype: float32, seed: "${params.seed}", loc: 3.0, scale: 2.0,
      chunks: [10, -1]}
  y: {source: npy, path: DATA, chunks: [10, -1]}
steps:
  mu:    {op: mean, inputs: [x], args: {axis: 0, keepdims: true}}
  sigma: {op: std, inputs: [x], args: {axis: 0, keepdims: true}}
  z:
    op: expr
    inputs: {x: x, mu: mu, sigma: sigma}
    args: {expression: "(x - mu) / sigma"}
    expect: {dtype: float32}
  w:     {op: add, inputs: [z, y]}
  z2:    {op: square, inputs: [z]}
  energy: {op: sum, inputs: [z2]}
  total: {op: sum, inputs: [w], args: {axis: 0}}
outputs:
  z: {from: z, sink: zarr, path: "${params.out}/z-${params.n}.zarr"}
  w: {from: w, sink: npy, path: "${params.out}/w.npy"}
  energy: {from: energy}
  total: {from: total}
"""


def build_in_python(data) -> fg.Pipeline:
    """The pipeline of YAML, written in Python."""
    p = fg.Pipeline("standardise", description="standardise a synthetic matrix, add a matrix read from a file")
    n = p.param("n", 40, description="rows")
    seed = p.param("seed", 0)
    out = p.param("out", "flowgpu-output/builder")
    x = p.input("x", source="normal", shape=(n, 6), dtype=np.float32, seed=seed, loc=3.0, scale=2.0,
                chunks=[10, -1])
    y = p.input("y", source="npy", path=data, chunks=[10, -1])
    mu = p.step("mu", "mean", x, axis=0, keepdims=True)
    sigma = p.step("sigma", "std", x, axis=0, keepdims=True)
    z = p.step("z", "expr", x=x, mu=mu, sigma=sigma, expression="(x - mu) / sigma", expect={"dtype": "float32"})
    w = p.step("w", "add", z, y)
    p.output("z", z, sink="zarr", path=f"{out}/z-{n}.zarr")
    p.output("w", w, "npy", path=f"{out}/w.npy")
    p.output("energy", p.step("energy", "sum", p.step("z2", "square", z)))
    p.output("total", p.step("total", "sum", w, axis=0))
    return p


@pytest.fixture
def both(tmp_path, rng):
    """The pipeline built in Python and loaded from the YAML file, over fresh data."""
    y = rng.standard_normal((40, 6))
    np.save(tmp_path / "y.npy", y)
    (tmp_path / "spec.yaml").write_text(YAML.replace("DATA", str(tmp_path / "y.npy")))
    return build_in_python(tmp_path / "y.npy"), pipeline.load(tmp_path / "spec.yaml"), y


def line_of(marker: str) -> int:
    """The line of this file that holds ``# @marker``."""
    with open(HERE) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# @{marker}"))


def col_of(marker: str, text: str) -> int:
    with open(HERE) as f:
        return f.readlines()[line_of(marker) - 1].index(text) + 1


def without_file(plan: dict) -> dict:
    return {k: v for k, v in plan.items() if k != "file"}


@pytest.mark.timeout(120)
def test_python_and_yaml_give_the_same_spec_plan_and_results(tmp_path, rng, both):
    p, spec, y = both
    assert p.spec.model_dump() == spec.model_dump()
    assert p.spec.steps["z"].inputs == {"x": "x", "mu": "mu", "sigma": "sigma"}
    assert p.spec.outputs["z"].path == os.path.abspath("flowgpu-output/builder/z-40.zarr")  # refs in f-strings are params
    assert without_file(p.plan()) == without_file(pipeline.describe(pipeline.compile(spec)))
    assert p.plan()["file"] == HERE and p.plan({"seed": 5})["params"]["seed"] == 5

    seed = int(rng.integers(1 << 30))
    runs = {}
    for name, what in (("python", p), ("yaml", spec)):
        overrides = {"params.seed": seed, "params.out": str(tmp_path / name)}
        runs[name] = p.run(session="local", progress=False, overrides=overrides) if what is p else \
            pipeline.run(what, session="local", progress=False, overrides=overrides)
    x = fg.normal((40, 6), dtype="float32", seed=seed, loc=3.0, scale=2.0, chunks=(10, -1)).compute()
    z = (x - x.mean(0)) / x.std(0)
    for name, result in runs.items():
        np.testing.assert_allclose(zarr.open_array(str(tmp_path / name / "z-40.zarr"))[:], z, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.load(tmp_path / name / "w.npy"), z + y, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(result.outputs["energy"], (z.astype(np.float64) ** 2).sum(), rtol=1e-4)
        np.testing.assert_allclose(result.outputs["total"], (z + y).sum(0), rtol=1e-4, atol=1e-4)
    assert runs["python"].outputs["energy"] == runs["yaml"].outputs["energy"]
    np.testing.assert_array_equal(runs["python"].outputs["total"], runs["yaml"].outputs["total"])


def test_the_docs_python_example_is_the_docs_yaml_example(tmp_path):
    text = open(os.path.join(ROOT, "docs", "pipelines.md")).read()
    yaml_example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    python = text.split("## Pipelines in Python", 1)[1].split("```python\n", 1)[1].split("\np.plan()", 1)[0]
    (tmp_path / "example.yaml").write_text(yaml_example)
    (tmp_path / "example.py").write_text(python)
    scope: dict = {}
    exec(compile(python, str(tmp_path / "example.py"), "exec"), scope)
    p, spec = scope["p"], pipeline.load(tmp_path / "example.yaml")
    for section in ("inputs", "steps", "outputs", "cluster"):
        assert getattr(p.spec, section) == getattr(spec, section), section
    assert without_file(p.plan({"n": 50})) == without_file(pipeline.describe(pipeline.compile(spec, {"n": 50})))


def test_import_flowgpu_stays_light_until_pipeline_is_used():
    code = ("import sys, flowgpu; loaded = 'flowgpu.pipeline' in sys.modules; flowgpu.Pipeline; "
            "print(loaded, 'flowgpu.pipeline.builder' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.stdout.split() == ["False", "True"], out.stderr


def test_to_yaml_round_trip(tmp_path, both):
    p, spec, _ = both
    path = tmp_path / "written.yaml"
    text = p.to_yaml(path, schema="./flowgpu-pipeline.schema.json")
    assert text.startswith(SPEC_HEAD + "# yaml-language-server: $schema=./flowgpu-pipeline.schema.json\n")
    assert path.read_text() == text and not [f for f in os.listdir(tmp_path) if f.startswith(".")]
    assert pipeline.load(path) == p.spec == spec  # equal specs, read from different places
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()  # a file to share, not a private one
    assert "${params.n}" in p.to_yaml() and "schema" not in p.to_yaml()
    again = fg.Pipeline.from_yaml(path)
    assert again.to_dict() == p.to_dict() and again.spec.model_dump() == spec.model_dump()
    assert fg.Pipeline.from_spec(spec).spec.model_dump() == spec.model_dump()
    # the YAML written from Python is a spec the command line accepts
    out = subprocess.run([sys.executable, "-m", "flowgpu", "validate", str(path)], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def test_to_yaml_never_replaces_the_script_an_input_or_a_file_it_did_not_write(tmp_path, rng, monkeypatch):
    """It replaced any file unasked: the pipeline's own input and the script calling it were lost."""
    monkeypatch.chdir(tmp_path)
    data = rng.random(12)
    np.save("data.npy", data)
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "sub").mkdir()
    p = fg.Pipeline("demo")
    p.output("t", p.step("t", "sum", p.input("x", source="npy", path="data.npy")))
    for target, said in (("data.npy", "'data.npy' is input 'x'"), (__file__, "is the spec"),
                         (".", "is the working directory"), ("sub", "'sub' is a folder")):
        with pytest.raises(ConfigError, match=f"to_yaml: .*{said}"):
            p.to_yaml(target)
    with pytest.raises(OutputExistsError, match="'notes.txt' already exists and is not a spec flowgpu wrote"):
        p.to_yaml("notes.txt")
    np.testing.assert_array_equal(np.load("data.npy"), data)
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    p.to_yaml("demo.yaml")
    p.output("m", p.step("m", "max", p["x"]))
    p.to_yaml("demo.yaml")  # its own earlier spec: replaced
    assert set(pipeline.load("demo.yaml").outputs) == {"t", "m"}
    p.to_yaml("notes.txt", overwrite=True)
    assert pipeline.load("notes.txt") == p.spec


def test_a_pipeline_read_from_yaml_extends_in_python_and_errors_name_each_file(tmp_path, both):
    _, spec, _ = both
    p = fg.Pipeline.from_yaml(tmp_path / "spec.yaml")
    p.output("mu", p.step("shifted", "add", p["mu"], p["sigma"]))
    assert p.spec.steps["shifted"].inputs == ["mu", "sigma"] and set(p.spec.outputs) == {*spec.outputs, "mu"}
    p.step("bad", "meen", p["x"])  # @extended
    with pytest.raises(SpecError) as e:
        p.plan()
    assert (e.value.file, e.value.line, e.value.path) == (HERE, line_of("extended"), "steps.bad.op")
    with pytest.raises(SpecError) as e:
        p.plan({"n": "many"})  # a YAML param: the YAML file's line
    assert (e.value.file, e.value.line) == (str(tmp_path / "spec.yaml"), 6)
    assert str(p["params.n"]) == "${params.n}"
    with pytest.raises(SpecError, match="did you mean 'sigma'"):
        p["sigam"]


def test_validation_errors_point_at_the_python_line(tmp_path):
    p = fg.Pipeline("errors")
    x = p.input("x", source="normal", shape=[8, 4], seed=1)
    p.step("m", "mean", x,
           axis=0, keepdimz=True)  # @bad-arg
    with pytest.raises(SpecError) as e:
        p.plan()
    assert (e.value.file, e.value.line, e.value.col) == (HERE, line_of("bad-arg"), col_of("bad-arg", "keepdimz"))
    assert e.value.path == "steps.m.args.keepdimz" and "keepdims" in str(e.value)
    assert str(e.value).startswith(f"{HERE}:{line_of('bad-arg')}:")

    p = fg.Pipeline("errors")
    x = p.input("x", source="normal", shape=[8, 4], seed=1)
    y = p.input("y", source="normal", shape=[5, 3], seed=2)
    p.output("s", p.step("s", "add", x, y))  # @shapes
    with pytest.raises(SpecError) as e:
        p.compile()
    assert (e.value.line, e.value.col, e.value.path) == (line_of("shapes"), col_of("shapes", "p.step"), "steps.s")

    p = fg.Pipeline("errors")
    x = p.input("x", source="normal", shape=[8, 4], seed=1)
    p.step("t", "transpose", x, expect={"shape": [8, 4]})  # @expect
    with pytest.raises(SpecError, match="shape mismatch") as e:
        p.compile()
    assert (e.value.line, e.value.path) == (line_of("expect"), "steps.t.expect.shape")

    p = fg.Pipeline("errors")
    p.input("x", source="normal", shape=[8, 4], sed=1)  # @unknown-key
    with pytest.raises(SpecError, match="unknown key 'sed'.*did you mean 'seed'") as e:
        p.spec
    assert (e.value.line, e.value.col, e.value.path) == (line_of("unknown-key"), col_of("unknown-key", "sed="),
                                                          "inputs.x.sed")

    p = fg.Pipeline("errors")
    n = p.param("n", 8)  # @param
    x = p.input("x", source="normal", shape=[n, 4])
    p.output("first", p.step("split", "test_split", x)["0"])
    p.output("bad", p.step("t", "transpose", p["split"]["2"]))  # @part
    with pytest.raises(SpecError, match="has no output '2'") as e:
        p.compile()
    assert (e.value.line, e.value.path) == (line_of("part"), "steps.t.inputs[0]")
    with pytest.raises(SpecError, match="param 'n' is int") as e:
        p.run(session="local", progress=False, overrides={"params.n": "eight"})
    assert (e.value.line, e.value.col) == (line_of("param"), col_of("param", "p.param"))


def test_wrong_uses_of_the_builder_fail_at_the_calling_line():
    p = fg.Pipeline("uses")
    x = p.input("x", source="normal", shape=[8, 4], seed=1)
    with pytest.raises(SpecError, match=r"'x' is already defined \(inputs.x, at .*test_builder.py") as e:
        p.step("x", "abs", x)  # @twice
    assert (e.value.file, e.value.line, e.value.path) == (HERE, line_of("twice"), "steps.x")
    with pytest.raises(SpecError, match="float 0.5 where an input or step is needed.*by keyword") as e:
        p.step("s", "subtract", x, 0.5)  # @non-ref
    assert (e.value.line, e.value.col, e.value.path) == (line_of("non-ref"), col_of("non-ref", "0.5"),
                                                          "steps.s.inputs[1]")
    with pytest.raises(SpecError, match=r"p\['x'\]"):
        p.output("o", "x")
    other = fg.Pipeline("other")
    theirs = other.input("x", source="normal", shape=[8, 4])
    with pytest.raises(SpecError, match="belongs to another pipeline") as e:
        p.step("y", "add", x, theirs)  # @other
    assert e.value.line == line_of("other")
    with pytest.raises(SpecError, match="by position .* or by name"):
        p.step("e", "expr", x, y=x, expression="x + y")
    with pytest.raises(SpecError, match="is not a valid name"):
        p.step("not a name", "abs", x)
    with pytest.raises(SpecError, match="is a param, not an array"):
        p.step("q", "abs", p.param("k", 2))
    with pytest.raises(SpecError, match="cannot be used here"):
        p.step("r", "clip", x, lo=0, hi={"a": x})
    with pytest.raises(SpecError, match="set .* is not spec data"):
        p.input("w", source="normal", shape={8, 4})
    with pytest.raises(SpecError, match="source is the name of a source .*, not a dask.array.core.Array") as e:
        p.input("z", source=da.ones(3))  # @array-source
    assert (e.value.line, e.value.col, e.value.path) == (line_of("array-source"), col_of("array-source", "source="),
                                                          "inputs.z.source")
    assert set(p.spec.steps) == set() and set(p.spec.inputs) == {"x"}  # nothing half-added
    p.step("ok", "clip", x, lo=0, hi=p["params.k"])
    assert p.to_dict()["steps"]["ok"] == {"op": "clip", "inputs": ["x"], "args": {"lo": 0, "hi": "${params.k}"}}


@pytest.mark.timeout(60)
def test_a_uses_step_binds_refs_and_passes_params(tmp_path, rng):
    (tmp_path / "inner.yaml").write_text(
        "params: {k: {type: float, default: 1.0}}\n"
        "inputs: {x: {source: normal, shape: [9, 4], dtype: float64}}\n"
        "steps: {scaled: {op: multiply, inputs: [x], args: {b: '${params.k}'}}, total: {op: sum, inputs: [scaled]}}\n"
        "outputs: {total: {from: total}}\n")
    x = rng.standard_normal((9, 4))
    np.save(tmp_path / "x.npy", x)
    p = fg.Pipeline("outer")
    k = p.param("k", 2.5)
    inner = p.uses("inner", tmp_path / "inner.yaml", x=p.input("x", source="npy", path=tmp_path / "x.npy"),
                   params={"k": k})
    p.output("total", inner["total"])
    assert p.to_dict()["steps"]["inner"] == {"uses": str(tmp_path / "inner.yaml"), "inputs": {"x": "x"},
                                             "params": {"k": "${params.k}"}}
    result = p.run(session="local", progress=False, overrides={"params.k": 0.5})
    np.testing.assert_allclose(result.outputs["total"], 0.5 * x.sum())
    p.output("bad", inner["totl"])  # @uses-part
    with pytest.raises(SpecError, match="has no output 'totl'") as e:
        p.compile()
    assert (e.value.line, e.value.path) == (line_of("uses-part"), "outputs.bad.from")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_functions_become_map_blocks_steps(tmp_path, rng):
    p = builder_steps.p
    step = p.spec.steps["centred"]
    assert (step.op, step.inputs) == ("map_blocks", ["x", "mu"])
    assert step.args == {"function": "tests.pipeline.builder_steps:centred", "dtype": "float32"}
    assert step.description == "Each value less its column's mean (the blocks of x and mu, chunk by chunk)."
    assert builder_steps.centred(np.float32(3), np.float32(1)) == 2  # the module keeps its function
    seed = int(rng.integers(1 << 30))
    result = p.run(session="local", progress=False, overrides={"params.seed": seed, "params.out": str(tmp_path / "py")})
    x = fg.normal((48, 5), dtype="float32", seed=seed, chunks=(12, -1)).compute()
    np.testing.assert_allclose(np.load(tmp_path / "py" / "centred.npy"), x - x.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.outputs["spread"], ((x - x.mean(0)) ** 2).sum(), rtol=1e-4)
    # its YAML runs from the command line, which imports the function by its path
    p.to_yaml(tmp_path / "blocks.yaml")
    out = subprocess.run([sys.executable, "-m", "flowgpu", "run", str(tmp_path / "blocks.yaml"),
                          "--set", f"params.seed={seed}", "--set", f"params.out={tmp_path / 'cli'}"],
                         capture_output=True, text=True, timeout=100, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "cli" / "centred.npy"), np.load(tmp_path / "py" / "centred.npy"))


def test_step_functions_that_cannot_be_imported_are_refused():
    p = fg.Pipeline("fns")
    x = p.input("x", source="normal", shape=[8, 4])

    def inner(x):
        return x

    with pytest.raises(SpecError, match="defined inside a function.*top level of a module") as e:
        p.blocks(inner)  # @closure
    assert e.value.line == line_of("closure")
    with pytest.raises(SpecError, match="is a lambda"):
        p.blocks(lambda x: x)
    script: dict = {"__name__": "__main__"}
    exec("def run_me(x):\n    return x\n", script)
    with pytest.raises(SpecError, match=r"__main__.*module:name"):
        p.blocks(script["run_me"])
    with pytest.raises(SpecError, match="parameter 'mu' names no input or step"):
        p.blocks(builder_steps.centred)
    p.blocks(builder_steps.centred, name="c", mu=x)  # a parameter bound to another ref
    assert p.to_dict()["steps"]["c"]["inputs"] == ["x", "x"]


def test_foreach_goes_into_the_spec_data(tmp_path):
    p = fg.Pipeline("batch")
    n = p.param("n", 100)
    p.input("x", source="normal", shape=[n, n])
    p.foreach(n=range(100, 400, 100))
    p.foreach(path={"glob": "data/*.npy"})
    assert p.to_dict()["foreach"] == {"n": [100, 200, 300], "path": {"glob": "data/*.npy"}}
    with pytest.raises(SpecError, match="given twice"):
        p.foreach(n=[1])
    if "foreach" not in Spec.model_fields:
        pytest.skip("the spec has no foreach: yet (the batch engine adds it)")
    p = fg.Pipeline("batch")
    n = p.param("n", 100)
    p.output("total", p.step("total", "sum", p.input("x", source="normal", shape=[n, 4])))
    p.foreach(n=[10, 20])
    p.to_yaml(tmp_path / "batch.yaml")
    assert pipeline.load(tmp_path / "batch.yaml").model_dump() == p.spec.model_dump()
    assert "foreach" in p.spec.model_dump()


def test_run_and_status_pass_their_arguments_through(monkeypatch):
    p = fg.Pipeline("through")
    p.output("x", p.input("x", source="normal", shape=[8, 4], seed=3))
    calls = []
    monkeypatch.setattr(pipeline, "run", lambda spec, **kw: calls.append(("run", spec, kw)) or "ran")
    monkeypatch.setattr(pipeline, "status", lambda spec, **kw: calls.append(("status", spec, kw)) or "said",
                        raising=False)
    assert p.run(foreach={"n": [1, 2]}, force=True, session="local") == "ran"
    assert p.status(foreach={"n": [1, 2]}, checksum=True) == "said"
    assert calls == [("run", p.spec, {"foreach": {"n": [1, 2]}, "force": True, "session": "local"}),
                     ("status", p.spec, {"foreach": {"n": [1, 2]}, "checksum": True})]


def test_status_says_what_a_run_would_do_without_running(tmp_path):
    if not hasattr(pipeline, "status"):
        pytest.skip("flowgpu.pipeline.status is not in this tree yet (the batch engine adds it)")
    p = fg.Pipeline("status")
    p.output("x", p.input("x", source="normal", shape=[8, 4], seed=3), sink="npy", path=str(tmp_path / "x.npy"))
    assert type(p.status()) is type(pipeline.status(p.spec))
    assert not (tmp_path / "x.npy").exists()


# -- cache keys agree: runs once flowgpu.pipeline.cache and flowgpu.pipeline.recipe are merged ----
def test_cache_keys_of_python_and_yaml_agree(both):
    pytest.importorskip("flowgpu.pipeline.cache", reason="incremental runs (flowgpu.pipeline.cache) not merged yet")
    recipe = pytest.importorskip("flowgpu.pipeline.recipe")
    p, spec, _ = both
    python, yaml = recipe.recipes(p.compile()), recipe.recipes(pipeline.compile(spec))
    assert "z" in python and set(python) == set(yaml) <= set(spec.outputs)
    assert {k: r.digest for k, r in python.items()} == {k: r.digest for k, r in yaml.items()}
    other = recipe.recipes(p.compile({"seed": 1}))
    assert other["z"].digest != python["z"].digest  # the digests do depend on what made each output
