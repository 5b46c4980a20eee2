"""Preference data's names (docs/preference.md): the samples table's columns of a pair or a label, the two roles of a
pair's completions, and the kinds of data a plan trains. Plain values, below every package: the formats write them,
the store types them, the planner and the runtime read them."""

from __future__ import annotations

PAIR_ID_COLUMN = "pair_id"  # int64: the pair a completion belongs to (its source row)
PAIR_ROLE_COLUMN = "pair_role"  # "chosen" or "rejected"
DESIRABLE_COLUMN = "desirable"  # bool: an unpaired (KTO) completion's label
PAIR_ROLES = ("chosen", "rejected")
DATA_KINDS = ("sft", "preference", "unpaired_preference")
