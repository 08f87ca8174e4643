"""The cache of what each output was made from: whether it is up to date, and if not, why.

One small JSON entry per output in ``flowgpu.cache.directory``, named by a digest of the output's
key (its path, or for a summary output the spec, output name and item params); it holds the
output's :class:`~flowgpu.pipeline.recipe.Recipe`, the output's fingerprint or value, and a
checksum. An entry is never trusted further than it checks: one that is not a small regular file,
fails its checksum or holds a value of another shape or dtype is a miss, said on stderr. A check by
content (``--checksum``) that finds an input's bytes unchanged under a new size or mtime records those,
so a later check by size and mtime finds it unchanged too.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowgpu import __version__, config
from flowgpu.diagnostics import jsontext
from flowgpu.io import atomic, sinks
from flowgpu.io.atomic import written_by_flowgpu
from flowgpu.io.paths import shown
from flowgpu.pipeline.compiler import Plan
from flowgpu.pipeline import tables
from flowgpu.pipeline.loader import Unread, read_bounded
from flowgpu.pipeline.recipe import Recipe, fingerprint, same_fingerprint

__all__ = ["Cache", "Verdict", "entry_checksum", "summarize"]

FORMAT = 3  # 2: paths resolved on the client; 3: a checksum, and a summary value's shape and dtype
OLD_FORMATS = {1: "recorded before paths were resolved on the client (an older flowgpu)",
               2: "recorded without a checksum (an older flowgpu)"}
DAMAGED = "cache entry damaged"
UP_TO_DATE = "up to date"
TABLE_MISSING = "table missing"  # the value is up to date; the run writes its table again, computing nothing
# an entry's recipe takes at most this; a summary value adds what its elements can take as JSON text
_ENTRY_BYTES = 8 << 20
_UNKNOWN_SHAPE_BYTES = 256 << 20
_NONFINITE = {text: float(word) for word, text in jsontext.NONFINITE.items()}
_warned: set[str] = set()


class _Untrusted(Exception):
    """An entry that is there but is not used: the message says why."""


def entry_checksum(entry: dict) -> str:
    """The checksum an entry carries: a digest of its JSON text (keys sorted, without ``checksum``)."""
    body = {k: v for k, v in entry.items() if k != "checksum"}
    text = json.dumps(jsontext.plain(body), sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass
class Verdict:
    """Whether ``output`` is up to date; if not, ``reason`` says why. ``value``: a summary output's
    cached value; ``location``: a path output's absolute path."""

    output: str
    up_to_date: bool
    reason: str
    value: Any = None
    location: str | None = None


def _location(plan: Plan, name: str) -> str | None:
    out = plan.spec.outputs[name]
    return os.path.abspath(out.path) if sinks.sink_entry(out.sink).has(sinks.WRITES_PATH) and out.path else None


# -- reading an entry, and what it must be to be used ------------------------------------------------
def _shape(x: Any) -> list[int | None]:
    return [int(d) if d == d else None for d in x.shape]


def _most_bytes(x: Any | None) -> int:
    """The most bytes an entry of an output computed as ``x`` (None: a path output) can need."""
    if x is None:
        return _ENTRY_BYTES
    shape = _shape(x)
    if None in shape:
        return _ENTRY_BYTES + _UNKNOWN_SHAPE_BYTES
    per_value = 64 + 2 * len(shape) + 12 * x.dtype.itemsize  # a number on its own indented line, generously
    return _ENTRY_BYTES + math.prod(shape) * per_value


