"""Read an Axolotl or TRL (`SFTConfig` / `trl sft --config`) YAML as it is: its data section as plancc settings.

Users come with a training config already written. Each of their keys is one of:

* a key that means a plancc setting: declared with the setting, as one of its spellings (`axolotl(...)`,
  `trl(...)` in `plancc.config.settings`), with how their value becomes plancc's; top level or a dataset entry's;
* a key read here because it takes more than one key to say (the tokenizer from `tokenizer_config`, else
  `base_model_config`, else `base_model`; a chat template; a dataset entry's `type` and field names);
* a key the tool's catalogue (`KNOWN`) lists: only training reads it (learning rate, LoRA, ...: named in one note),
  or it shapes data in a way plancc cannot honour yet (refused, exit 2, saying what to do);
* any other key: named in the note; once a tool's catalogue is `complete`, refused with a did-you-mean over
  plancc's settings and every key the tool is known to have.

A config is taken for Axolotl's when it has `base_model` or a dataset entry with a `type`, for TRL's when it has
`model_name_or_path`, `dataset_name` or `output_dir`; `--config-format` says so outright. Anything else is a plancc
config, returned as written. The table is in docs/compiling.md, "Axolotl and TRL configs".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from plancc.config import registry
from plancc.config.fields import closest
from plancc.config.formats import AXOLOTL_TYPES
from plancc.core.choices import ConfigFormat
from plancc.errors import SettingsError

BUILTIN_TEMPLATES = ("chatml", "llama3")  # Axolotl chat_template names that are plancc built-ins too
ENTRY_TYPES = (*AXOLOTL_TYPES, "a mapping with field_instruction/field_output/format")
# the keys read here (module docstring), top level and per dataset entry
AXOLOTL_READ = ("tokenizer_config", "base_model_config", "base_model", "datasets", "test_datasets", "chat_template",
                "chat_template_jinja")
AXOLOTL_ENTRY_READ = ("path", "data_files", "type", "field_messages", "message_property_mappings",
                      "message_field_role", "message_field_content", "field", "ds_type")
TRL_READ = ("tokenizer_name_or_path", "model_name_or_path", "dataset_name", "dataset_train_split",
            "assistant_only_loss")


@dataclass(frozen=True)
class Known:
    """A tool's catalogue of the keys that mean no plancc setting: `training_only` (named in the note),
    `unsupported` (`{key: what to do}`: refused), and whether it is `complete` (every key the tool has is a
    setting's spelling, read here, or listed: then any other key is refused as unknown)."""

    training_only: frozenset[str] = frozenset()
    unsupported: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    complete: bool = False


KNOWN: dict[str, Known] = {"axolotl": Known(), "trl": Known()}


@dataclass
class Imported:
    """A config read as plancc settings: `kind` (plancc, axolotl or trl), the keys it did not use, and the key
    that set each setting (`spelled`: `{setting: their key}`, so that a message names what the user wrote)."""

    settings: dict[str, Any]
    kind: str = ConfigFormat.PLANCC
    ignored: list[str] = field(default_factory=list)
    spelled: dict[str, str] = field(default_factory=dict)

    def note(self, path: Path) -> str | None:
        """The one line a user reads about what was not used (None for a plancc config)."""
        if self.kind == ConfigFormat.PLANCC:
            return None
        unused = ", ".join(self.ignored) if self.ignored else "none"
        return (f"note: read {path} as a{'n' if self.kind == 'axolotl' else ''} {self.kind.capitalize()} config "
                f"(its data settings); keys plancc does not use: {unused}")


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
              known: Mapping[str, Known] | None = None) -> Imported:
    """`data` (config file `path`'s mapping) as plancc settings, by `config_format` (auto: `kind_of`); `known`:
    the tools' catalogues (`KNOWN`)."""
    if config_format not in tuple(ConfigFormat):
        raise SettingsError(f"--config-format must be one of {', '.join(ConfigFormat)}; got {config_format!r}",
                            "config_format")
    kind = kind_of(data) if config_format == ConfigFormat.AUTO else ConfigFormat(config_format)
    if kind == ConfigFormat.PLANCC:
        return Imported(dict(data))
    reader = _Reader(kind, path, (known or KNOWN)[kind])
    settings = _axolotl(data, reader) if kind == ConfigFormat.AXOLOTL else _trl(data, reader)
    reader.refuse()
    return Imported(settings, kind, reader.noted, reader.spelled)


