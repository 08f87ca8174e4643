"""Progress while a pipeline runs, and the reports around it: plan tables and run summaries."""

from flowgpu.diagnostics.progress import compute_with_progress
from flowgpu.diagnostics.report import format_bytes, render_plan, render_summary

__all__ = ["compute_with_progress", "format_bytes", "render_plan", "render_summary"]
