"""Reading spec YAML safely, remembering where every value is written.

The YAML is composed into nodes and turned into data by hand, so that duplicate keys and
non-plain tags are refused, a document stays within the ``flowgpu.spec`` limits (bytes, depth,
nodes once aliases are expanded), and a :class:`SourceMap` gives every value's line and column.
"""

from __future__ import annotations

import os
import shlex
import re
import stat
from dataclasses import dataclass, field
from typing import Any

import yaml

from flowgpu import config
from flowgpu.errors import SpecError, SpecLimitError

__all__ = ["SourceMap", "Unread", "read_bounded", "read_yaml", "parse_yaml", "format_path", "limit"]

_PLAIN_TAGS = {
    "tag:yaml.org,2002:" + t for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "binary")
}
Path = tuple


def format_path(path: Path) -> str:
    """``("steps", "norm", "inputs", 0)`` -> ``steps.norm.inputs[0]``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<document>"


@dataclass
class SourceMap:
    """Where each value (and each mapping key) of a spec is written; ``files``: the file of each entry
    written elsewhere than ``file`` (a pipeline built in Python by several scripts)."""

    file: str | None = None
    values: dict[Path, tuple[int, int]] = field(default_factory=dict)
    keys: dict[Path, tuple[int, int]] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)

    def mark(self, file: str, path: Path, value: tuple[int, int], key: tuple[int, int] | None = None) -> None:
        self.values[path], self.keys[path] = value, key or value
        if file != self.file:
            self.files[path] = file

    def _nearest(self, path: Path, key: bool) -> tuple[Path, tuple[int, int] | None]:
        path, tables = tuple(path), ((self.keys, self.values) if key else (self.values, self.keys))
        while path and not any(path in t for t in tables):
            path = path[:-1]
        return path, next((t[path] for t in tables if path in t), None)

    def locate(self, path: Path, *, key: bool = False) -> tuple[int | None, int | None]:
        """Line and column (1-based) of ``path``, or of its nearest written parent."""
        return self._nearest(path, key)[1] or ((None, None) if self.file is None else (1, 1))

    def error(self, message: str, path: Path = (), hint: str | None = None, *, key: bool = False,
              kind: type[SpecError] = SpecError) -> SpecError:
        found = self._nearest(path, key)[0]
        line, col = self.locate(path, key=key)
        return kind(message, file=self.files.get(found, self.file), line=line, col=col,
                    path=format_path(tuple(path)), hint=hint)


def limit(name: str) -> int:
    """``flowgpu.spec.<name>`` as a number (byte sizes such as ``"1MiB"`` parsed)."""
    value = config.get(f"spec.{name}")
    return int(config.parse_size(value) if isinstance(value, str) else value)


class _Loader(yaml.SafeLoader):
    """SafeLoader that only composes (see :func:`_build`), refusing to nest deeper than ``max-depth``."""

    def __init__(self, text: str, file: str | None):
        super().__init__(text)
        self.file, self.depth, self.nodes = file, 0, 0
        self.max_depth, self.max_nodes = limit("max-depth"), limit("max-nodes")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.depth >= self.max_depth:
            mark = self.peek_event().start_mark
            raise SpecLimitError(f"the document nests deeper than {self.max_depth} levels", file=self.file,
                                 line=mark.line + 1, col=mark.column + 1, path="<document>",
                                 hint="flatten it, or raise flowgpu.spec.max-depth")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


# ints as YAML 1.1 resolves them, less its base-60 form (``range: 1:30`` is text, not 90); floats also as
# YAML 1.2 does (``1e-3``, ``2E5``: YAML 1.1 wants a dot and a signed exponent, and reads those as text)
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in entries if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(
    r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"), list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _build(node: yaml.Node, loader: _Loader, smap: SourceMap, path: Path, depth: int = 0) -> Any:
    smap.values[path] = _mark(node)
    loader.nodes += 1
    if depth > loader.max_depth:
        raise smap.error(f"the document nests deeper than {loader.max_depth} levels (a recursive alias?)", path,
                         hint="remove the alias that refers to itself, or raise flowgpu.spec.max-depth",
                         kind=SpecLimitError)
    if loader.nodes > loader.max_nodes:
        raise smap.error(f"the document holds more than {loader.max_nodes:,} values once its aliases are expanded "
                         "(aliases of aliases, a 'billion laughs'?)", path, kind=SpecLimitError,
                         hint="write the values out instead of nesting aliases, or raise flowgpu.spec.max-nodes")
    if node.tag not in _PLAIN_TAGS:
        raise smap.error(f"the YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')!r} is not allowed", path,
                         hint="specs are plain data: remove the tag (flowgpu never constructs Python objects "
                              "from YAML)")
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise smap.error("mapping keys must be plain names", path, hint="quote the key or rename it")
            if key_node.tag.endswith(":merge") or key_node.value == "<<":
                raise smap.error("YAML merge keys ('<<') are not supported", path,
                                 hint="write the keys out, or share values through params")
            key = _build(key_node, loader, SourceMap(smap.file), path, depth + 1)
            if isinstance(key, (dict, list)) or key is None:
                raise smap.error(f"mapping key {key!r} is not a name", path, hint="use a plain name as key")
            if key in out:
                first = smap.keys[path + (key,)]
                raise SpecError(
                    f"duplicate key {key!r} (first written at line {first[0]})",
                    file=smap.file, line=key_node.start_mark.line + 1, col=key_node.start_mark.column + 1,
                    path=format_path(path + (key,)), hint="each key may appear once in a mapping; remove or rename one",
                )
            smap.keys[path + (key,)] = _mark(key_node)
            out[key] = _build(value_node, loader, smap, path + (key,), depth + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(v, loader, smap, path + (i,), depth + 1) for i, v in enumerate(node.value)]
    value = loader.construct_object(node, deep=True)
    if node.tag.endswith(("timestamp", "binary")):
        return node.value  # keep dates and base64 text as the strings the user wrote
    if isinstance(value, str) and "\0" in value:
        raise smap.error(f"the value {value[:80]!r} holds a NUL character (\\0), which no name, path or text may hold",
                         path, hint="remove the \\0 escape from the value")
    return value


def _syntax_hint(text: str, mark: Any) -> str:
    line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
    if "${" in line:
        return "quote values that hold ${params...} inside [ ] or { }, e.g. shape: [\"${params.n}\", 10]"
    if "\t" in line:
        return "YAML does not allow tabs for indentation; use spaces"
    return "check the indentation, brackets and quoting around this place"


def _unprintable(e: yaml.reader.ReaderError, text: str, file: str | None) -> SpecError:
    at = min(max(int(e.position), 0), len(text))
    line, col = text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1
    code = e.character if isinstance(e.character, int) else -1
    what = "a NUL byte" if code == 0 else f"the control character #x{code:04x}" if code >= 0 else "a character"
    return SpecError(f"the file holds {what}, which YAML text may not hold", file=file, line=line, col=col,
                     path="<document>", hint="specs are plain UTF-8 text: remove the character (is this a binary "
                                             "file, or not a spec?)")


def parse_yaml(text: str, file: str | None = None) -> tuple[Any, SourceMap]:
    """Parse YAML text into plain data and its :class:`SourceMap`; errors are :class:`SpecError`."""
    try:
        loader = _Loader(text, file)  # its reader refuses unprintable characters at once
        node = loader.get_single_node()
    except yaml.reader.ReaderError as e:
        raise _unprintable(e, text, file) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = (e.problem or "malformed YAML").strip()
        context = f" {e.context.strip()}" if e.context else ""
        raise SpecError(f"malformed YAML: {problem}{context}", file=file, line=line, col=col, path="<document>",
                        hint=_syntax_hint(text, mark)) from None
    except yaml.YAMLError as e:
        raise SpecError(f"malformed YAML: {e}", file=file, line=1, col=1, path="<document>",
                        hint="check the file is UTF-8 YAML text") from None
    smap = SourceMap(file)
    try:
        return ({}, smap) if node is None else (_build(node, loader, smap, ()), smap)
    finally:
        loader.dispose()


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


class Unread(Exception):
    """What :func:`read_bounded` found instead: ``kind`` ("a FIFO", ...), or the ``size`` too large."""

    def __init__(self, kind: str | None = None, size: int = 0):
        super().__init__(kind or f"{size:,} bytes")
        self.kind, self.size = kind, size


def read_bounded(path: str, most: int, flags: int = 0) -> bytes:
    """The bytes of the regular file ``path`` if it holds at most ``most``, else :class:`Unread`. Opened
    without blocking (a FIFO would wait for a writer) and checked once open, so nothing can swap it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unread(_KINDS.get(stat.S_IFMT(info.st_mode), "a socket"))
        with open(fd, "rb", closefd=False) as f:
            data = f.read(most + 1) if info.st_size <= most else b""
    finally:
        os.close(fd)
    if max(info.st_size, len(data)) > most:
        raise Unread(size=max(info.st_size, len(data)))  # more than it said when opened: it grew while read
    return data


