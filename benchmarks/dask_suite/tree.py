"""The test files to run, copied into a folder of their own with their package's pytest settings.

Two packages' suites (:data:`SUITES`): dask's array tests, and xarray's tests of its dask code.

* dask: the installed wheel ships ``dask/array/tests/`` and ``dask/conftest.py``; where a build does
  not, the sdist of the same version is downloaded (``pip download --no-binary :all: --no-deps
  dask==X``) and its copies are used. The folder gets a ``pytest.ini`` and a ``conftest.py`` that
  reproduce what dask's own ``pyproject.toml`` and root ``conftest.py`` set up for these tests
  (warnings are errors, strict xfails, its markers, ``slow`` tests only with ``--runslow``,
  array-expr tests skipped).
* xarray: the wheel ships ``xarray/tests/`` but not the root ``conftest.py`` (its options, the
  ``skip_if_param`` marker) nor ``pyproject.toml`` (its markers and warning filters), so the sdist
  of the installed version is downloaded (once, into a cache folder) and its files are used: the
  ``pytest.ini`` is made from its ``[tool.pytest.ini_options]``, its root ``conftest.py`` and
  ``xarray/tests/conftest.py`` are loaded as plugins.

A file may be named ``NAME:KEYWORD`` (``test_rolling:dask``): then only its tests whose id holds
KEYWORD (case-insensitive) run, as ``pytest -k KEYWORD`` would select them from that file alone.
Nothing is written into site-packages, and both runs see exactly the same files.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FILES", "SUITES", "Suite", "find_tests", "prepare"]

# The files issue 16 names; `--files` runs others of dask/array/tests/ too.
FILES = ("test_array_core", "test_ufunc", "test_reductions", "test_creation", "test_routines", "test_masked",
         "test_gufunc", "test_slicing", "test_optimization", "test_overlap", "test_rechunk")
# xarray's tests of its dask code that issue 28 names (test_rolling: its dask tests only)
XARRAY_FILES = ("test_dask", "test_computation", "test_weighted", "test_groupby", "test_duck_array_ops",
                "test_rolling:dask")

INI = """\
# Written by benchmarks/dask_suite/tree.py: dask's own pytest settings for its array tests.
[pytest]
markers =
    network: needs an internet connection
    slow: skipped unless --runslow is passed
    gpu: meant for GPUs
    skip_with_pyarrow_strings: skipped when pyarrow strings are on
    xfail_with_pyarrow_strings: xfailed when pyarrow strings are on
    array_expr: array-expr specific
    normal_and_array_expr: run with and without array-expr
addopts = --strict-markers --strict-config
xfail_strict = true
timeout = 300
timeout_method = thread
filterwarnings =
    error
    ignore:Couldn't detect a suitable IP address:RuntimeWarning:distributed
    ignore:Creating scratch directories is taking a surprisingly long time.*:UserWarning
    ignore:Port 8787 is already in use:UserWarning
    ignore:The 'generic' unit for NumPy timedelta is deprecated:DeprecationWarning:
    module:Exception ignored:pytest.PytestUnraisableExceptionWarning::
    module:unclosed database in <sqlite3.Connection:ResourceWarning::
"""

CONFTEST = '''\
"""Written by benchmarks/dask_suite/tree.py: what dask's root conftest.py does for its array tests."""
import pytest

pytest_plugins = ["dask_conftest"]  # dask/conftest.py as installed (fixtures such as `xfail`)


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run the tests dask marks slow")


def pytest_runtest_setup(item):
    if "slow" in item.keywords and not item.config.getoption("--runslow"):
        pytest.skip("need --runslow option to run")
    if "array_expr" in item.keywords:
        pytest.skip("array-expr tests are not run here")
'''


XARRAY_CONFTEST = '''\
"""Written by benchmarks/dask_suite/tree.py: xarray's root conftest.py and xarray/tests/conftest.py, as plugins."""

pytest_plugins = ["xarray_conftest", "xarray_tests_conftest"]
'''

SELECT = '''

