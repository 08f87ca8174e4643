"""Computing many dask collections as one graph, with a rich progress bar.

On a distributed client the bar follows the scheduler (the same feed ``distributed.progress``
uses); without one it follows dask's local callbacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask
from dask.callbacks import Callback
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["compute_with_progress"]


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


def _distributed(client, targets: Sequence[Any], progress: Progress | None, task: Any) -> list[Any]:
    futures = client.compute(list(targets))
    if progress is not None:
        from distributed.diagnostics.progressbar import TextProgressBar

        class _Feed(TextProgressBar):
            def _draw_bar(self, remaining, all, **kwargs):  # noqa: A002 - distributed's names
                progress.update(task, total=all, completed=all - remaining)

            def _draw_stop(self, **kwargs):
                pass

        try:
            _Feed(futures, scheduler=client.scheduler.address, interval="200ms", complete=True)
        except Exception:  # noqa: S110 - the bar is a courtesy; the results below are what matters
            pass
    try:
        return client.gather(futures)
    except BaseException:
        client.cancel(futures)  # the rest of a failed graph stops, and stops writing into staged outputs
        raise


def compute_with_progress(targets: Sequence[Any], *, client: Any = None, console: Console | None = None,
                          show: bool = True, description: str = "running") -> list[Any]:
    """Compute ``targets`` together (shared tasks once) and return their results in order.

    With ``client`` the graph goes to that cluster; without one it runs on dask's threaded scheduler
    in this process (even when a distributed client is the default).
    """
    progress = _bar(console or Console(stderr=True)) if show else None
    task = progress.add_task(description, total=None) if progress is not None else None
    try:
        if progress is not None:
            progress.start()
        if client is not None:
            return _distributed(client, targets, progress, task)
        if progress is not None:
            with _LocalBar(progress, task):
                return list(dask.compute(*targets, scheduler="threads"))
        return list(dask.compute(*targets, scheduler="threads"))
    finally:
        if progress is not None:
            progress.stop()