def read_yaml(path: str | os.PathLike, what: str = "spec file") -> tuple[Any, SourceMap]:
    """Read and parse a YAML file; ``what`` it is, for messages."""
    path = os.fspath(path)
    try:
        text = read_bounded(path, limit("max-bytes")).decode("utf-8")
    except Unread as e:
        raise SpecLimitError(f"{path!r} is {e.kind}, not a regular file" if e.kind else
                             f"{path!r} holds {e.size:,} bytes, more than the {limit('max-bytes'):,} a spec may hold",
                             file=path, path="<document>", hint="give the path of a YAML file" if e.kind else
                             "specs are small YAML files; raise flowgpu.spec.max-bytes if this one is meant") from None
    except FileNotFoundError:
        raise SpecError(f"{what} {path!r} does not exist", file=path, line=None, col=None,
                        path="<document>", hint="check the path (relative paths start at the working directory)"
                        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read {what} {path!r}: {e}", file=path, path="<document>",
                        hint="give a readable UTF-8 YAML file") from None
    if path.endswith(".py"):  # YAML's own message for Python code ("mapping values are not allowed") says nothing
        raise SpecError(f"{path!r} is a Python file, not a YAML {what}", file=path, path="<document>",
                        hint=f"run a Python pipeline with python {shlex.quote(path)}, or write it as YAML with "
                             "p.to_yaml(...) and give that file")
    return parse_yaml(text, file=path)
