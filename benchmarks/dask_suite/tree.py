"""The dask test files to run, copied into a folder of their own with dask's pytest settings.

The installed dask wheel ships ``dask/array/tests/`` and ``dask/conftest.py``; where a build does
not, the sdist of the same version is downloaded (``pip download --no-binary :all: --no-deps
dask==X``) and its copies are used. Either way the files are copied into a fresh folder beside a
``pytest.ini`` and a ``conftest.py`` that reproduce what dask's own ``pyproject.toml`` and root
``conftest.py`` set up for these tests (warnings are errors, strict xfails, its markers, ``slow``
tests only with ``--runslow``, array-expr tests skipped). Nothing is written into site-packages,
and both runs see exactly the same files.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import dask

__all__ = ["FILES", "find_tests", "prepare"]

# The files issue 16 names; `--files` runs others of dask/array/tests/ too.
FILES = ("test_array_core", "test_ufunc", "test_reductions", "test_creation", "test_routines", "test_masked",
         "test_gufunc", "test_slicing", "test_optimization", "test_overlap", "test_rechunk")

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


class SuiteSetupError(RuntimeError):
    """dask's test files cannot be found or fetched."""


def _sdist_tests(version: str, cache: Path) -> Path:
    """``dask/`` of the sdist of ``version``, downloaded (once) into ``cache``."""
    root = cache / f"dask-{version}"
    if not (root / "dask" / "array" / "tests").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                                   f"dask=={version}", "-d", tmp], capture_output=True, text=True)
            archives = list(Path(tmp).glob("dask-*.tar.gz"))
            if done.returncode or not archives:
                raise SuiteSetupError(f"the installed dask {version} has no dask/array/tests and "
                                      f"`pip download dask=={version}` failed:\n{done.stderr[-2000:]}")
            with tarfile.open(archives[0]) as tar:
                members = [m for m in tar.getmembers() if "/dask/" in m.name and
                           ("/dask/array/tests/" in m.name or m.name.endswith("/dask/conftest.py"))]
                tar.extractall(tmp, members=members, filter="data")
            shutil.move(str(Path(tmp) / f"dask-{version}"), root)
    return root / "dask"


def find_tests(cache: Path | None = None) -> tuple[Path, str]:
    """The ``dask/`` folder holding ``array/tests`` for the installed dask, and where it came from."""
    installed = Path(dask.__file__).parent
    if (installed / "array" / "tests" / "test_array_core.py").is_file():
        return installed, f"installed dask {dask.__version__} ({installed})"
    cache = cache or Path(tempfile.gettempdir()) / "flowgpu-dask-suite"
    return _sdist_tests(dask.__version__, cache), f"sdist of dask {dask.__version__}"


def prepare(folder: Path, files: list[str], source: Path) -> list[str]:
    """Copy ``files`` (names in ``source/array/tests``, with or without ``.py``) into ``folder``
    with the settings above; returns the copied file names."""
    tests = source / "array" / "tests"
    if not tests.is_dir():
        raise SuiteSetupError(f"{source} has no array/tests/ folder: give the dask/ folder of a dask checkout or sdist")
    names = [f if f.endswith(".py") else f + ".py" for f in files]
    missing = [n for n in names if not (tests / n).is_file()]
    if missing:
        have = sorted(p.stem for p in tests.glob("test_*.py"))
        raise SuiteSetupError(f"no such dask test file: {', '.join(missing)} (in {tests}; there are: "
                              f"{', '.join(have)})")
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        shutil.copyfile(tests / n, folder / n)
    (folder / "pytest.ini").write_text(INI)
    (folder / "conftest.py").write_text(CONFTEST)
    dask_conftest = source / "conftest.py"
    (folder / "dask_conftest.py").write_text(dask_conftest.read_text() if dask_conftest.is_file() else "")
    return names
