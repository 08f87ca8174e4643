"""Built-in ops (filled in by the pipeline layer)."""
