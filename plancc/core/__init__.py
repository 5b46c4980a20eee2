"""The leaf below every package: the update layout, plan arrays and their row sums, numba set-up, number
formatting, the metric column names, the named choices of the settings and the canonical hash of settings. Imports
numpy, numba and orjson only, never another plancc package."""
