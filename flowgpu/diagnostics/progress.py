"""Rich progress bars for a run's items: one bar per running item.

On a distributed client a bar follows the scheduler (the same feed ``distributed.progress``
uses); without one it follows dask's local callbacks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from dask.callbacks import Callback
from distributed.diagnostics.progressbar import ProgressBar
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["BatchBars"]


def _bar(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("tasks"), TimeElapsedColumn(), console=console, transient=False)


class _LocalBar(Callback):
    def __init__(self, progress: Progress, task: Any):
        super().__init__()
        self.progress, self.task = progress, task

    def _start_state(self, dsk, state):
        self.progress.update(self.task, total=len(dsk), completed=0)

    def _posttask(self, key, result, dsk, state, worker_id):
        self.progress.advance(self.task)


class _Feed(ProgressBar):
    """distributed's scheduler feed for one set of futures, drawn as one rich task."""

    def __init__(self, futures: Sequence[Any], scheduler: str, progress: Progress, task: Any):
        super().__init__(futures, scheduler, interval="250ms", complete=True)
        self.progress, self.task = progress, task

    def _draw_bar(self, remaining: int = 0, all: int = 0, **kwargs: Any) -> None:  # noqa: A002 - distributed's names
        self.progress.update(self.task, total=all, completed=all - remaining)

    def close(self) -> None:
        comm = getattr(self, "comm", None)
        if comm is not None and not comm.closed():
            comm.abort()


class BatchBars:
    """One bar per running item of a batch (rich, on stderr); a finished item's bar goes away.

    On a distributed client each bar follows the scheduler's count of its item's tasks (the feed
    ``distributed.progress`` uses, one per item, all on the client's event loop); in this process a
    bar follows dask's local callbacks (:meth:`local`).
    """

    def __init__(self, console: Console | None, show: bool = True):
        self.progress = _bar(console or Console(stderr=True)) if show else None
        self._feeds: dict[Any, _Feed] = {}

    def __enter__(self) -> "BatchBars":
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for feed in self._feeds.values():
            feed.close()
        if self.progress is not None:
            self.progress.stop()

    def add(self, label: str) -> Any:
        return self.progress.add_task(label, total=None) if self.progress is not None else None

    def follow(self, task: Any, client: Any, futures: Sequence[Any]) -> None:
        """Draw ``task`` from the scheduler's progress on ``futures``."""
        if self.progress is None:
            return
        with contextlib.suppress(Exception):  # the bar is a courtesy; the results are what matters
            feed = self._feeds[task] = _Feed(futures, client.scheduler.address, self.progress, task)
            client.loop.add_callback(feed.listen)

    def local(self, task: Any) -> Callback | None:
        """A dask callback drawing ``task`` while computing in this process (None when quiet)."""
        return _LocalBar(self.progress, task) if self.progress is not None else None

    def done(self, task: Any) -> None:
        feed = self._feeds.pop(task, None)
        if feed is not None:
            feed.close()
        if self.progress is not None:
            self.progress.update(task, visible=False)
