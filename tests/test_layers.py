"""The package's layers import downward only, and every import of our own modules says so at the top.

The contracts live in pyproject.toml (checked by import-linter). import-linter sees an import inside
a function as well, but a function-level import, or ``importlib.import_module("flowgpu...")``, hides
the dependency from a reader of the module's top, so the AST scan below refuses them.
"""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
PACKAGE = ROOT / "flowgpu"

# The one place a function may import our own modules: the PEP 562 ``__getattr__`` of the root
# package, which loads the public API from its ``_EXPORTS`` table on first use so that
# ``import flowgpu`` stays instant (and never imports CuPy).
EXCEPTIONS = {("flowgpu/__init__.py", "__getattr__")}


def test_layers_import_downward_only():
    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).with_name("lint-imports"))
    if not pathlib.Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install '.[test]')")
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _ours(name: str | None) -> bool:
    return name is not None and (name == "flowgpu" or name.startswith("flowgpu."))


def _bindings(tree: ast.AST) -> dict[str, list[ast.AST]]:
    """Every expression each name is bound to anywhere in a module (scopes ignored: a wider net)."""
    out: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            pairs = [(node.target, node.value)]
        elif isinstance(node, (ast.For, ast.comprehension)):
            pairs = [(node.target, node.iter)]
        for target, value in pairs:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    out.setdefault(name.id, []).append(value)
    return out


def _names_our_module(expr: ast.AST, bindings: dict, seen: frozenset = frozenset()) -> bool:
    """Whether ``expr`` may evaluate to one of our module names: a ``"flowgpu..."`` string in it, or in
    what the names it uses are bound to."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _ours(node.value):
            return True
        if isinstance(node, ast.Name) and node.id not in seen:
            if any(_names_our_module(v, bindings, seen | {node.id}) for v in bindings.get(node.id, ())):
                return True
    return False


def _is_import_module(call: ast.Call) -> bool:
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    return name in ("import_module", "__import__") and bool(call.args)


def _imports_ours(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or _ours(node.module)
    return isinstance(node, ast.Import) and any(_ours(a.name) for a in node.names)


def hidden_imports(source: str, path: str) -> list[str]:
    """``path:line code`` of each import of our own modules inside a function, and of each
    ``importlib.import_module`` / ``__import__`` that may load one of them."""
    tree = ast.parse(source)
    bindings = _bindings(tree)
    functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    excepted = [range(f.lineno, f.end_lineno + 1) for f in functions if (path, f.name) in EXCEPTIONS]
    found = {n for f in functions for n in ast.walk(f) if _imports_ours(n)}
    found |= {n for n in ast.walk(tree)
              if isinstance(n, ast.Call) and _is_import_module(n) and _names_our_module(n.args[0], bindings)}
    kept = [n for n in found if not any(n.lineno in span for span in excepted)]
    return [f"{path}:{n.lineno} {ast.unparse(n)}" for n in sorted(kept, key=lambda n: n.lineno)]


def _package_findings() -> dict[str, list[str]]:
    out = {}
    for file in sorted(PACKAGE.rglob("*.py")):
        rel = file.relative_to(ROOT).as_posix()
        found = hidden_imports(file.read_text(), rel)
        if found:
            out[rel] = found
    return out


def test_no_function_level_imports_of_our_modules():
    bad = [line for rel, lines in _package_findings().items() for line in lines]
    assert not bad, "import these at the top of the module (the layer map says which may):\n" + "\n".join(bad)



@pytest.mark.parametrize("code, hits", [
    ("def f():\n    from flowgpu import backend\n", [2]),
    ("def f():\n    import flowgpu.memory.store as s\n", [2]),
    ("def f():\n    from . import x\n", [2]),
    ("def f():\n    import numpy, cupy\n    from dask import config\n", []),
    ("import importlib\nimportlib.import_module('flowgpu.ops.fft')\n", [2]),
    ("import importlib\nM = ('flowgpu.a', 'flowgpu.b')\nfor m in M:\n    importlib.import_module(m)\n", [4]),
    ("import importlib\ndef f(path):\n    return importlib.import_module(path.split(':')[0])\n", []),
    ("T = {'x': 'flowgpu.a'}\ndef g(n):\n    m = T.get(n)\n    return __import__(m)\n", [4]),
])
def test_the_scan_finds_hidden_imports(code, hits):
    assert [int(h.split(":")[1].split()[0]) for h in hidden_imports(code, "flowgpu/x.py")] == hits


def test_the_root_loader_is_the_only_exception():
    source = (PACKAGE / "__init__.py").read_text()
    assert hidden_imports(source, "flowgpu/__init__.py") == []
    assert hidden_imports(source, "flowgpu/other.py")  # the same loader anywhere else is refused
