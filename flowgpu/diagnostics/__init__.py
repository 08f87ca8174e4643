"""Progress while a pipeline runs, and the reports around it: plan tables and run summaries."""

from flowgpu.diagnostics.progress import BatchBars
from flowgpu.diagnostics.report import (format_bytes, render_batch, render_plan, render_status, render_summary,
                                        workers_line)

__all__ = ["BatchBars", "format_bytes", "render_batch", "render_plan", "render_status",
           "render_summary", "workers_line"]
