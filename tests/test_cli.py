"""The flowgpu command: thin wrappers over the library, exit codes 0 / 2 / 1."""

from __future__ import annotations

import json
import os
import re
import pathlib
import socket

import numpy as np
import pytest
from click.testing import CliRunner

import tests.pipeline.helpers  # noqa: F401  (registers the test ops)
from flowgpu.cli import cli
from flowgpu.pipeline.spec import json_schema

ROOT = pathlib.Path(__file__).resolve().parents[1] / "pipelines"

SPEC = """\
params: {n: 30}
inputs:
  x: {source: npy, path: x.npy}
steps:
  y: {op: multiply, inputs: [x], args: {b: 2.0}}
  s: {op: sum, inputs: [y]}
outputs:
  y: {from: y, sink: npy, path: out/y.npy}
  s: {from: s}
"""


def _spec(tmp_path, rng, text=SPEC):
    x = rng.random(30)
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "spec.yaml").write_text(text)
    return x


def test_ops_lists_the_registry():
    result = CliRunner().invoke(cli, ["ops"])
    assert result.exit_code == 0
    for name in ("add", "sum", "gaussian_filter", "test_counted"):
        assert name in result.output


def test_schema_is_the_models_schema(tmp_path):
    result = CliRunner().invoke(cli, ["schema"])
    assert result.exit_code == 0 and json.loads(result.output) == json_schema()
    assert CliRunner().invoke(cli, ["schema", "-o", str(tmp_path / "s.json")]).exit_code == 0
    assert json.loads((tmp_path / "s.json").read_text()) == json_schema()
    assert CliRunner().invoke(cli, ["schema", "-o", str(tmp_path / "s.json")]).exit_code == 0  # its own: replaced
    assert json.loads((tmp_path / "s.json").read_text())["title"] == "flowgpu pipeline spec"


def test_schema_never_replaces_a_users_file_unless_told(tmp_path, rng):
    mine = tmp_path / "spec.yaml"
    text = f"name: mine\n# {rng.integers(1 << 30)}\n"
    mine.write_text(text)
    result = CliRunner().invoke(cli, ["schema", "-o", str(mine)])
    assert result.exit_code == 2 and "already exists and is not a spec schema flowgpu wrote" in result.output
    assert "--overwrite" in result.output and mine.read_text() == text
    assert CliRunner().invoke(cli, ["schema", "-o", str(mine), "--overwrite"]).exit_code == 0
    assert json.loads(mine.read_text()) == json_schema()


