"""Probes and profiles: where the time goes, and what the machine allows (GPU only, most of them)."""
