"""Planning: the samples table becomes per-epoch plan arrays."""
