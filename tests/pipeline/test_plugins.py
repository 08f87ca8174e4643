"""Third-party sources and sinks: through entry points (a tiny distribution on sys.path, nothing
installed) and through register_source in Python. They run, validate, list and appear in the
schema exactly like the built-ins."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import dask
import numpy as np
import pytest
import yaml

from flowgpu import pipeline
from flowgpu.errors import ConfigError, OutputError, SpecError
from flowgpu.io import sinks, sources

ROOT = pathlib.Path(__file__).resolve().parents[2]

PLUGIN = '''
"""A third-party package adding one source and one sink to flowgpu through entry points."""
import dask
import dask.array as da
import numpy as np

from flowgpu.io.sinks import PendingWrite


def ramp(n: int, step: float = 1.0, start: float = 0.0, chunks: int = 4) -> da.Array:
    """Values start, start + step, ... (n of them)."""
    return start + da.arange(n, chunks=chunks) * step


def _write(values, path, fmt):
    np.savetxt(path, np.atleast_1d(np.asarray(values)), fmt=fmt)
    return path


def text(x, path=None, overwrite=False, fmt: str = "%.17g"):
    """A plain-text file, one value per line."""
    return PendingWrite("text", dask.delayed(_write)(x, path, fmt), path)
'''

ENTRY_POINTS = """\
[flowgpu.sources]
ramp = flowgpu_test_plugin:ramp

[flowgpu.sinks]
text = flowgpu_test_plugin:text
"""

BESIDE = '''
import numpy as np


def wave(n: int):
    return np.sin(np.arange(n) / 3.0)
'''

SPEC = """\
inputs:
  r: {{source: ramp, n: {n}, step: {step}, start: {start}}}
  w: {{source: python, callable: "beside_mod:wave", args: {{n: {n}}}, shape: [{n}], dtype: float64}}
steps:
  s: {{op: add, inputs: [r, w]}}
outputs:
  t: {{from: s, sink: text, path: {out}}}
