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
