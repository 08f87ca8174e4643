"""Table outputs (sink: table): one row per batch item, named after its inputs, against NumPy."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from flowgpu import pipeline
from flowgpu.cli import cli
from flowgpu.errors import SpecError

SPEC = """\
name: tiles
params:
  tile: data/tiles/t_00.npy
foreach:
  tile: {glob: "data/tiles/*.npy"}
inputs:
  x: {source: npy, path: "${params.tile}", chunks: [8, -1]}
steps:
  doubled: {op: multiply, inputs: [x], args: {b: 2.0}}
  mean: {op: mean, inputs: [x]}
  peak: {op: max, inputs: [x]}
  colmean: {op: mean, inputs: [x], args: {axis: 0}}
  high: {op: greater, inputs: [x], args: {b: 0.5}}
  count: {op: sum, inputs: [high]}
outputs:
  doubled: {from: doubled, sink: npy, path: "out/${params.tile.stem}.doubled.npy"}
  mean: {from: mean, sink: table, path: out/stats.csv}
  peak: {from: peak, sink: table, path: out/stats.csv}
  colmean: {from: colmean, sink: table, path: out/stats.csv}
  count: {from: count, sink: table, path: out/stats.csv}
"""


def _tiles(folder: Path, rng, n: int = 3) -> dict[str, np.ndarray]:
    (folder / "data" / "tiles").mkdir(parents=True, exist_ok=True)
    tiles = {}
    for i in range(n):
        path = f"data/tiles/t_{i:02d}.npy"
        tiles[path] = rng.random((int(rng.integers(10, 30)), 4)).astype("float32")
        np.save(folder / path, tiles[path])
    return tiles


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check_row(row: dict[str, str], tile: str, x: np.ndarray) -> None:
    """A row holds the item's param, then each output as NumPy computes it (the text reads back to the float32)."""
    assert row["tile"] == tile
    np.testing.assert_allclose(np.float32(row["mean"]), x.astype("float64").mean(), rtol=1e-5)
    assert np.float32(row["peak"]) == x.max()
    np.testing.assert_allclose([np.float32(row[f"colmean_{i}"]) for i in range(4)], x.astype("float64").mean(0),
                               rtol=1e-5)
    assert int(row["count"]) == int((x > 0.5).sum())


