"""``python -m benchmarks.dask_suite.run``: dask's own array tests, plain against fused.

The tool is tested end to end on a fake dask test folder (``--source``) whose tests break, slow
down, or slow down only once when fusion is on, so every verdict is deterministic; then on dask's
real tests (slow: the CI gate of issue 16).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.dask_suite import tree

ROOT = Path(__file__).resolve().parents[2]

FAKE = '''
import time

import dask
import dask.array as da
import numpy as np
import pytest

_calls = []


def fused():
    return dask.config.get("array_optimize", None) is not None


def test_same():  # 1 s both ways: compiling the fused kernel (~1-3 s on a busy machine) is not 5x that
    time.sleep(1.0)
    x = np.random.default_rng().random(20)
    d = da.from_array(x, chunks=7)
    np.testing.assert_allclose(((d * 2 + 1) ** 2 - d).compute(), (x * 2 + 1) ** 2 - x)


def test_breaks():
    assert not fused(), "broken by fusion"


def test_slow_always():
    if fused():
        time.sleep(1.5)


def test_slow_first():
    if fused() and not _calls:
        time.sleep(1.5)
    _calls.append(1)


def test_skipped():
    pytest.skip("dask skips this")


def test_fails_plain():
    assert False, "fails both ways"


def test_warns(xfail):  # dask's own conftest fixture, and warnings are errors as in dask's settings
    import warnings
    xfail("dask xfails this")
    warnings.warn("a warning fails a test", UserWarning)
'''


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.dask_suite.run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def fake_source(tmp_path):
    src = tmp_path / "dask"
    (src / "array" / "tests").mkdir(parents=True)
    (src / "array" / "tests" / "test_fake.py").write_text(textwrap.dedent(FAKE))
    (src / "conftest.py").write_text((Path(tree.find_tests()[0]) / "conftest.py").read_text())
    return src


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_verdicts_on_a_fake_suite(fake_source, tmp_path):
    out, report = tmp_path / "out", tmp_path / "r.json"
    done = _run("--source", str(fake_source), "--files", "test_fake", "-n", "0", "--floor", "0.2",
                "--out", str(out), "--json", str(report), timeout=280)
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(report.read_text())
    kinds = {f["test"]: f["kind"] for f in doc["findings"]}
    assert kinds == {"test_fake.py::test_breaks": "fails fused", "test_fake.py::test_slow_always": "slower fused",
                     "test_fake.py::test_slow_first": "slower on first call only"}, done.stdout
    assert [f["regression"] for f in doc["findings"] if f["test"].endswith("test_slow_first")] == [False]
    assert doc["fails_plain"] == ["test_fake.py::test_fails_plain"]
    for run in ("plain", "fused"):
        assert {k: doc["runs"][run][k] for k in ("tests", "failed", "skipped", "xfailed")} == \
            {"tests": 7, "failed": 1 + (run == "fused"), "skipped": 1, "xfailed": 1}
    assert doc["census"]["fused"] >= 1 and doc["census"]["computes"] >= doc["census"]["fused"]
    # the verdict, then the findings table last on stdout
    assert "plain against fused: 2 regression(s), 1 slower on the first call only (compilation: " in done.stdout
    table = done.stdout.rstrip().split("| finding |")[1].splitlines()[2:]
    assert [row.split(" | ")[:2] for row in table] == [
        ["| fails fused", "test_fake.py::test_breaks"], ["| slower fused", "test_fake.py::test_slow_always"],
        ["| slower on first call only", "test_fake.py::test_slow_first"]]
    assert (out / "plain.xml").is_file() and (out / "fused.xml").is_file()

    # the same two reports compared again, without rerunning: no recheck, both slow tests stay regressions
    again = _run("--compare", str(out / "plain.xml"), str(out / "fused.xml"), "--floor", "0.2", timeout=120)
    assert again.returncode == 1
    assert "3 regression(s)" in again.stdout and "| slower fused | test_fake.py::test_slow_first |" in again.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_regressions_exits_0(fake_source, tmp_path):
    done = _run("--source", str(fake_source), "--files", "test_fake", "-n", "0", "-k", "same or skipped",
                "--out", str(tmp_path / "out"), timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "plain against fused: no regressions" in done.stdout
    assert "1 of them ran a flowgpu kernel" in done.stdout


@pytest.mark.timeout(120)
def test_bad_arguments_exit_2(tmp_path):
    done = _run("--files", "test_no_such_file", "--out", str(tmp_path), timeout=100)
    assert done.returncode == 2
    assert "no such dask test file: test_no_such_file.py" in done.stderr and "test_ufunc" in done.stderr
    assert "Traceback" not in done.stderr
    done = _run("--source", str(tmp_path / "nowhere"), "--out", str(tmp_path), timeout=100)
    assert done.returncode == 2 and "nowhere has no array/tests/ folder" in done.stderr
    done = _run("--compare", str(tmp_path / "a.xml"), str(tmp_path / "b.xml"), timeout=100)
    assert done.returncode == 2 and "no such JUnit report" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_dask_array_tests_pass_fused(tmp_path):
    """Issue 16: the 11 files of dask's array tests (4268 tests), plain and fused, in CI."""
    report = tmp_path / "r.json"
    done = _run("-n", "2", "--out", str(tmp_path / "out"), "--json", str(report), timeout=2600)
    doc = json.loads(report.read_text())
    assert doc["runs"]["plain"]["passed"] > 3500, doc["runs"]
    assert doc["census"]["fused"] > 100
    assert done.returncode == 0, done.stdout[-6000:]


