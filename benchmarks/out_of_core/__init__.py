"""Out-of-core passes: data larger than device (or host) memory, flowgpu's store against the cluster's own."""
