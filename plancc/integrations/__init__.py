"""Training on a plan inside other trainers' own entry points (Axolotl: `plancc.integrations.axolotl`).

Each module imports its trainer's package at import time, so it is imported only where that trainer is installed;
the plan replay itself is `plancc.runtime`'s (sampler, collator, loss, checked resume).
"""