FAKE_XARRAY = '''
import dask.array as da
import numpy as np
import pytest


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_chain(backend):
    x = np.random.default_rng().random(20)
    d = da.from_array(x, chunks=7) if backend == "dask" else x
    np.testing.assert_allclose(np.asarray((d * 2 + 1) ** 2 - d), (x * 2 + 1) ** 2 - x)


def test_dask_breaks():
    import dask
    assert dask.config.get("array_optimize", None) is None, "broken by fusion"


def test_marked(needs_root_conftest):
    pass


@pytest.mark.flaky
def test_flaky_dask():
    assert False, "skipped: the root conftest.py skips flaky tests without --run-flaky"
'''

FAKE_XARRAY_ROOT = '''
import pytest


def pytest_addoption(parser):
    parser.addoption("--run-flaky", action="store_true")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "flaky" in item.keywords and not config.getoption("--run-flaky"):
            item.add_marker(pytest.mark.skip(reason="flaky"))


@pytest.fixture
def needs_root_conftest():
    return 1
'''

FAKE_PYPROJECT = '''
[tool.pytest.ini_options]
addopts = ["--strict-config", "--strict-markers", "--mypy-pyproject-toml-file=pyproject.toml"]
filterwarnings = ["error:::xarray.*", "default:something harmless"]
markers = ["flaky: flaky tests", "slow: slow tests"]
'''


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_another_packages_tests(tmp_path):
    """--package xarray: the root conftest.py and the markers of the source's pyproject.toml hold, and a file
    given as NAME:KEYWORD runs only its tests whose id holds KEYWORD."""
    src = tmp_path / "xarray-src"
    (src / "xarray" / "tests").mkdir(parents=True)
    (src / "xarray" / "tests" / "test_fake.py").write_text(textwrap.dedent(FAKE_XARRAY))
    (src / "xarray" / "tests" / "conftest.py").write_text("")
    (src / "conftest.py").write_text(textwrap.dedent(FAKE_XARRAY_ROOT))
    (src / "pyproject.toml").write_text(textwrap.dedent(FAKE_PYPROJECT))
    report = tmp_path / "r.json"
    done = _run("--package", "xarray", "--source", str(src), "--files", "test_fake:dask", "-n", "0",
                "--out", str(tmp_path / "out"), "--json", str(report), timeout=280)
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(report.read_text())
    regressions = [(f["test"], f["kind"]) for f in doc["findings"] if f["regression"]]
    assert regressions == [("test_fake.py::test_dask_breaks", "fails fused")]  # (test_chain compiles: first call only)
    for run in ("plain", "fused"):  # test_chain[dask], test_dask_breaks, test_flaky_dask (skipped)
        assert {k: doc["runs"][run][k] for k in ("tests", "skipped")} == {"tests": 3, "skipped": 1}, doc["runs"]
    assert "xarray's tests of its dask code, plain against fused: 1 regression(s)" in done.stdout
    ini = (tmp_path / "out" / "tests" / "pytest.ini").read_text()
    assert "error:::xarray.*" in ini and "mypy" not in ini


@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_xarray_dask_tests_pass_fused(tmp_path):
    """Issue 28: xarray's tests of its dask code (6 files, about 4,200 tests), plain and fused, in CI: no test
    that passes plain fails fused, none is 5x slower warm."""
    report = tmp_path / "r.json"
    done = _run("--package", "xarray", "-n", "2", "--out", str(tmp_path / "out"), "--json", str(report), timeout=2600)
    doc = json.loads(report.read_text())
    assert doc["runs"]["plain"]["passed"] > 3500, doc["runs"]
    assert doc["census"]["fused"] > 1000
    assert done.returncode == 0, done.stdout[-6000:]
