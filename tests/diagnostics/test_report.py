"""The tables ``flowgpu run``, ``status`` and ``plan`` print: user text exactly as it is (rich reads
``[run]`` or ``[nan, 0.5, inf]`` as markup and dropped it)."""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from flowgpu.cli import cli

SPEC = """\
name: brackets
inputs:
  x: {source: npy, path: x.npy}
  z: {source: npy, path: z.npy}
steps:
  y: {op: multiply, inputs: [x, x]}
  top: {op: max, inputs: [x], args: {axis: 1}}
outputs:
  y: {from: y, path: "out/[run]/y.npy"}
  top: {from: top}
  z: {from: z}
"""

BATCH = """\
name: per-file
params:
  input: {type: str}
inputs:
  x: {source: npy, path: "${params.input}"}
steps:
  top: {op: max, inputs: [x]}
outputs:
  top: {from: top}
"""


def _rows(text: str) -> list[list[str]]:
    """The table's rows, a cell folded over lines (a long path: pytest-xdist's tmp folders) joined again."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]] if line.startswith("│") else None
        if cells is not None and rows and not cells[0] and len(cells) == len(rows[-1]):
            rows[-1] = [a + b for a, b in zip(rows[-1], cells)]
        elif cells is not None:
            rows.append(cells)
    return rows


def test_brackets_nan_and_inf_are_shown(tmp_path, rng, monkeypatch, cpu_session):
    monkeypatch.chdir(tmp_path)
    x = rng.random((3, 5)).astype(np.float32)
    x[0, int(rng.integers(5))], x[2, int(rng.integers(5))] = np.nan, np.inf
    np.save("x.npy", x)
    np.save("z.npy", np.full((1, 1), np.nan, dtype=np.float32))
    (tmp_path / "spec.yaml").write_text(SPEC)
    result = CliRunner().invoke(cli, ["run", "spec.yaml"])
    assert result.exit_code == 0, result.output
    written = tmp_path / "out" / "[run]" / "y.npy"
    np.testing.assert_array_equal(np.load(written), x * x)
    top = [float(v) for v in np.max(x, axis=1)]
    assert _rows(result.stdout) == [["y", "(3, 5)", "float32", str(written), "computed"],
                                    ["top", "(3,)", "float32", repr(top), "computed"],
                                    ["z", "(1, 1)", "float32", "[[nan]]", "computed"]]
    planned = CliRunner().invoke(cli, ["plan", "spec.yaml"])
    assert ["y", "y", "npy", "(3, 5)", "float32", "60 B", str(written)] in _rows(planned.stdout)


def test_a_glob_with_brackets_names_its_files(tmp_path, rng, monkeypatch, cpu_session):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d[raw]").mkdir()
    tops = {}
    for name in ("a", "b"):
        x = rng.random((4, 3))
        np.save(f"d[raw]/{name}.npy", x)
        tops[f"d[raw]/{name}.npy"] = float(x.max())
    (tmp_path / "spec.yaml").write_text(BATCH)
    result = CliRunner().invoke(cli, ["run", "spec.yaml", "--foreach", "params.input=d[[]raw]/*.npy"])
    assert result.exit_code == 0, result.output
    assert [r[1:4] for r in _rows(result.stdout)] == [[path, "ok", repr(top)] for path, top in tops.items()]
    status = CliRunner().invoke(cli, ["status", "spec.yaml", "--foreach", "params.input=d[[]raw]/*.npy"])
    assert [r[1:4] for r in _rows(status.stdout)] == [[path, "top", "up to date"] for path in tops]