cluster: {{backend: cpu, n_workers: 1, threads_per_worker: 2, dashboard_address: null}}
"""


@pytest.fixture
def plugin_dist(tmp_path):
    """A distribution a plain sys.path entry makes visible to importlib.metadata, nothing installed."""
    site = tmp_path / "site"
    info = site / "flowgpu_test_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "flowgpu_test_plugin.py").write_text(PLUGIN)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flowgpu-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "beside_mod.py").write_text(BESIDE)  # importable because it is beside the spec
    work = tmp_path / "work"  # the cwd: neither the spec folder nor on PYTHONPATH
    work.mkdir()
    return site, specs, work


def _console_script(tmp_path) -> list[str]:
    """The ``flowgpu`` console script (sys.path[0] is its bin folder, not the cwd)."""
    script = pathlib.Path(sys.executable).parent / "flowgpu"
    if not script.exists():  # the same text pip writes
        script = tmp_path / "bin" / "flowgpu"
        script.parent.mkdir(exist_ok=True)
        script.write_text("import sys\nfrom flowgpu.cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n")
    return [sys.executable, str(script)]


def _flowgpu(how: list[str], args: list[str], site, work) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    return subprocess.run([*how, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["python -m flowgpu", "console script"])
def test_entry_point_source_and_sink_run_from_yaml(how, plugin_dist, tmp_path, rng):
    site, specs, work = plugin_dist
    cmd = [sys.executable, "-m", "flowgpu"] if how == "python -m flowgpu" else _console_script(tmp_path)
    n, step, start = int(rng.integers(5, 40)), float(rng.normal()), float(rng.normal())
    out = tmp_path / "result.txt"
    (specs / "spec.yaml").write_text(SPEC.format(n=n, step=step, start=start, out=out))
    done = _flowgpu(cmd, ["run", str(specs / "spec.yaml"), "--quiet"], site, work)
    assert done.returncode == 0, done.stderr
    expected = start + np.arange(n) * step + np.sin(np.arange(n) / 3.0)
    np.testing.assert_allclose(np.loadtxt(out), expected, rtol=1e-12, atol=1e-12)

    bad = SPEC.format(n="ten", step=step, start=start, out=out)
    (specs / "bad.yaml").write_text(bad)
    refused = _flowgpu(cmd, ["run", str(specs / "bad.yaml"), "--quiet"], site, work)
    assert refused.returncode == 2, refused.stderr
    where = re.search(r"bad\.yaml:(\d+):(\d+): inputs\.r\.n: ", refused.stderr)
    assert where, refused.stderr
    assert (int(where.group(1)), int(where.group(2))) == (2, bad.splitlines()[1].index("ten") + 1)
    assert "(hint: " in refused.stderr

    typo = SPEC.format(n=n, step=step, start=start, out=out).replace("step:", "stepp:")
    (specs / "typo.yaml").write_text(typo)
    refused = _flowgpu(cmd, ["validate", str(specs / "typo.yaml")], site, work)
    assert refused.returncode == 2
    assert "typo.yaml:2:" in refused.stderr and "inputs.r.stepp" in refused.stderr
    assert "did you mean 'step'" in refused.stderr


@pytest.mark.slow
def test_plugins_are_listed_and_in_the_schema(plugin_dist):
    site, _, work = plugin_dist
    cmd = [sys.executable, "-m", "flowgpu"]
    listed = _flowgpu(cmd, ["sources"], site, work)
    assert listed.returncode == 0 and re.search(r"ramp .*Values start, start \+ step", listed.stdout), listed.stdout
    listed = _flowgpu(cmd, ["sinks"], site, work)
    assert listed.returncode == 0 and re.search(r"text .*writes_path.*fmt='%.17g'", listed.stdout), listed.stdout
    schema = json.loads(_flowgpu(cmd, ["schema"], site, work).stdout)
    ramp = schema["$defs"]["RampSource"]
    assert ramp["properties"]["source"]["const"] == "ramp" and set(ramp["required"]) == {"n", "source"}
    assert schema["$defs"]["TextOutput"]["properties"]["sink"]["const"] == "text"
    refs = json.dumps(schema["properties"]["inputs"]) + json.dumps(schema["properties"]["outputs"])
    assert "#/$defs/RampSource" in refs and "#/$defs/TextOutput" in refs


def test_a_broken_plugin_warns_and_the_rest_works(plugin_dist):
    site, _, work = plugin_dist
    (site / "flowgpu_test_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        ENTRY_POINTS + "broken = flowgpu_test_plugin:does_not_exist\n")
    listed = _flowgpu([sys.executable, "-m", "flowgpu"], ["sinks"], site, work)
    assert listed.returncode == 0
    assert "could not load sink plugin 'broken'" in listed.stderr
    assert re.search(r"text .*writes_path", listed.stdout) and re.search(r"zarr .*atomic", listed.stdout)


@pytest.fixture
def scratch_source():
    yield "test_checkerboard"
    sources.SOURCES.remove("test_checkerboard")


def test_register_source_then_run(scratch_source, rng):
    def checkerboard(rows: int, cols: int, high: float = 1.0):
        """A checkerboard of 0 and high."""
        return (np.add.outer(np.arange(rows), np.arange(cols)) % 2) * high

    sources.register_source(scratch_source, checkerboard)
    rows, cols, high = int(rng.integers(2, 9)), int(rng.integers(2, 9)), float(rng.normal())
    spec = {"inputs": {"b": {"source": scratch_source, "rows": rows, "cols": cols, "high": high}},
            "steps": {"total": {"op": "sum", "inputs": ["b"]}},
            "outputs": {"total": {"from": "total"}}}
    result = pipeline.run(spec, session="local", progress=False)
    expected = (np.add.outer(np.arange(rows), np.arange(cols)) % 2).sum() * high
    assert result.outputs["total"] == pytest.approx(expected, rel=1e-12)
    with pytest.raises(SpecError, match=r"inputs\.b\.rows: .*valid integer"):
        pipeline.validate({**spec, "inputs": {"b": {"source": scratch_source, "rows": "many", "cols": 2}}})
    assert "#/$defs/TestCheckerboardSource" in json.dumps(pipeline.json_schema()["properties"]["inputs"])


@pytest.fixture
def scratch_sink():
    yield "test_lines"
    sinks.SINKS.remove("test_lines")


def test_a_sinks_suffixes_refuse_a_path_named_for_another_kind_of_file(scratch_sink, tmp_path, rng, monkeypatch):
    """A registered sink says how its files are named; a path whose suffix names another kind of
    file (a store, a .npy file) is refused at ``outputs.NAME.path`` with a name to use; a path with no
    suffix, or one that names no kind of file, is written as given."""
    def lines(x, path=None, overwrite=False):
        """One value per line."""
        return sinks.PendingWrite("test_lines", dask.delayed(np.savetxt)(path, x), path)

    sinks.register_sink(scratch_sink, lines, suffixes=(".TXT",))
    monkeypatch.chdir(tmp_path)
    values = rng.normal(size=int(rng.integers(3, 20)))
    np.save(tmp_path / "v.npy", values)

    def spec(path):
        return {"inputs": {"v": {"source": "npy", "path": str(tmp_path / "v.npy")}},
                "outputs": {"t": {"from": "v", "sink": scratch_sink, "path": path}}}

    for wrong, better in (("out/t.npy", "out/t.txt"), ("t.zarr", "t.txt")):
        with pytest.raises(SpecError, match=rf"outputs\.t\.path: .*but sink 'test_lines' writes a \.txt file.*"
                                            rf"hint: name it e\.g\. '{re.escape(better)}'"):
            pipeline.validate(spec(wrong))
    assert sorted(os.listdir(tmp_path)) == ["v.npy"]
    for right in ("t.txt", "t.log", "plain"):
        pipeline.run(spec(right), session="local", progress=False)
        np.testing.assert_array_equal(np.loadtxt(tmp_path / right), values)


def _lines_spec(tmp_path, out: str, k: float) -> dict:
    return {"params": {"k": k},
            "inputs": {"v": {"source": "npy", "path": str(tmp_path / "v.npy"), "chunks": [7]}},
            "steps": {"s": {"op": "expr", "inputs": {"x": "v"}, "args": {"expression": "x * ${params.k}"}}},
            "outputs": {"t": {"from": "s", "sink": "test_lines", "path": str(tmp_path / "out" / out)}}}


def _run_local(spec, **kw):
    return pipeline.run(spec, session="local", progress=False, **kw)


@pytest.mark.parametrize("out", ["t.txt", "t.txt.gz"])
def test_a_registered_sinks_output_is_flowgpus_own_up_to_date_until_its_recipe_changes(scratch_sink, tmp_path, rng,
                                                                                        out):
    """A sink registered as the docs show (atomic=False: it writes where it is told) wrote a file with
    no marker: the next run refused it as not flowgpu's, and --overwrite found it "changed since it was
    written" every time. Its write is now staged and committed as the built-ins' are (at a path of the
    output's own name: np.savetxt gzips a .gz), so a second run computes nothing, a new param rewrites
    it, and a file the user put there is still refused."""
    def lines(x, path=None, overwrite=False):
        """One value per line."""
        return sinks.PendingWrite("test_lines", dask.delayed(np.savetxt)(path, x), path)

    sinks.register_sink(scratch_sink, lines, suffixes=(".txt",))
    values, k = rng.normal(size=int(rng.integers(20, 60))), float(rng.normal())
    np.save(tmp_path / "v.npy", values)
    target = tmp_path / "out" / out

    first = _run_local(_lines_spec(tmp_path, out, k))
    assert first.summary["outputs"]["t"]["status"] == "computed" and first.outputs["t"] == str(target)
    np.testing.assert_allclose(np.loadtxt(target), values * k, rtol=1e-15)
    assert target.read_bytes()[:2] == b"\x1f\x8b" if out.endswith(".gz") else target.read_text()[0] != "\x1f"
    stamp = target.stat().st_mtime_ns
    for overwrite in (False, True):  # with --overwrite, too: the file is the one flowgpu wrote
        again = _run_local(_lines_spec(tmp_path, out, k), overwrite=overwrite)
        assert again.summary["outputs"]["t"]["status"] == "up-to-date" and again.summary["tasks"] == 0
    assert target.stat().st_mtime_ns == stamp
    assert sorted(os.listdir(target.parent)) == sorted([out, f".{out}.flowgpu-output.json"])  # no staging left
    assert pipeline.status(_lines_spec(tmp_path, out, k))["items"][0]["outputs"]["t"]["up_to_date"]

    k2 = k + 1.0 + abs(float(rng.normal()))
    changed = _run_local(_lines_spec(tmp_path, out, k2))
    assert changed.summary["outputs"]["t"]["status"] == "computed"
    assert changed.summary["outputs"]["t"]["reason"] == "params changed: k"
    np.testing.assert_allclose(np.loadtxt(target), values * k2, rtol=1e-15)

    mine = rng.normal(size=5)
    np.savetxt(tmp_path / out, mine)
    os.replace(tmp_path / out, target)  # the user's file, where flowgpu's was (its marker still beside it)
    with pytest.raises(SpecError, match=r"outputs\.t\.path: output .* already exists and is not the one flowgpu wrote"):
        _run_local(_lines_spec(tmp_path, out, k2))
    np.testing.assert_array_equal(np.loadtxt(target), mine)


def test_a_sink_whose_write_makes_nothing_at_its_path_fails_the_run(scratch_sink, tmp_path, rng):
    """A sink whose target wrote nothing (here: elsewhere) was reported as written at its path; now
    the item fails with what to fix, and nothing is left at the path nor beside it."""
    elsewhere = tmp_path / "elsewhere.txt"

    def astray(x, path=None, overwrite=False):
        """Writes another path than the one it is given."""
        return sinks.PendingWrite("test_lines", dask.delayed(np.savetxt)(str(elsewhere), x), path)

    sinks.register_sink(scratch_sink, astray)
    values = rng.normal(size=int(rng.integers(5, 30)))
    np.save(tmp_path / "v.npy", values)
    with pytest.raises(OutputError, match=r"sink 'test_lines' wrote nothing for output .*t\.txt.*Nothing was replaced"):
        _run_local(_lines_spec(tmp_path, "t.txt", 1.0))
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    np.testing.assert_allclose(np.loadtxt(elsewhere), values)

    sinks.register_sink(scratch_sink, astray, atomic=True)  # says it stages its output, and does not
    with pytest.raises(ConfigError, match=r"sink 'test_lines' is registered atomic=True but its PendingWrite carries "
                                          r"no AtomicPath; register it with atomic=False"):
        _run_local(_lines_spec(tmp_path, "t.txt", 1.0))


def test_register_sink_refuses_a_prepare_that_cannot_take_flowgpus_call(scratch_sink, tmp_path, rng):
    """A sink taking no arguments (or not path, or not overwrite) was registered, listed and validated,
    and failed mid-run with a TypeError; it is refused when registered, naming the sink and the call."""
    def bare():
        """Takes nothing."""

    def no_path(x, overwrite=False):
        """No path."""

    def no_overwrite(x, *, path=None):
        """No overwrite."""

    for bad in (bare, no_path, no_overwrite, lambda: None):
        with pytest.raises(ConfigError, match=r"^sink 'test_lines': .*cannot take flowgpu's call \(.*\); a sink's "
                                              r"prepare must accept the array first and the keywords path, overwrite"):
            sinks.register_sink(scratch_sink, bad)
        assert scratch_sink not in sinks.SINKS

    def named_otherwise(values, path=None, overwrite=False, fmt: str = "%.17g", *, digits: int):
        """The array by another name, and a required option."""
        return sinks.PendingWrite("test_lines", dask.delayed(np.savetxt)(path, values, fmt=fmt), path)

    entry = sinks.register_sink(scratch_sink, named_otherwise)
    assert set(entry.options.model_fields) == {"fmt", "digits"}  # the array is not an option
    values = rng.normal(size=int(rng.integers(5, 30)))
    np.save(tmp_path / "v.npy", values)
    spec = _lines_spec(tmp_path, "t.txt", 1.0)
    spec["outputs"]["t"]["digits"] = 3
    _run_local(spec)
    np.testing.assert_allclose(np.loadtxt(tmp_path / "out" / "t.txt"), values, rtol=1e-15)


def test_an_entry_point_sink_of_the_wrong_shape_is_refused_before_the_run(plugin_dist):
    """An entry-point sink that takes no arguments was listed and validated, and ``flowgpu run`` started
    a cluster and failed with a TypeError (exit 1); now loading it warns why, and a spec naming it is
    refused at its ``sink`` (exit 2) with the same words, no traceback."""
    site, specs, work = plugin_dist
    with open(site / "flowgpu_test_plugin.py", "a") as f:
        f.write('\n\ndef badsink():\n    """Takes nothing."""\n')
    (site / "flowgpu_test_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        ENTRY_POINTS + "badsink = flowgpu_test_plugin:badsink\n")
    (specs / "bad.yaml").write_text("inputs:\n  r: {source: ramp, n: 5}\n"
                                    "outputs:\n  t: {from: r, sink: badsink, path: out.txt}\n")
    done = _flowgpu([sys.executable, "-m", "flowgpu"], ["run", str(specs / "bad.yaml"), "--quiet"], site, work)
    said = ("sink 'badsink': badsink() cannot take flowgpu's call (too many positional arguments); a sink's prepare "
            "must accept the array first and the keywords path, overwrite")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "could not load sink plugin 'badsink'" in done.stderr
    assert re.search(r"bad\.yaml:4:\d+: outputs\.t\.sink: could not load sink plugin 'badsink' .*"
                     + re.escape(said), done.stderr), done.stderr
    assert not (work / "out.txt").exists()


def test_the_docs_sink_example_runs_and_its_output_is_up_to_date_on_the_next_run(tmp_path, rng, monkeypatch):
    text = (ROOT / "docs" / "pipelines.md").read_text()
    code = "# mypkg/io.py" + text.split("```python\n# mypkg/io.py", 1)[1].split("```", 1)[0]
    output = re.search(r"`outputs: (\{t: .*\})` then writes", text).group(1)
    monkeypatch.chdir(tmp_path)
    values = rng.normal(size=int(rng.integers(5, 40)))
    np.save(tmp_path / "v.npy", values)
    spec = {"inputs": {"v": {"source": "npy", "path": str(tmp_path / "v.npy")}},
            "steps": {"s": {"op": "negative", "inputs": ["v"]}}, "outputs": yaml.safe_load(output)}
    assert "text" not in sinks.SINKS
    try:
        exec(compile(code, "mypkg/io.py", "exec"), {})  # registers sink "text"
        first, second = _run_local(spec), _run_local(spec)
    finally:
        sinks.SINKS.remove("text")
    np.testing.assert_allclose(np.loadtxt(first.outputs["t"]), -values, atol=5e-4)
    assert second.summary["outputs"]["t"]["status"] == "up-to-date"
