"""The leaf below every package: the update layout, plan arrays and their row sums, numba set-up, number
formatting and the metric column names. Imports numpy (and numba) only, never another plancc package."""
