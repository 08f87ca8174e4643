"""Rich progress bars for a run's items: one bar per running item, following the scheduler (the
feed ``distributed.progress`` uses) on a distributed client, dask's local callbacks without one."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from dask.callbacks import Callback
from distributed.diagnostics.progressbar import ProgressBar
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["BatchBars"]


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
    """One bar per running item of a batch (rich, on stderr); a finished item's bar goes away."""

    def __init__(self, console: Console | None, show: bool = True):
        self.progress = None
        if show:
            self.progress = Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
                                     MofNCompleteColumn(), TextColumn("tasks"), TimeElapsedColumn(),
                                     console=console or Console(stderr=True))
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
        if self.progress is None:
            return None
        progress = self.progress
        return Callback(start_state=lambda dsk, state: progress.update(task, total=len(dsk), completed=0),
                        posttask=lambda *args: progress.advance(task))

    def done(self, task: Any) -> None:
        feed = self._feeds.pop(task, None)
        if feed is not None:
            feed.close()
        if self.progress is not None:
            self.progress.update(task, visible=False)
