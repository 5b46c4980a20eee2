"""Read an Axolotl or TRL (`SFTConfig` / `trl sft --config`) YAML as it is: its data section as plancc settings.

A compile from such a config that exits 0 means "these are the tokens and labels that tool would train on". Users
come with a training config already written; each of its keys is one of:

* a key that means a plancc setting: declared with the setting, as one of its spellings (`axolotl(...)`,
  `trl(...)` in `plancc.config.settings`), with how their value becomes plancc's; top level or a dataset entry's;
* a key read here because it takes more than one key to say (the tokenizer from `tokenizer_config`, else
  `base_model_config`, else `base_model`; a chat template; a dataset entry's `type`, field names and roles; the
  batch layout), or because it changes nothing plancc plans (the order of the prepared rows);
* a key the tool's catalogue (`KNOWN`, made from `plancc.config.foreign_keys`) lists: only training reads it
  (learning rate, LoRA, ...: named in one note), or it shapes data in a way plancc cannot honour (refused, exit 2,
  saying what to do; at a value that changes nothing it is accepted);
* any other key: refused with a did-you-mean over plancc's settings and every key the tool is known to have (a
  catalogue that is not `complete` notes it instead).

A config is taken for Axolotl's when it has `base_model` or a dataset entry with a `type`, for TRL's when it has
`model_name_or_path`, `dataset_name` or `output_dir`; `--config-format` says so outright. Anything else is a plancc
config, returned as written. The key-by-key table is docs/axolotl-trl.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancc.config.foreign_axolotl import axolotl_settings
from plancc.config.foreign_reader import KNOWN, Known, Reader
from plancc.config.foreign_trl import trl_settings
from plancc.core.choices import ConfigFormat
from plancc.errors import SettingsError


@dataclass
class Imported:
    """A config read as plancc settings: `kind` (plancc, axolotl or trl), its training-only keys (`ignored`), and
    the key that set each setting (`spelled`: `{setting: their key}`, so that a message names what the user
    wrote)."""

    settings: dict[str, Any]
    kind: str = ConfigFormat.PLANCC
    ignored: list[str] = field(default_factory=list)
    spelled: dict[str, str] = field(default_factory=dict)

    def note(self, path: Path) -> str | None:
        """The one line a user reads about the keys that only training reads (None for a plancc config)."""
        if self.kind == ConfigFormat.PLANCC:
            return None
        tool = self.kind.capitalize()
        keys = ", ".join(self.ignored) if self.ignored else "none"
        return (f"note: read {path} as a{'n' if self.kind == 'axolotl' else ''} {tool} config: its data keys are "
                f"honoured; training-only keys (optimizer, schedule, LoRA, precision, logging, hardware: they do "
                f"not change the data): {keys}")


def kind_of(data: dict[str, Any]) -> ConfigFormat:
    """Which tool wrote `data`, by its keys (see the module docstring)."""
    entries = data.get("datasets")
    if "base_model" in data or (isinstance(entries, list) and any(isinstance(e, dict) and "type" in e
                                                                   for e in entries)):
        return ConfigFormat.AXOLOTL
    if {"model_name_or_path", "dataset_name", "output_dir"} & set(data):
        return ConfigFormat.TRL
    return ConfigFormat.PLANCC


def translate(data: dict[str, Any], path: Path, config_format: str = "auto",
              known: dict[str, Known] | None = None) -> Imported:
    """`data` (config file `path`'s mapping) as plancc settings, by `config_format` (auto: `kind_of`); `known`:
    the tools' catalogues (`KNOWN`)."""
    if config_format not in tuple(ConfigFormat):
        raise SettingsError(f"--config-format must be one of {', '.join(ConfigFormat)}; got {config_format!r}",
                            "config_format")
    kind = kind_of(data) if config_format == ConfigFormat.AUTO else ConfigFormat(config_format)
    if kind == ConfigFormat.PLANCC:
        return Imported(dict(data))
    reader = Reader(kind, path, (known or KNOWN)[kind])
    settings = axolotl_settings(data, reader) if kind == ConfigFormat.AXOLOTL else trl_settings(data, reader)
    reader.refuse()
    return Imported(settings, kind, reader.noted, reader.spelled)


__all__ = ["KNOWN", "Imported", "Known", "kind_of", "translate"]
