"""The package's layers import downward only (contracts in pyproject.toml, checked by import-linter)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest


def test_layers_import_downward_only():
    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).with_name("lint-imports"))
    if not pathlib.Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install '.[test]')")
    root = pathlib.Path(__file__).parent.parent
    out = subprocess.run([exe], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
