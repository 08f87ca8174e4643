"""Batches: foreach over globs, lists, ranges and grids; every item checked up front; --keep-going."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

import flowgpu as fg
from flowgpu import pipeline
from flowgpu.errors import RunError, SpecError

CHECKS = '''
import numpy as np

def finite(block):
    if not np.isfinite(block).all():
        raise ValueError("the block holds NaN or inf")
    return block * 2.0
'''


def _cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _write(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def glob_spec() -> dict:
    return {
        "name": "per-file",
        "params": {"input": {"type": "str", "default": "data/a.npy"}},
        "inputs": {"x": {"source": "npy", "path": "${params.input}", "chunks": [32, -1]}},
        "steps": {"y": {"op": "map_blocks", "inputs": ["x"], "args": {"function": "checks:finite"}},
                  "total": {"op": "sum", "inputs": ["y"]}},
        "outputs": {"total": {"from": "total"},
                    "doubled": {"from": "y", "sink": "npy", "path": "out/${params.input}"}},
        "cluster": {"backend": "cpu", "n_workers": 2, "threads_per_worker": 1, "dashboard_address": None},
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_glob_batch_with_one_bad_file_keeps_going_and_says_which_failed(tmp_path, rng):
    (tmp_path / "checks.py").write_text(CHECKS)
    (tmp_path / "data").mkdir()
    arrays = {}
    for name in ("a", "b", "c"):
        arrays[name] = rng.random((100, 7))
    arrays["b"][57, 3] = np.nan  # a bad file: valid .npy, but its data fails the step's check
    for name, x in arrays.items():
        np.save(tmp_path / "data" / f"{name}.npy", x)
    spec = _write(tmp_path / "batch.yaml", glob_spec())
    done = _cli("run", str(spec), "--foreach", "params.input=data/*.npy", "--keep-going", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # not every item succeeded
    summary = json.loads(done.stdout)  # results alone on stdout: `flowgpu run ... --json | jq` works
    assert "6 to compute (new)" in done.stderr  # progress and notes went to stderr
    items = {Path(i["params"]["input"]).stem: i for i in summary["items"]}
    assert [i["params"]["input"] for i in summary["items"]] == ["data/a.npy", "data/b.npy", "data/c.npy"]
    assert items["b"]["status"] == "failed" and "NaN or inf" in items["b"]["error"]
    assert "checks.py" in items["b"]["error"]  # where the user's function raised
    for name in ("a", "c"):
        assert items[name]["status"] == "ok"
        np.testing.assert_allclose(items[name]["outputs"]["total"]["value"], (arrays[name] * 2).sum())
        np.testing.assert_array_equal(np.load(tmp_path / "out" / "data" / f"{name}.npy"), arrays[name] * 2)
    assert not (tmp_path / "out" / "data" / "b.npy").exists()  # nothing of the failed item was moved into place
    assert summary["status"] == "failed" and summary["counts"] == {"ok": 2, "failed": 1}
    assert not [f for _, d, fs in os.walk(tmp_path / "out") for f in d + fs if ".flowgpu-tmp-" in f]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_keep_going_the_first_failure_stops_the_batch_with_its_item_named(tmp_path, rng):
    (tmp_path / "checks.py").write_text(CHECKS)
    (tmp_path / "data").mkdir()
    x = rng.random((64, 5))
    x[3, 1] = np.inf
    np.save(tmp_path / "data" / "bad.npy", x)
    np.save(tmp_path / "data" / "good.npy", rng.random((64, 5)))
    spec = _write(tmp_path / "batch.yaml", glob_spec())
    done = _cli("run", str(spec), "--foreach", "params.input=data/bad.npy,data/good.npy", cwd=tmp_path)
    assert done.returncode == 1
    assert "batch item 1 of 2 (input=data/bad.npy)" in done.stderr and "NaN or inf" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "data" / "bad.npy").exists()


def grid_spec(tmp_path) -> dict:
    return {
        "name": "grid",
        "params": {"seed": 0, "n": 40, "out": str(tmp_path / "out")},
        "inputs": {"x": {"source": "random", "shape": ["${params.n}", 6], "seed": "${params.seed}", "chunks": [16, -1]}},
        "steps": {"total": {"op": "sum", "inputs": ["x"]},
                  "colmean": {"op": "mean", "inputs": ["x"], "args": {"axis": 0}}},
        "outputs": {"total": {"from": "total"},
                    "colmean": {"from": "colmean", "sink": "zarr", "path": "${params.out}/m-${params.seed}-${params.n}.zarr"}},
    }


def test_a_param_grid_runs_every_combination_against_numpy(tmp_path):
    result = pipeline.run(grid_spec(tmp_path), session="local", progress=False,
                          foreach={"seed": [3, 11], "n": "40:81:40"})
    assert isinstance(result, pipeline.BatchResult) and result.ok
    got = [(r.params["seed"], r.params["n"]) for r in result.items]
    assert got == [(3, 40), (3, 80), (11, 40), (11, 80)]  # the first name varies slowest
    for r in result.items:
        x = fg.random((r.params["n"], 6), seed=r.params["seed"], chunks=(16, -1)).compute()
        np.testing.assert_allclose(r.outputs["total"], x.sum())
        import zarr
        np.testing.assert_allclose(zarr.open_array(r.outputs["colmean"])[:], x.mean(axis=0))
        assert r.status == "ok"
    assert result.summary["counts"] == {"ok": 4}


def test_the_specs_foreach_block_and_the_command_line_make_one_grid(tmp_path):
    spec = grid_spec(tmp_path)
    spec["foreach"] = {"seed": [1, 2], "n": {"range": "16:33:16"}}
    items = pipeline.run(spec, session="local", progress=False).items
    assert [(r.params["seed"], r.params["n"]) for r in items] == [(1, 16), (1, 32), (2, 16), (2, 32)]
    # --foreach replaces the block's values of that param; --set pins a param (no longer iterated)
    items = pipeline.run(spec, session="local", progress=False, foreach={"n": [24]}).items
    assert [(r.params["seed"], r.params["n"]) for r in items] == [(1, 24), (2, 24)]
    items = pipeline.run(spec, session="local", progress=False, overrides={"params.seed": 5}).items
    assert [(r.params.get("seed"), r.params["n"]) for r in items] == [(None, 16), (None, 32)]
    assert all(r.summary["params"]["seed"] == 5 for r in items)


def test_foreach_on_the_command_line_replaces_a_glob_that_no_longer_matches(tmp_path, rng, monkeypatch):
    """The block's glob is not expanded when --foreach gives that param (the data folder was renamed)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "moved").mkdir()
    arrays = {f"moved/t{i}.npy": rng.normal(size=int(rng.integers(5, 30))) for i in range(2)}
    for path, a in arrays.items():
        np.save(path, a)
    spec = {"params": {"input": {"type": "str"}}, "foreach": {"input": {"glob": "data/*.npy"}},
            "inputs": {"x": {"source": "npy", "path": "${params.input}"}},
            "steps": {"total": {"op": "sum", "inputs": ["x"]}}, "outputs": {"total": {"from": "total"}}}
    with pytest.raises(SpecError, match="the glob 'data/\\*.npy' matches no path"):
        pipeline.run(spec, session="local", progress=False)
    result = pipeline.run(spec, session="local", progress=False, foreach={"input": "moved/*.npy"})
    assert [r.params["input"] for r in result.items] == sorted(arrays)
    for r in result.items:
        np.testing.assert_allclose(r.outputs["total"], arrays[r.params["input"]].sum(), rtol=1e-12)