def test_a_glob_batch_names_its_outputs_by_stem_and_writes_one_row_per_item(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiles = _tiles(tmp_path, rng)
    (tmp_path / "s.yaml").write_text(SPEC)
    result = pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    assert result.ok
    rows = _rows(tmp_path / "out" / "stats.csv")
    assert list(rows[0]) == ["tile", "mean", "peak", "colmean_0", "colmean_1", "colmean_2", "colmean_3", "count"]
    assert len(rows) == len(tiles)
    for row, item, (tile, x) in zip(rows, result.items, sorted(tiles.items())):
        _check_row(row, tile, x)
        assert item.outputs["doubled"] == str(tmp_path / "out" / f"{Path(tile).stem}.doubled.npy")
        np.testing.assert_array_equal(np.load(item.outputs["doubled"]), x * 2)
        assert np.float32(row["mean"]) == np.float32(item.outputs["mean"])  # the summary keeps the value too
        assert item.summary["outputs"]["mean"]["sink"] == "table" and "value" in item.summary["outputs"]["mean"]


def test_a_rerun_keeps_every_row_and_updates_the_changed_items_row(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiles = _tiles(tmp_path, rng)
    (tmp_path / "s.yaml").write_text(SPEC)
    pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    table = tmp_path / "out" / "stats.csv"
    before = table.read_bytes()
    tiles["data/tiles/t_01.npy"] = changed = rng.random((12, 4)).astype("float32") + 1
    np.save(tmp_path / "data/tiles/t_01.npy", changed)
    result = pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    assert [i.status for i in result.items] == ["up-to-date", "ok", "up-to-date"]
    rows = _rows(table)
    assert len(rows) == 3
    for row, (tile, x) in zip(rows, sorted(tiles.items())):
        _check_row(row, tile, x)
    assert before.splitlines()[1] == table.read_bytes().splitlines()[1]  # the other rows as they were
    # nothing changed: nothing computed, the table left alone; a removed table comes back, all rows
    stamp = table.stat().st_mtime_ns
    again = pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    assert {i.status for i in again.items} == {"up-to-date"} and table.stat().st_mtime_ns == stamp
    written = table.read_bytes()
    table.unlink()
    again = pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    assert {i.status for i in again.items} == {"up-to-date"} and table.read_bytes() == written


def test_a_plain_run_writes_one_row(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiles = _tiles(tmp_path, rng, 1)
    (tmp_path / "s.yaml").write_text(SPEC.replace('  tile: {glob: "data/tiles/*.npy"}\n', "").replace("foreach:\n", ""))
    pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    rows = _rows(tmp_path / "out" / "stats.csv")
    assert len(rows) == 1 and "tile" not in rows[0]  # no foreach params: the outputs only
    rows[0]["tile"] = "data/tiles/t_00.npy"
    _check_row(rows[0], "data/tiles/t_00.npy", tiles["data/tiles/t_00.npy"])


def test_a_path_with_a_foreach_param_makes_one_table_per_value(tmp_path):
    spec = {"params": {"seed": 0, "n": 10},
            "inputs": {"x": {"source": "random", "shape": ["${params.n}"], "seed": "${params.seed}"}},
            "steps": {"total": {"op": "sum", "inputs": ["x"]}},
            "outputs": {"total": {"from": "total", "sink": "table", "path": str(tmp_path / "t-${params.n}.csv")}}}
    pipeline.run(spec, session="local", progress=False, foreach={"n": [10, 20], "seed": [3, 4, 5]})
    from flowgpu import arrays

    for n in (10, 20):
        rows = _rows(tmp_path / f"t-{n}.csv")
        assert [(int(r["n"]), int(r["seed"])) for r in rows] == [(n, s) for s in (3, 4, 5)]
        for r in rows:
            want = arrays.random((n,), seed=int(r["seed"])).compute().sum()
            assert float(r["total"]) == want


def test_a_table_is_not_written_when_an_item_failed(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiles = _tiles(tmp_path, rng)
    (tmp_path / "checks.py").write_text("import numpy as np\n\ndef finite(block):\n"
                                        "    if not np.isfinite(block).all():\n        raise ValueError('NaN')\n"
                                        "    return block\n")
    text = SPEC.replace("  mean: {op: mean, inputs: [x]}", "  ok: {op: map_blocks, inputs: [x], args: {function: "
                        "'checks:finite'}}\n  mean: {op: mean, inputs: [ok]}")
    (tmp_path / "s.yaml").write_text(text)
    pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    table = tmp_path / "out" / "stats.csv"
    before = table.read_bytes()
    bad = tiles["data/tiles/t_01.npy"].copy()
    bad[0, 0] = np.nan
    np.save(tmp_path / "data/tiles/t_01.npy", bad)
    result = pipeline.run(tmp_path / "s.yaml", session="local", progress=False, keep_going=True)
    assert [i.status for i in result.items] == ["up-to-date", "failed", "up-to-date"]
    assert table.read_bytes() == before  # a table never leaves out the rows of items that failed, silently


@pytest.mark.parametrize("change, where, message, hint", [
    (("out/stats.csv", "out/stats.txt"), ("mean", "path"), "a table is written as CSV or Parquet, and "
     "'out/stats.txt' ends in neither .csv nor .parquet", "e.g. path: out/stats.csv"),
    (("peak: {from: peak", "peak: {from: doubled"), ("peak", "from"), "4): a table column holds a scalar, or a 1-D array of at most 64 values (one column each)", "write it with an array sink"),
    (("colmean: {from: colmean", "colmean: {from: high2"), ("colmean", "from"), "output 'colmean' is complex64: a "
     "table holds numbers, booleans and text", "ops real, imag"),
    (("count: {from: count, sink: table, path: out/stats.csv}", "tile: {from: count, sink: table, path: out/stats.csv}"),
     ("mean", "path"), "the table 'out/stats.csv' would have two columns 'tile'", "rename the output"),
    (("out/${params.tile.stem}.doubled.npy", "out/stats.csv"), ("mean", "path"), "outputs 'doubled' and 'mean' both "
     "write 'out/stats.csv'", "give each output its own path"),
])
def test_a_bad_table_is_refused_at_its_place_in_the_file(tmp_path, rng, monkeypatch, change, where, message, hint):
    monkeypatch.chdir(tmp_path)
    _tiles(tmp_path, rng)
    text = SPEC.replace(*change).replace("  count: {op: sum", "  high2: {op: astype, inputs: [colmean], args: "
                                                             "{dtype: complex64}}\n  count: {op: sum")
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError) as e:
        pipeline.validate(tmp_path / "s.yaml")
    err = e.value
    lines = text.splitlines()
    line = next(i for i, t in enumerate(lines, 1) if i > lines.index("outputs:") and t.startswith(f"  {where[0]}: {{"))
    col = text.splitlines()[line - 1].index(f"{where[1]}: ") + len(where[1]) + 3
    assert (err.file, err.line, err.col, err.path) == (str(tmp_path / "s.yaml"), line, col, f"outputs.{where[0]}.{where[1]}")
    assert message in err.message and (hint is None or hint in err.hint)
    assert not (tmp_path / "out").exists()
    done = CliRunner().invoke(cli, ["validate", str(tmp_path / "s.yaml")])
    assert done.exit_code == 2 and f"s.yaml:{line}:{col}: outputs.{where[0]}.{where[1]}: " in done.output
    assert "Traceback" not in done.output


def test_parquet_without_pyarrow_is_a_clear_error_and_with_it_keeps_dtypes(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiles = _tiles(tmp_path, rng)
    text = SPEC.replace("out/stats.csv", "out/stats.parquet")
    (tmp_path / "s.yaml").write_text(text)
    monkeypatch.setattr("flowgpu.io.table.has_pyarrow", lambda: False)
    with pytest.raises(SpecError) as e:
        pipeline.validate(tmp_path / "s.yaml")
    assert e.value.path == "outputs.mean.path" and e.value.line == text.splitlines().index("outputs:") + 3
    assert "writing a Parquet table needs pyarrow, which is not installed" in e.value.message
    assert "pip install pyarrow" in e.value.hint
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    pq = pytest.importorskip("pyarrow.parquet")
    pipeline.run(tmp_path / "s.yaml", session="local", progress=False)
    got = pq.read_table(tmp_path / "out" / "stats.parquet").to_pydict()
    assert got["tile"] == sorted(tiles)
    for i, tile in enumerate(sorted(tiles)):
        assert np.float32(got["peak"][i]) == tiles[tile].max()
        assert got["count"][i] == int((tiles[tile] > 0.5).sum())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_command_line_runs_a_table_batch(tmp_path, rng):
    tiles = _tiles(tmp_path, rng)
    (tmp_path / "s.yaml").write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "flowgpu", "run", "s.yaml", "--workers", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "table out/stats.csv: 3 rows, written" in done.stderr
    for row, (tile, x) in zip(_rows(tmp_path / "out" / "stats.csv"), sorted(tiles.items()), strict=True):
        _check_row(row, tile, x)
        assert (tmp_path / "out" / f"{Path(tile).stem}.doubled.npy").exists()


@pytest.mark.gpu
def test_a_table_batch_on_a_gpu_session_holds_numpys_values(tmp_path, rng, monkeypatch, gpu_session):
    monkeypatch.chdir(tmp_path)
    tiles = _tiles(tmp_path, rng)
    (tmp_path / "s.yaml").write_text(SPEC)
    result = pipeline.run(tmp_path / "s.yaml", session=gpu_session, progress=False)
    assert result.summary["session"]["backend"] == "gpu"
    for row, (tile, x) in zip(_rows(tmp_path / "out" / "stats.csv"), sorted(tiles.items()), strict=True):
        _check_row(row, tile, x)
        np.testing.assert_array_equal(np.load(tmp_path / "out" / f"{Path(tile).stem}.doubled.npy"), x * 2)


def test_a_rerun_of_one_pinned_item_keeps_the_batchs_columns(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiles = _tiles(tmp_path, rng)
    (tmp_path / "s.yaml").write_text(SPEC)
    pipeline.run(tmp_path / "s.yaml", session="local", progress=False, overrides={"params.tile": "data/tiles/t_02.npy"})
    rows = _rows(tmp_path / "out" / "stats.csv")
    assert len(rows) == 1 and list(rows[0])[:2] == ["tile", "mean"]  # the run's one item, under the batch's header
    _check_row(rows[0], "data/tiles/t_02.npy", tiles["data/tiles/t_02.npy"])
