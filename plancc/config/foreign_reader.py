"""What reading another tool's config needs, whatever the tool: its key catalogue (`Known`, `KNOWN`) and the
`Reader` that sorts a config's keys into settings, notes and refusals (`plancc.config.foreign`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from plancc.config import foreign_keys as fk
from plancc.config import registry
from plancc.config.fields import closest
from plancc.config.formats import AXOLOTL_TYPES
from plancc.core.choices import ConfigFormat
from plancc.errors import SettingsError

BUILTIN_TEMPLATES = ("chatml", "llama3")  # Axolotl chat_template names that are plancc built-ins too
ENTRY_TYPES = (*AXOLOTL_TYPES, "a mapping with field_instruction/field_output/format")
# Axolotl's role names when an entry gives no `roles` (its chat_template strategy's default)
AXOLOTL_ROLES = {"human": "user", "user": "user", "assistant": "assistant", "gpt": "assistant", "system": "system",
                 "tool": "tool"}
SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")
# the keys read here (module docstring), top level and per dataset entry
AXOLOTL_READ = ("tokenizer_config", "base_model_config", "base_model", "datasets", "test_datasets", "chat_template",
                "chat_template_jinja", "special_tokens", "default_system_message", "shuffle_merged_datasets",
                "shuffle_before_merging_datasets", "tokenizer_use_fast", "tokenizer_type", "rl",
                *fk.AXOLOTL_LAYOUT_KEYS)
AXOLOTL_ENTRY_READ = ("path", "data_files", "type", "field_messages", "message_property_mappings",
                      "message_field_role", "message_field_content", "message_field_training", "field", "ds_type",
                      "roles", "roles_to_train", "chat_template", "chat_template_jinja", "field_thinking",
                      "split_thinking", "template_thinking_key", "preprocess_shards", "input_format",
                      "field_chosen", "field_rejected")
AXOLOTL_PAIR_FIELDS = ("field_chosen", "field_rejected")  # an `rl` entry's reply fields (refused without `rl`)
# the keys of an `rl` entry that Axolotl 0.19.0's DPO dataset schema keeps (with `split`), or that change nothing
# (the others it drops: its strategy never sees them)
AXOLOTL_PAIR_READ = ("path", "data_files", "type", "field_messages", *AXOLOTL_PAIR_FIELDS, "ds_type",
                     "preprocess_shards", "input_format")
TRL_READ = ("tokenizer_name_or_path", "model_name_or_path", "dataset_name", "dataset_train_split",
            "assistant_only_loss", *fk.TRL_LAYOUT_KEYS)


@dataclass(frozen=True)
class Known:
    """A tool's catalogue of the keys that mean no plancc setting: `training_only` (named in the note),
    `unsupported` (`{key: why, what to do}`: refused), `entry` (a dataset entry's keys refused likewise), `inert`
    (values of refused keys that change nothing: accepted), and whether it is `complete` (every key the tool has is
    a setting's spelling, read here, or listed: then any other key is refused as unknown)."""

    training_only: frozenset[str] = frozenset()
    unsupported: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    complete: bool = False
    entry: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    inert: Mapping[str, tuple[Any, ...]] = field(default_factory=lambda: MappingProxyType({}))


def _refusals(unsupported: Mapping[str, str], to_honour: Mapping[str, str]) -> MappingProxyType:
    """One table of refused keys: why each is refused, and what to do."""
    return MappingProxyType({**{k: f"not honoured yet: {v}" for k, v in to_honour.items()}, **unsupported})


KNOWN: dict[str, Known] = {
    "axolotl": Known(frozenset(fk.AXOLOTL_TRAINING_ONLY), _refusals(fk.AXOLOTL_UNSUPPORTED, fk.AXOLOTL_TO_HONOUR),
                     True, _refusals(fk.AXOLOTL_DATASET_UNSUPPORTED, fk.AXOLOTL_DATASET_TO_HONOUR),
                     MappingProxyType(fk.AXOLOTL_INERT)),
    "trl": Known(frozenset(fk.TRL_TRAINING_ONLY), _refusals(fk.TRL_UNSUPPORTED, fk.TRL_TO_HONOUR), True,
                 inert=MappingProxyType(fk.TRL_INERT)),
}


@dataclass
class Reader:
    """One config's keys as its tool spells them, sorted into settings, notes and refusals (module docstring)."""

    tool: str
    path: Path
    known: Known
    noted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    spelled: dict[str, str] = field(default_factory=dict)  # top-level settings: the key that set each

    def settings(self, data: dict[str, Any], read: tuple[str, ...], where: str = "", entry: bool = False
                 ) -> dict[str, Any]:
        """The plancc settings `data`'s keys spell (a transform given None may leave the setting unset); every
        other key not in `read` noted or refused."""
        spelled = registry.spellings(self.tool, entry=entry)
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key in spelled:
                name, spelling = spelled[key]
                if value is not None or spelling.to_plancc is not None:
                    value = spelling.value(value)
                if value is not None:
                    out[name] = value
                    if not entry:
                        self.spelled[name] = key
            elif key not in read:
                self.other(f"{where}{key}", str(key), value, entry)
        return out

    def other(self, shown: str, key: str, value: Any, entry: bool) -> None:
        """A key that sets no plancc setting: accepted (unset, or at a value that changes nothing), noted
        (training only; any key of an incomplete catalogue) or refused (named in the error)."""
        refused = self.known.entry if entry else self.known.unsupported
        if value is None or (key in self.known.inert and _same(value, self.known.inert[key])):
            return
        if key in refused:
            self.refused.append(f"{shown!r} ({refused[key]})")
        elif (key in self.known.training_only and not entry) or not self.known.complete:
            self.noted.append(shown)
        else:
            self.refused.append(f"{shown!r} ({self.unknown(key, entry)})")

    def refuse_value(self, shown: str, why: str) -> None:
        """A key whose value plancc cannot honour: named in the error with why."""
        self.refused.append(f"{shown!r} ({why})")

    def unknown(self, key: str, entry: bool) -> str:
        """Why an unknown key is refused: another place's key, a plancc setting, or the closest known key."""
        if self.tool == ConfigFormat.AXOLOTL and not entry and key in self.keys(True):
            return "a key of each dataset entry in Axolotl: set it on the entries"
        if key in registry.SETTINGS:
            return (f"a plancc setting, not {'an Axolotl' if self.tool == 'axolotl' else 'a TRL'} key: give it as "
                    "a flag or in a plancc config")
        close = closest(key, self.vocabulary(entry))
        return "unknown" + (f"; did you mean {close!r}?" if close else "")

    def keys(self, entry: bool) -> set[str]:
        """Every key the tool is known to have (top level, or a dataset entry's)."""
        if self.tool != ConfigFormat.AXOLOTL:
            return {*registry.spellings(self.tool), *TRL_READ, *self.known.training_only, *self.known.unsupported}
        if entry:
            return {*registry.spellings(self.tool, entry=True), *AXOLOTL_ENTRY_READ, *self.known.entry}
        return {*registry.spellings(self.tool), *AXOLOTL_READ, *self.known.training_only, *self.known.unsupported}

    def vocabulary(self, entry: bool) -> list[str]:
        """Every key a did-you-mean may suggest: the tool's, and at the top level plancc's settings too."""
        return sorted(self.keys(entry) | (set() if entry else set(registry.GIVEN)))

    def refuse(self) -> None:
        """The error naming every key refused, when there is one."""
        if self.refused:
            raise SettingsError(f"config file {self.path}: {self.tool.capitalize()} key"
                                f"{'s' if len(self.refused) > 1 else ''} plancc cannot honour: "
                                f"{', '.join(self.refused)}")


def _same(value: Any, values: tuple[Any, ...]) -> bool:
    """Whether `value` is one of `values` (a bool is never the number 0 or 1)."""
    return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in values)


def tokenizer(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The first of `keys` set: a local tokenizer directory or a Hub id (read beside the config file when
    something is there)."""
    found = next((data[k] for k in keys if isinstance(data.get(k), str) and data[k]), None)
    return {} if found is None else {"tokenizer": found}
