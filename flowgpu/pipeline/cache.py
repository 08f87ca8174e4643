"""The cache of what each output was made from: whether it is up to date, and if not, why.

One small JSON file per output in ``flowgpu.cache.directory`` (default ``.flowgpu/cache`` in the
working directory), named by a digest of the output's key: its absolute path for an output that
writes one, else (a summary output) the spec's file or name, the output's name and the batch
item's params. An entry holds the output's :class:`~flowgpu.pipeline.recipe.Recipe` (digest,
params, input fingerprints, code), for a path output the output's fingerprint right after its
commit, for a summary output its value.

A run calls :meth:`Cache.check` (before computing), :meth:`Cache.invalidate` (before committing:
an entry never says up to date for an output that is not complete) and :meth:`Cache.record`
(after the commit). Entries are written atomically (temporary file, then a rename); one that
cannot be read reads as new. The cache is an aid: a cache folder that cannot be written is
reported once on stderr and the run carries on.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from flowgpu import __version__, config
from flowgpu.io import sinks
from flowgpu.io.atomic import written_by_flowgpu
from flowgpu.pipeline.compiler import Plan
from flowgpu.pipeline.outcome import write_json
from flowgpu.pipeline.recipe import Recipe, fingerprint, same_fingerprint

__all__ = ["Cache", "Verdict", "summarize"]

# 2: input and output paths are resolved on the client before anything runs. An entry of format 1 may
# record fill values that workers running in another folder read from a relative Zarr path, so none is trusted.
FORMAT = 2
OLD_FORMATS = {1: "recorded before paths were resolved on the client (an older flowgpu)"}
_warned: set[str] = set()


@dataclass
class Verdict:
    """Whether ``output`` is up to date; if not, ``reason`` says why in a few words. ``value``: a
    summary output's cached value (when up to date); ``location``: a path output's absolute path."""

    output: str
    up_to_date: bool
    reason: str
    value: Any = None
    location: str | None = None


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it is under it."""
    rel = os.path.relpath(path)
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel


def _location(plan: Plan, name: str) -> str | None:
    out = plan.spec.outputs[name]
    return os.path.abspath(out.path) if sinks.sink_entry(out.sink).has(sinks.WRITES_PATH) and out.path else None


