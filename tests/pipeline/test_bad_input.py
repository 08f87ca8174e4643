"""Bad input: one table. Each case gives exit code 2 and one message with file:line:col, the field
path and a hint, and nothing is executed or written."""

from __future__ import annotations

import os
import re

import dask
import pytest
from click.testing import CliRunner

import flowgpu.pipeline.runner as runner_mod
import flowgpu.runtime.session as session_mod
from flowgpu.cli import cli

GOOD_INPUTS = """\
inputs:
  x: {source: random, shape: [8, 4], seed: 1}
"""

# name: (spec text, extra files {name: text}, extra CLI args, expected line, field path, words in message)
CASES = {
    "malformed yaml": ("name: t\nsteps:\n  a: b: c\n", {}, [], 3, "<document>", "malformed YAML"),
    "tab indentation": ("name: t\ninputs:\n\tx: 1\n", {}, [], 3, "<document>", "malformed YAML"),
    "duplicate key": (GOOD_INPUTS + "steps:\n  s: {op: sum, inputs: [x]}\n  s: {op: mean, inputs: [x]}\n",
                      {}, [], 5, "steps.s", "duplicate key 's'"),
    "python tag": ("name: !!python/object/apply:os.system ['touch pwned']\n", {}, [], 1, "name",
                   "'!!python/object/apply:os.system' is not allowed"),
    "custom tag": (GOOD_INPUTS + "steps:\n  s: !include other.yaml\n", {}, [], 4, "steps.s", "is not allowed"),
    "unknown top-level key": (GOOD_INPUTS + "stepz:\n  s: {op: sum, inputs: [x]}\n", {}, [], 3, "stepz",
                              "did you mean 'steps'"),
    "unknown step key": (GOOD_INPUTS + "steps:\n  s:\n    op: sum\n    inputs: [x]\n    arg: {axis: 0}\n",
                         {}, [], 7, "steps.s.arg", "did you mean 'args'"),
    "wrong type shape": ("inputs:\n  x: {source: random, shape: [8, big]}\n", {}, [], 2, "inputs.x.shape[1]",
                         "valid integer"),
    "wrong type inputs": (GOOD_INPUTS + "steps:\n  s: {op: sum, inputs: 3}\n", {}, [], 4, "steps.s.inputs",
                          "valid list"),
    "not a mapping": ("- a\n- b\n", {}, [], 1, "<document>", "not list"),
    "unknown source": ("inputs:\n  x: {source: randm, shape: [3]}\n", {}, [], 2, "inputs.x.source",
                       "unknown source 'randm'"),
    "unknown op": (GOOD_INPUTS + "steps:\n  s: {op: summ, inputs: [x]}\n", {}, [], 4, "steps.s.op",
                   "did you mean 'sum'"),
    "bad op argument": (GOOD_INPUTS + "steps:\n  s: {op: sum, inputs: [x], args: {axes: 0}}\n", {}, [], 4,
                        "steps.s.args.axes", "unknown argument 'axes'; did you mean 'axis'"),
    "bad op argument type": (GOOD_INPUTS + "steps:\n  s:\n    op: sum\n    inputs: [x]\n    args:\n"
                             "      keepdims: 'yes'\n", {}, [], 8, "steps.s.args.keepdims",
                             "argument 'keepdims' must be bool, not str"),
    "missing op argument": (GOOD_INPUTS + "steps:\n  s: {op: clip, inputs: [x], args: {lo: 0}}\n", {}, [], 4,
                            "steps.s.args", "missing argument 'hi'"),
    "too many op inputs": (GOOD_INPUTS + "steps:\n  s: {op: sqrt, inputs: [x, x]}\n", {}, [], 4,
                           "steps.s.inputs", "takes 1 input(s) (x), got 2"),
    "include spelled out": (GOOD_INPUTS + "steps:\n  sub: {include: other.yaml}\n", {}, [], 4,
                            "steps.sub.include", "did you mean 'uses'"),
    "expr inputs by position": (GOOD_INPUTS + "steps:\n  e:\n    op: expr\n    inputs: [x]\n"
                                "    args: {expression: 'x * 2'}\n", {}, [], 6, "steps.e.inputs",
                                "takes its inputs by name"),
    "op and uses": (GOOD_INPUTS + "steps:\n  s: {op: sum, uses: other.yaml}\n", {}, [], 4, "steps.s",
                    "exactly one of 'op' or 'uses'"),
    "invalid name": (GOOD_INPUTS + "steps:\n  my-step: {op: sum, inputs: [x]}\n", {}, [], 4, "steps.my-step",
                     "not a valid name"),
    "missing ref": (GOOD_INPUTS + "steps:\n  s: {op: sum, inputs: [xx]}\n", {}, [], 4, "steps.s.inputs[0]",
                    "did you mean 'x'"),
    "missing output ref": (GOOD_INPUTS + "outputs:\n  o: {from: nothing}\n", {}, [], 4, "outputs.o.from",
                           "not an input or step"),
    "cyclic ref": (GOOD_INPUTS + "steps:\n  a: {op: add, inputs: [x, b]}\n  b: {op: sqrt, inputs: [a]}\n",
                   {}, [], 4, "steps.a.inputs", "cycle"),
    "step reads itself": (GOOD_INPUTS + "steps:\n  a: {op: add, inputs: [x, a]}\n", {}, [], 4, "steps.a.inputs",
                          "reads its own result"),
    "missing include": (GOOD_INPUTS + "steps:\n  sub: {uses: nothere.yaml}\n", {}, [], 4, "steps.sub.uses",
                        "does not exist"),
    "self include": (GOOD_INPUTS + "steps:\n  sub: {uses: spec.yaml}\n", {}, [], 4, "steps.sub.uses",
                     "includes the spec it is in"),
    "cyclic include": (GOOD_INPUTS + "steps:\n  sub: {uses: other.yaml}\n",
                       {"other.yaml": "steps:\n  back: {uses: spec.yaml}\n"}, [], 2, "steps.back.uses",
                       "cyclic include"),
    "include undeclared param": (GOOD_INPUTS + "steps:\n  sub:\n    uses: other.yaml\n    params: {m: 3}\n",
                                 {"other.yaml": "params: {n: 2}\n"}, [], 6, "steps.sub.params.m", "no param 'm'"),
    "shape mismatch": (GOOD_INPUTS + "  y: {source: random, shape: [3], seed: 2}\n"
                       "steps:\n  s: {op: add, inputs: [x, y]}\n", {}, [], 5, "steps.s", "fails on its inputs"),
    "shape mismatch expect": (GOOD_INPUTS + "steps:\n  s:\n    op: sum\n    inputs: [x]\n    args: {axis: 0}\n"
                              "    expect: {shape: [8]}\n", {}, [], 8, "steps.s.expect.shape", "shape mismatch"),
    "dtype mismatch expect": (GOOD_INPUTS + "steps:\n  s:\n    op: sqrt\n    inputs: [x]\n"
                              "    expect: {dtype: float32}\n", {}, [], 7, "steps.s.expect.dtype", "dtype mismatch"),
    "dtype mismatch include": (GOOD_INPUTS + "steps:\n  sub:\n    uses: other.yaml\n    inputs: {a: x}\n",
                               {"other.yaml": "inputs:\n  a: {source: zeros, shape: [8, 4], dtype: float32}\n"},
                               [], 6, "steps.sub.inputs.a", "dtype mismatch"),
    "undefined param": ("params: {n: 4}\ninputs:\n  x: {source: random, shape: ['${params.m}']}\n", {}, [], 3,
                        "inputs.x.shape[0]", "undefined param 'm'"),
    "unquoted param in flow": ("params: {n: 4}\ninputs:\n  x: {source: random, shape: [${params.n}]}\n", {}, [], 3,
                               "<document>", "malformed YAML"),
    "override undeclared param": ("params: {n: 4}\n" + GOOD_INPUTS, {}, ["--set", "params.nn=3"], 1, "params",
                                  "does not declare"),
    "override wrong type": ("params: {n: 4}\n" + GOOD_INPUTS, {}, ["--set", "params.n=many"], 1, "params.n",
                            "param 'n' is int"),
    "param without value": ("params:\n  n: {type: int}\n" + GOOD_INPUTS, {}, [], 2, "params.n", "has no value"),
    "zarr output without path": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: zarr}\n", {}, [], 4, "outputs.o",
                                 "needs a 'path'"),
    "output path that two sinks write": (GOOD_INPUTS + "outputs:\n  o: {from: x, path: out/o.zarr}\n", {}, [], 4,
                                         "outputs.o", "may be written by sink xarray or zarr: say which"),
    "sink option with no sink": (GOOD_INPUTS + "outputs:\n  o: {from: x, path: out/o.zarr, codec: lz4}\n", {}, [], 4,
                                 "outputs.o.codec", "'codec' is an option of sink zarr, and this output names no "
                                 "sink (hint: say which: sink: zarr)"),
    "summary output with a path": (GOOD_INPUTS + "outputs:\n  o: {from: x, path: out/o}\n", {}, [], 4, "outputs.o",
                                   "a summary output (the default when no sink is given and the path's suffix "
                                   "names none) takes no 'path'; give the sink that writes the file (sink: "),
    "foreign data at output": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: npy, path: taken.npy}\n",
                               {"taken.npy": "not flowgpu's"}, [], 4, "outputs.o.path", "not written by flowgpu"),
    "two outputs one path": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: npy, path: a.npy}\n"
                             "  p: {from: x, sink: npy, path: a.npy}\n", {}, [], 5, "outputs.p.path",
                             "both write"),
    "zarr output named as a npy file": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: zarr, path: out/o.npy}\n", {},
                                        [], 4, "outputs.o.path",
                                        "the name of a .npy file, but sink 'zarr' writes a Zarr store (hint: name it "
                                        "e.g. 'out/o.zarr')"),
    "npy output named as a store": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: npy, path: o.zarr}\n", {}, [], 4,
                                    "outputs.o.path", "the name of a Zarr store, but sink 'npy' writes a .npy file"),
    "xarray output named as a TIFF": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: xarray, path: o.tif}\n", {}, [],
                                      4, "outputs.o.path", "but sink 'xarray' writes a Zarr store or a NetCDF file or "
                                                           "an HDF5 file"),
    "fill value the dtype cannot hold": ("inputs:\n  x: {source: full, shape: [4], dtype: int32, fill_value: .inf}\n",
                                         {}, [], 2, "inputs.x.fill_value", "int32 cannot hold it"),
    "chunks of zero": ("inputs:\n  x: {source: random, shape: [4, 4], chunks: [0, 2]}\n", {}, [], 2, "inputs.x",
                       "block length of 0"),
    "negative chunks": ("inputs:\n  x: {source: random, shape: [4, 4], chunks: [-2, 2]}\n", {}, [], 2, "inputs.x",
                        "block length of -2; give lengths of at least 1, -1 for a whole axis"),
    "arange to infinity": ("inputs:\n  x: {source: arange, stop: .inf}\n", {}, [], 2, "inputs.x",
                           "not a finite number"),
    "shape overflowing int64": ("inputs:\n  x: {source: random, shape: [10000000000, 10000000000]}\n", {}, [], 2,
                                "inputs.x.shape", "more than a 64-bit index can count"),
    "map_blocks kwarg the function lacks": (
        GOOD_INPUTS + "steps:\n  y: {op: map_blocks, inputs: [x], args: {function: 'kwfix_mod:clean', kwargs: "
        "{limt: 1.0}}}\noutputs:\n  o: {from: y}\n", {"kwfix_mod.py": "def clean(b, limit=1.0):\n    return b\n"},
        [], 4, "steps.y.args.kwargs", "got an unexpected keyword argument 'limt'; did you mean 'limit'?"),
    "no outputs": (GOOD_INPUTS + "steps:\n  s: {op: sum, inputs: [x]}\n", {}, [], 1, "outputs",
                   "the spec has no outputs, so a run would compute nothing (hint: add one"),
    "empty file": ("", {}, [], 1, "outputs", "the spec has no outputs"),
    "output inside a file": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: npy, path: notes/o.npy}\n",
                             {"notes": "a user's file"}, [], 4, "outputs.o.path",
                             "'notes' is a file, so 'notes/o.npy' cannot be made inside it"),
    "expected dtype that is none": (GOOD_INPUTS + "steps:\n  s: {op: sum, inputs: [x], expect: {dtype: floatt}}\n"
                                    "outputs:\n  o: {from: s}\n", {}, [], 4, "steps.s.expect.dtype",
                                    "'floatt' is not a dtype"),
    "param default using another param": ('params: {base: out, sub: "${params.base}/deep"}\n' + GOOD_INPUTS +
                                          'outputs:\n  o: {from: x, sink: npy, path: "${params.sub}/o.npy"}\n', {},
                                          [], 1, "params.sub", "which uses ${params.base}: a param's default is not "
                                                               "substituted"),
    "zstd level out of range": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: zarr, path: o.zarr, level: 99}\n",
                                {}, [], 4, "outputs.o.level", "less than or equal to 22"),
    "zarr shards that are not whole chunks": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: zarr, path: o.zarr, "
                                              "chunks: [2, 4], shards: [3, 4]}\n", {}, [], 4, "outputs.o.shards",
                                              "zarr shards [3, 4] are not whole multiples of chunks [2, 4]"),
    "zarr level for lz4": (GOOD_INPUTS + "outputs:\n  o: {from: x, sink: zarr, path: o.zarr, codec: lz4, level: 5}\n",
                           {}, [], 4, "outputs.o.level", "zarr level 5 is for codec zstd only"),
    "expression with an unknown name": (GOOD_INPUTS + 'steps:\n  s: {op: expr, inputs: {x: x}, args: {expression: '
                                        '"x * k"}}\noutputs:\n  o: {from: s}\n', {}, [], 4, "steps.s.args.expression",
                                        "unknown name 'k'; the inputs are: x"),
    "nesting too deep": ("name: " + "[" * 200 + "]" * 200 + "\n", {}, [], 1, "<document>", "nests deeper than 100"),
}


