"""Orchestration of one compile: a source (or a recipe of sources) becomes a plan directory. `run` plans and writes,
`samples` loads or scans a compile's samples, `carry` takes a scan's settings into the plan's, `recipe` joins a
recipe's datasets."""