def test_validate_several_files(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _spec(tmp_path, rng)
    (tmp_path / "bad.yaml").write_text("steps:\n  s: {op: nope}\n")
    result = CliRunner().invoke(cli, ["validate", "spec.yaml", str(ROOT / "quickstart.yaml")])
    assert result.exit_code == 0 and result.output.count(": ok") == 2
    result = CliRunner().invoke(cli, ["validate", "spec.yaml", "bad.yaml"])
    assert result.exit_code == 2 and "spec.yaml: ok" in result.output and "bad.yaml:2:" in result.output


def test_plan_shows_steps_in_order_and_estimates(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _spec(tmp_path, rng)
    result = CliRunner().invoke(cli, ["plan", "spec.yaml"])
    assert result.exit_code == 0, result.output
    assert result.output.index("multiply") < result.output.index("sum")
    assert "peak memory per worker" in result.output
    result = CliRunner().invoke(cli, ["plan", "spec.yaml", "--json"])
    desc = json.loads(result.output)
    assert [r["name"] for r in desc["steps"]] == ["x", "y", "s"]
    assert desc["steps"][1]["shape"] == [30] and desc["steps"][1]["bytes"] == 240
    assert desc["peak_worker_bytes"] > 0 and desc["tasks"] > 0
    assert not (tmp_path / "out").exists()


def test_validate_and_plan_take_runs_foreach_and_check_every_item(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = rng.standard_normal((int(rng.integers(20, 40)), 4))
    np.save("x.npy", x)
    (tmp_path / "spec.yaml").write_text(  # k has no default: the batch gives it
        "params: {k: {type: int}}\ninputs: {x: {source: npy, path: x.npy}}\n"
        "steps: {s: {op: sum, inputs: [x], args: {axis: '${params.k}'}}}\noutputs: {s: {from: s}}\n")
    for command in (["validate"], ["plan"], ["run", "--dry-run"]):
        good = CliRunner().invoke(cli, [*command, "spec.yaml", "--foreach", "params.k=0,1"])
        assert good.exit_code == 0, good.output
        bad = CliRunner().invoke(cli, [*command, "spec.yaml", "--foreach", "params.k=0,1,2"])  # x is 2-D
        assert bad.exit_code == 2 and "Traceback" not in bad.output
        assert bad.stderr.startswith("error: spec.yaml:3:") and "batch item 3 of 3 (k=2): step 's'" in bad.stderr
    assert "spec.yaml: ok" in CliRunner().invoke(cli, ["validate", "spec.yaml", "--foreach", "params.k=1"]).stdout
    shown = CliRunner().invoke(cli, ["plan", "spec.yaml", "--foreach", "params.k=1,0", "--json"])
    assert json.loads(shown.stdout)["outputs"]["s"]["shape"] == [x.shape[0]]  # the first item's: k=1
    assert shown.stderr == "plan of batch item 1 of 2 (k=1); every item was checked\n"


def test_dry_run_writes_nothing(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _spec(tmp_path, rng)
    result = CliRunner().invoke(cli, ["run", "spec.yaml", "--dry-run"])
    assert result.exit_code == 0 and "nothing was run or written" in result.output
    assert not (tmp_path / "out").exists()


def test_run_with_sets_summary_and_local_cluster(tmp_path, rng, monkeypatch, cpu_session):
    monkeypatch.chdir(tmp_path)
    x = _spec(tmp_path, rng)
    result = CliRunner().invoke(cli, ["run", "spec.yaml", "--summary", "run.json"])
    assert result.exit_code == 0, result.output
    assert "flowgpu running spec.yaml on cpu (2 worker(s)); dashboard: off" in result.stderr  # once its session is ready
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), 2 * x)
    summary = json.loads((tmp_path / "run.json").read_text())
    np.testing.assert_allclose(summary["outputs"]["s"]["value"], 2 * x.sum())
    assert summary["outputs"]["y"]["shape"] == [30]


def test_failure_while_running_exits_1(tmp_path, rng, monkeypatch, cpu_session):
    monkeypatch.chdir(tmp_path)
    _spec(tmp_path, rng, SPEC.replace("op: multiply, inputs: [x], args: {b: 2.0}", "op: test_explode, inputs: [x]"))
    result = CliRunner().invoke(cli, ["run", "spec.yaml", "--quiet"])
    assert result.exit_code == 1, result.output
    assert "failed while running" in result.output
    assert not (tmp_path / "out" / "y.npy").exists()


def _dead_runs_staging(folder):
    """A staging folder beside an output, as a run killed mid-write leaves it (its owner is gone)."""
    stage = folder / f".y.npy.flowgpu-tmp-r{os.urandom(8).hex()}"
    stage.mkdir(parents=True)
    (stage / "data").write_bytes(b"half")
    who = {"pid": os.getpid(), "host": socket.gethostname(), "start": 1.0}  # this pid, but another start: dead
    (stage / "owner.json").write_text(json.dumps({**who, "ino": stage.stat().st_ino}))
    return stage


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_runs_say_nothing_on_stderr_when_they_clean_a_dead_runs_staging(tmp_path, rng, monkeypatch, quiet,
                                                                              cpu_session):
    monkeypatch.chdir(tmp_path)
    x = _spec(tmp_path, rng)
    stage = _dead_runs_staging(tmp_path / "out")
    result = CliRunner().invoke(cli, ["run", "spec.yaml"] + (["-q"] if quiet else []))
    assert result.exit_code == 0, result.output
    assert not stage.exists()
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), 2 * x)
    assert ("no longer running" in result.stderr) is not quiet, result.stderr
    if quiet:
        assert result.stderr == ""