def _snapshot(root) -> list:
    out = []
    for d, dirs, files in os.walk(root):
        out += [os.path.join(d, f) for f in files] + [os.path.join(d, x) + "/" for x in dirs]
    return sorted(out)


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail loudly if anything is computed or a cluster is started."""
    def boom(*args, **kwargs):
        raise AssertionError("a bad spec must not start a cluster or compute anything")

    monkeypatch.setattr(session_mod.Session, "__init__", boom)
    monkeypatch.setattr(runner_mod, "execute", boom)
    monkeypatch.setattr(runner_mod.sinks, "prepare_write", boom)
    with dask.config.set(scheduler=boom):
        yield


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case, tmp_path, monkeypatch, nothing_runs):
    text, extra, args, line, path, words = CASES[case]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(text)
    for name, content in extra.items():
        (tmp_path / name).write_text(content)
    before = _snapshot(tmp_path)
    result = CliRunner().invoke(cli, ["run", "spec.yaml", *args, "--quiet"])
    message = result.output
    assert result.exit_code == 2, (result.exit_code, message, result.exception)
    assert message.count("error:") == 1, message
    where = re.search(r"(\S+\.yaml):(\d+):(\d+)", message)
    assert where, f"no file:line:col in {message!r}"
    assert int(where.group(2)) == line, message
    assert f": {path}: " in message, message
    assert "(hint: " in message, message
    assert words in message, message
    assert _snapshot(tmp_path) == before
    assert not os.path.exists(tmp_path / "pwned")


def test_table_is_large_enough():
    assert len(CASES) >= 20


def test_a_missing_params_file_is_called_a_params_file(tmp_path, monkeypatch, nothing_runs):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(GOOD_INPUTS + "outputs:\n  o: {from: x}\n")
    result = CliRunner().invoke(cli, ["run", "spec.yaml", "--params", "nothere.yaml", "--quiet"])
    assert result.exit_code == 2 and "params file 'nothere.yaml' does not exist" in result.output, result.output


def test_a_python_pipeline_given_as_the_spec_says_how_to_run_it(tmp_path, monkeypatch, nothing_runs):
    """`flowgpu run build.py` said 'malformed YAML: mapping values are not allowed here'."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build.py").write_text('import flowgpu as fg\np = fg.Pipeline("demo", description="x: y")\n')
    for command in ("run", "validate", "plan", "status"):
        result = CliRunner().invoke(cli, [command, "build.py"])
        assert result.exit_code == 2, result.output
        assert result.output == ("error: build.py: <document>: 'build.py' is a Python file, not a YAML spec file "
                                 "(hint: run a Python pipeline with python build.py, or write it as YAML with "
                                 "p.to_yaml(...) and give that file)\n"), result.output