# The files given as NAME:KEYWORD: only their tests whose id holds KEYWORD (case-insensitive) run.
SELECT = {select!r}


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        word = SELECT.get(item.nodeid.split("::")[0])
        (keep if word is None or word.lower() in item.nodeid.lower() else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
'''


class SuiteSetupError(RuntimeError):
    """A package's test files cannot be found or fetched."""


@dataclass(frozen=True)
class Suite:
    """One package's test suite: where its tests are, which run by default, and its pytest settings."""

    package: str
    tests: str  # the test folder, relative to the source folder (see find_tests)
    files: tuple[str, ...]  # the default files (NAME or NAME:KEYWORD)
    ini: Callable[[Path], str]  # the pytest.ini, from the source folder
    conftest: str  # the conftest.py written beside the tests
    plugins: tuple[tuple[str, str], ...]  # (module written beside the tests, file of the source folder)
    runslow: bool  # whether ``--runslow`` means something to its conftest
    source_help: str


def _xarray_ini(source: Path) -> str:
    """pytest.ini from xarray's own ``[tool.pytest.ini_options]``: its markers and warning filters
    (warnings raised in xarray are errors), without the options of plugins its other tests need
    (pytest-mypy-plugins, pytest-asyncio)."""
    opts = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    filters = list(opts.get("filterwarnings", []))
    # the copied test modules are test_x, not xarray.tests.test_x: warnings raised in them are errors too
    filters.insert(1 if filters and filters[0].startswith("error:::xarray") else 0, "error:::test_")
    filters += ["ignore:Port 8787 is already in use:UserWarning"]
    markers = list(opts.get("markers", []))
    # test_dask imports test_backends, whose async tests carry pytest-asyncio's marker (strict markers:
    # unregistered, the whole file would not be collected); none of the files run here is async
    markers.append("asyncio: async tests (pytest-asyncio)")
    lines = ["# Written by benchmarks/dask_suite/tree.py from xarray's pyproject.toml [tool.pytest.ini_options].",
             "[pytest]", "markers =", *(f"    {m}" for m in markers),
             "addopts = --strict-markers --strict-config", "timeout = 300", "timeout_method = thread",
             "filterwarnings =", *(f"    {f}" for f in filters)]
    return "\n".join(lines) + "\n"


SUITES = {
    "dask": Suite("dask", "array/tests", FILES, lambda source: INI, CONFTEST, (("dask_conftest", "conftest.py"),),
                  runslow=True, source_help="a dask/ folder holding array/tests/ (and conftest.py)"),
    "xarray": Suite("xarray", "xarray/tests", XARRAY_FILES, _xarray_ini, XARRAY_CONFTEST,
                    (("xarray_conftest", "conftest.py"), ("xarray_tests_conftest", "xarray/tests/conftest.py")),
                    runslow=False,
                    source_help="the root of an xarray checkout or unpacked sdist (xarray/tests/, conftest.py, "
                                "pyproject.toml)"),
}


def _sdist(package: str, version: str, cache: Path, keep: Callable[[str], bool]) -> Path:
    """The root of the sdist of ``package==version`` (only the members ``keep`` accepts), downloaded once
    into ``cache``."""
    root = cache / f"{package}-{version}"
    if not (root / ".complete").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                                   f"{package}=={version}", "-d", tmp], capture_output=True, text=True)
            archives = list(Path(tmp).glob(f"{package}-*.tar.gz"))
            if done.returncode or not archives:
                raise SuiteSetupError(f"the tests of {package} {version} need its sdist, and `pip download "
                                      f"{package}=={version}` failed:\n{done.stderr[-2000:]}")
            with tarfile.open(archives[0]) as tar:
                top = f"{package}-{version}/"
                members = [m for m in tar.getmembers() if m.name.startswith(top) and keep(m.name[len(top):])]
                tar.extractall(tmp, members=members, filter="data")
            (Path(tmp) / f"{package}-{version}" / ".complete").write_text("")
            shutil.rmtree(root, ignore_errors=True)
            shutil.move(str(Path(tmp) / f"{package}-{version}"), root)
    return root


def find_tests(cache: Path | None = None, package: str = "dask") -> tuple[Path, str]:
    """The source folder of ``package``'s tests (as :class:`Suite` lays it out), and where it came from."""
    mod = importlib.import_module(package)
    version, installed = mod.__version__, Path(mod.__file__).parent
    cache = cache or Path(tempfile.gettempdir()) / "flowgpu-dask-suite"
    if package == "dask":
        if (installed / "array" / "tests" / "test_array_core.py").is_file():
            return installed, f"installed dask {version} ({installed})"
        keep = lambda name: name.startswith("dask/array/tests/") or name == "dask/conftest.py"  # noqa: E731
        return _sdist("dask", version, cache, keep) / "dask", f"sdist of dask {version}"
    keep = lambda name: name.startswith("xarray/tests/") or name in ("conftest.py", "pyproject.toml")  # noqa: E731
    return _sdist(package, version, cache, keep), f"sdist of {package} {version} (installed: {installed})"


def _split(name: str) -> tuple[str, str | None]:
    """``"test_rolling:dask"`` -> ``("test_rolling.py", "dask")``."""
    file, _, word = name.partition(":")
    return (file if file.endswith(".py") else file + ".py"), (word or None)


def prepare(folder: Path, files: list[str], source: Path, suite: Suite | None = None) -> list[str]:
    """Copy ``files`` (names in ``source/<suite.tests>``, with or without ``.py``, or NAME:KEYWORD) into
    ``folder`` with the suite's settings; returns the copied file names."""
    suite = suite or SUITES["dask"]
    tests = source / suite.tests
    if not tests.is_dir():
        raise SuiteSetupError(f"{source} has no {suite.tests}/ folder: give {suite.source_help}")
    chosen = [_split(f) for f in files]
    names = [n for n, _ in chosen]
    missing = [n for n in names if not (tests / n).is_file()]
    if missing:
        have = sorted(p.stem for p in tests.glob("test_*.py"))
        raise SuiteSetupError(f"no such {suite.package} test file: {', '.join(missing)} (in {tests}; there are: "
                              f"{', '.join(have)})")
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copyfile(tests / n, folder / n)
    (folder / "pytest.ini").write_text(suite.ini(source))
    select = {n: w for n, w in chosen if w}
    (folder / "conftest.py").write_text(suite.conftest + (SELECT.replace("{select!r}", repr(select)) if select else ""))
    for module, path in suite.plugins:
        shipped = source / path
        (folder / f"{module}.py").write_text(shipped.read_text() if shipped.is_file() else "")
    return names
