"""The cache: up to date only when recipe, inputs and output all match what was recorded."""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from flowgpu import pipeline
from flowgpu.cli import cli
from flowgpu.io.atomic import marker_path
from flowgpu.pipeline.cache import Cache, Verdict, summarize
from flowgpu.pipeline.recipe import recipes

pytestmark = pytest.mark.timeout(120)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_spec(tmp_path) -> dict:
    """Outputs z (zarr) and c (npy) and s (summary) read a.npy; b (summary) is synthetic."""
    return {
        "name": "cache-test",
        "params": {"k": 0.5, "seed": 7},
        "inputs": {"x": {"source": "npy", "path": "a.npy", "chunks": [16, 3]},
                   "y": {"source": "normal", "shape": [30, 5], "seed": "${params.seed}"}},
        "steps": {"c": {"op": "subtract", "inputs": ["x"], "args": {"b": "${params.k}"}},
                  "s": {"op": "sum", "inputs": ["c"], "args": {"axis": 0}},
                  "t": {"op": "transpose", "inputs": ["c"]},
                  "m": {"op": "mean", "inputs": ["y"], "args": {"axis": 1}}},
        "outputs": {"z": {"from": "t", "sink": "zarr", "path": "out/t.zarr"},
                    "c": {"from": "c", "sink": "npy", "path": "out/c.npy"},
                    "s": {"from": "s"},
                    "b": {"from": "m"}},
    }


@pytest.fixture
def work(tmp_path, rng, monkeypatch):
    """A fresh working directory holding a.npy (fresh random data) and the spec."""
    monkeypatch.chdir(tmp_path)
    x = rng.standard_normal((50, 3))
    np.save(tmp_path / "a.npy", x)
    return x, make_spec(tmp_path)


def run_recorded(spec: dict, cache: Cache, item: dict | None = None, **params):
    """What the runner will do: recipes before the run, invalidate, run, record each output."""
    plan = pipeline.compile(spec, params=params)
    rs = recipes(plan)
    cache.invalidate(plan, list(rs), item=item)
    result = pipeline.run(spec, session="local", progress=False,
                          overrides={f"params.{k}": v for k, v in params.items()})
    for name, recipe in rs.items():
        if spec["outputs"][name].get("sink") in (None, "summary"):
            cache.record(plan, name, recipe, item=item, value=result.outputs[name])
        else:
            cache.record(plan, name, recipe, item=item, location=result.outputs[name])
    return result


def verdicts(spec: dict, cache: Cache, checksum: bool = False, **kw) -> dict[str, Verdict]:
    params = kw.pop("params", None)
    plan = pipeline.compile(spec, params=params)
    return cache.check(plan, recipes(plan, checksum=checksum), checksum=checksum, **kw)


def reasons(v: dict[str, Verdict]) -> dict[str, str]:
    return {k: x.reason for k, x in v.items()}


def touch(path: str) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000))


def test_new_then_up_to_date_with_the_summary_values_exactly(work):
    x, spec = work
    with dask.config.set({"flowgpu.cache.directory": ".flowgpu/cache"}):  # the default, from the working dir
        assert Cache().directory == os.path.abspath(".flowgpu/cache")
    cache = Cache()
    first = verdicts(spec, cache)
    assert reasons(first) == dict.fromkeys(spec["outputs"], "new")
    assert summarize(first) == "4 to compute (new)"
    result = run_recorded(spec, cache)
    now = verdicts(spec, cache)
    assert all(v.up_to_date for v in now.values()) and summarize(now) == "4 up to date"
    assert now["s"].value == result.outputs["s"] and now["b"].value == result.outputs["b"]
    np.testing.assert_allclose(now["s"].value, (x - 0.5).sum(0))
    assert now["z"].location == os.path.abspath("out/t.zarr") and now["z"].value is None
    assert len(os.listdir(cache.directory)) == 4  # one small file per output


def test_touching_an_input_recomputes_only_what_reads_it(work):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    touch("a.npy")
    now = verdicts(spec, cache)
    assert reasons(now) == {"z": "inputs changed: a.npy", "c": "inputs changed: a.npy",
                            "s": "inputs changed: a.npy", "b": "up to date"}
    assert summarize(now) == "1 up to date, 3 to compute (inputs changed: a.npy)"


