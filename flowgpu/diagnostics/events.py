"""What a pipeline run tells those who follow it, in the order it happens.

A subscriber is a callable given each event (``pipeline.run(..., subscribers=[f])``, or
:class:`flowgpu.pipeline.RunConfig`'s ``subscribers``), on the run's own thread; what it raises stops
the run. The CLI prints the dashboard link on :class:`SessionReady`; the dashboard's flowgpu page
follows items from :class:`ItemStarted` to :class:`ItemFinished` (:class:`flowgpu.diagnostics.monitor.Follower`).
The events live here, below the pipeline layer, so diagnostics can subscribe; what belongs to that
layer (a plan, an outcome record) travels as a plain attribute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "ItemFinished", "ItemStarted", "RunFinished", "SessionReady"]


@dataclass(frozen=True)
class SessionReady:
    """The session the run computes on is ready (given, joined or started); none when all is up to date."""

    session: Any  # a flowgpu.runtime.RunSession


@dataclass(frozen=True)
class ItemStarted:
    """One item (a plain run is one) is staged and about to be computed."""

    index: int  # the item's place in the batch
    label: str | None  # its foreach params (``seed=1``); None for a plain run
    plan: Any  # the pipeline.Plan it runs (compiled for the session)
    describe: Callable[[], dict]  # pipeline.describe(plan), made when asked
    targets: dict[str, Any]  # output name -> what computes it (the sink's write)
    cached: tuple[str, ...]  # its outputs that are up to date


@dataclass(frozen=True)
class ItemFinished:
    """One item ended: ``outcome`` (a pipeline.batch.Outcome) has its ``status`` (ok, failed or
    cancelled), ``values``, ``written``, ``error`` and ``seconds``."""

    index: int
    outcome: Any


@dataclass(frozen=True)
class RunFinished:
    """The run ended, ok or failed: ``summary`` is what ``--summary`` writes."""

    summary: dict[str, Any]


Event = SessionReady | ItemStarted | ItemFinished | RunFinished
