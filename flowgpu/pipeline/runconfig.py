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
    """How to run a pipeline (or a batch of it); :func:`flowgpu.pipeline.run` builds one from its keywords.

    Attributes
    ----------
    overrides : dotted keys to set, e.g. ``{"params.n": 1000}`` (as ``--set``).
    params_file : a YAML file of param values (as ``--params``).
    session : a :class:`flowgpu.Session` to run on; default: the current one, else one started from
        the spec's ``cluster:`` block (and closed at the end). ``"local"`` runs on dask's threaded
        scheduler in this process, with no cluster (small runs and tests).
    overwrite : replace output paths that hold data flowgpu did not write.
    summary_path : also write the summary as JSON there (atomically); a failed run writes one too,
        with ``status: "failed"``, the error, the step it came from when known, and what was written.
    cluster : Session options overriding the spec's ``cluster:`` block (``--scheduler``, ``--gpus``).
        With no scheduler or session given, a run joins the cluster that stays up (``flowgpu cluster
        start``) when one runs, and says so; ``{"standalone": True}`` starts one of its own instead.
    console : where to print progress and notes (default: stderr); ``progress=False`` is quiet.
    allow_spec_address : let the spec's ``cluster.address`` (another scheduler) or a dashboard open to
        the network take effect; without it they are refused (see :func:`session_options`).
    wait : when another run is writing one of the outputs, wait for it (a line on stderr says so);
        ``False`` (``--no-wait``): fail at once with :class:`OutputLockedError`.
    foreach : run a batch: param name -> values (a list, a glob ``"data/*.npy"``, a range ``"0:8"``,
        ``{"glob": ...}``, ``{"range": ...}``), with the spec's ``foreach:`` block; several make a grid.
        Every item is compiled before any runs; the result is then a :class:`BatchResult`.
    keep_going : a failing item does not stop the others (the result says which failed).
    force : compute every output, up to date or not.
    checksum : tell changed input files by their content, not only their size and modification time.
    cache : skip outputs that are up to date, and record what made each output written
        (``flowgpu.cache.directory``); ``False`` computes everything and records nothing.
    report : also write a self-contained HTML report of the run (or batch) there, atomically, also
        when it failed while computing: :mod:`flowgpu.diagnostics.runreport`.
    subscribers : callables given each event of the run (:mod:`flowgpu.diagnostics.events`):
        ``SessionReady`` (the CLI prints the dashboard link), each item's ``ItemStarted`` and
        ``ItemFinished``, then ``RunFinished`` with the summary.
    """

    overrides: dict[str, Any] | None = None
    params_file: str | None = None
    session: RunSession | str | None = None
    overwrite: bool = False
    summary_path: str | None = None
    cluster: dict[str, Any] | None = None
    console: Console | None = None
    progress: bool = True
    allow_spec_address: bool = False
    wait: bool = True
    foreach: dict[str, Any] | None = None
    keep_going: bool = False
    force: bool = False
    checksum: bool = False
    cache: bool = True
    report: str | os.PathLike | None = None
    subscribers: Sequence[Callable[[Any], None]] = ()
