"""Hostile or careless specs, through the real command line: code a spec may run, nothing runs
before ``run``, nothing is replaced that holds the user's work, a spec cannot send the run (or
the dashboard) elsewhere, and a failed run still writes its summary.

Every test runs ``python -m flowgpu`` in a fresh folder and says what was lost: nothing. User code
proves whether it ran by a marker file it appends to when called.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import zarr

ROOT = pathlib.Path(__file__).resolve().parents[2]

MARK = '''
import os
import numpy as np


def _mark(what):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "marker.txt"), "a") as f:
        f.write(what + "\\n")


def make(n, seed):
    _mark("make")
    return np.random.default_rng(seed).standard_normal(n)


def double(block):
    _mark("double")
    return block * 2


def fail(block):
    _mark("fail")
    raise ValueError("the user function gave up")
'''

CLUSTER = 'cluster: {backend: cpu, n_workers: 1, threads_per_worker: 1, dashboard_address: "127.0.0.1:0"}\n'


def spec_text(*, n: int = 50, seed: int = 0, source_extra: str = ", shape: [50], dtype: float64",
              function: str = "mark:double", out: str = "out.zarr", cluster: str = CLUSTER) -> str:
    return (
        "name: trust\n"
        "inputs:\n"
        f'  x: {{source: python, callable: "mark:make", args: {{n: {n}, seed: {seed}}}{source_extra}}}\n'
        "steps:\n"
        f'  y: {{op: map_blocks, inputs: [x], args: {{function: "{function}"}}}}\n'
        "outputs:\n"
        f"  out: {{from: y, sink: zarr, path: {out}}}\n" + cluster
    )


def flowgpu(folder: pathlib.Path, *args: str, env: dict | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "flowgpu", *args], cwd=folder, env=environ, capture_output=True,
                          text=True, timeout=timeout)


def files(folder: pathlib.Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (what must not be lost)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and "__pycache__" not in p.parts}


@pytest.fixture
def work(tmp_path):
    (tmp_path / "mark.py").write_text(MARK)
    return tmp_path


def marker(folder: pathlib.Path) -> list[str]:
    path = folder / "marker.txt"
    return path.read_text().split() if path.exists() else []


# -- nothing runs before run ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_validate_plan_and_dry_run_call_no_user_code_and_run_does(work, rng):
    seed, n = int(rng.integers(1 << 30)), int(rng.integers(20, 80))
    (work / "s.yaml").write_text(spec_text(n=n, seed=seed, source_extra=f", shape: [{n}], dtype: float64"))
    r = flowgpu(work, "validate", "s.yaml")
    assert r.returncode == 0, r.stderr
    assert "imports mark:make (callable" in r.stdout and "imports mark:double (function" in r.stdout
    for args in (("plan", "s.yaml"), ("plan", "--json", "s.yaml"), ("run", "--dry-run", "s.yaml")):
        r = flowgpu(work, *args)
        assert r.returncode == 0, (args, r.stderr)
    assert marker(work) == [], "validate, plan and --dry-run ran user code"
    assert not (work / "out.zarr").exists()

    r = flowgpu(work, "run", "-q", "s.yaml")
    assert r.returncode == 0, r.stderr
    calls = marker(work)
    assert calls.count("make") == 1 and "double" in calls, calls  # the source is called once, by run
    expected = 2 * np.random.default_rng(seed).standard_normal(n)
    np.testing.assert_array_equal(zarr.open_array(str(work / "out.zarr"))[...], expected)


@pytest.mark.timeout(60)
def test_a_python_source_naming_os_system_does_not_run_under_validate(work):
    (work / "s.yaml").write_text(
        'inputs:\n  x: {source: python, callable: "os:system", args: {command: "touch pwned"}, shape: [1], '
        "dtype: int64}\noutputs:\n  v: {from: x}\n")
    r = flowgpu(work, "validate", "s.yaml")
    assert r.returncode == 0, r.stderr
    assert "imports os:system (callable; runs when the spec runs)" in r.stdout
    for args in (("plan", "s.yaml"), ("run", "--dry-run", "s.yaml")):
        assert flowgpu(work, *args).returncode == 0
    assert not (work / "pwned").exists(), "validate/plan ran the spec's os.system command"
    r = flowgpu(work, "run", "--trust", "numpy", "s.yaml")
    assert r.returncode == 2
    assert "s.yaml:2:" in r.stderr and "inputs.x.callable" in r.stderr and "outside the trusted modules" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (work / "pwned").exists(), "a refused import ran"


@pytest.mark.timeout(60)
def test_trust_refuses_imports_outside_it_at_the_spec_field(work):
    (work / "s.yaml").write_text(spec_text(function="os:system"))
    before = files(work)
    r = flowgpu(work, "validate", "--trust", "mark", "s.yaml")
    assert r.returncode == 2
    assert "s.yaml:5:" in r.stderr and "steps.y.args.function" in r.stderr, r.stderr
    assert "'os:system': is outside the trusted modules ('mark')" in r.stderr and "--trust os" in r.stderr
    # the setting, from the environment as any dask option; --trust adds to it
    env = {"DASK_FLOWGPU__TRUSTED_MODULES": '["numpy"]'}
    r = flowgpu(work, "plan", "s.yaml", env=env)
    assert r.returncode == 2 and "inputs.x.callable" in r.stderr and "('numpy')" in r.stderr
    r = flowgpu(work, "run", "--dry-run", "--trust", "mark", "--trust", "os", "s.yaml", env=env)
    assert r.returncode == 0, r.stderr
    assert marker(work) == [] and files(work) == before, "nothing ran, nothing was written"


@pytest.mark.timeout(60)
def test_a_python_source_declares_its_shape_and_dtype_or_plan_call(work):
    (work / "s.yaml").write_text(spec_text(source_extra=""))
    r = flowgpu(work, "validate", "s.yaml")
    assert r.returncode == 2 and "inputs.x" in r.stderr and "declare" in r.stderr and "plan_call" in r.stderr
    (work / "s.yaml").write_text(spec_text(n=30, source_extra=", plan_call: true"))
    r = flowgpu(work, "plan", "s.yaml")
    assert r.returncode == 0, r.stderr
    assert "called at plan time (plan_call: true)" in r.stderr
    assert marker(work) == ["make"]  # what plan_call asks for, and nothing else (map_blocks is not called)


@pytest.mark.timeout(300)
def test_run_checks_the_callable_against_the_declared_shape(work):
    (work / "s.yaml").write_text(spec_text(n=40, source_extra=", shape: [41], dtype: float64"))
    assert flowgpu(work, "validate", "s.yaml").returncode == 0
    r = flowgpu(work, "run", "-q", "s.yaml")
    assert r.returncode == 2, r.stderr
    assert "returned shape [40], but the spec declares [41]" in r.stderr and "inputs.x" in r.stderr
    assert marker(work) == ["make"] and not (work / "out.zarr").exists(), "nothing was written"


# -- nothing replaced that holds the user's work ---------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["parent", "cwd", "spec_folder", "input", "include"])
def test_overwrite_never_replaces_the_cwd_the_spec_its_includes_or_an_input(work, case, rng):
    proj = work / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "specs" / "lib").mkdir(parents=True)
    x = rng.standard_normal(16)
    zarr.create_array(str(proj / "data" / "in.zarr"), shape=x.shape, chunks=(8,), dtype=x.dtype)[...] = x
    (proj / "specs" / "lib" / "inner.yaml").write_text("inputs:\n  a: {source: random, shape: [4], seed: 2}\n"
                                                       "outputs:\n  a: {from: a}\n")
    out, cwd, what = {  # (output path, working directory, what the refusal names)
        "parent": ("..", proj, "which contains the working directory"),
        "cwd": (".", proj, "which is the working directory"),
        "spec_folder": ("specs", proj, "which contains the spec 'specs/s.yaml'"),
        "input": ("data", proj, "which contains input 'x' (data/in.zarr)"),
        "include": ("../specs/lib", proj / "data", "which contains the included spec"),
    }[case]
    source = "{source: random, shape: [16], seed: 1}" if case == "include" else "{source: zarr, path: data/in.zarr}"
    steps = "  inner: {uses: lib/inner.yaml}\n" if case == "include" else ""
    spec = "../specs/s.yaml" if case == "include" else "specs/s.yaml"
    (proj / "specs" / "s.yaml").write_text(
        f"inputs:\n  x: {source}\nsteps:\n{steps}  y: {{op: negative, inputs: [x]}}\n"
        f"outputs:\n  o: {{from: y, sink: zarr, path: '{out}'}}\n" + CLUSTER)
    before = files(work)
    for command in (["validate", "--overwrite"], ["run", "--overwrite", "-q"], ["run", "--dry-run", "--overwrite"]):
        r = flowgpu(cwd, *command, spec)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert "outputs.o.path" in r.stderr and what in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert files(work) == before, "a file of the user's was lost or changed"


@pytest.mark.timeout(60)
def test_validate_refuses_what_run_refuses_before_computing(work):
    (work / "taken.zarr").mkdir()
    (work / "taken.zarr" / "thesis.tex").write_text("three years of work")
    base = "inputs:\n  x: {source: random, shape: [8], seed: 3}\n"
    (work / "foreign.yaml").write_text(base + "outputs:\n  o: {from: x, sink: zarr, path: taken.zarr}\n")
    (work / "twice.yaml").write_text(base + "outputs:\n  a: {from: x, sink: zarr, path: same.zarr}\n"
                                            "  b: {from: x, sink: npy, path: ./same.zarr}\n")
    before = files(work)
    r = flowgpu(work, "validate", "foreign.yaml")
    assert r.returncode == 2 and "outputs.o.path" in r.stderr and "not written by flowgpu" in r.stderr, r.stderr
    r = flowgpu(work, "validate", "twice.yaml")
    assert r.returncode == 2 and "both write" in r.stderr and "outputs.b.path" in r.stderr, r.stderr
    assert files(work) == before and not (work / "same.zarr").exists()


# -- a spec cannot send the run elsewhere ----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_spec_address_is_refused_unless_confirmed(work):
    address = "tcp://127.0.0.1:9"  # nothing listens there: a confirmed address fails to connect, quickly
    (work / "s.yaml").write_text(spec_text(cluster=f"cluster: {{address: '{address}'}}\n"))
    for args in (("run", "-q", "s.yaml"), ("validate", "s.yaml"), ("run", "--dry-run", "s.yaml")):
        r = flowgpu(work, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert "s.yaml:8:" in r.stderr and "cluster.address" in r.stderr and address in r.stderr
        assert "--allow-spec-address" in r.stderr and f"--scheduler {address}" in r.stderr
    assert flowgpu(work, "validate", "--allow-spec-address", "s.yaml").returncode == 0
    env = {"DASK_FLOWGPU__CONNECT_TIMEOUT": "1s"}
    r = flowgpu(work, "validate", "--scheduler", address, "s.yaml", env=env)  # confirmed, then its workers asked
    assert r.returncode == 1 and "could not reach the scheduler at " + address in r.stderr, r.stderr
    for confirm in (("--allow-spec-address",), ("--scheduler", address)):
        r = flowgpu(work, "run", "-q", *confirm, "s.yaml", env=env)
        assert r.returncode == 1 and "could not reach the scheduler at " + address in r.stderr, r.stderr
    assert marker(work) == [] and not (work / "out.zarr").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dashboard_open_to_the_network_needs_confirmation_and_the_link_says_where_it_listens(work):
    cluster = 'cluster: {backend: cpu, n_workers: 1, threads_per_worker: 1, dashboard_address: "0.0.0.0:0"}\n'
    (work / "s.yaml").write_text(spec_text(cluster=cluster))
    r = flowgpu(work, "run", "s.yaml")
    assert r.returncode == 2 and "cluster.dashboard_address" in r.stderr and "0.0.0.0:0" in r.stderr, r.stderr
    assert marker(work) == [] and not (work / "out.zarr").exists()
    r = flowgpu(work, "run", "--allow-spec-address", "s.yaml")
    assert r.returncode == 0, r.stderr
    assert "dashboard: http://0.0.0.0:" in r.stderr, r.stderr  # not the 127.0.0.1 it does not only listen on


# -- --summary on failure --------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_a_failed_run_writes_its_summary(work):
    (work / "s.yaml").write_text(spec_text(function="mark:fail"))
    r = flowgpu(work, "run", "-q", "s.yaml", "--summary", "summary.json")
    assert r.returncode == 1, r.stderr
    summary = json.loads((work / "summary.json").read_text())
    assert summary["status"] == "failed" and "the user function gave up" in summary["error"]
    assert summary["step"] == "y"
    assert summary["written"] == [] and summary["not_written"] == ["out"]
    assert summary["outputs"]["out"]["written"] is False and not (work / "out.zarr").exists()
    assert [p.name for p in work.iterdir() if p.name.startswith(".summary.json")] == [], "a temporary was left"
    # a refused spec too: the summary says why, and what it did not write
    (work / "s.yaml").write_text(spec_text(out="."))
    r = flowgpu(work, "run", "-q", "--overwrite", "s.yaml", "--summary", "summary.json")
    assert r.returncode == 2
    summary = json.loads((work / "summary.json").read_text())
    assert summary["status"] == "failed" and "the working directory" in summary["error"]
    assert summary["not_written"] == ["out"] and (work / "mark.py").exists()
