"""Incremental runs: a run computes only the outputs whose recipe or input files changed, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr

import flowgpu as fg
from flowgpu import pipeline


def two_branches(tmp_path: Path) -> dict:
    """Two inputs, each with its own branch and outputs (a file and a summary value)."""
    return {
        "name": "two-branches",
        "params": {"ka": 2.0, "kb": 3.0},
        "inputs": {"a": {"source": "npy", "path": str(tmp_path / "a.npy"), "chunks": [25, -1]},
                   "b": {"source": "npy", "path": str(tmp_path / "b.npy"), "chunks": [25, -1]}},
        "steps": {"sa": {"op": "expr", "inputs": {"x": "a"}, "args": {"expression": "x * ${params.ka}"}},
                  "sb": {"op": "expr", "inputs": {"x": "b"}, "args": {"expression": "x - ${params.kb}"}},
                  "ta": {"op": "sum", "inputs": ["sa"]},
                  "tb": {"op": "sum", "inputs": ["sb"]}},
        "outputs": {"za": {"from": "sa", "sink": "zarr", "path": str(tmp_path / "out" / "a.zarr")},
                    "zb": {"from": "sb", "sink": "npy", "path": str(tmp_path / "out" / "b.npy")},
                    "ta": {"from": "ta"}, "tb": {"from": "tb"}},
    }


@pytest.fixture
def data(tmp_path, rng):
    a, b = rng.random((60, 4)), rng.random((70, 3))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return a, b


def _run(spec, **kw):
    return pipeline.run(spec, session="local", progress=False, **kw)


def _statuses(result) -> dict[str, str]:
    return {name: o["status"] for name, o in result.summary["outputs"].items()}


def _check(result, a, b, ka=2.0, kb=3.0, tmp_path=None):
    np.testing.assert_allclose(result.outputs["ta"], (a * ka).sum())
    np.testing.assert_allclose(result.outputs["tb"], (b - kb).sum())
    np.testing.assert_allclose(zarr.open_array(result.outputs["za"])[:], a * ka)
    np.testing.assert_allclose(np.load(result.outputs["zb"]), b - kb)


def _touch(path: Path) -> None:
    later = time.time_ns() + 2_000_000_000
    os.utime(path, ns=(later, later))


def test_an_unchanged_second_run_computes_nothing_and_returns_the_same_results(tmp_path, data):
    a, b = data
    first = _run(two_branches(tmp_path))
    assert set(_statuses(first).values()) == {"computed"}
    stamp = os.stat(tmp_path / "out" / "b.npy").st_mtime_ns
    second = _run(two_branches(tmp_path))
    assert set(_statuses(second).values()) == {"up-to-date"}
    assert second.summary["tasks"] == 0 and second.summary["bytes_read"] == 0
    assert second.outputs == first.outputs  # the cached values, exactly
    _check(second, a, b)
    assert os.stat(tmp_path / "out" / "b.npy").st_mtime_ns == stamp  # not rewritten


def test_touching_one_input_recomputes_only_the_outputs_that_read_it(tmp_path, data):
    a, b = data
    _run(two_branches(tmp_path))
    stamp = os.stat(tmp_path / "out" / "a.zarr" / "zarr.json").st_mtime_ns if (
        tmp_path / "out" / "a.zarr" / "zarr.json").exists() else None
    b2 = b + 1.0
    np.save(tmp_path / "b.npy", b2)
    _touch(tmp_path / "b.npy")
    status = pipeline.status(two_branches(tmp_path))
    assert {o: v["up_to_date"] for o, v in status["items"][0]["outputs"].items()} == {
        "za": True, "zb": False, "ta": True, "tb": False}
    assert "inputs changed:" in status["line"] and "b.npy" in status["line"] and "2 up to date" in status["line"]
    again = _run(two_branches(tmp_path))
    assert _statuses(again) == {"za": "up-to-date", "zb": "computed", "ta": "up-to-date", "tb": "computed"}
    _check(again, a, b2)
    if stamp is not None:
        assert os.stat(tmp_path / "out" / "a.zarr" / "zarr.json").st_mtime_ns == stamp


def test_changing_one_param_recomputes_only_the_affected_outputs(tmp_path, data):
    a, b = data
    _run(two_branches(tmp_path))
    again = _run(two_branches(tmp_path), overrides={"params.kb": -1.5})
    assert _statuses(again) == {"za": "up-to-date", "zb": "computed", "ta": "up-to-date", "tb": "computed"}
    assert again.summary["outputs"]["tb"]["reason"] == "params changed: kb"
    _check(again, a, b, kb=-1.5)


def test_force_recomputes_everything(tmp_path, data):
    a, b = data
    _run(two_branches(tmp_path))
    forced = _run(two_branches(tmp_path), force=True)
    assert set(_statuses(forced).values()) == {"computed"}
    assert {o["reason"] for o in forced.summary["outputs"].values()} == {"forced"}
    _check(forced, a, b)


def test_an_output_changed_by_hand_is_recomputed(tmp_path, data):
    a, b = data
    _run(two_branches(tmp_path))
    np.save(tmp_path / "out" / "b.npy", np.zeros((70, 3)))  # someone edits the result
    again = _run(two_branches(tmp_path), overwrite=True)
    assert again.summary["outputs"]["zb"]["status"] == "computed"
    _check(again, a, b)


def test_checksum_ignores_a_touch_that_changed_no_byte(tmp_path, data):
    _run(two_branches(tmp_path), checksum=True)
    _touch(tmp_path / "a.npy")
    assert pipeline.status(two_branches(tmp_path))["line"].startswith("2 up to date, 2 to compute (inputs changed")
    assert pipeline.status(two_branches(tmp_path), checksum=True)["line"] == "4 up to date"


def test_a_batch_recomputes_only_the_items_whose_inputs_changed(tmp_path, rng, monkeypatch):
    (tmp_path / "data").mkdir()
    arrays = {n: rng.random((40, 5)) for n in "pqrs"}
    for n, x in arrays.items():
        np.save(tmp_path / "data" / f"{n}.npy", x)
    spec = {"name": "per-file", "params": {"input": "data/p.npy"},
            "inputs": {"x": {"source": "npy", "path": "${params.input}", "chunks": [20, -1]}},
            "steps": {"t": {"op": "sum", "inputs": ["x"]}},
            "outputs": {"t": {"from": "t"}}}
    monkeypatch.chdir(tmp_path)
    first = _run(spec, foreach={"input": "data/*.npy"})
    assert [r.status for r in first.items] == ["ok"] * 4
    arrays["r"] = arrays["r"] * -2
    np.save(tmp_path / "data" / "r.npy", arrays["r"])
    _touch(tmp_path / "data" / "r.npy")
    again = _run(spec, foreach={"input": "data/*.npy"})
    assert [r.status for r in again.items] == ["up-to-date", "up-to-date", "ok", "up-to-date"]
    for r in again.items:
        np.testing.assert_allclose(r.outputs["t"], arrays[Path(r.params["input"]).stem].sum())
    assert again.summary["counts"] == {"up-to-date": 3, "ok": 1}


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_command_line_says_what_is_up_to_date_and_status_agrees(tmp_path, data):
    a, b = data
    spec = two_branches(tmp_path)
    spec["cluster"] = {"backend": "cpu", "n_workers": 1, "dashboard_address": None}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    first = _cli("run", str(path), "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "4 to compute (new)" in first.stderr
    assert json.loads(first.stdout)["outputs"]["ta"]["status"] == "computed"
    status = _cli("status", str(path), "--json", cwd=tmp_path)
    assert status.returncode == 0 and json.loads(status.stdout)["line"] == "4 up to date"
    second = _cli("run", str(path), "--json", cwd=tmp_path)
    assert second.returncode == 0 and "4 up to date" in second.stderr
    assert "running" not in second.stderr  # no cluster was started
    summary = json.loads(second.stdout)
    np.testing.assert_allclose(summary["outputs"]["ta"]["value"], (a * 2.0).sum())
    changed = _cli("status", str(path), "--set", "params.ka=5", "--json", cwd=tmp_path)
    assert changed.returncode == 0 and json.loads(changed.stdout)["line"] == "2 up to date, 2 to compute (params changed: ka)"
    forced = _cli("run", str(path), "--force", "-q", cwd=tmp_path)
    assert forced.returncode == 0 and "computed" in forced.stdout and "up-to-date" not in forced.stdout


def _random_total(name: str, seed: int):
    p = fg.Pipeline(name)
    p.output("total", p.step("total", "sum", p.input("x", source="random", shape=[40, 30], seed=seed)))
    return p


def test_two_python_pipelines_of_one_script_each_keep_their_values(tmp_path, monkeypatch):
    """Their values shared one cache entry (the script's and the output's name): each run of one
    recomputed the other, saying its 'recipe changed'."""
    monkeypatch.chdir(tmp_path)
    seeds = {"a": 11, "b": 12}
    want = {n: float(fg.random((40, 30), seed=s).compute().sum()) for n, s in seeds.items()}
    for statuses in ({"computed"}, {"up-to-date"}):
        for name, seed in seeds.items():
            result = _random_total(name, seed).run(session="local", progress=False)
            assert set(_statuses(result).values()) == statuses, (name, result.summary)
            assert result.outputs["total"] == pytest.approx(want[name], rel=1e-12)


CELL = "p = fg.Pipeline('cell')\np.output('m', p.step('m', 'max', p.input('x', source='random', shape=[50], seed=3)))\n"


def test_a_notebook_cell_run_again_finds_its_value_up_to_date(tmp_path, monkeypatch):
    """A cell's file is made up anew each time it runs (IPython: <ipython-input-N-...>), so the value
    was 'new' at every run of the same cell."""
    monkeypatch.chdir(tmp_path)
    want = float(fg.random((50,), seed=3).compute().max())
    for n, status in ((1, "computed"), (2, "up-to-date")):
        cell = {"fg": fg}
        exec(compile(CELL, f"<ipython-input-{n}-{os.urandom(4).hex()}>", "exec"), cell)  # noqa: S102
        result = cell["p"].run(session="local", progress=False)
        assert _statuses(result) == {"m": status} and result.outputs["m"] == want
