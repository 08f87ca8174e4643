"""Progress while a pipeline runs, and the reports around it: plan tables and run summaries."""

from flowgpu.diagnostics.progress import BatchBars, compute_with_progress
from flowgpu.diagnostics.report import format_bytes, render_batch, render_plan, render_status, render_summary

__all__ = ["BatchBars", "compute_with_progress", "format_bytes", "render_batch", "render_plan", "render_status",
           "render_summary"]