def test_checksum_ignores_a_touch_but_not_new_bytes(work, rng):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    assert reasons(verdicts(spec, cache, checksum=True))["s"] == "no checksum recorded: a.npy"
    assert reasons(verdicts(spec, cache, checksum=True))["b"] == "up to date"  # reads no file
    touch("a.npy")
    assert reasons(verdicts(spec, cache, checksum=True))["s"] == "inputs changed: a.npy"  # nothing to compare
    plan = pipeline.compile(spec)
    summed = recipes(plan, checksum=True)
    for name, recipe in summed.items():
        cache.record(plan, name, recipe, value=cache.entry(plan, name).get("value"))
    touch("a.npy")
    assert reasons(verdicts(spec, cache))["s"] == "inputs changed: a.npy"  # by stat it did change
    assert all(v.up_to_date for v in verdicts(spec, cache, checksum=True).values())
    assert all(v.up_to_date for v in verdicts(spec, cache).values())  # its new stat was recorded
    np.save("a.npy", rng.standard_normal((50, 3)))
    assert reasons(verdicts(spec, cache, checksum=True))["s"] == "inputs changed: a.npy"


def test_a_touch_that_checksum_found_changed_no_byte_is_not_a_change_to_a_later_plain_run(work, rng):
    x, spec = work
    first = pipeline.run(spec, session="local", progress=False, checksum=True)
    np.testing.assert_allclose(first.outputs["s"], (x - 0.5).sum(0))
    os.utime("a.npy", ns=(os.stat("a.npy").st_atime_ns, os.stat("a.npy").st_mtime_ns + int(rng.integers(1, 9e9))))
    assert pipeline.status(spec)["line"] == "1 up to date, 3 to compute (inputs changed: a.npy)"
    touched = pipeline.run(spec, session="local", progress=False, checksum=True)
    assert {o["status"] for o in touched.summary["outputs"].values()} == {"up-to-date"}  # the same bytes
    assert pipeline.status(spec)["line"] == "4 up to date"  # and so by size and mtime, after that run
    again = pipeline.run(spec, session="local", progress=False)
    assert {o["status"] for o in again.summary["outputs"].values()} == {"up-to-date"}
    np.testing.assert_allclose(again.outputs["s"], (x - 0.5).sum(0))
    np.save("a.npy", x + 1)  # new bytes: seen with and without --checksum
    assert pipeline.status(spec, checksum=True)["line"] == "1 up to date, 3 to compute (inputs changed: a.npy)"
    assert pipeline.status(spec)["line"] == "1 up to date, 3 to compute (inputs changed: a.npy)"


def test_a_changed_param_or_step_names_what_changed(work):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    assert reasons(verdicts(spec, cache, params={"k": 0.25})) == {
        "z": "params changed: k", "c": "params changed: k", "s": "params changed: k", "b": "up to date"}
    assert reasons(verdicts(spec, cache, params={"seed": 8, "k": 1.5}))["b"] == "params changed: seed"
    edited = copy.deepcopy(spec)
    edited["steps"]["s"]["op"] = "max"
    assert reasons(verdicts(edited, cache)) == {"z": "up to date", "c": "up to date", "s": "recipe changed",
                                                "b": "up to date"}
    assert reasons(verdicts(spec, cache, force=True)) == dict.fromkeys(spec["outputs"], "forced")


def test_a_rerun_with_other_params_then_is_up_to_date_for_those(work):
    x, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    run_recorded(spec, cache, k=2.0)
    now = verdicts(spec, cache, params={"k": 2.0})
    assert all(v.up_to_date for v in now.values())
    np.testing.assert_allclose(now["s"].value, (x - 2.0).sum(0))
    assert reasons(verdicts(spec, cache))["s"] == "params changed: k"


def test_an_output_removed_or_edited_by_hand_is_recomputed(work, rng):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    np.save("out/c.npy", rng.standard_normal((50, 3)))  # by hand: the marker beside it stays
    assert os.path.exists(marker_path(os.path.abspath("out/c.npy")))
    arr = zarr.open_array("out/t.zarr", mode="r+")
    arr[0, 0] = 42.0
    now = reasons(verdicts(spec, cache))
    assert now["c"] == now["z"] == "output changed since it was written" and now["s"] == "up to date"
    run_recorded(spec, cache)
    assert all(v.up_to_date for v in verdicts(spec, cache).values())
    os.unlink(marker_path(os.path.abspath("out/c.npy")))
    assert reasons(verdicts(spec, cache))["c"] == "output changed since it was written"
    shutil.rmtree("out/t.zarr")
    assert reasons(verdicts(spec, cache))["z"] == "output missing"


