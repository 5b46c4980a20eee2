"""Settings: every setting declared once (`settings`, with `fields` and `checks`), listed by name (`registry`),
resolved once from defaults, a config file (`files`; another tool's: `foreign`) and flags (`resolve`), and a
recipe's datasets (`recipe`).

The typed settings users build themselves (`plancc.compile(src, out, scan=ScanOptions(...),
plan=PlanSettings(...))`) are importable from here.
"""

from plancc.config.settings import CostMode, LongPolicy, Mode, PlanSettings, ScanOptions, Shift

__all__ = ["CostMode", "LongPolicy", "Mode", "PlanSettings", "ScanOptions", "Shift"]
