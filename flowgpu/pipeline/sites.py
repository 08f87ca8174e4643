"""Where a pipeline built in Python was written: the caller's file, line and column of each call.

:func:`call_site` finds the frame that called into the builder and, when the source can be read,
the call expression in it (parsed with :mod:`ast`), so each argument has its own position:
``p.step("z", "expr", x=x, expression="x - mu")`` places ``steps.z.args.expression`` at the
``expression=`` of that call, over several lines too. :class:`ScriptMap` is the
:class:`~flowgpu.pipeline.loader.SourceMap` of such a pipeline: every later error (the schema's,
the compiler's) then says ``script.py:14:5`` as it says ``spec.yaml:14:5`` for a YAML file.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import os
import sys
from dataclasses import dataclass, field

from flowgpu.errors import SpecError
from flowgpu.pipeline.loader import Path, SourceMap, format_path

__all__ = ["Site", "ScriptMap", "call_site"]

Pos = tuple[int, int]


@dataclass
class Site:
    """One call: its file and position, and those of its positional and keyword arguments."""

    file: str
    at: Pos
    args: list[Pos | None] = field(default_factory=list)
    keywords: dict[str, Pos] = field(default_factory=dict)  # keyword -> where its ``name=value`` is written

    def arg(self, i: int) -> Pos:
        """Where positional argument ``i`` is written (the call, when unknown)."""
        return (self.args[i] if i < len(self.args) else None) or self.at

    def keyword(self, name: str) -> Pos:
        """Where keyword argument ``name`` is written (the call, when unknown)."""
        return self.keywords.get(name, self.at)

    def given(self, name: str, i: int) -> Pos:
        """Where an argument that may be given by keyword ``name`` or in position ``i`` is written."""
        return self.keywords.get(name) or self.arg(i)

    def error(self, message: str, path: Path = (), hint: str | None = None, at: Pos | None = None) -> SpecError:
        line, col = at or self.at
        return SpecError(message, file=self.file, line=line, col=col, path=format_path(tuple(path)), hint=hint)


@dataclass
class ScriptMap(SourceMap):
    """A SourceMap whose entries may come from several files (a pipeline built by functions of
    several modules, or read from YAML and extended in Python): ``files`` holds the file of each
    entry written elsewhere than ``file``."""

    files: dict[Path, str] = field(default_factory=dict)

    def mark(self, site: Site, path: Path, value: Pos, key: Pos | None = None) -> None:
        """Record that ``site`` wrote ``path``: its value at ``value``, its name at ``key`` (default: the same)."""
        self.values[path], self.keys[path] = value, key or value
        if site.file != self.file:
            self.files[path] = site.file

    def error(self, message: str, path: Path = (), hint: str | None = None, *, key: bool = False,
              kind: type[SpecError] = SpecError) -> SpecError:
        line, col = self.locate(path, key=key)
        found = tuple(path)
        while found and found not in self.values and found not in self.keys:
            found = found[:-1]
        return kind(message, file=self.files.get(found, self.file), line=line, col=col,
                    path=format_path(tuple(path)), hint=hint)


@functools.lru_cache(maxsize=32)
def _calls(file: str, text: str) -> dict[tuple[int, int, int, int], ast.Call]:
    """The call expressions of a source text, by their (line, end line, col, end col), as
    :class:`dis.Positions` orders them."""
    try:
        tree = ast.parse(text, filename=file)
    except (SyntaxError, ValueError):
        return {}
    return {(n.lineno, n.end_lineno, n.col_offset, n.end_col_offset): n
            for n in ast.walk(tree) if isinstance(n, ast.Call)}


def _pos(node: ast.AST) -> Pos:
    return node.lineno, node.col_offset + 1


def call_site(skip: str) -> Site:
    """The call into the builder (the first frame outside the file ``skip``), with its arguments' positions."""
    frame = sys._getframe(1)
    skip = os.path.abspath(skip)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename) == skip:
        frame = frame.f_back
    file = frame.f_code.co_filename
    positions = inspect.getframeinfo(frame, context=0).positions
    if positions is None or positions.lineno is None:
        return Site(file, (frame.f_lineno, 1))
    site = Site(file, (positions.lineno, (positions.col_offset or 0) + 1))
    call = _calls(file, "".join(linecache.getlines(file, frame.f_globals))).get(tuple(positions))
    if call is None:  # no source (the REPL, exec) or not a call (a bare decorator): the line is all we know
        return site
    starred = False
    for a in call.args:
        starred = starred or isinstance(a, ast.Starred)
        site.args.append(None if starred else _pos(a))
    for k in call.keywords:
        if k.arg is not None:
            site.keywords[k.arg] = _pos(k)
    return site