def test_a_removed_table_is_said_missing_and_written_again_from_the_cache(work, rng):
    x, _ = work
    ks = sorted(rng.uniform(-1, 1, 2).round(3).tolist())
    spec = {"name": "stats", "params": {"k": 0.0}, "foreach": {"k": ks},
            "inputs": {"x": {"source": "npy", "path": "a.npy", "chunks": [16, 3]}},
            "steps": {"c": {"op": "subtract", "inputs": ["x"], "args": {"b": "${params.k}"}},
                      "total": {"op": "sum", "inputs": ["c"]}, "peak": {"op": "max", "inputs": ["c"]}},
            "outputs": {"c": {"from": "c", "sink": "npy", "path": "out/c-${params.k}.npy"},
                        "total": {"from": "total", "sink": "table", "path": "out/stats.csv"},
                        "peak": {"from": "peak", "sink": "table", "path": "out/stats.csv"}}}
    with open("s.yaml", "w") as f:
        json.dump(spec, f)  # JSON is YAML
    pipeline.run("s.yaml", session="local", progress=False)
    written = open("out/stats.csv", "rb").read()
    rows = list(csv.DictReader(open("out/stats.csv", newline="")))
    assert [float(r["k"]) for r in rows] == ks
    np.testing.assert_allclose([[float(r["total"]), float(r["peak"])] for r in rows],
                               [[(x - k).sum(), (x - k).max()] for k in ks])
    os.unlink("out/stats.csv")
    said = CliRunner().invoke(cli, ["status", "s.yaml"])
    assert said.exit_code == 0 and "stats: 2 up to date, 4 to write (table missing)" in said.output
    assert said.output.count("to write") == 5 and said.output.count("table missing") == 5  # the line, then each
    again = pipeline.run("s.yaml", session="local", progress=False)
    assert [i.status for i in again.items] == ["up-to-date"] * 2  # nothing computed: the values are cached
    assert open("out/stats.csv", "rb").read() == written
    assert pipeline.status("s.yaml")["line"] == "6 up to date"


@pytest.mark.parametrize("garbage", ["", "{", "[1, 2]", '{"format": 3, "digest": "x"}', "\x00\xff", "[" * 100_000])
def test_a_corrupt_entry_is_computed_again_and_said_so(work, garbage, capfd):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    plan = pipeline.compile(spec)
    with open(cache.path(plan, "s"), "w", encoding="latin-1") as f:
        f.write(garbage)
    capfd.readouterr()
    assert reasons(verdicts(spec, cache)) == {"z": "up to date", "c": "up to date", "s": "cache entry damaged",
                                              "b": "up to date"}
    (note,) = capfd.readouterr().err.splitlines()
    assert note.startswith("flowgpu: not using the cache entry of output 's' (") and "computed again" in note
    assert cache.entry(plan, "s") is None


@pytest.mark.parametrize("form, reason", [(1, "recorded before paths were resolved on the client (an older flowgpu)"),
                                          (2, "recorded without a checksum (an older flowgpu)"),
                                          (99, "recorded by another flowgpu")])
def test_an_entry_of_another_format_is_computed_again_with_its_reason(work, form, reason, capfd):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    plan = pipeline.compile(spec)
    entry = json.loads(open(cache.path(plan, "s")).read())
    del entry["checksum"]
    entry["format"] = form
    with open(cache.path(plan, "s"), "w") as f:
        json.dump(entry, f)
    assert reasons(verdicts(spec, cache))["s"] == reason
    assert "cache entry" not in capfd.readouterr().err  # the reason says it all


def test_a_cached_nan_is_the_float_a_run_computes(work, rng):
    """Entries hold NaN and the infinities as JSON strings; the up-to-date value is the float again."""
    _, spec = work
    x = rng.standard_normal((50, 3))
    x[rng.integers(50), 0], x[rng.integers(50), 1], x[rng.integers(50), 2] = np.nan, np.inf, -np.inf
    np.save("a.npy", x)
    spec["steps"]["s"] = {"op": "multiply", "inputs": ["x"], "args": {"b": 2.0}}
    spec["outputs"] = {"s": {"from": "s"}}
    cache = Cache()
    result = run_recorded(spec, cache)
    np.testing.assert_array_equal(np.array(result.outputs["s"]), x * 2)
    got = verdicts(spec, cache)["s"]
    assert got.up_to_date and all(isinstance(v, float) for row in got.value for v in row), got.value[:2]
    np.testing.assert_array_equal(np.array(got.value), x * 2)  # NaN where NaN, the same infinities