def test_bad_arguments_exit_2(tmp_path, rng, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _spec(tmp_path, rng)
    assert CliRunner().invoke(cli, ["run", "spec.yaml", "--set", "novalue"]).exit_code == 2
    assert CliRunner().invoke(cli, ["run", "missing.yaml"]).exit_code == 2
    assert CliRunner().invoke(cli, ["run", "spec.yaml", "--workers", "0"]).exit_code == 2


def test_info_still_works():
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 0 and "GPUs visible" in result.output


def test_ops_prints_docstrings_verbatim():
    result = CliRunner().invoke(cli, ["ops"])
    assert "Values limited to the range [lo, hi]." in result.output  # not eaten as rich markup
    for name in ("real", "imag", "conj", "angle"):
        assert f"\n│ {name} " in result.output
    # types as written in the code, not as quoted strings; docstrings' ``code`` as `code`
    assert "(x: Array) -> Array" in result.output and "'Array'" not in result.output
    assert "``" not in result.output + CliRunner().invoke(cli, ["sinks"]).output


def test_sources_and_sinks_list_the_registries():
    result = CliRunner().invoke(cli, ["sources"])
    assert result.exit_code == 0
    assert re.search(r"│ npy +│ yes +│ chunks='auto', path", result.output), result.output
    assert re.search(r"│ random +│ no +│ .*shape", result.output)
    result = CliRunner().invoke(cli, ["sinks"])
    assert result.exit_code == 0
    assert re.search(r"│ zarr +│ atomic, writes_path +│ component=None", result.output), result.output
    assert re.search(r"│ summary +│ in_summary ", result.output)


def _strict(text: str):
    """JSON as the standard has it: NaN and Infinity are not JSON (jq refuses them)."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_and_summary_are_valid_json_when_a_value_is_nan_or_infinite(tmp_path, rng, monkeypatch, cpu_session):
    monkeypatch.chdir(tmp_path)
    x = rng.random(30) + 0.5
    np.save(tmp_path / "x.npy", x)
    y = x.copy()
    y[7] = np.nan
    np.save(tmp_path / "y.npy", y)
    (tmp_path / "spec.yaml").write_text(
        "inputs: {x: {source: npy, path: x.npy}, y: {source: npy, path: y.npy}}\n"
        "steps: {s: {op: sum, inputs: [y]}, m: {op: max, inputs: [x]}, inv: {op: expr, inputs: {x: x}, "
        "args: {expression: '1 / (x - x)'}}, big: {op: max, inputs: [inv]}, small: {op: min, inputs: [neg]}, "
        "neg: {op: expr, inputs: {x: x}, args: {expression: '-1 / (x - x)'}}}\n"
        "outputs: {s: {from: s}, m: {from: m}, big: {from: big}, small: {from: small}}\n")
    result = CliRunner().invoke(cli, ["run", "spec.yaml", "--json", "--quiet", "--summary", "run.json"])
    assert result.exit_code == 0, result.output
    for text in (result.stdout, (tmp_path / "run.json").read_text()):
        outs = _strict(text)["outputs"]
        assert (outs["s"]["value"], outs["big"]["value"], outs["small"]["value"]) == ("NaN", "Infinity", "-Infinity")
        assert outs["m"]["value"] == x.max()


def test_a_failed_run_still_gives_its_summary_on_stdout(tmp_path, rng, monkeypatch, cpu_session):
    """``--json | jq`` got nothing when a run failed (without --keep-going), though --summary had it;
    a failed batch's table was not printed either. The error itself stays on stderr."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    np.save(tmp_path / "x.npy", rng.standard_normal((20, 3)))
    limit = float(rng.uniform(1.2, 1.8))
    (tmp_path / f"boom{os.getpid()}.py").write_text(
        f"def boom(b, k):\n    if k > {limit}:\n        raise ValueError('bad block')\n    return b * k\n")
    (tmp_path / "spec.yaml").write_text(
        "params: {k: {type: float, default: 1.0}}\ninputs: {x: {source: npy, path: x.npy}}\n"
        f"steps: {{y: {{op: map_blocks, inputs: [x], args: {{function: 'boom{os.getpid()}:boom', "
        "kwargs: {k: '${params.k}'}}}, t: {op: sum, inputs: [y]}}\noutputs: {t: {from: t}}\n")
    one = CliRunner().invoke(cli, ["run", "spec.yaml", "--set", "params.k=2.0", "--json", "-q", "--summary", "s.json"])
    assert one.exit_code == 1 and "ValueError: bad block" in one.stderr
    said = json.loads(one.stdout)
    assert said == json.loads((tmp_path / "s.json").read_text())
    assert said["status"] == "failed" and said["step"] == "y" and said["not_written"] == ["t"]
    both = CliRunner().invoke(cli, ["run", "spec.yaml", "--foreach", "params.k=1.0,2.0", "--json", "-q", "--force"])
    assert both.exit_code == 1
    items = json.loads(both.stdout)["items"]
    failed = [i for i in items if i["status"] == "failed"]
    assert [i["params"]["k"] for i in failed] == [2.0]
    assert (failed[0]["step"], failed[0]["written"], failed[0]["not_written"]) == ("y", [], ["t"])  # as a run's
    table = CliRunner().invoke(cli, ["run", "spec.yaml", "--foreach", "params.k=1.0,2.0", "-q", "--force"])
    assert table.exit_code == 1 and "failed" in table.stdout and "bad block" in table.stdout


def test_an_ops_warning_is_given_once_at_its_steps_line_in_the_spec(tmp_path, rng, monkeypatch, cpu_session):
    """A step whose op warns (fft on an axis split into chunks) warns once, at the step's line of the
    spec: the run compiles the spec again for its workers, and the op's own line would say nothing."""
    monkeypatch.chdir(tmp_path)
    x = rng.standard_normal((16, 12))
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "spec.yaml").write_text(
        "inputs:\n  x: {source: npy, path: x.npy, chunks: [8, 6]}\nsteps:\n"
        "  f: {op: fft, inputs: [x], args: {axis: 1}}\n  a: {op: abs, inputs: [f]}\n"
        "outputs:\n  a: {from: a, sink: npy, path: out/a.npy}\n")
    with pytest.warns(UserWarning) as seen:
        result = CliRunner().invoke(cli, ["run", "spec.yaml", "-q"])
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(np.load(tmp_path / "out" / "a.npy"), np.abs(np.fft.fft(x, axis=1)), rtol=1e-10)
    fft = [w for w in seen if "is split into several chunks" in str(w.message)]
    assert [(pathlib.Path(w.filename).name, w.lineno, type(w.message).__name__) for w in fft] == [
        ("spec.yaml", 4, "FFTRechunkWarning")]
    assert str(fft[0].message).startswith("step 'f': op 'fft': axis [1]")