class Cache:
    """The entries of one cache folder (``directory``; default: ``flowgpu.cache.directory``)."""

    def __init__(self, directory: str | os.PathLike | None = None):
        chosen = config.get("cache.directory", override_with=os.fspath(directory) if directory is not None else None)
        self.directory = os.path.abspath(os.path.expanduser(chosen))

    def __repr__(self) -> str:
        return f"Cache({self.directory!r})"

    # -- where entries live ---------------------------------------------------------------------
    def key(self, plan: Plan, name: str, item: dict | None = None) -> dict:
        """What identifies output ``name``'s entry: its path, or (a summary output) the spec,
        the output's name and the batch item's params."""
        location = _location(plan, name)
        if location is not None:
            return {"path": location}
        spec = os.path.abspath(plan.file) if plan.file else plan.spec.name
        return {"spec": spec, "output": name, "item": dict(item or {})}

    def path(self, plan: Plan, name: str, item: dict | None = None) -> str:
        """The file of output ``name``'s entry."""
        text = json.dumps(self.key(plan, name, item), sort_keys=True, default=str)
        return os.path.join(self.directory, hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + ".json")

    def entry(self, plan: Plan, name: str, item: dict | None = None, *, any_format: bool = False) -> dict | None:
        """Output ``name``'s entry, or None when there is none (or it cannot be read: a new output);
        ``any_format``: also one an older flowgpu wrote (its ``format`` says which)."""
        try:
            with open(self.path(plan, name, item)) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        ok = (isinstance(data, dict) and (any_format or data.get("format") == FORMAT)
              and isinstance(data.get("digest"), str)
              and data.get("key") == json.loads(json.dumps(self.key(plan, name, item), default=str)))
        return data if ok else None

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
        """A :class:`Verdict` for each output in ``recipes`` (see :func:`~flowgpu.pipeline.recipe.recipes`)."""
        return {name: self._verdict(plan, name, recipe, item, checksum, force) for name, recipe in recipes.items()}

    def _verdict(self, plan: Plan, name: str, recipe: Recipe, item: dict | None, checksum: bool,
                 force: bool) -> Verdict:
        location = _location(plan, name)

        def stale(reason: str) -> Verdict:
            return Verdict(name, False, reason, location=location)

        if force:
            return stale("forced")
        entry = self.entry(plan, name, item, any_format=True)
        if entry is None or (location is None and "value" not in entry):
            return stale("new")
        if entry.get("format") != FORMAT:
            old = entry.get("format")
            return stale(OLD_FORMATS.get(old, "recorded by another flowgpu") if isinstance(old, int)
                         else "recorded by another flowgpu")
        if entry["digest"] != recipe.digest:
            before = entry.get("params") if isinstance(entry.get("params"), dict) else {}
            changed = sorted(k for k in set(before) | set(recipe.params)
                             if k not in before or k not in recipe.params or before[k] != recipe.params[k])
            return stale(f"params changed: {', '.join(changed)}" if changed else "recipe changed")
        recorded = entry.get("inputs") if isinstance(entry.get("inputs"), dict) else {}
        changed, unsummed = [], []
        for path, now in recipe.inputs.items():
            if checksum and "content" not in now:
                now = fingerprint(path, checksum=True)
            was = recorded.get(path)
            if checksum and isinstance(was, dict) and "content" not in was and same_fingerprint(was, now):
                unsummed.append(_shown(path))  # unchanged by stat, but no content digest to compare with
            elif not same_fingerprint(was, now, checksum):
                changed.append(_shown(path))
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
            return Verdict(name, True, "up to date", location=location)
        return Verdict(name, True, "up to date", value=entry["value"])

    def invalidate(self, plan: Plan, names: list[str] | tuple[str, ...], *, item: dict | None = None) -> None:
        """Remove the entries of outputs about to be rewritten: call it before their commit, so a
        run that dies while committing leaves no entry that says up to date."""
        for name in names:
            try:
                os.unlink(self.path(plan, name, item))
            except (FileNotFoundError, NotADirectoryError):
                pass  # no entry (or no cache folder): nothing says up to date
            except OSError as e:
                self._warn("update", e)

    def record(self, plan: Plan, name: str, recipe: Recipe, *, item: dict | None = None,
               location: str | None = None, value: Any = None) -> None:
        """After output ``name`` was committed: store its recipe (take it before the run read its
        inputs), and its fingerprint now (a path output) or ``value`` (a summary output, JSON data).
        Never raises: a cache that cannot be written is reported once on stderr."""
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
            try:
                entry["value"] = json.loads(json.dumps(value, allow_nan=True))
            except (TypeError, ValueError) as e:
                print(f"flowgpu: the value of output {name!r} is not JSON data ({e}), so it is not cached; the "
                      "next run computes it again", file=sys.stderr, flush=True)
                return
        try:
            os.makedirs(self.directory, exist_ok=True)
            write_json(self.path(plan, name, item), entry)
        except (OSError, TypeError, ValueError) as e:
            self._warn("write", e)


def summarize(verdicts: dict[str, Verdict] | list[Verdict]) -> str:
    """One line for the user: ``3 up to date, 1 to compute (inputs changed: data/b.npy)``."""
    items = list(verdicts.values()) if isinstance(verdicts, dict) else list(verdicts)
    fresh = sum(v.up_to_date for v in items)
    reasons: dict[str, int] = {}
    for v in items:
        if not v.up_to_date:
            reasons[v.reason] = reasons.get(v.reason, 0) + 1
    todo = len(items) - fresh
    parts = [f"{fresh} up to date"] if fresh or not todo else []
    if todo:
        why = "; ".join(r if n == 1 or todo == n else f"{r} ({n})" for r, n in reasons.items())
        parts.append(f"{todo} to compute ({why})")
    return ", ".join(parts)
