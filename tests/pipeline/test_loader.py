"""The YAML loader: plain data, exact places, and refusal of anything that is not plain data."""

from __future__ import annotations

import pytest

from flowgpu.errors import SpecError
from flowgpu.pipeline.loader import format_path, parse_yaml

TEXT = """\
name: demo
steps:
  norm:
    op: divide
    inputs: [x, y]
"""


def test_source_map_points_at_values_and_keys():
    data, smap = parse_yaml(TEXT, "demo.yaml")
    assert data == {"name": "demo", "steps": {"norm": {"op": "divide", "inputs": ["x", "y"]}}}
    assert smap.locate(("steps", "norm", "op")) == (4, 9)
    assert smap.locate(("steps", "norm", "op"), key=True) == (4, 5)
    assert smap.locate(("steps", "norm", "inputs", 1)) == (5, 17)
    # a path that is not written falls back to its nearest written parent
    assert smap.locate(("steps", "norm", "args", "axis")) == (4, 5)


def test_format_path():
    assert format_path(("steps", "norm", "inputs", 0)) == "steps.norm.inputs[0]"
    assert format_path(()) == "<document>"


def test_scalars_keep_yaml_types_and_dates_stay_text():
    data, _ = parse_yaml("a: 1\nb: 1.5\nc: true\nd: null\ne: 2024-01-02\nf: '7'\n")
    assert data == {"a": 1, "b": 1.5, "c": True, "d": None, "e": "2024-01-02", "f": "7"}


def test_aliases_are_plain_copies():
    data, _ = parse_yaml("a: &s [1, 2]\nb: *s\n")
    assert data == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("text", [
    "a: !!python/name:os.system\n",
    "a: !!python/object/new:dict []\n",
    "a: !!set {x}\n",
    "a: !custom 3\n",
])
def test_tags_are_refused(text):
    with pytest.raises(SpecError, match="is not allowed") as e:
        parse_yaml(text, "t.yaml")
    assert (e.value.line, e.value.col, e.value.path) == (1, 4, "a")


def test_merge_keys_and_duplicates_are_refused():
    with pytest.raises(SpecError, match="merge keys"):
        parse_yaml("base: &b {x: 1}\nother:\n  <<: *b\n")
    with pytest.raises(SpecError, match="duplicate key 'x'") as e:
        parse_yaml("m:\n  x: 1\n  y: 2\n  x: 3\n", "t.yaml")
    assert (e.value.line, e.value.path) == (4, "m.x")


def test_empty_document_is_empty_mapping():
    assert parse_yaml("# nothing\n")[0] == {}