def test_summary_entries_are_per_spec_and_batch_item(work):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache, item={"k": 0.5})
    assert reasons(verdicts(spec, cache, item={"k": 0.5}))["s"] == "up to date"
    other = reasons(verdicts(spec, cache, item={"k": 9}))
    assert other["s"] == other["b"] == "new" and other["z"] == "up to date"  # a path output: keyed by its path
    assert reasons(verdicts(dict(spec, name="another"), cache, item={"k": 0.5}))["s"] == "new"


def test_after_invalidate_nothing_is_up_to_date_until_recorded(work):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    plan = pipeline.compile(spec)
    cache.invalidate(plan, ["z", "s"])
    assert reasons(verdicts(spec, cache)) == {"z": "new", "c": "up to date", "s": "new", "b": "up to date"}


def test_a_run_killed_while_committing_leaves_no_entry_saying_up_to_date(work, tmp_path):
    _, spec = work
    cache = Cache()
    run_recorded(spec, cache)
    edited = copy.deepcopy(spec)
    edited["steps"]["c"]["args"]["b"] = 0.75  # every output of x rewritten
    code = textwrap.dedent("""
        import json, sys
        from tests.pipeline.test_cache import run_recorded
        from flowgpu.pipeline.cache import Cache
        run_recorded(json.loads(sys.argv[1]), Cache())
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, FLOWGPU_TEST_FAULT="commit:after-first-rename@kill")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(edited)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 137, done.stderr
    for which in (spec, edited):
        now = verdicts(which, cache)
        assert not any(v.up_to_date for v in now.values()), reasons(now)  # that run was rewriting all
    run_recorded(edited, cache)  # finishes (or rolls back) the dead commit, then writes and records
    assert all(v.up_to_date for v in verdicts(edited, cache).values())


def test_a_cache_that_cannot_be_written_warns_once_and_the_run_goes_on(work, capfd):
    x, spec = work
    open("blocked", "w").close()  # a file where the cache folder should be: not writable, even by root
    with dask.config.set({"flowgpu.cache.directory": "blocked/cache"}):
        cache = Cache()
    assert cache.directory == os.path.abspath("blocked/cache")
    result = run_recorded(spec, cache)
    np.testing.assert_allclose(result.outputs["s"], (x - 0.5).sum(0))
    err = capfd.readouterr().err
    assert err.count("cannot write the cache") == 1 and "blocked" in err
    assert reasons(verdicts(spec, cache)) == dict.fromkeys(spec["outputs"], "new")


def test_a_value_that_is_not_json_is_not_recorded(work, capfd):
    _, spec = work
    cache = Cache(".other-cache")
    plan = pipeline.compile(spec)
    cache.record(plan, "s", recipes(plan)["s"], value=object())
    assert "the value of output 's' is not JSON data" in capfd.readouterr().err
    assert reasons(verdicts(spec, cache))["s"] == "new"


@pytest.mark.slow
def test_two_processes_recording_different_outputs_at_once_keep_both(work, tmp_path):
    _, spec = work
    run_recorded(spec, Cache())
    code = textwrap.dedent("""
        import json, sys, time
        from flowgpu import pipeline
        from flowgpu.pipeline.cache import Cache
        from flowgpu.pipeline.recipe import recipes
        spec, name = json.loads(sys.argv[1]), sys.argv[2]
        cache = Cache()
        plan = pipeline.compile(spec)
        recipe = recipes(plan)[name]
        value = cache.entry(plan, name)["value"]
        while not __import__("os").path.exists("go"):
            time.sleep(0.005)
        for _ in range(200):
            cache.invalidate(plan, [name])
            cache.record(plan, name, recipe, value=value)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps(spec), name], env=env, cwd=tmp_path)
             for name in ("s", "b")]
    open("go", "w").close()
    assert [p.wait(timeout=90) for p in procs] == [0, 0]
    assert all(v.up_to_date for v in verdicts(spec, Cache()).values())
    assert not [f for f in os.listdir(Cache().directory) if not f.endswith(".json")]  # no temporaries left


def test_summarize_counts_and_groups_reasons():
    v = [Verdict("a", True, "up to date"), Verdict("b", False, "new"), Verdict("c", False, "new"),
         Verdict("d", False, "inputs changed: data/b.npy")]
    assert summarize(v) == "1 up to date, 3 to compute (new (2); inputs changed: data/b.npy)"
    assert summarize({"a": v[0]}) == "1 up to date"
    assert summarize([]) == "0 up to date"
    assert summarize(v[:2] + [Verdict("e", True, "table missing")]) == \
        "1 up to date, 1 to compute (new), 1 to write (table missing)"
