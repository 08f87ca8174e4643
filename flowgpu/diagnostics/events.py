"""What a pipeline run tells its subscribers (``pipeline.run(..., subscribers=[f])``), in order.

A subscriber is called with each event on the run's thread (what it raises stops the run). The
events live below the pipeline layer so diagnostics can subscribe; pipeline objects travel untyped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "ItemFinished", "ItemStarted", "RunFinished", "SessionReady"]


@dataclass(frozen=True)
class SessionReady:
    """The run's session is ready (given, joined or started); not sent when all is up to date."""

    session: Any  # a flowgpu.runtime.RunSession


@dataclass(frozen=True)
class ItemStarted:
    """One item (a plain run is one) is staged and about to be computed."""

    index: int  # its place in the batch
    label: str | None  # its foreach params (``seed=1``); None for a plain run
    plan: Any  # the pipeline.Plan it runs (compiled for the session)
    describe: Callable[[], dict]  # pipeline.describe(plan), made when asked
    targets: dict[str, Any]  # output name -> what computes it (the sink's write)
    cached: tuple[str, ...]  # its outputs that are up to date


@dataclass(frozen=True)
class ItemFinished:
    """One item ended (ok, failed or cancelled)."""

    index: int
    outcome: Any  # its pipeline.batch.Outcome: status, values, written, error, seconds


@dataclass(frozen=True)
class RunFinished:
    """The run ended, ok or failed: ``summary`` is what ``--summary`` writes."""

    summary: dict[str, Any]


Event = SessionReady | ItemStarted | ItemFinished | RunFinished
