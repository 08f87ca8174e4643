"""Registries (a name maps to an entry: its callable, options model, docstring and capabilities) and
:func:`import_object`, the one resolver of import paths (``"package.module:name"``).

flowgpu keeps three registries: ops, sources and sinks. Each holds flowgpu's built-ins and, loaded
lazily on first use, the entry points of its group (``flowgpu.ops``, ``flowgpu.sources``,
``flowgpu.sinks``); an entry point names a callable, or a module that registers what it defines. A
plugin that fails to load is reported with a warning and left out. The spec model and its JSON
schema are generated from the registries.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect
import os
import re
import sys
import threading
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

import cloudpickle
import dask.config
from pydantic import BaseModel, ConfigDict, Field, create_model

from flowgpu import importcheck
from flowgpu.errors import ImportPathError, did_you_mean

__all__ = ["Entry", "Registry", "Options", "OpenOptions", "options_model", "import_object", "add_import_dirs",
           "checking_only", "import_candidates", "pickled_by_value", "trusted_modules", "trusting", "check_trusted",
           "recording_imports"]

T = TypeVar("T", bound="Entry")


@dataclass(frozen=True)
class Entry:
    """One registered thing: ``func``, the model of its options, its docstring and capabilities."""

    name: str
    func: Callable[..., Any]
    doc: str = ""
    options: type[BaseModel] | None = None
    capabilities: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # a sink's: how its files are named (the first is suggested); empty: any name
    check: Callable[..., None] | None = None  # a sink's: check(x, **options) raises what prepare would refuse

    @property
    def summary(self) -> str:
        """The first line of the docstring."""
        return (self.doc.strip().splitlines() or [""])[0]

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def _all_entry_points() -> Any:
    """Every installed distribution's entry points, read once (each read scans every distribution)."""
    return entry_points()


def _entry_points(group: str) -> list:
    return list(_all_entry_points().select(group=group))


def _defined_as(func: Any) -> tuple:
    """Where ``func`` was defined: two registrations of one definition are one, not a clash."""
    return getattr(func, "__module__", None), getattr(func, "__qualname__", None) or id(func)


def _plugin_warning(ep: Any, message: str) -> None:
    """One line naming the entry point, not a line of flowgpu's code."""
    warnings.warn_explicit(f"flowgpu: {message}", UserWarning, filename=f"entry point {ep.name} = {ep.value}", lineno=0,
                           module="flowgpu.registry")


class Registry(Generic[T]):
    """Entries by name, filled by built-ins and lazily from the entry-point group ``group``.

    ``what`` is what an entry is called in messages (``"source"``), ``error`` the exception of an
    unknown name; ``from_plugin`` turns an entry point's name and loaded object into an entry (None:
    it registered itself, e.g. a module whose import calls ``register``).
    """

    def __init__(self, group: str, what: str, *, error: type[Exception],
                 from_plugin: Callable[[str, Any], T | None]):
        self.group = group
        self.what = what
        self.error = error
        self._from_plugin = from_plugin
        self._entries: dict[str, T] = {}
        self._lock = threading.RLock()
        self._plugins_loaded = False
        self.broken: dict[str, str] = {}  # plugins that failed to load: name -> why (said again where named)
        self.version = 0  # bumped on every change, so what is generated from a registry can be rebuilt

    def add(self, entry: T, *, replace: bool = False) -> T:
        """Add ``entry``; an existing name with another callable is refused unless ``replace``."""
        with self._lock:
            old = self._entries.get(entry.name)
            if old is not None and not replace and _defined_as(old.func) != _defined_as(entry.func):
                module = getattr(old.func, "__module__", "?")  # the same function defined again (a module or a
                raise self.error(f"{self.what} {entry.name!r} is already registered (by {module}); "  # cell run
                                 "pick another name or pass replace=True")  # again) replaces it
            self._entries[entry.name] = entry
            self.version += 1
        return entry

    def remove(self, name: str) -> None:
        with self._lock:
            if self._entries.pop(name, None) is not None:
                self.version += 1

    def _load_plugins(self) -> None:
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True
            for ep in _entry_points(self.group):
                try:
                    entry = self._from_plugin(ep.name, ep.load())
                except Exception as e:  # noqa: BLE001 - a broken plugin must not break every pipeline
                    self.broken[ep.name] = (f"could not load {self.what} plugin {ep.name!r} ({ep.value}) from "
                                            f"entry-point group {self.group!r}: {type(e).__name__}: {e}")
                    _plugin_warning(ep, self.broken[ep.name])
                    continue
                if entry is not None and entry.name in self._entries:  # never in place of a built-in's values
                    _plugin_warning(ep, f"{self.what} plugin {ep.name!r} ({ep.value}) is not used: flowgpu already has "
                                        f"a {self.what} {entry.name!r} (from {self._entries[entry.name].func.__module__}); "
                                        "rename the plugin's entry point")
                elif entry is not None:
                    self.add(entry)

    def get(self, name: str) -> T:
        """The entry registered as ``name``; an unknown name suggests close matches."""
        self._load_plugins()
        entry = self._entries.get(name)
        if entry is None:
            raise self.error(self.broken.get(name) or f"unknown {self.what} {name!r}; {self.suggest(name)}")
        return entry

    def suggest(self, name: Any) -> str:
        """'did you mean ...?' for ``name``, else the names to choose from."""
        known = self.names()
        listing = f"run 'flowgpu {self.what}s' to list them"
        return did_you_mean(name, known, f"choose one of {', '.join(known)} ({listing})" if len(known) <= 12
                            else listing, n=3)

    def names(self) -> list[str]:
        return [e.name for e in self.entries()]

    def entries(self) -> list[T]:
        self._load_plugins()
        with self._lock:
            return [self._entries[n] for n in sorted(self._entries)]

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries


class Options(BaseModel):
    """Base of options models: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True)


class OpenOptions(Options):
    """Options of a function that takes ``**kwargs``: unknown keys are passed through."""

    model_config = ConfigDict(extra="allow")


def options_model(name: str, func: Callable, *, skip: Iterable[str] = ()) -> type[BaseModel]:
    """A pydantic model of ``func``'s keyword options, from its type-hinted signature.

    Parameters without a default are required, unannotated ones take any value, and ``**kwargs``
    lets unknown keys through. ``skip`` names parameters that are not options (a sink's array).
    """
    try:
        hints = typing.get_type_hints(func, include_extras=True)  # Annotated bounds are checked too
    except Exception:  # noqa: BLE001 - annotations that do not resolve are simply not checked
        hints = {}
    base: type[BaseModel] = Options
    fields: dict[str, Any] = {}
    for p in inspect.signature(func).parameters.values():
        if p.kind == p.VAR_KEYWORD:
            base = OpenOptions
        elif p.name not in skip and p.kind != p.VAR_POSITIONAL:
            fields[p.name] = (hints.get(p.name, Any), Field(... if p.default is p.empty else p.default))
    return create_model(f"{name}_options", __base__=base, __doc__=inspect.getdoc(func) or None, **fields)


_local_dirs: set[str] = set()


def add_import_dirs(*dirs: str | os.PathLike) -> None:
    """Make modules in ``dirs`` importable (appended to ``sys.path`` once; existing entries win).

    The pipeline layer calls this with a spec's own folder and the working directory; functions of
    such a module travel to the workers by value (:func:`pickled_by_value`).
    """
    for d in dirs:
        d = os.path.abspath(os.fspath(d))
        _local_dirs.add(os.path.realpath(d))
        if d not in (os.path.abspath(p or os.curdir) for p in sys.path):
            sys.path.append(d)


def _installed(path: str) -> bool:
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts or any(path.startswith(p + os.sep) for p in prefixes)


def pickled_by_value(obj: Any) -> bytes | None:
    """cloudpickle's bytes of ``obj`` with its code inside when its module is one of the user's own
    (in a spec's folder or the working directory, not installed), else None: workers that did not
    start here cannot import such a module, and would keep the version they imported first."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    if module is None or not file or module.__name__ == "__main__":
        return None
    real = os.path.realpath(file)
    if _installed(real) or not any(real.startswith(d + os.sep) for d in _local_dirs):
        return None
    cloudpickle.register_pickle_by_value(module)
    return cloudpickle.dumps(obj)


def import_candidates(path: str) -> list[tuple[str, str]]:
    """(module, attribute path) pairs an import path may mean, the longest module first."""
    if ":" in path:
        module, _, attr = path.partition(":")
        return [(module, attr)]
    parts = path.split(".")
    return [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]


def _fail(what: str, path: str, problem: str, fix: str) -> ImportPathError:
    return ImportPathError(f"{what} {path!r}: {problem}; {fix}")


_recorded: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar("flowgpu_imports",
                                                                                         default=None)
_checking: contextvars.ContextVar[bool] = contextvars.ContextVar("flowgpu_checking_only", default=False)


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value: Any) -> Iterator[Any]:
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def checking_only(on: bool = True) -> contextlib.AbstractContextManager:
    """Inside the block :func:`import_object` imports no module not imported yet: it checks the name in
    the module's source (:mod:`flowgpu.importcheck`) and returns an ``Unimported`` stand-in, so
    ``validate``, ``plan``, ``status`` and ``run --dry-run`` run none of the user's code. ``on=False``
    imports again (a ``python`` source with ``plan_call: true`` asks to be called)."""
    return _setting(_checking, on)


def recording_imports() -> contextlib.AbstractContextManager[list[tuple[str, str]]]:
    """Collect ``(what, path)`` of every import path :func:`import_object` resolves inside the block
    (each once, in order): what a spec would import, and so run, e.g. for ``flowgpu validate``."""
    return _setting(_recorded, [])


def trusted_modules() -> list[str] | None:
    """The module prefixes import paths may come from (``flowgpu.trusted-modules``); None: any."""
    value = dask.config.get("flowgpu.trusted-modules", None)
    if value is None:
        return None
    return [value] if isinstance(value, str) else [str(v) for v in value]


@contextlib.contextmanager
def trusting(modules: Iterable[str]) -> Iterator[None]:
    """Trust ``modules`` too inside the block (``--trust MODULE``); none given: no change. Once any
    module is trusted, import paths outside the trusted ones are refused."""
    extra = [m.strip() for m in modules if m and m.strip()]
    with dask.config.set({"flowgpu.trusted-modules": [*(trusted_modules() or []), *extra]} if extra else {}):
        yield


def check_trusted(path: Any, *, what: str = "import path") -> None:
    """Refuse ``path`` unless its module is under a prefix of ``flowgpu.trusted-modules`` (when set):
    ``"mypkg"`` trusts ``mypkg`` and ``mypkg.sub``, not ``mypkgx``. Nothing is imported."""
    trusted = trusted_modules()
    if trusted is None or not isinstance(path, str):
        return
    path = path.strip()
    module = path.partition(":")[0]
    if any(module == t or module.startswith(t.rstrip(".") + ".") for t in trusted if t):
        return
    listed = ", ".join(repr(t) for t in trusted) or "none"
    suggested = module if ":" in path else path.rpartition(".")[0]
    raise _fail(what, path, f"is outside the trusted modules ({listed}), so it was not imported",
                f"trust it with --trust {suggested} (or flowgpu.trusted-modules in your dask config) "
                "if you mean to run its code")


def _record(what: str, path: str, found: Any) -> Any:
    seen = _recorded.get()
    if seen is not None and (what, path) not in seen:
        seen.append((what, path))
    return found


def _stand_in(what: str, path: str, module_name: str, attr: str) -> Any:
    """What :func:`import_object` gives in :func:`checking_only`: an ``Unimported`` stand-in, the
    error an import would give, or None when ``module_name`` is not there (try the next candidate)."""
    verdict, detail = importcheck.lookup(module_name, attr)
    if verdict == importcheck.NOT_FOUND and detail is None:
        return None
    if verdict == importcheck.NOT_FOUND:
        name = attr.split(".")[0]
        raise _fail(what, path, f"{module_name!r} has no attribute {name!r}",
                    did_you_mean(name, detail, "check the spelling", n=3))
    return importcheck.Unimported(path, detail if verdict == "found" else None)


def import_object(path: Any, *, what: str = "import path") -> Any:
    """The object at ``"package.module:name"`` (or ``"package.module.name"``).

    The module is imported from ``sys.path`` (see :func:`add_import_dirs`), only when it is trusted
    (:func:`check_trusted`). Every failure is an ImportPathError in one style:
    ``{what} 'path': problem; how to fix it``.

    >>> import_object("numpy:sqrt").__name__
    'sqrt'
    """
    text = path.strip() if isinstance(path, str) else ""
    if (text.count(":") > 1 or (":" not in text and "." not in text)
            or not all(p.isidentifier() for p in re.split("[.:]", text))):
        raise _fail(what, text or str(path), "is not an import path",
                    "write 'package.module:name' (or 'package.module.name')")
    path = text
    check_trusted(path, what=what)
    missing = None
    for module_name, attr in import_candidates(path):
        if _checking.get() and module_name not in sys.modules:
            stand_in = _stand_in(what, path, module_name, attr)
            if stand_in is not None:
                return _record(what, path, stand_in)
            missing = missing or f"no module named {module_name!r}"
            continue
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is not None and not module_name.startswith(e.name):  # found, but it imports a missing one
                raise _fail(what, path, f"importing {module_name!r} failed: {e}",
                            "install what it needs (here and on the workers)") from None
            missing = missing or f"no module named {module_name!r}"
            continue
        except Exception as e:  # noqa: BLE001 - the user's module raised while importing
            raise _fail(what, path, f"importing {module_name!r} failed: {type(e).__name__}: {e}",
                        "fix the module") from None
        owner = module_name
        for name in attr.split("."):
            if not hasattr(obj, name):
                raise _fail(what, path, f"{owner!r} has no attribute {name!r}", did_you_mean(
                    name, [n for n in dir(obj) if not n.startswith("_")], "check the spelling", n=3))
            obj = getattr(obj, name)
            owner = f"{owner}.{name}"
        return _record(what, path, obj)
    raise _fail(what, path, missing or "not found",
                "check the spelling, that the package is installed (here and on the workers), or put the "
                "module beside the spec file")