def test_a_param_the_batch_iterates_over_needs_no_default(tmp_path, rng, monkeypatch):
    """A param declared by type only takes its values from the foreach block or --foreach (as a
    Snakemake wildcard does); one that nothing gives a value is still refused, saying how to give one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    arrays = {f"data/t{i}.npy": rng.normal(size=(int(rng.integers(5, 30)), 4)) for i in range(3)}
    for path, a in arrays.items():
        np.save(path, a)
    spec = {"params": {"input": {"type": "str"}, "k": {"type": "float"}},
            "foreach": {"input": {"glob": "data/*.npy"}},
            "inputs": {"x": {"source": "npy", "path": "${params.input}"}},
            "steps": {"y": {"op": "multiply", "inputs": ["x"], "args": {"b": "${params.k}"}},
                      "total": {"op": "sum", "inputs": ["y"]}},
            "outputs": {"total": {"from": "total"},
                        "y": {"from": "y", "sink": "npy", "path": "out/${params.input.stem}-${params.k}.npy"}}}
    result = pipeline.run(spec, session="local", progress=False, foreach={"k": "0.5,3"})
    assert [(r.params["input"], r.params["k"]) for r in result.items] == [
        (p, k) for p in sorted(arrays) for k in (0.5, 3.0)]
    for r in result.items:
        want = arrays[r.params["input"]] * r.params["k"]
        np.testing.assert_allclose(r.outputs["total"], want.sum(), rtol=1e-12)
        np.testing.assert_array_equal(np.load(r.outputs["y"]), want)
    with pytest.raises(SpecError, match=r"params\.k: param 'k' has no value.*--foreach params\.k="):
        pipeline.run(spec, session="local", progress=False)
    assert _cli("validate", str(_write(tmp_path / "spec.yaml", spec)), "--set", "params.k=2", cwd=tmp_path).returncode == 0


def test_an_invalid_item_refuses_the_whole_batch_naming_it_and_nothing_runs(tmp_path):
    spec = grid_spec(tmp_path)
    spec["steps"]["total"]["expect"] = {"shape": []}
    spec["steps"]["colmean"]["expect"] = {"shape": [6]}
    spec["steps"]["rows"] = {"op": "reshape", "inputs": ["x"], "args": {"shape": [-1, 12]}}
    spec["outputs"]["rows"] = {"from": "rows"}
    path = _write(tmp_path / "grid.yaml", spec)
    with pytest.raises(SpecError) as e:  # n=40: 240 values reshape to 12 columns; n=41 does not
        pipeline.run(str(path), session="local", progress=False, foreach={"n": [40, 41, 42]})
    assert "batch item 2 of 3 (n=41)" in str(e.value) and "rows" in str(e.value)
    assert str(e.value).startswith(f"{path}:")  # file:line:col of the step
    assert not (tmp_path / "out").exists()  # the valid items did not run either
    done = _cli("run", str(path), "--foreach", "params.n=40,41,42", cwd=tmp_path)
    assert done.returncode == 2 and "batch item 2 of 3 (n=41)" in done.stderr and "Traceback" not in done.stderr


def test_two_items_writing_one_path_are_refused(tmp_path):
    spec = grid_spec(tmp_path)
    spec["outputs"]["colmean"]["path"] = "${params.out}/m-${params.n}.zarr"  # seed is not in the path
    with pytest.raises(SpecError, match=r"batch items 1 \(seed=1, n=16\) and 3 \(seed=2, n=16\) both write") as e:
        pipeline.run(spec, session="local", progress=False, foreach={"seed": [1, 2], "n": [16, 32]})
    assert "${params.seed}" in e.value.hint
    with pytest.raises(SpecError) as e:  # the param that tells the two apart, not the first one named
        pipeline.run(spec, session="local", progress=False, foreach={"n": [16, 32], "seed": [1, 2]})
    assert "${params.seed}" in e.value.hint and "${params.n}" not in e.value.hint, e.value.hint


def test_two_items_whose_paths_share_a_stem_are_refused_saying_how_to_keep_them_apart(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        np.save(tmp_path / folder / "t.npy", rng.random((4, 3)))
    spec = {"params": {"tile": "a/t.npy"}, "foreach": {"tile": {"glob": "*/t.npy"}},
            "inputs": {"x": {"source": "npy", "path": "${params.tile}"}},
            "outputs": {"o": {"from": "x", "sink": "npy", "path": "out/${params.tile.stem}.npy"}}}
    path = _write(tmp_path / "s.yaml", spec)
    with pytest.raises(SpecError) as e:
        pipeline.run(path, session="local", progress=False)
    assert "batch items 1 (tile=a/t.npy) and 2 (tile=b/t.npy) both write output 'o' to 'out/t.npy'" in e.value.message
    assert "${params.tile.parent.name}_${params.tile.stem}" in e.value.hint
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "out/${params.tile.stem}" in text)
    assert (e.value.file, e.value.line, e.value.path) == (str(path), line, "outputs.o.path")
    assert not (tmp_path / "out").exists()
    spec["outputs"]["o"]["path"] = "out/${params.tile.parent.name}_${params.tile.stem}.npy"  # as the hint says
    result = pipeline.run(_write(tmp_path / "s.yaml", spec), session="local", progress=False)
    for folder, item in zip("ab", result.items):
        np.testing.assert_array_equal(np.load(item.outputs["o"]), np.load(tmp_path / folder / "t.npy"))
        assert item.outputs["o"] == str(tmp_path / "out" / f"{folder}_t.npy")


def chained_spec() -> dict:
    """Item p reads src/p.npy and writes d/p.out.npy: item p=x.out reads what item p=x writes when src is d."""
    return {
        "name": "chained",
        "params": {"p": {"type": "str", "default": "x"}, "src": {"type": "str", "default": "d"}},
        "inputs": {"a": {"source": "npy", "path": "${params.src}/${params.p}.npy", "chunks": [10, -1]}},
        "steps": {"b": {"op": "multiply", "inputs": ["a"], "args": {"b": 2.0}},
                  "total": {"op": "sum", "inputs": ["b"]}},
        "outputs": {"total": {"from": "total"}, "b": {"from": "b", "sink": "npy", "path": "d/${params.p}.out.npy"}},
    }


@pytest.mark.parametrize("src", ["d", "linked"])
def test_an_item_may_not_read_what_another_item_of_the_batch_writes(tmp_path, rng, monkeypatch, src):
    """Items run at the same time: item 2 read item 1's output before or after its commit, by chance."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    os.symlink("d", tmp_path / "linked")  # the same folder by another name
    x = rng.standard_normal((30, 4))
    np.save(tmp_path / "d" / "x.npy", x)
    spec = _write(tmp_path / "chained.yaml", chained_spec())
    first = pipeline.run(str(spec), session="local", progress=False)  # d/x.out.npy, written by flowgpu
    np.testing.assert_allclose(first.outputs["total"], 2 * x.sum())
    written, before = (tmp_path / "d" / "x.out.npy").read_bytes(), sorted(os.listdir(tmp_path / "d"))
    with pytest.raises(SpecError) as e:
        pipeline.run(str(spec), session="local", progress=False, foreach={"p": ["x", "x.out"]},
                     overrides={"params.src": src})
    message = str(e.value)
    assert message.startswith(f"{spec}:12:11: inputs.a.path: "), message  # where the path is given
    assert (f"batch item 2 (p=x.out) reads '{src}/x.out.npy' (input 'a'), which batch item 1 (p=x) writes (output 'b')"
            in message), message
    assert sorted(os.listdir(tmp_path / "d")) == before  # nothing ran
    assert (tmp_path / "d" / "x.out.npy").read_bytes() == written
    done = _cli("run", "chained.yaml", "--foreach", "params.p=x.out,x", "--set", f"params.src={src}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "batch item 1 (p=x.out) reads" in done.stderr and "which batch item 2 (p=x) writes" in done.stderr
    ok = pipeline.run(str(spec), session="local", progress=False, foreach={"p": ["x"]}, overrides={"params.src": src})
    np.testing.assert_allclose(ok.items[0].outputs["total"], 2 * x.sum())  # one item reads no other's output


@pytest.mark.parametrize("given, message", [
    ({"nope": [1, 2]}, "'nope' is not a param of this spec"),
    ({"seed": "nothing/*.npy"}, "matches no path"),
    ({"seed": "5:1"}, "is empty"),
    ({"seed": []}, "no values"),
])
def test_bad_foreach_values_are_one_clear_error(tmp_path, given, message):
    with pytest.raises(SpecError, match=message):
        pipeline.run(grid_spec(tmp_path), session="local", progress=False, foreach=given)


def test_a_bad_foreach_block_points_into_the_file(tmp_path):
    spec = grid_spec(tmp_path)
    spec["foreach"] = {"seed": {"range": "1:x"}}
    path = _write(tmp_path / "grid.yaml", spec)
    with pytest.raises(SpecError) as e:
        pipeline.status(str(path))
    assert "foreach.seed" in str(e.value) and str(e.value).startswith(f"{path}:")
    done = _cli("run", str(path), "--foreach", "seed", cwd=tmp_path)
    assert done.returncode == 2 and "params.NAME=VALUES" in done.stderr


def test_a_yaml_range_is_a_range_not_a_base_60_number(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid_spec(tmp_path), sort_keys=False) + "foreach:\n  n: {range: 1:3}\n")
    assert [i["params"]["n"] for i in pipeline.status(str(path))["items"]] == [1, 2]


