"""Read an Axolotl or TRL (`SFTConfig` / `trl sft --config`) YAML as it is: its data section as plancc settings.

Users come with a training config already written; the keys that decide which tokens a model sees and how they are
batched map onto plancc's (the table in docs/compiling.md, "Axolotl and TRL configs"), and the training keys plancc
has no use for (learning rate, optimizer, LoRA, ...) are listed in one note, not refused. A config is taken for
Axolotl's when it has `base_model` or a dataset entry with a `type`, for TRL's when it has `model_name_or_path`,
`dataset_name` or `output_dir`; `--config-format` says so outright. Anything else is a plancc config, returned
as written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancc.errors import SettingsError

CONFIG_FORMATS = ("auto", "plancc", "axolotl", "trl")
BUILTIN_TEMPLATES = ("chatml", "llama3")  # Axolotl chat_template names that are plancc built-ins too

# top-level keys that are the same setting under another name: {their key: plancc setting}
AXOLOTL_KEYS = {"sequence_len": "sequence_len", "micro_batch_size": "micro_batch_size",
                "gradient_accumulation_steps": "grad_accum", "num_epochs": "epochs", "seed": "seed",
                "val_set_size": "val_set_size", "train_on_inputs": "train_on_inputs",
                "roles_to_train": "roles_to_train", "train_on_eos": "train_on_eos",
                "dataset_processes": "num_proc"}
TRL_KEYS = {"max_length": "sequence_len", "max_seq_length": "sequence_len",
            "per_device_train_batch_size": "micro_batch_size", "gradient_accumulation_steps": "grad_accum",
            "num_train_epochs": "epochs", "seed": "seed", "dataset_num_proc": "num_proc",
            "chat_template_path": "chat_template"}
ENTRY_OWN = ("roles_to_train", "train_on_eos")  # what an Axolotl entry trains: the recipe entry's own keys too
# per-dataset keys of an Axolotl entry that become the entry's own (recipe) keys
ENTRY_KEYS = {"path", "split", "type", "field_messages", "message_property_mappings", "message_field_role",
              "message_field_content", *ENTRY_OWN, "field", "data_files", "ds_type"}
ENTRY_TYPES = ("alpaca", "chat_template", "completion", "a mapping with field_instruction/field_output/format")


@dataclass
class Imported:
    """A config read as plancc settings: `kind` (plancc, axolotl or trl) and the keys it did not use."""

    settings: dict[str, Any]
    kind: str = "plancc"
    ignored: list[str] = field(default_factory=list)

    def note(self, path: Path) -> str | None:
        """The one line a user reads about what was not used (None for a plancc config)."""
        if self.kind == "plancc":
            return None
        unused = ", ".join(self.ignored) if self.ignored else "none"
        return (f"note: read {path} as a{'n' if self.kind == 'axolotl' else ''} {self.kind.capitalize()} config "
                f"(its data settings); keys plancc does not use: {unused}")


def kind_of(data: dict[str, Any]) -> str:
    """Which tool wrote `data`, by its keys (see the module docstring)."""
    entries = data.get("datasets")
    if "base_model" in data or (isinstance(entries, list) and any(isinstance(e, dict) and "type" in e
                                                                   for e in entries)):
        return "axolotl"
    if {"model_name_or_path", "dataset_name", "output_dir"} & set(data):
        return "trl"
    return "plancc"


def translate(data: dict[str, Any], path: Path, config_format: str = "auto") -> Imported:
    """`data` (config file `path`'s mapping) as plancc settings, by `config_format` (auto: `kind_of`)."""
    if config_format not in CONFIG_FORMATS:
        raise SettingsError(f"--config-format must be one of {', '.join(CONFIG_FORMATS)}; got {config_format!r}",
                            "config_format")
    kind = kind_of(data) if config_format == "auto" else config_format
    if kind == "axolotl":
        return _axolotl(data, path)
    if kind == "trl":
        return _trl(data, path)
    return Imported(dict(data))


def _mapped(out: Imported, name: str, value: Any, key: str) -> None:
    """Set plancc setting `name` from their `key` (every name the key tables map to is a plancc setting, a test
    holds them to that)."""
    out.settings[name] = value


def _tokenizer(data: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first of `keys` set: a local tokenizer directory or a Hub id (`load_config_file` reads a relative one
    beside the config file)."""
    return next((data[k] for k in keys if isinstance(data.get(k), str) and data[k]), None)


def _axolotl(data: dict[str, Any], path: Path) -> Imported:
    if data.get("rl"):
        raise SettingsError(f"config file {path}: rl: {data['rl']} trains on preference or feedback data, not SFT "
                            "data: plancc does not plan it yet (an SFT config has no rl key)")
    out = Imported({}, "axolotl")
    tokenizer = _tokenizer(data, ("tokenizer_config", "base_model_config", "base_model"))
    if tokenizer is not None:
        out.settings["tokenizer"] = tokenizer
    used = {"tokenizer_config", "base_model_config", "base_model", "datasets", "test_datasets", "chat_template",
            "chat_template_jinja", "sample_packing"}
    for key, value in data.items():
        if key in AXOLOTL_KEYS:
            _mapped(out, AXOLOTL_KEYS[key], value, key)
        elif key not in used:
            out.ignored.append(key)
    if "sample_packing" in data:
        out.settings["mode"] = "packed" if data["sample_packing"] else "padded"
    template = _axolotl_template(data, path)
    if template is not None:
        out.settings["chat_template"] = template
    for key, target in (("datasets", "datasets"), ("test_datasets", "eval_datasets")):
        entries = data.get(key) or []
        if not isinstance(entries, list):
            raise SettingsError(f"config file {path}: {key} must be a list of datasets, got {entries!r}")
        out.settings[target] = [_axolotl_entry(e, f"{key}[{i}]", path, out) for i, e in enumerate(entries)]
    return out


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


def _axolotl_entry(entry: Any, where: str, path: Path, out: Imported) -> dict[str, Any]:
    """One Axolotl dataset entry as a plancc recipe entry, with its own roles_to_train and train_on_eos (a recipe
    entry's what-is-trained settings, over the top level's)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path") or entry.get("data_files"), str):
        raise SettingsError(f"config file {path}: {where} needs a path, got {entry!r}")
    source = entry["data_files"] if isinstance(entry.get("data_files"), str) else entry["path"]
    spec: dict[str, Any] = {"path": source}
    if entry.get("split") is not None:
        spec["split"] = entry["split"]
    spec.update(_axolotl_type(entry, where, path))
    spec.update({k: entry[k] for k in ENTRY_OWN if entry.get(k) is not None})
    out.ignored += [f"{where}.{k}" for k in entry if k not in ENTRY_KEYS]
    out.ignored += [f"{where}.message_property_mappings.{k}" for k in entry.get("message_property_mappings") or {}
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
    if kind == "alpaca":
        return {"format": "alpaca"}
    if kind == "completion":
        text = entry.get("field", "text")
        return {"format": "text", **({"columns": {"text": text}} if text != "text" else {})}
    if kind == "chat_template":
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
    raise SettingsError(f"config file {path}: {where} has type {kind!r}, which plancc does not read; types: "
                        f"{', '.join(ENTRY_TYPES)}")


def _trl(data: dict[str, Any], path: Path) -> Imported:
    from plancc.config.foreign_keys import TRL_PREFERENCE_ONLY

    preference = [k for k in data if k in TRL_PREFERENCE_ONLY]
    if preference:
        raise SettingsError(f"config file {path}: {', '.join(preference)} belong to a DPO or KTO config (preference "
                            "or feedback data, not SFT data): plancc does not plan it yet")
    out = Imported({}, "trl")
    tokenizer = _tokenizer(data, ("tokenizer_name_or_path", "model_name_or_path"))
    if tokenizer is not None:
        out.settings["tokenizer"] = tokenizer
    used = {"tokenizer_name_or_path", "model_name_or_path", "packing", "dataset_name", "dataset_train_split",
            "dataset_text_field", "completion_only_loss", "assistant_only_loss"}
    for key, value in data.items():
        if key in TRL_KEYS:
            number = int(value) if key == "num_train_epochs" and isinstance(value, float) and value.is_integer() \
                else value
            _mapped(out, TRL_KEYS[key], number, key)
        elif key not in used:
            out.ignored.append(key)
    if "packing" in data:
        out.settings["mode"] = "packed" if data["packing"] else "padded"
    if data.get("dataset_text_field", "text") != "text":
        out.settings["columns"] = {"text": data["dataset_text_field"]}
    if data.get("completion_only_loss") is not None:
        _mapped(out, "train_on_inputs", not data["completion_only_loss"], "completion_only_loss")
    if data.get("assistant_only_loss"):
        out.settings["roles_to_train"] = ["assistant"]
    elif data.get("assistant_only_loss") is False:  # TRL then trains every token of a conversation
        out.ignored.append("assistant_only_loss false (plancc trains the turns of roles_to_train, not a whole "
                           "conversation)")
    if isinstance(data.get("dataset_name"), str):
        split = {"split": data["dataset_train_split"]} if data.get("dataset_train_split") else {}
        out.settings["datasets"] = [{"path": data["dataset_name"], **split}]
    return out