@dataclass
class _Reader:
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
                self._other(f"{where}{key}", str(key), entry)
        return out

    def _other(self, shown: str, key: str, entry: bool) -> None:
        if key in self.known.unsupported:
            self.refused.append(f"{shown!r} ({self.known.unsupported[key]})")
        elif key in self.known.training_only or not self.known.complete:
            self.noted.append(shown)
        else:
            close = closest(key, self.vocabulary(entry))
            self.refused.append(f"{shown!r} (unknown" + (f"; did you mean {close!r}?)" if close else ")"))

    def vocabulary(self, entry: bool) -> list[str]:
        """Every key a did-you-mean may suggest: plancc's settings and every key the tool is known to have."""
        read = AXOLOTL_ENTRY_READ if entry else AXOLOTL_READ if self.tool == ConfigFormat.AXOLOTL else TRL_READ
        return sorted({*registry.GIVEN, *registry.spellings(self.tool, entry=entry), *read,
                       *self.known.training_only, *self.known.unsupported})

    def refuse(self) -> None:
        """The error naming every key refused, when there is one."""
        if self.refused:
            raise SettingsError(f"config file {self.path}: {self.tool.capitalize()} key"
                                f"{'s' if len(self.refused) > 1 else ''} plancc cannot honour: "
                                f"{', '.join(self.refused)}")