def test_items_carry_their_typed_values_and_empty_results_keep_their_shape(tmp_path, rng, monkeypatch):
    """A float param's items say 3.0 (what names their files), not the 3 written; a summary of no values
    has NumPy's shape ([] for (0, 3)), not dask's [[]]."""
    monkeypatch.chdir(tmp_path)
    x = rng.standard_normal((4, 5, 3))
    np.save("x.npy", x)
    np.save("e.npy", np.empty((4, 0, 3)))
    spec = {"params": {"c": 1.5}, "foreach": {"c": [3, 0.5]},
            "inputs": {"x": {"source": "npy", "path": "x.npy"}, "e": {"source": "npy", "path": "e.npy"}},
            "steps": {"y": {"op": "multiply", "inputs": ["x"], "args": {"b": "${params.c}"}},
                      "m": {"op": "max", "inputs": ["y"], "args": {"axis": 0}},
                      "n": {"op": "max", "inputs": ["e"], "args": {"axis": 0}}},
            "outputs": {"m": {"from": "m"}, "n": {"from": "n"},
                        "y": {"from": "y", "sink": "npy", "path": "out/y_${params.c}.npy"}}}
    result = pipeline.run(spec, session="local", progress=False)
    for r, c in zip(result.items, (3.0, 0.5)):
        assert r.params == {"c": c} and isinstance(r.params["c"], float)
        np.testing.assert_allclose(r.outputs["m"], (x * c).max(0), rtol=1e-12)
        np.testing.assert_array_equal(np.load(f"out/y_{c}.npy"), x * c)
        assert r.outputs["n"] == np.empty((4, 0, 3)).max(0).tolist() == []  # NumPy's (0, 3): no row at all
        assert r.summary["outputs"]["n"]["shape"] == [0, 3]
    assert [i["params"] for i in result.summary["items"]] == [{"c": 3.0}, {"c": 0.5}]


