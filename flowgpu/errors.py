"""The one exception family of flowgpu.

Every error flowgpu raises on purpose derives from :class:`FlowgpuError`, and also from the
built-in exception a caller would naturally catch (``ValueError`` for bad values, ``RuntimeError``
for failures while running, ...). Messages say what was wrong, where, and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean", "FlowgpuError", "ConfigError", "SourceError", "QueryPlanningError", "ImportPathError",
           "PathNotVisibleError", "BackendError", "SessionError", "ClusterError", "ClusterRunningError", "ChunkError",
           "SpecError", "SpecLimitError", "OpError", "ArgumentError", "KernelError", "OutputExistsError", "OutputError",
           "OutputLockedError", "RunError", "MemoryLimitError"]


class FlowgpuError(Exception):
    """Root of all errors raised by flowgpu."""


class ConfigError(FlowgpuError, ValueError):
    """A bad option value: unknown backend, unparsable memory limit, ..."""


class SourceError(ConfigError):
    """A source that cannot be opened as its options say (a dataset not in the file, pages that do
    not stack); ``option`` names the option at fault, so a spec's error points at it."""

    def __init__(self, message: str, option: str | None = None):
        self.option = option
        super().__init__(message)


class QueryPlanningError(ConfigError):
    """dask's ``array.query-planning`` is on: flowgpu's fusion works on dask's classic graphs, so a
    Session or a pipeline run refuses (:func:`flowgpu.fusion.classic.require_classic_graphs`)."""


class ImportPathError(ConfigError, ImportError):
    """An import path (``package.module:name``) that cannot be resolved: bad form, missing module,
    missing attribute, or a module that fails while importing."""


class PathNotVisibleError(ConfigError):
    """A path the client sees but a worker does not (another host, another mount, another working
    directory): put it where every host sees it, or use a URL."""


class BackendError(FlowgpuError, RuntimeError):
    """The requested backend is not available here (e.g. ``backend="gpu"`` with no GPU)."""


class SessionError(FlowgpuError, RuntimeError):
    """A cluster could not be started or joined."""


class ClusterError(SessionError):
    """A cluster that stays up between runs (``flowgpu cluster``) could not be started, found or stopped."""


class ClusterRunningError(ClusterError):
    """``flowgpu cluster start`` while a cluster that stays up already runs (exit 2: stop it first)."""


class ChunkError(FlowgpuError, ValueError):
    """Chunks that are malformed or cannot fit a worker."""


class MemoryLimitError(FlowgpuError, ValueError):
    """A memory limit that is larger than the device or too small to hold one chunk."""


class OpError(FlowgpuError, ValueError):
    """An unknown op, or an op called with arguments it does not take."""


class ArgumentError(OpError):
    """An op argument that does not fit the op's signature; ``argument`` names it (None: the inputs)."""

    def __init__(self, message: str, argument: str | None = None):
        self.argument = argument
        super().__init__(message)


class KernelError(FlowgpuError, ValueError):
    """A user kernel or fused expression that cannot be built or applied."""


class SpecError(FlowgpuError, ValueError):
    """An invalid pipeline spec.

    Parameters
    ----------
    message : what is wrong.
    file, line, col : where (1-based line and column), when known.
    path : the field path inside the spec, e.g. ``steps.norm.op``.
    hint : how to fix it.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None, col: int | None = None,
                 path: str | None = None, hint: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.col = col
        self.path = path
        self.hint = hint
        super().__init__(self.format())

    @property
    def location(self) -> str:
        return ":".join(str(p) for p in (self.file, self.line, self.col) if p is not None)

    def format(self) -> str:
        where = self.location
        head = f"{where}: " if where else ""
        field = f"{self.path}: " if self.path else ""
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"{head}{field}{self.message}{hint}"


class SpecLimitError(SpecError):
    """A spec (or params file, or ``--set`` value) beyond the ``flowgpu.spec`` limits: too large,
    too deep, too many values once aliases expand, or not a regular file."""


class OutputExistsError(FlowgpuError, FileExistsError):
    """An output path already holds something flowgpu did not write."""


class OutputError(FlowgpuError, OSError):
    """An output that could not be written or moved into place (a read-only or full filesystem,
    data that appeared at its path during the run); the old output, if any, is left as it was."""


class OutputLockedError(OutputError):
    """Another run is writing the same output (``--no-wait``)."""


class RunError(FlowgpuError, RuntimeError):
    """A pipeline failed while running."""


def did_you_mean(name: object, known: Iterable[object], otherwise: str = "", n: int = 1) -> str:
    """``"did you mean 'x'?"`` naming the ``n`` closest of ``known`` to ``name``, else ``otherwise``."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=n)
    return f"did you mean {', '.join(map(repr, close))}?" if close else otherwise