def test_clean_of_a_path_that_is_not_there_is_a_usage_error(tmp_path, monkeypatch):
    """A mistyped path said 'nothing to clean' and exit 0, as if it had been checked."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    result = CliRunner().invoke(cli, ["clean", "out", "outt"])
    assert result.exit_code == 2 and "'outt' does not exist, and no run left anything for it there" in result.output
    result = CliRunner().invoke(cli, ["clean", "out"])
    assert result.exit_code == 0 and "nothing to clean" in result.output


@pytest.mark.slow  # starts its own cluster in a subprocess
def test_a_run_whose_dashboard_port_is_taken_says_where_it_is_without_distributeds_warning(tmp_path, rng):
    import subprocess
    import sys

    _spec(tmp_path, rng)
    holder = socket.socket()
    try:
        try:
            holder.bind(("127.0.0.1", 8787))
            holder.listen()
        except OSError:
            pass  # already taken: as well
        env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
        run = subprocess.run([sys.executable, "-m", "flowgpu", "run", "spec.yaml", "--set", "cluster.n_workers=1"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    finally:
        holder.close()
    assert run.returncode == 0, run.stderr
    assert "already in use" not in run.stderr and "UserWarning" not in run.stderr, run.stderr
    assert re.search(r"dashboard: http://127\.0\.0\.1:(?!8787/)\d+/flowgpu", run.stderr), run.stderr


def test_validate_refuses_the_cluster_a_run_would_refuse(tmp_path, rng, monkeypatch):
    """'validate' said ok for memory_limit: lots and for backend: gpu on a machine without one; 'run'
    then refused them, the GPU one with no file:line:col."""
    from flowgpu import backend

    monkeypatch.chdir(tmp_path)
    _spec(tmp_path, rng, SPEC + "cluster: {backend: gpu}\n")
    result = CliRunner().invoke(cli, ["validate", "spec.yaml"])
    if backend.has_gpu():
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 2 and "spec.yaml:10:" in result.output, result.output
    assert "cluster.backend: backend='gpu' but no GPU is visible here" in result.output
    _spec(tmp_path, rng, SPEC + "cluster: {memory_limit: lots}\n")
    result = CliRunner().invoke(cli, ["validate", "spec.yaml"])
    assert result.exit_code == 2 and "spec.yaml:10:" in result.output, result.output
    assert "cluster.memory_limit: memory_limit='lots' is not a memory size" in result.output
