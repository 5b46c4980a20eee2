"""Storage: plan and scan directories on disk."""
