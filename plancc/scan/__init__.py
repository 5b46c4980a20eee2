"""Scanning: a source becomes a samples table (samples.parquet + the token store)."""