def test_a_range_of_fractions_says_a_range_takes_integers(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid_spec(tmp_path), sort_keys=False))
    with pytest.raises(SpecError, match=r"'0:1:0.25' is not a range: start:stop\[:step\] takes integers") as e:
        pipeline.status(str(path), foreach={"n": "0:1:0.25"})
    assert e.value.hint.startswith("list the values instead")


@pytest.mark.timeout(300)
def test_items_run_together_on_one_cluster_and_share_their_common_input(tmp_path, cpu_session, rng):
    x = rng.random((300, 40))
    np.save(tmp_path / "x.npy", x)
    spec = {
        "name": "shared",
        "params": {"k": 1.0},
        "inputs": {"x": {"source": "npy", "path": str(tmp_path / "x.npy"), "chunks": [50, -1]}},
        "steps": {"y": {"op": "expr", "inputs": {"x": "x"}, "args": {"expression": "x * ${params.k}"}},
                  "total": {"op": "sum", "inputs": ["y"]}},
        "outputs": {"total": {"from": "total"}},
    }
    result = pipeline.run(spec, session=cpu_session, progress=False, foreach={"k": [0.5, 2.0, -3.0]})
    assert result.ok
    for r in result.items:
        np.testing.assert_allclose(r.outputs["total"], (x * r.params["k"]).sum())


