"""Every benchmark script imports, and ``python -m benchmarks.<kind>.<name> --help`` works without a GPU.

Cheap on purpose (no cluster, no data): a module that no longer imports, after a rename elsewhere
in flowgpu, fails here in CI and not in the next session on a GPU machine.
"""

from __future__ import annotations

import importlib
import pkgutil
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks

ROOT = Path(benchmarks.__file__).parent.parent
MODULES = sorted(m.name for m in pkgutil.walk_packages(benchmarks.__path__, "benchmarks."))
SCRIPTS = [name for name in MODULES if hasattr(importlib.import_module(name), "main")]


def test_every_kind_has_its_scripts():
    kinds = {name.split(".")[1] for name in SCRIPTS}
    assert kinds == {"suite", "out_of_core", "probes", "batch", "dask_suite"}
    assert {"benchmarks.suite.run", "benchmarks.out_of_core.run", "benchmarks.probes.out_of_core"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(name, capsys, monkeypatch):
    """``--help`` runs the module as ``python -m`` does (``__main__``) and exits 0 with its usage."""
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    monkeypatch.delitem(sys.modules, name)  # run afresh as __main__, as ``python -m`` does
    with pytest.raises(SystemExit) as e:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m {name} ")
    assert "--json PATH" in out


def test_help_from_the_repository_root():
    """The real command line, in a fresh interpreter, from the repository root."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.suite.run", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--only" in done.stdout and "--size {small,full}" in done.stdout


@pytest.mark.parametrize("name", SCRIPTS)
def test_rejects_unknown_options(name, capsys):
    mod = importlib.import_module(name)
    with pytest.raises(SystemExit) as e:
        mod.main(["--no-such-option"])
    assert e.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_h200_script_names_existing_modules():
    """Every ``python3 -m benchmarks...`` in benchmarks/h200.sh is a script here, and the shell parses."""
    text = (ROOT / "benchmarks" / "h200.sh").read_text()
    named = {word for line in text.splitlines() for word in line.split() if word.startswith("benchmarks.")}
    assert named and named <= set(SCRIPTS), named - set(SCRIPTS)
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "h200.sh")]).returncode == 0
