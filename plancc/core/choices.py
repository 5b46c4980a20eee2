"""The settings with named values, as str enums: below every package, since the planner, the store and the
runtime branch on them and need nothing else of the settings."""

from __future__ import annotations

from enum import StrEnum


class Choice(StrEnum):
    """A setting with named values. Members are strings ("packed" == Mode.PACKED), so manifests, config files,
    fingerprints and CLI flags hold exactly the value, and `repr` shows it as the plain string it replaces."""

    def __repr__(self) -> str:
        return repr(self.value)


class Mode(Choice):
    """Layout of a microbatch (docs/spec.md §4): one packed row (or rows), a padded group, or a flattened row."""

    PACKED = "packed"
    PADDED = "padded"
    FLATTENED = "flattened"


class Shift(Choice):
    """Label semantics (docs/spec.md §3): shift inside each sample, over each packed row, or labels already shifted."""

    SAMPLE = "sample"
    ROW = "row"
    NONE = "none"


class CostMode(Choice):
    """What rank ordering and within-update trades even out: padded token slots, or attention work (the sum of
    squared sample lengths)."""

    TOKENS = "tokens"
    ATTENTION = "attention"


class LongPolicy(Choice):
    """What the scan does with a sample longer than --sequence-len."""

    TRUNCATE = "truncate"
    DROP = "drop"
    ERROR = "error"


class ChatRole(Choice):
    """A chat turn's role, as `roles_to_train` names the turns trained."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class TrainOnEos(Choice):
    """Which end-of-turn markup (or appended EOS) is trained: each trained turn's, the last trained turn's, every
    turn's, or none."""

    TURN = "turn"
    LAST = "last"
    ALL = "all"
    NONE = "none"


class TrainOn(Choice):
    """Which of a conversation's trained turns are trained: all of them, or only the last; or every token of the
    conversation, its markup too (TRL's loss on conversational data)."""

    ALL_TURNS = "all_turns"
    LAST_TURN = "last_turn"
    ALL_TOKENS = "all_tokens"


class EndOfTurn(Choice):
    """What a chat turn's end is, for `train_on_eos`: the template's markup after the content (up to the next turn),
    or the eos and `eot_tokens` tokens found just after the content (Axolotl's rule)."""

    MARKUP = "markup"
    TOKENS = "tokens"


class DatasetRole(Choice):
    """What a recipe's dataset is for: training, or the eval plan only."""

    TRAIN = "train"
    EVAL = "eval"


class MixKind(Choice):
    """How a recipe's dataset mixes into an epoch: repeated a number of times, or weighted by its share."""

    REPEAT = "repeat"
    WEIGHT = "weight"


class ConfigFormat(Choice):
    """Which tool wrote a config file: found from its keys (auto), or said outright."""

    AUTO = "auto"
    PLANCC = "plancc"
    AXOLOTL = "axolotl"
    TRL = "trl"