def _read(path: str, most: int) -> dict | None:
    """The JSON object in the entry file ``path`` (a regular file of at most ``most`` bytes, no link), or
    None when there is none."""
    try:
        text = read_bounded(path, most, os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except Unread as e:
        raise _Untrusted(f"it is {'a folder' if e.kind == 'a directory' else e.kind}, not a file flowgpu wrote"
                         if e.kind else f"it holds more bytes than an entry of this output can ({most:,}): "
                                        f"{e.size:,}") from None
    except OSError as e:
        raise _Untrusted("it is a symbolic link, not a file flowgpu wrote" if e.errno == errno.ELOOP
                         else f"it cannot be read ({e.strerror or e})") from None
    try:
        data = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _Untrusted("it is not JSON text") from None
    if not isinstance(data, dict):
        raise _Untrusted("it is not a JSON object")
    return data


def _leaf_check(dtype: np.dtype) -> Any:
    """A test of one value of ``dtype`` as ``to_summary_value`` writes it."""
    if dtype.kind == "b":
        return lambda v: isinstance(v, bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and info.min <= v <= info.max
    if dtype.kind in "fc":
        return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
            isinstance(v, str) and v in _NONFINITE)
    if dtype.kind == "U":
        return lambda v: isinstance(v, str) and len(v) <= dtype.itemsize // 4
    return None


def _fits(value: Any, shape: list[int | None], leaf: Any) -> bool:
    if not shape:
        return leaf(value)
    if not isinstance(value, list) or (shape[0] is not None and len(value) != shape[0]):
        return False
    return all(_fits(v, shape[1:], leaf) for v in value)


def _finite_back(value: Any) -> Any:
    """The strings an entry holds for NaN and the infinities, as floats again."""
    if isinstance(value, str):
        return _NONFINITE.get(value, value)
    if isinstance(value, list):
        return [_finite_back(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite_back(v) for k, v in value.items()}
    return value


def _check_value(entry: dict, x: Any) -> None:
    shape, dtype = _shape(x), np.dtype(x.dtype)
    if entry.get("shape") != shape or entry.get("dtype") != str(dtype):
        raise _Untrusted(f"it records a value of shape {entry.get('shape')!r} and dtype {entry.get('dtype')!r}, "
                         f"but the output is {dtype} of shape {shape}")
    leaf = _leaf_check(dtype)
    value = entry.get("value")
    if leaf is None:
        raise _Untrusted(f"flowgpu keeps no values of dtype {dtype}")
    if dtype.kind == "c":
        fits = isinstance(value, dict) and set(value) == {"real", "imag"} and all(
            _fits(value[part], shape, leaf) for part in ("real", "imag"))
    else:
        fits = _fits(value, shape, leaf)
    if not fits:
        raise _Untrusted(f"its value is not {dtype} of shape {shape}")
    if dtype.kind in "fc":
        entry["value"] = _finite_back(value)


_FIELDS = {"digest": str, "params": dict, "inputs": dict, "code": dict, "item": dict}


def _check(entry: dict, key: Any, x: Any | None) -> None:
    """Raise :class:`_Untrusted` unless ``entry`` is what flowgpu wrote for this output (``x``: a summary
    output's array, None for a path output)."""
    if entry.get("checksum") != entry_checksum(entry):
        raise _Untrusted("its checksum does not match what it holds (edited by hand?)")
    if entry.get("key") != key:
        raise _Untrusted("it is another output's entry")
    for name, kind in _FIELDS.items():
        if not isinstance(entry.get(name), kind):
            raise _Untrusted(f"its {name!r} is not a{'n' if kind is dict else ''} {'object' if kind is dict else 'string'}")
    if not all(isinstance(v, dict) for v in entry["inputs"].values()):
        raise _Untrusted("its 'inputs' are not fingerprints")
    if x is None:
        if not isinstance(entry.get("output_fingerprint"), dict):
            raise _Untrusted("its 'output_fingerprint' is not an object")
    else:
        _check_value(entry, x)


class Cache:
    """The entries of one cache folder (``directory``; default: ``flowgpu.cache.directory``)."""

    def __init__(self, directory: str | os.PathLike | None = None):
        chosen = config.get("cache.directory", override_with=os.fspath(directory) if directory is not None else None)
        self.directory = os.path.abspath(os.path.expanduser(chosen))

    def __repr__(self) -> str:
        return f"Cache({self.directory!r})"

    # -- where entries live ---------------------------------------------------------------------
    def key(self, plan: Plan, name: str, item: dict | None = None) -> dict:
        location = _location(plan, name)
        if location is not None:
            return {"path": location}
        # a value is the spec's: its file and name (a script may define several pipelines); a notebook
        # cell's file is made up anew each run, so there the working directory stands for it
        file = plan.file if plan.file and os.path.isfile(plan.file) else os.path.join(os.getcwd(), "<interactive>")
        return {"spec": os.path.abspath(file), "name": plan.spec.name, "output": name, "item": dict(item or {})}

    def path(self, plan: Plan, name: str, item: dict | None = None) -> str:
        text = json.dumps(self.key(plan, name, item), sort_keys=True, default=str)
        return os.path.join(self.directory, hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + ".json")

    def entry(self, plan: Plan, name: str, item: dict | None = None) -> dict | None:
        """Output ``name``'s entry, or None when there is none, it is not trusted or of another format."""
        try:
            data = self._load(plan, name, item)
        except _Untrusted:
            return None
        return data if data is not None and data.get("format") == FORMAT else None

    def _load(self, plan: Plan, name: str, item: dict | None = None) -> dict | None:
        """Output ``name``'s entry (None when there is none; one of another format unchecked); raises
        ``_Untrusted`` for one that fails a check."""
        x = None if _location(plan, name) is not None else plan.outputs[name]
        data = _read(self.path(plan, name, item), _most_bytes(x))
        if data is None or data.get("format") != FORMAT:
            return data
        try:
            _check(data, json.loads(jsontext.dumps(self.key(plan, name, item))), x)
        except RecursionError:
            raise _Untrusted("it nests too deep") from None
        return data

    def _warn(self, what: str, e: BaseException) -> None:
        if self.directory in _warned:
            return
        _warned.add(self.directory)
        detail = getattr(e, "strerror", None) or str(e)
        print(f"flowgpu: cannot {what} the cache in {self.directory} ({detail}); outputs are written as "
              "usual, but a later run cannot tell they are up to date (set flowgpu.cache.directory to a "
              "writable folder)", file=sys.stderr, flush=True)

    # -- the three calls of a run -----------------------------------------------------------------
    def check(self, plan: Plan, recipes: dict[str, Recipe], *, item: dict | None = None, checksum: bool = False,
              force: bool = False) -> dict[str, Verdict]:
        return {name: self._verdict(plan, name, recipe, item, checksum, force) for name, recipe in recipes.items()}

    def _verdict(self, plan: Plan, name: str, recipe: Recipe, item: dict | None, checksum: bool,
                 force: bool) -> Verdict:
        location = _location(plan, name)

        def stale(reason: str) -> Verdict:
            return Verdict(name, False, reason, location=location)

        if force:
            return stale("forced")
        try:
            entry = self._load(plan, name, item)
        except _Untrusted as e:
            of = f" of item {', '.join(f'{k}={v}' for k, v in item.items())}" if item else ""
            print(f"flowgpu: not using the cache entry of output {name!r}{of} "
                  f"({shown(self.path(plan, name, item))}): {e}; it is computed again", file=sys.stderr, flush=True)
            return stale(DAMAGED)
        if entry is None:
            return stale("new")
        if entry.get("format") != FORMAT:
            old = entry.get("format")
            return stale(OLD_FORMATS.get(old, "recorded by another flowgpu") if isinstance(old, int)
                         else "recorded by another flowgpu")
        if entry["digest"] != recipe.digest:
            before = entry["params"]
            changed = sorted(k for k in set(before) | set(recipe.params)
                             if k not in before or k not in recipe.params or before[k] != recipe.params[k])
            return stale(f"params changed: {', '.join(changed)}" if changed else "recipe changed")
        recorded = entry["inputs"]
        changed, unsummed, restamped = [], [], {}
        for path, now in recipe.inputs.items():
            if checksum and "content" not in now:
                now = fingerprint(path, checksum=True)
            was = recorded.get(path)
            if checksum and isinstance(was, dict) and "content" not in was and same_fingerprint(was, now):
                unsummed.append(shown(path))  # unchanged by stat, but no content digest to compare with
            elif not same_fingerprint(was, now, checksum):
                changed.append(shown(path))
            elif not same_fingerprint(was, now):  # the same bytes (checksum), a new size or mtime: a touch
                restamped[path] = now
        changed += [f"{shown(path)} (removed)" for path in sorted(set(recorded) - set(recipe.inputs))]  # a glob's page
        if changed:
            return stale(f"inputs changed: {', '.join(changed)}")
        if unsummed:
            return stale(f"no checksum recorded: {', '.join(unsummed)}")
        if location is not None:
            if not os.path.lexists(location):
                return stale("output missing")
            if not written_by_flowgpu(location) or not same_fingerprint(entry.get("output_fingerprint"),
                                                                        fingerprint(location)):
                return stale("output changed since it was written")
            verdict = Verdict(name, True, UP_TO_DATE, location=location)
        else:
            out = plan.spec.outputs[name]
            missing = tables.collects(out) and out.path is not None and not os.path.lexists(out.path)
            verdict = Verdict(name, True, TABLE_MISSING if missing else UP_TO_DATE, value=entry["value"])
        if restamped:  # recorded as they are now, so that a check by size and mtime finds them unchanged too
            self._write(plan, name, item, {**entry, "inputs": {**recorded, **restamped}})
        return verdict

    def invalidate(self, plan: Plan, names: list[str] | tuple[str, ...], *, item: dict | None = None) -> None:
        """Remove the entries of outputs about to be rewritten (before their commit: a run that dies
        while committing leaves no entry that says up to date)."""
        for name in names:
            try:
                os.unlink(self.path(plan, name, item))
            except (FileNotFoundError, NotADirectoryError):
                pass  # no entry (or no cache folder): nothing says up to date
            except OSError as e:
                self._warn("update", e)

    def record(self, plan: Plan, name: str, recipe: Recipe, *, item: dict | None = None,
               location: str | None = None, value: Any = None) -> None:
        """After output ``name`` was committed: store its recipe and its fingerprint now (a path output)
        or ``value``. Never raises: a cache that cannot be written is reported once on stderr."""
        entry: dict[str, Any] = {
            "format": FORMAT, "flowgpu": __version__, "key": self.key(plan, name, item), "output": name,
            "item": dict(item or {}), "digest": recipe.digest, "params": recipe.params, "inputs": recipe.inputs,
            "code": recipe.code, "recorded": time.time(),
        }
        path_output = _location(plan, name)
        if path_output is not None:
            entry["location"] = os.path.abspath(location) if location else path_output
            entry["output_fingerprint"] = fingerprint(entry["location"])
        else:
            x = plan.outputs[name]
            entry["shape"], entry["dtype"] = _shape(x), str(np.dtype(x.dtype))
            try:
                entry["value"] = json.loads(json.dumps(value, allow_nan=True))
            except (TypeError, ValueError) as e:
                print(f"flowgpu: the value of output {name!r} is not JSON data ({e}), so it is not cached; the "
                      "next run computes it again", file=sys.stderr, flush=True)
                return
        self._write(plan, name, item, entry)

    def _write(self, plan: Plan, name: str, item: dict | None, entry: dict[str, Any]) -> None:
        """Store output ``name``'s ``entry``, with its checksum; a cache that cannot be written is said once."""
        entry["checksum"] = entry_checksum(entry)
        most = _most_bytes(None if _location(plan, name) is not None else plan.outputs[name])
        try:
            text = jsontext.dumps(entry, indent=2)
        except (TypeError, ValueError) as e:
            self._warn("write", e)
            return
        if len(text) > most:
            print(f"flowgpu: the cache entry of output {name!r} would hold more than {most:,} bytes, so it is not "
                  "cached; the next run computes it again", file=sys.stderr, flush=True)
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
            # not synced (that cost up to 10 ms a run): an entry a crash left torn fails its checks
            atomic.write_text(self.path(plan, name, item), text, sync=False)
        except OSError as e:
            self._warn("write", e)


def summarize(verdicts: dict[str, Verdict] | list[Verdict]) -> str:
    """One line for the user: ``3 up to date, 1 to compute (inputs changed: data/b.npy)``; an up to date
    value whose table is missing is ``to write``."""
    items = list(verdicts.values()) if isinstance(verdicts, dict) else list(verdicts)
    fresh = sum(v.reason == UP_TO_DATE for v in items)
    parts = [f"{fresh} up to date"] if fresh or fresh == len(items) else []
    for label, done in (("to compute", False), ("to write", True)):
        reasons = Counter(v.reason for v in items if v.up_to_date == done and v.reason != UP_TO_DATE)
        todo = sum(reasons.values())
        if todo:
            why = "; ".join(r if n == 1 or todo == n else f"{r} ({n})" for r, n in reasons.items())
            parts.append(f"{todo} {label} ({why})")
    return ", ".join(parts)
