"""How a pipeline runs: :class:`RunConfig`, what ``flowgpu run`` and :func:`flowgpu.pipeline.run` pass."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from flowgpu.runtime import RunSession

__all__ = ["RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    """How to run a pipeline (or a batch of it); :func:`flowgpu.pipeline.run` builds one from its keywords."""

    overrides: dict[str, Any] | None = None  # dotted keys to set, e.g. {"params.n": 1000} (--set)
    params_file: str | None = None  # a YAML file of param values (--params)
    # a flowgpu.Session; default: the current one, else one started from the spec's cluster: block and
    # closed at the end; "local": dask's threaded scheduler in this process, no cluster
    session: RunSession | str | None = None
    overwrite: bool = False  # replace output paths that hold data flowgpu did not write
    summary_path: str | None = None  # also write the summary there as JSON, atomically (a failed run's too)
    # Session options over the spec's cluster: block (--scheduler, --gpus); with neither, a run joins the
    # cluster that stays up (flowgpu cluster start), saying so, unless {"standalone": True}
    cluster: dict[str, Any] | None = None
    console: Console | None = None  # where progress and notes go (default: stderr)
    progress: bool = True  # False: quiet
    allow_spec_address: bool = False  # let the spec's address or an open dashboard count (checks.session_options)
    wait: bool = True  # wait for another run writing an output (False, --no-wait: OutputLockedError at once)
    # run a batch: param -> values (a list, a glob "data/*.npy", a range "0:8", {"glob": ...}, {"range": ...}),
    # with the spec's foreach: block; several make a grid; the result is then a BatchResult
    foreach: dict[str, Any] | None = None
    keep_going: bool = False  # a failing item does not stop the others (the result says which failed)
    force: bool = False  # compute every output, up to date or not
    checksum: bool = False  # tell changed input files by their content, not only size and modification time
    cache: bool = True  # skip up-to-date outputs and record what made each written (False: neither)
    report: str | os.PathLike | None = None  # also write an HTML report of the run there (a failed run's too)
    # called with each event of the run (diagnostics.events): SessionReady (the CLI prints the dashboard
    # link), each item's ItemStarted and ItemFinished, then RunFinished with the summary
    subscribers: Sequence[Callable[[Any], None]] = ()
