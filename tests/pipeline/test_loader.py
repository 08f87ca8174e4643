"""The YAML loader: plain data, exact places, and refusal of anything that is not plain data."""

from __future__ import annotations

import os

import dask
import pytest

from flowgpu.errors import SpecError, SpecLimitError
from flowgpu.pipeline.loader import format_path, parse_yaml, read_yaml
from flowgpu.pipeline.build import parse_value

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


def test_values_past_max_nodes_are_refused_while_expanding_aliases():
    text = "a: &a [1, 2, 3, 4]\nb: &b [*a, *a, *a, *a]\nc: [*b, *b, *b, *b]\n"
    assert len(parse_yaml(text)[0]["c"]) == 4  # 4 + 16 + 64 values + lists: within the default
    with dask.config.set({"flowgpu.spec.max-nodes": 50}), pytest.raises(SpecLimitError, match="more than 50 values"):
        parse_yaml(text, "bomb.yaml")


def test_nesting_past_max_depth_is_refused_while_composing():
    with dask.config.set({"flowgpu.spec.max-depth": 5}):
        assert parse_yaml("a: [[[1]]]")[0] == {"a": [[[1]]]}
        with pytest.raises(SpecLimitError, match="nests deeper than 5 levels") as e:
            parse_yaml("a: [[[[[[1]]]]]]", "deep.yaml")
    assert e.value.file == "deep.yaml" and e.value.line == 1


def test_only_regular_files_within_max_bytes_are_read(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    with pytest.raises(SpecLimitError, match="is a FIFO, not a regular file"):
        read_yaml(tmp_path / "fifo.yaml")  # at once: opened without blocking, then refused
    with pytest.raises(SpecLimitError, match="is a device"):
        read_yaml("/dev/zero")
    (tmp_path / "big.yaml").write_text("name: " + "x" * 2000 + "\n")
    with dask.config.set({"flowgpu.spec.max-bytes": "1KiB"}), pytest.raises(SpecLimitError, match="2,007 bytes"):
        read_yaml(tmp_path / "big.yaml")
    assert read_yaml(tmp_path / "big.yaml")[0]["name"] == "x" * 2000


def test_command_line_values_are_bounded_like_files():
    assert parse_value("[1, [2, 3]]") == [1, [2, 3]]
    assert parse_value("a: [1") == "a: [1"  # not YAML: the text itself
    assert parse_value("!!python/name:os.system") == "!!python/name:os.system"  # tags are never constructed
    with pytest.raises(SpecLimitError, match="nests deeper than"):
        parse_value("[" * 500 + "]" * 500)