def _tokenizer(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The first of `keys` set: a local tokenizer directory or a Hub id (read beside the config file when
    something is there)."""
    found = next((data[k] for k in keys if isinstance(data.get(k), str) and data[k]), None)
    return {} if found is None else {"tokenizer": found}


def _axolotl(data: dict[str, Any], reader: _Reader) -> dict[str, Any]:
    if data.get("rl"):
        raise SettingsError(f"config file {reader.path}: rl: {data['rl']} trains on preference or feedback data "
                            "rendered by Axolotl's own prompt strategies, which plancc does not reproduce: compile "
                            "the rows as plancc preference data (prompt, chosen, rejected; docs/preference.md) and "
                            "train with PlanDPOTrainer or PlanKTOTrainer")
    settings = {**_tokenizer(data, ("tokenizer_config", "base_model_config", "base_model")),
                **reader.settings(data, AXOLOTL_READ)}
    template = _axolotl_template(data, reader.path)
    if template is not None:
        settings["chat_template"] = template
    for key, target in (("datasets", "datasets"), ("test_datasets", "eval_datasets")):
        entries = data.get(key) or []
        if not isinstance(entries, list):
            raise SettingsError(f"config file {reader.path}: {key} must be a list of datasets, got {entries!r}")
        settings[target] = [_axolotl_entry(e, f"{key}[{i}]", reader) for i, e in enumerate(entries)]
    return settings


def _axolotl_template(data: dict[str, Any], path: Path) -> str | None:
    """Axolotl's `chat_template`: a plancc built-in, the tokenizer's own (`tokenizer_default`), or `jinja` with
    `chat_template_jinja` a file."""
    name = data.get("chat_template")
    jinja = data.get("chat_template_jinja")
    if name in (None, "tokenizer_default") and jinja is None:
        return None
    if name in BUILTIN_TEMPLATES:
        return name
    if (name in (None, "jinja")) and isinstance(jinja, str):
        if "{%" in jinja or "{{" in jinja:
            raise SettingsError(f"config file {path}: chat_template_jinja holds the template's text; save it as a "
                                "file and give its path")
        return jinja
    raise SettingsError(f"config file {path}: chat_template {name!r} is not one plancc knows; use "
                        f"{', '.join(BUILTIN_TEMPLATES)}, tokenizer_default, or jinja with chat_template_jinja FILE")


def _axolotl_entry(entry: Any, where: str, reader: _Reader) -> dict[str, Any]:
    """One Axolotl dataset entry as a plancc recipe entry, with its own settings (an entry's `roles_to_train`,
    `train_on_eos`, ...: over the top level's)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path") or entry.get("data_files"), str):
        raise SettingsError(f"config file {reader.path}: {where} needs a path, got {entry!r}")
    source = entry["data_files"] if isinstance(entry.get("data_files"), str) else entry["path"]
    own = reader.settings(entry, AXOLOTL_ENTRY_READ, f"{where}.", entry=True)
    spec = {"path": source, **_axolotl_type(entry, where, reader.path), **own}
    reader.noted += [f"{where}.message_property_mappings.{k}" for k in entry.get("message_property_mappings") or {}
                     if k not in ("role", "content")]
    return spec


def _axolotl_type(entry: dict[str, Any], where: str, path: Path) -> dict[str, Any]:
    """The plancc format and field mappings of an entry's `type`."""
    kind = entry.get("type", "alpaca")
    if isinstance(kind, dict):
        columns = {role: kind[f"field_{role}"] for role in ("instruction", "input", "output")
                   if isinstance(kind.get(f"field_{role}"), str) and kind[f"field_{role}"] != role}
        spec = {"format": "alpaca", **({"columns": columns} if columns else {})}
        for key, name in (("format", "prompt_format"), ("no_input_format", "no_input_format")):
            if kind.get(key) is not None:
                spec[name] = kind[key]
        return spec
    fmt = AXOLOTL_TYPES.get(kind) if isinstance(kind, str) else None
    if fmt == "text":
        text = entry.get("field", "text")
        return {"format": "text", **({"columns": {"text": text}} if text != "text" else {})}
    if fmt == "messages":
        spec = {"format": "messages"}
        if entry.get("field_messages", "messages") != "messages":
            spec["columns"] = {"messages": entry["field_messages"]}
        fields = dict(entry.get("message_property_mappings") or {})
        for role in ("role", "content"):
            if entry.get(f"message_field_{role}") is not None:
                fields[role] = entry[f"message_field_{role}"]
        fields = {k: v for k, v in fields.items() if k in ("role", "content") and v != k}
        if fields:
            spec["message_fields"] = fields
        return spec
    if fmt is not None:
        return {"format": fmt}
    raise SettingsError(f"config file {path}: {where} has type {kind!r}, which plancc does not read; types: "
                        f"{', '.join(ENTRY_TYPES)}")


def _trl(data: dict[str, Any], reader: _Reader) -> dict[str, Any]:
    settings = {**_tokenizer(data, ("tokenizer_name_or_path", "model_name_or_path")),
                **reader.settings(data, TRL_READ), **_trl_preference(data, reader.path)}
    if data.get("assistant_only_loss"):
        settings["roles_to_train"] = ["assistant"]
    elif data.get("assistant_only_loss") is False:  # TRL then trains every token of a conversation
        reader.noted.append("assistant_only_loss false (plancc trains the turns of roles_to_train, not a whole "
                           "conversation)")
    if isinstance(data.get("dataset_name"), str):
        split = {"split": data["dataset_train_split"]} if data.get("dataset_train_split") else {}
        settings["datasets"] = [{"path": data["dataset_name"], **split}]
    return settings


def _trl_preference(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A DPOConfig or KTOConfig (a key SFTConfig lacks) plans preference data (docs/preference.md): KTO's keys
    force the format `unpaired_preference`, DPO's `preference` (keys both have, such as `beta`, leave the data to
    tell); the SFT what-is-trained keys mean nothing there and are refused. Read as SFTConfig otherwise: TRL's
    preference trainers share its data keys (`max_length` bounds each completion, `per_device_train_batch_size`
    counts pairs)."""
    from plancc.config.foreign_keys import TRL_DPO_AND_KTO, TRL_KTO_ONLY, TRL_PREFERENCE_ONLY

    preference = [k for k in data if k in TRL_PREFERENCE_ONLY]
    if not preference:
        return {}
    sft = [k for k in ("assistant_only_loss", "completion_only_loss") if data.get(k) is not None]
    if sft:
        raise SettingsError(f"config file {path}: {', '.join(sft)} belong to an SFT config; {preference[0]} makes "
                            "it a DPO or KTO config, whose completions are always the targets and prompts never")
    kto = [k for k in preference if k in TRL_KTO_ONLY]
    dpo = [k for k in preference if k not in TRL_KTO_ONLY and k not in TRL_DPO_AND_KTO]
    if kto and dpo:
        raise SettingsError(f"config file {path}: {kto[0]} is a KTOConfig key and {dpo[0]} a DPOConfig key; a "
                            "config trains one of them")
    return {"format": "unpaired_preference"} if kto else {"format": "preference"} if dpo else {}
