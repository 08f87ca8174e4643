"""Import paths checked without importing (``validate``, ``plan``, ``status`` and ``run --dry-run`` run
none of the user's code): :func:`lookup` finds the module's file as the import system would, never
running a package's ``__init__``, and looks for the name among its top-level statements (:mod:`ast`).
What it finds stands in as an :class:`Unimported` (the signature, refusing to be called). Where the
source cannot tell (a compiled extension, a module ``__getattr__``, ``import *``), the name is taken as there.
"""

from __future__ import annotations

import ast
import importlib.machinery
import inspect
import os
from typing import Any

__all__ = ["Unimported", "find_module", "top_level_names", "lookup", "NOT_FOUND", "UNKNOWN"]

NOT_FOUND, UNKNOWN = "not found", "unknown"


class Unimported:
    """Stands for the object at ``path`` that a check found in the source without importing it."""

    def __init__(self, path: str, signature: inspect.Signature | None = None):
        self.path = path
        self.__name__ = self.__qualname__ = path.replace(":", ".").rpartition(".")[2]
        self.__module__ = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
        if signature is not None:
            self.__signature__ = signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.path!r} was only checked, not imported: validate, plan and status run no "
                           "user code (flowgpu run imports and calls it)")

    def __dask_tokenize__(self) -> Any:
        return ("flowgpu-unimported", self.path)

    def __repr__(self) -> str:
        return f"<{self.path} (checked, not imported)>"


def find_module(name: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of module ``name`` as an import would find it, without importing it or its parents."""
    spec, locations = None, None
    for i, _ in enumerate(name.split(".")):
        if i and not locations:
            return None
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(name.split(".")[: i + 1]), locations)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    return spec


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> inspect.Signature:
    """The parameters a ``def`` declares (defaults stand in as ``...``: only names and kinds matter here)."""
    P = inspect.Parameter
    a = node.args
    params: list[inspect.Parameter] = []
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)
    for i, arg in enumerate(positional):
        kind = P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=... if i >= first_default else P.empty))
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=P.empty if default is None else ...))
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params)


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a module's top level, those inside ``if``/``try``/``with``/loops included
    (a name defined under ``if TYPE_CHECKING:`` or ``try: ... except ImportError:`` is defined)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        for field in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)) and getattr(node, field, None):
                out += _statements(getattr(node, field))
        for handler in getattr(node, "handlers", None) or []:
            out += _statements(handler.body)
    return out


def top_level_names(source: str) -> tuple[dict[str, Any], bool]:
    """Names a module's source defines at its top level (a ``def`` -> its signature, anything else ->
    None), and whether it may define others the source does not show (``__getattr__``, ``import *``)."""
    names: dict[str, Any] = {}
    open_ended = False
    for node in _statements(ast.parse(source).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = _signature(node)
            open_ended |= node.name == "__getattr__"
        elif isinstance(node, ast.ClassDef):
            names[node.name] = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names.setdefault(n.id, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    open_ended = True
                else:
                    names.setdefault(alias.asname or alias.name.partition(".")[0], None)
        elif isinstance(node, ast.Expr) and "globals" in ast.dump(node):
            open_ended = True  # globals()[...] = ...: names the source does not spell
    return names, open_ended


def lookup(module: str, attr: str) -> tuple[str, Any]:
    """Whether ``module`` defines ``attr`` (its first part), read from the source without importing:
    ``("found", signature or None)``, ``(NOT_FOUND, names it does define)`` or ``(UNKNOWN, reason)``;
    ``(NOT_FOUND, None)`` when the module itself is not there."""
    spec = find_module(module)
    if spec is None:
        return NOT_FOUND, None
    origin = spec.origin if spec.has_location else None
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        return UNKNOWN, "its source is not Python text"
    try:
        with open(origin, encoding="utf-8") as f:
            names, open_ended = top_level_names(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError) as e:
        return UNKNOWN, f"its source cannot be read ({type(e).__name__})"
    first = attr.split(".")[0]
    if first in names:
        return "found", names[first] if first == attr else None
    if open_ended:
        return UNKNOWN, "it may define names its source does not show"
    return NOT_FOUND, sorted(n for n in names if not n.startswith("_"))
