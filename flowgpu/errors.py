"""The one exception family of flowgpu: each derives from :class:`FlowgpuError` and from the built-in
exception a caller would naturally catch (``ValueError`` for bad values, ``RuntimeError`` while running).
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
    """A source that cannot be opened as its options say; ``option`` names the option at fault."""

    def __init__(self, message: str, option: str | None = None):
        self.option = option
        super().__init__(message)


class QueryPlanningError(ConfigError):
    """dask's ``array.query-planning`` is on, and flowgpu's fusion works on dask's classic graphs."""


class ImportPathError(ConfigError, ImportError):
    """An import path (``package.module:name``) that cannot be resolved."""


class PathNotVisibleError(ConfigError):
    """A path the client sees but a worker does not (another host, mount or working directory)."""


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
    """An invalid pipeline spec: ``message`` at ``file:line:col`` (1-based, when known), at the field
    ``path`` inside the spec (``steps.norm.op``), with a ``hint`` how to fix it."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None, col: int | None = None,
                 path: str | None = None, hint: str | None = None):
        self.message = message
        self.file = file
        self.line = line
        self.col = col
        self.path = path
        self.hint = hint
        head = "".join(f"{part}: " for part in (self.location, path) if part)
        super().__init__(head + message + (f" (hint: {hint})" if hint else ""))

    @property
    def location(self) -> str:
        return ":".join(str(p) for p in (self.file, self.line, self.col) if p is not None)


class SpecLimitError(SpecError):
    """A spec (or params file, or ``--set`` value) beyond the ``flowgpu.spec`` limits."""


class OutputExistsError(FlowgpuError, FileExistsError):
    """An output path already holds something flowgpu did not write."""


class OutputError(FlowgpuError, OSError):
    """An output that could not be written or moved into place; the old output, if any, is left as it was."""


class OutputLockedError(OutputError):
    """Another run is writing the same output (``--no-wait``)."""


class RunError(FlowgpuError, RuntimeError):
    """A pipeline failed while running."""


def did_you_mean(name: object, known: Iterable[object], otherwise: str = "", n: int = 1) -> str:
    """``"did you mean 'x'?"`` naming the ``n`` closest of ``known`` to ``name``, else ``otherwise``."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=n)
    return f"did you mean {', '.join(map(repr, close))}?" if close else otherwise
