"""Batches: many items on one cluster, incremental re-runs."""