def test_a_failing_item_in_python_raises_unless_keep_going(tmp_path, cpu_session):
    spec = grid_spec(tmp_path)
    spec["params"]["scale"] = 1.0
    spec["steps"]["scaled"] = {"op": "expr", "inputs": {"x": "x"}, "args": {"expression": "log(x * ${params.scale})"}}
    spec["steps"]["checked"] = {"op": "map_blocks", "inputs": ["scaled"],
                                "args": {"function": "tests.pipeline.helpers:finite"}}
    spec["steps"]["total"]["inputs"] = ["checked"]
    del spec["outputs"]["colmean"]
    with pytest.raises(RunError, match=r"batch item 2 of 2 \(scale=0.0\)"):
        pipeline.run(spec, session=cpu_session, progress=False, foreach={"scale": [1.0, 0.0]})
    heard = []
    result = pipeline.run(spec, session=cpu_session, progress=False, foreach={"scale": [0.0, 1.0]},
                          keep_going=True, force=True, subscribers=[heard.append])
    assert not result.ok and [r.status for r in result.items] == ["failed", "ok"]
    ended = {e.index: e.outcome for e in heard if type(e).__name__ == "ItemFinished"}  # each item, as it ended
    assert {i: o.status for i, o in ended.items()} == {0: "failed", 1: "ok"}
    assert sorted(e.label for e in heard if type(e).__name__ == "ItemStarted") == ["scale=0.0", "scale=1.0"]
    assert heard[-1].summary == result.summary and result.summary["counts"] == {"failed": 1, "ok": 1}
    x = fg.random((40, 6), seed=0, chunks=(16, -1)).compute()
    np.testing.assert_allclose(result.items[1].outputs["total"], (2 * np.log(x)).sum())


def test_dry_run_checks_every_item(tmp_path):
    path = _write(tmp_path / "grid.yaml", grid_spec(tmp_path))
    done = _cli("run", str(path), "--foreach", "params.seed=1,2,3", "--dry-run", cwd=tmp_path)
    assert done.returncode == 0 and "3 batch items checked" in done.stdout
    assert not (tmp_path / "out").exists()
