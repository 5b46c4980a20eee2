"""Settings: what can be set, how a config file, a recipe and another tool's config become typed settings.

The typed settings users build themselves (`plancc.compile(src, out, scan=ScanOptions(...),
plan=PlanSettings(...))`) are importable from here.
"""

from plancc.config.settings import CostMode, LongPolicy, Mode, PlanSettings, ScanOptions, Shift

__all__ = ["CostMode", "LongPolicy", "Mode", "PlanSettings", "ScanOptions", "Shift"]
