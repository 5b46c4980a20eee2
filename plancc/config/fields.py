"""How a setting is declared: one dataclass field whose metadata, a `Setting`, says everything plancc does with it.

A field of `ScanOptions`, `PlanSettings` or `RunOptions` (`plancc.config.settings`) is declared with `setting(...)`;
the rest is made from its `Setting`:

* the `compile`/`scan` flag, its help and shown default (`plancc.cli.options`);
* the config-file key, the API keyword and the did-you-mean for a misspelt one (`plancc.config.resolve`);
* whether a recipe entry may set it for its dataset, or repeat it for the recipe (`plancc.config.recipe`);
* whether the scan record (and so the scan cache key) or the plan's config fingerprint holds it
  (`plancc.store.scan_record.RecordedOptions`, `PlanSettings.to_dict`);
* the Axolotl and TRL keys that mean it, with how their value becomes plancc's (`plancc.config.foreign`).

Its stage is where it is declared: a `ScanOptions` field decides the samples table, a `PlanSettings` field the
plan, one declared once for both (`both(...)` in each class) both; `RunOptions` change neither
(`plancc.config.registry` lists them all).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

SETTING = "plancc"  # the field metadata key that holds its Setting


def flag(name: str) -> str:
    """The command-line flag of setting `name` (`sequence_len` -> `--sequence-len`)."""
    return f"--{name.replace('_', '-')}"


def closest(word: str, choices: Any) -> str | None:
    """The one of `choices` closest to `word` when one is close, else None."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return close[0] if close else None


def did_you_mean(word: str, choices: Any) -> str:
    """` (did you mean 'x'?)` for the closest of `choices`, else an empty string."""
    close = closest(word, choices)
    return f" (did you mean {close!r}?)" if close else ""


class Record(Enum):
    """Whether the scan record (for a scan option: and so the scan cache key) or the plan's settings (for a plan
    setting: and so the config fingerprint) hold a setting."""

    ALWAYS = "always"
    UNLESS_DEFAULT = "unless_default"  # only away from its default: what was made before it existed keeps its bytes
    WHEN_USED = "when_used"  # only when the scan used it (`template_date`: a template that reads the date)
    NEVER = "never"  # a check on the result, not part of it (`max_dropped`), or nothing a plan depends on


class Flag(Enum):
    """Where a setting's command-line flag is."""

    GROUP = "group"  # with the flags of its stage, in declaration order (`plancc.cli.options`)
    OWN = "own"  # placed by the commands that take it (`--num-proc`, `--samples-per-epoch`)
    NONE = "none"  # none: a config file and the API only


class PerDataset(Enum):
    """Whether a recipe's dataset entry may give a setting."""

    NO = "no"
    OWN = "own"  # the dataset's own value, over the recipe's
    RECIPE = "recipe"  # one value for the whole recipe: an entry may repeat it, entries that disagree are an error


@dataclass(frozen=True)
class Spelling:
    """Another tool's key for a setting: `tool` axolotl or trl (a config of theirs read whole sets the setting from
    it, `to_plancc` turning their value into plancc's), or None (a name other tools use, only pointed at when a
    plancc config holds it). `top`: a top-level key; `entry`: a key of a dataset entry (Axolotl's `datasets`)."""

    key: str
    tool: str | None = None
    to_plancc: Callable[[Any], Any] | None = None
    top: bool = True
    entry: bool = False

    def value(self, value: Any) -> Any:
        """Their value as plancc's."""
        return value if self.to_plancc is None else self.to_plancc(value)


def axolotl(key: str, to_plancc: Callable[[Any], Any] | None = None, *, top: bool = True,
            entry: bool = False) -> Spelling:
    """Axolotl's key for a setting."""
    return Spelling(key, "axolotl", to_plancc, top, entry)


def trl(key: str, to_plancc: Callable[[Any], Any] | None = None) -> Spelling:
    """TRL's (`SFTConfig`, `trl sft --config`) key for a setting."""
    return Spelling(key, "trl", to_plancc)


def elsewhere(key: str) -> Spelling:
    """A name other tools (Hugging Face `TrainingArguments`, ...) give a setting: a plancc config holding it is told
    the plancc spelling."""
    return Spelling(key)


@dataclass(frozen=True)
class Setting:
    """What one setting is: its default, help and check, and where else it appears (module docstring).

    `check(name, value)` validates a value and returns its normal form (`plancc.config.checks`); `shown` is the
    default `--help` shows when not the default itself; `off` is a switch's second flag (`--no-balance`);
    `path` marks a value that may name a file (read beside the config file that gives it); `derived` a setting
    users never give (computed: a recipe's `mixture`)."""

    default: Any
    help: str
    check: Callable[[str, Any], Any]
    shown: str | None = None
    off: str | None = None
    flag: Flag = Flag.GROUP
    record: Record = Record.ALWAYS
    dataset: PerDataset = PerDataset.NO
    spellings: tuple[Spelling, ...] = ()
    path: bool = False
    derived: bool = False

    def field(self) -> Any:
        """The dataclass field declaring this setting (a fresh one each call: a setting of two stages is declared
        once and made a field of both classes)."""
        return dataclasses.field(default=self.default, metadata={SETTING: self})

    def flags(self, name: str) -> str:
        """Its flag, with a switch's second flag: `--balance/--no-balance`."""
        return flag(name) + (f"/{self.off}" if self.off else "")

    def shown_default(self, name: str) -> str:
        """The default `--help` shows for setting `name`: `shown`, a switch's flag at its default (`no-balance`),
        or the default's text."""
        if self.shown is not None:
            return self.shown
        if self.off is not None:
            return (flag(name) if self.default else self.off).lstrip("-")
        if isinstance(self.default, tuple):
            return ",".join(map(str, self.default))
        return str(self.default)


def setting(default: Any, help: str, check: Callable[[str, Any], Any], **meta: Any) -> Any:
    """A settings dataclass field declaring one setting (see `Setting` for `meta`)."""
    return Setting(default, help, check, **meta).field()


def both(declared: Setting) -> Any:
    """The field of a setting of both stages, declared once (`SEQUENCE_LEN`): a field of each class holding it."""
    return declared.field()


def setting_of(field: dataclasses.Field) -> Setting | None:
    """The Setting a dataclass field declares (None: a field that is no setting)."""
    return field.metadata.get(SETTING)
