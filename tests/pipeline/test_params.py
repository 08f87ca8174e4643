"""Params: typed defaults, ${params.x} substitution, --set and --params overrides."""

from __future__ import annotations

import os

import pytest

from flowgpu.errors import SpecError
from flowgpu.pipeline import from_dict, load

SPEC = """\
params:
  n: {type: int, default: 6}
  scale: 2.5
  tag: {type: str, default: run}
  flags: {type: list, default: [1, 2]}
inputs:
  x: {source: normal, shape: ["${params.n}", 3], scale: "${params.scale}", seed: 3}
outputs:
  o: {from: x, sink: npy, path: "out/${params.tag}-${params.n}.npy"}
"""


def test_defaults_are_typed_and_substituted(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    spec = load(tmp_path / "s.yaml")
    assert spec.inputs["x"].shape == [6, 3]
    assert spec.inputs["x"].scale == 2.5
    assert spec.outputs["o"].path == os.path.abspath("out/run-6.npy")  # resolved on the client, where it loads
    assert spec.origin.params == {"n": 6, "scale": 2.5, "tag": "run", "flags": [1, 2]}


def test_set_and_params_file_override_in_order(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    (tmp_path / "p.yaml").write_text("n: 10\ntag: other\n")
    spec = load(tmp_path / "s.yaml", {"params.n": "12"}, params_file=str(tmp_path / "p.yaml"))
    assert spec.inputs["x"].shape == [12, 3]  # --set wins over --params
    assert spec.outputs["o"].path == os.path.abspath("out/other-12.npy")
    spec = load(tmp_path / "s.yaml", {"params.scale": "3"})
    assert spec.inputs["x"].scale == 3.0 and isinstance(spec.origin.params["scale"], float)


@pytest.mark.parametrize("top", ["", "params:\n"])
def test_a_bad_params_file_value_is_reported_where_the_file_writes_it(tmp_path, rng, top):
    (tmp_path / "s.yaml").write_text(SPEC)
    pad = "  " if top else ""
    n, scale = int(rng.integers(2, 99)), float(rng.uniform(1, 9))
    params = tmp_path / "p.yaml"
    params.write_text(f"{top}{pad}scale: {scale}\n{pad}nn: {n}\n")  # a typo: nn for n
    with pytest.raises(SpecError) as e:
        load(tmp_path / "s.yaml", params_file=str(params))
    at = "params.nn" if top else "nn"
    assert str(e.value).startswith(f"{params}:{2 + bool(top)}:{1 + len(pad)}: {at}: params file entry params.nn "
                                   "names a param this spec does not declare")
    assert e.value.hint == "did you mean 'n'?"
    params.write_text(f"{top}{pad}n: {n}\n{pad}scale: {scale}\n{pad}tag: [{n}]\n")  # a list for a str
    with pytest.raises(SpecError) as e:
        load(tmp_path / "s.yaml", params_file=str(params))
    at = "params.tag" if top else "tag"
    assert str(e.value).startswith(f"{params}:{3 + bool(top)}:{6 + len(pad)}: {at}: param 'tag' is str but the "
                                   f"params file gives [{n}] (list)")
    assert load(tmp_path / "s.yaml", {"params.tag": "x"}, params_file=str(params)).inputs["x"].shape == [n, 3]
    params.write_text(f"{top}{pad}n: [{n}\n")
    with pytest.raises(SpecError) as e:
        load(tmp_path / "s.yaml", params_file=str(params))
    assert str(e.value).startswith(f"{params}:{2 + bool(top)}:1: <document>: malformed YAML")


def test_exponent_floats_are_floats_everywhere_a_value_is_written(tmp_path):
    """``1e-3`` is a float in --set, in a --params file and in the spec (YAML 1.1 reads it as text, which a
    float param refused)."""
    (tmp_path / "s.yaml").write_text(SPEC)  # scale: 2.5, a float param
    assert load(tmp_path / "s.yaml", {"params.scale": "1e-3"}).inputs["x"].scale == 0.001
    (tmp_path / "p.yaml").write_text("scale: 5E-4\n")
    assert load(tmp_path / "s.yaml", params_file=str(tmp_path / "p.yaml")).inputs["x"].scale == 0.0005
    (tmp_path / "e.yaml").write_text(SPEC.replace("scale: 2.5", "scale: 2e-3"))
    spec = load(tmp_path / "e.yaml", {"params.scale": "-3"})  # the default made a float param: an int is taken
    assert spec.origin.params["scale"] == -3.0 and spec.inputs["x"].scale == -3.0
    spec = load(tmp_path / "s.yaml", {"params.tag": "1e3"})
    assert spec.outputs["o"].path == os.path.abspath("out/1e3-6.npy")  # a str param keeps the text given


def test_a_fraction_for_an_int_param_is_refused_with_how_to_make_it_a_float(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    with pytest.raises(SpecError) as e:
        load(tmp_path / "s.yaml", {"params.n": "2.5"})
    assert "param 'n' is int but the override gives 2.5 (float)" in str(e.value)
    assert e.value.hint == ("give an int value, or write the default of 'n' with a decimal point to make it a "
                            "float param")


def test_other_dotted_overrides(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    spec = load(tmp_path / "s.yaml", {"cluster.n_workers": "2", "inputs.x.seed": "9"})
    assert spec.cluster.n_workers == 2
    assert spec.inputs["x"].seed == 9
    with pytest.raises(SpecError, match="not a section"):
        load(tmp_path / "s.yaml", {"clusterr.n_workers": "2"})


def test_python_dicts_get_the_same_treatment():
    spec = from_dict({"params": {"n": 4}, "inputs": {"x": {"source": "zeros", "shape": ["${params.n}"]}}},
                     {"params.n": 7})
    assert spec.inputs["x"].shape == [7]
    with pytest.raises(SpecError, match="undefined param 'm'"):
        from_dict({"inputs": {"x": {"source": "zeros", "shape": ["${params.m}"]}}})


PATHS = """\
params:
  tile: data/tiles/t_01.npy
  n: 3
inputs:
  x: {source: zeros, shape: ["${params.n}"]}
outputs:
  o: {from: x, sink: npy, path: "out/PATH"}
"""


@pytest.mark.parametrize("ref, expected", [
    ("${params.tile.stem}.smooth.npy", "t_01.smooth.npy"),
    ("${params.tile.name}", "t_01.npy"),
    ("x${params.tile.suffix}", "x.npy"),
    ("${params.tile.parent}/o.npy", "data/tiles/o.npy"),
    ("${params.tile.parent.name}_${params.tile.stem}.npy", "tiles_t_01.npy"),
])
def test_a_path_param_gives_its_parts_as_pathlib_does(tmp_path, ref, expected):
    (tmp_path / "s.yaml").write_text(PATHS.replace("PATH", ref))
    spec = load(tmp_path / "s.yaml")
    assert spec.outputs["o"].path == os.path.abspath(os.path.join("out", expected))


def test_a_whole_value_path_part_is_text(tmp_path):
    spec = from_dict({"params": {"tile": "data/a.b.npy"}, "name": "${params.tile.stem}"})
    assert spec.name == "a.b"


@pytest.mark.parametrize("ref, message, hint", [
    ("${params.n.stem}", "param 'n' is int (3), not a path: 'stem' is an attribute of path params "
                         "(.name, .stem, .suffix, .parent)", "use ${params.n} for its value"),
    ("${params.tile.stm}", "unknown attribute 'stm' of path param 'tile'", "did you mean .stem?"),
    ("${params.tile.parent.size}", "unknown attribute 'size' of path param 'tile'", ".name, .stem, .suffix, .parent"),
])
def test_a_bad_path_part_is_refused_where_it_is(tmp_path, ref, message, hint):
    (tmp_path / "s.yaml").write_text(PATHS.replace("PATH", ref))
    with pytest.raises(SpecError) as e:
        load(tmp_path / "s.yaml")
    assert (e.value.line, e.value.col, e.value.path) == (7, 33, "outputs.o.path")
    assert message in e.value.message and hint in e.value.hint
    assert str(e.value).startswith(f"{tmp_path / 's.yaml'}:7:33: outputs.o.path: ")
