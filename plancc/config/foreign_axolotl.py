"""An Axolotl 0.19.0 config's data section as plancc settings: what `axolotl preprocess` would tokenize, label,
drop and batch, said in plancc's settings (`plancc.config.foreign` says how a key is read, noted or refused).

Chat entries (`type: chat_template`) are read as Axolotl's chat_template strategy reads them, whatever plancc's own
defaults are: the messages field named (default `messages`; a source without it is an error), the message keys
named (default `role` and `content`, required in every message), Axolotl's role names (`roles`, or its default
map), its per-turn flag (`message_field_training`, none by default) and its end-of-turn rule (`end_of_turn
tokens`: the eos, or `eot_tokens`, found after a turn's content).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plancc.config import registry
from plancc.config.foreign_keys import AXOLOTL_RL_HONOURED, AXOLOTL_RL_REFUSED, AXOLOTL_RL_TYPES
from plancc.config.foreign_reader import (
    AXOLOTL_ENTRY_READ,
    AXOLOTL_PAIR_FIELDS,
    AXOLOTL_PAIR_READ,
    AXOLOTL_READ,
    AXOLOTL_ROLES,
    BUILTIN_TEMPLATES,
    ENTRY_TYPES,
    SPECIAL,
    Reader,
    tokenizer,
)
from plancc.config.formats import AXOLOTL_TYPES
from plancc.errors import SettingsError

FAST = ("AutoTokenizer", "PreTrainedTokenizerFast")  # tokenizer_type values that load the tokenizer.json
PACKING_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attention_4", "flash_attention_torch",
                     "flex_attention", "xformers", "sage", "kernels-community/flash-attn2",
                     "kernels-community/flash-attn3", "kernels-community/sage-attention")
# Axolotl's legacy attention flags, in its order of priority, and the attn_implementation each means
LEGACY_ATTENTION = {"xformers_attention": "xformers", "sage_attention": "sage", "flex_attention": "flex_attention",
                    "flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager"}
CHAT_ONLY = ("train_on_eos", "train_on_eot", "drop_system_message")  # entry settings of chat_template entries
PAD_MULTIPLE = 64  # Axolotl's collator pads to this multiple unless pad_to_multiple_of or pad_to_sequence_len says


def axolotl_settings(data: dict[str, Any], reader: Reader) -> dict[str, Any]:
    """The plancc settings of Axolotl config `data` (every key sorted by `reader`)."""
    rl = _rl(data, reader)
    settings = {**tokenizer(data, ("tokenizer_config", "base_model_config", "base_model")),
                "max_dropped": 1.0,  # Axolotl drops rows too long or with nothing to train, however many (said)
                "drop_eos_only": True,  # an empty output or text gets no eos in Axolotl: nothing to train
                **reader.settings(data, AXOLOTL_READ), **_tokens(data, reader), **layout(data, reader)}
    _fast_tokenizer(data, reader)
    template = chat_template(data, reader.path)
    if template is not None:
        settings["chat_template"] = template
    for key, target in (("datasets", "datasets"), ("test_datasets", "eval_datasets")):
        entries = data.get(key) or []
        if not isinstance(entries, list):
            raise SettingsError(f"config file {reader.path}: {key} must be a list of datasets, got {entries!r}")
        settings[target] = [_entry(e, f"{key}[{i}]", reader, rl) for i, e in enumerate(entries)]
    return settings


def _rl(data: dict[str, Any], reader: Reader) -> str | None:
    """`rl`: the preference methods whose pairs plancc renders as Axolotl does (`axolotl_preference`); any other
    refused with why. The loss it names (and `rl_beta`, `simpo_gamma`, ...) is the trainer's: noted."""
    rl = data.get("rl")
    if not rl:
        return None
    if rl not in AXOLOTL_RL_HONOURED:
        why = AXOLOTL_RL_REFUSED.get(rl, f"unknown; values: {', '.join([*AXOLOTL_RL_HONOURED, *AXOLOTL_RL_REFUSED])}")
        raise SettingsError(f"config file {reader.path}: rl: {rl}: {why}")
    if data.get("excess_length_strategy") == "truncate":
        reader.refuse_value("excess_length_strategy", "truncate cuts an Axolotl preference reply by decoding a "
                                                      "prefix of its tokens back to text: not reproduced; use drop")
    return str(rl)


def _tokens(data: dict[str, Any], reader: Reader) -> dict[str, Any]:
    """`special_tokens` as plancc's `special_tokens` (bos/eos/pad/unk, in the order given: the order new ones get
    ids in) and `added_special_tokens` (its `additional_special_tokens`)."""
    given = data.get("special_tokens")
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise SettingsError(f"config file {reader.path}: special_tokens must be a mapping (eos_token: ...), got "
                            f"{given!r}")
    out: dict[str, Any] = {}
    named = [(k, v) for k, v in given.items() if k in SPECIAL and v is not None]
    if named:
        out["special_tokens"] = named
    if given.get("additional_special_tokens"):
        out["added_special_tokens"] = given["additional_special_tokens"]
    for key in given:
        if key not in (*SPECIAL, "additional_special_tokens"):
            reader.refuse_value(f"special_tokens.{key}", f"unknown; names are {', '.join(SPECIAL)}, "
                                                          "additional_special_tokens")
    return out


def _fast_tokenizer(data: dict[str, Any], reader: Reader) -> None:
    """plancc reads the tokenizer.json: what Axolotl loads by default (a fast tokenizer); a slow one may differ."""
    if data.get("tokenizer_use_fast") is False:
        reader.refuse_value("tokenizer_use_fast", "false loads the slow tokenizer, whose ids may differ: plancc "
                                                  "reads tokenizer.json; remove it")
    kind = data.get("tokenizer_type")
    if kind is not None and kind not in FAST:
        reader.refuse_value("tokenizer_type", f"{kind} may not be the tokenizer.json's tokenizer: plancc reads "
                                              f"tokenizer.json ({', '.join(FAST)}); remove it")


def _attention(data: dict[str, Any]) -> str | None:
    """Axolotl's attn_implementation: the key, else its first legacy flag set."""
    if data.get("attn_implementation"):
        return str(data["attn_implementation"]).split(":", 1)[0].split("@", 1)[0].strip()
    return next((impl for flag, impl in LEGACY_ATTENTION.items() if data.get(flag)), None)


def layout(data: dict[str, Any], reader: Reader) -> dict[str, Any]:
    """The batch layout keys: flattening, real batches (Axolotl's default: unless the attention packs), padding,
    the update size from `batch_size`, the last batch, the eval layout."""
    out: dict[str, Any] = {}
    packing = bool(data.get("sample_packing"))
    if data.get("batch_flattening") and not packing:
        out["mode"] = "flattened"
    if packing:
        real = data.get("multipack_real_batches")
        out["real_batches"] = bool(real) if real is not None else _attention(data) not in PACKING_ATTENTION
    multiple = data.get("pad_to_multiple_of") or PAD_MULTIPLE
    if data.get("pad_to_sequence_len"):
        sequence_len = data.get("sequence_len") or 2048
        out["pad_multiple"] = multiple * math.ceil(sequence_len / multiple)
    elif data.get("pad_to_sequence_len") is None:
        out["pad_multiple"] = multiple
    if data.get("gradient_accumulation_steps") is None and data.get("batch_size"):
        out["grad_accum"] = max(int(data["batch_size"]) // int(data.get("micro_batch_size") or 1), 1)
    if data.get("dataloader_drop_last") is not None:
        out["drop_last"] = data["dataloader_drop_last"]
    evals = data.get("eval_sample_packing")
    if evals is not None and bool(evals) != packing:
        reader.refuse_value("eval_sample_packing", "an eval layout other than training's is not honoured yet: "
                                                   "remove it (the eval plan then packs as training does)")
    return out


def chat_template(data: dict[str, Any], path: Path) -> str | None:
    """Axolotl's `chat_template` (top level or an entry's): a plancc built-in, the tokenizer's own
    (`tokenizer_default`: None), or `jinja` with `chat_template_jinja` a file or the template's text."""
    name = data.get("chat_template")
    jinja = data.get("chat_template_jinja")
    if name in (None, "tokenizer_default") and jinja is None:
        return None
    if name in BUILTIN_TEMPLATES:
        return name
    if name in (None, "jinja") and isinstance(jinja, str) and jinja:
        return jinja
    raise SettingsError(f"config file {path}: chat_template {name!r} is not one plancc knows; use "
                        f"{', '.join(BUILTIN_TEMPLATES)}, tokenizer_default, or jinja with chat_template_jinja (a "
                        "file, or the template's text)")


def _entry(entry: Any, where: str, reader: Reader, rl: str | None) -> dict[str, Any]:
    """One Axolotl dataset entry as a plancc recipe entry, with its own settings."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path") or entry.get("data_files"), str):
        raise SettingsError(f"config file {reader.path}: {where} needs a path, got {entry!r}")
    source = entry["data_files"] if isinstance(entry.get("data_files"), str) else entry["path"]
    if rl is not None:
        return {"path": source, **_pairs(entry, where, reader, rl)}
    for key in AXOLOTL_PAIR_FIELDS:
        if entry.get(key) is not None:
            reader.refuse_value(f"{where}.{key}", "preference pairs (chosen/rejected) are not SFT data: set rl: "
                                                  "dpo (docs/preference.md)")
    own = reader.settings(entry, AXOLOTL_ENTRY_READ, f"{where}.", entry=True)
    spec = _type(entry, where, reader)
    if spec["format"] != "messages":  # Axolotl reads these for chat_template entries only
        own = {k: v for k, v in own.items() if k not in CHAT_ONLY}
    return {"path": source, **spec, **own}


def _type(entry: dict[str, Any], where: str, reader: Reader) -> dict[str, Any]:
    """The plancc format and field mappings of an entry's `type`."""
    kind = entry.get("type", "alpaca")
    if isinstance(kind, dict):
        columns = {role: kind[f"field_{role}"] for role in ("instruction", "input", "output")
                   if isinstance(kind.get(f"field_{role}"), str) and kind[f"field_{role}"] != role}
        spec = {"format": "alpaca", **({"columns": columns} if columns else {})}
        for key, name in (("format", "prompt_format"), ("no_input_format", "no_input_format")):
            if kind.get(key) is not None:
                spec[name] = kind[key]
        for key in ("field_system", "system_format", "system_prompt"):
            if kind.get(key) is not None:
                reader.refuse_value(f"{where}.type.{key}", "a system prompt in a user-defined type is not honoured "
                                                           "yet: put it in the format")
        return spec
    fmt = AXOLOTL_TYPES.get(kind) if isinstance(kind, str) else None
    if fmt == "text":
        text = entry.get("field", "text")
        return {"format": "text", **({"columns": {"text": text}} if text != "text" else {})}
    if fmt == "messages":
        return _chat(entry, where, reader)
    if fmt is not None:
        return {"format": fmt}
    raise SettingsError(f"config file {reader.path}: {where} has type {kind!r}, which plancc does not read; types: "
                        f"{', '.join(ENTRY_TYPES)}")


def _pairs(entry: dict[str, Any], where: str, reader: Reader, rl: str) -> dict[str, Any]:
    """An `rl` entry of `type: chat_template.default`, as Axolotl 0.19.0 reads it: its DPO dataset schema keeps the
    path, split and the three field names and drops every other key, so its strategy reads the messages' `role`
    and `content` with its default roles and the top-level chat template; a key it drops is refused (it would
    do nothing there)."""
    kind = entry.get("type")
    if kind not in AXOLOTL_RL_TYPES:
        raise SettingsError(f"config file {reader.path}: {where} has type {kind!r} with rl: {rl}, which plancc does "
                            f"not read; types: {', '.join(AXOLOTL_RL_TYPES)} (Axolotl's chat_template.default)")
    own = reader.settings(entry, AXOLOTL_ENTRY_READ, f"{where}.", entry=True)
    spelled = registry.spellings("axolotl", entry=True)
    for key, value in entry.items():
        if value is not None and key not in (*AXOLOTL_PAIR_READ, "split") and (key in AXOLOTL_ENTRY_READ
                                                                              or key in spelled):
            reader.refuse_value(f"{where}.{key}", "Axolotl 0.19.0's DPO dataset schema drops it, so it does nothing "
                                "(messages are read by role and content, roles user, assistant, system, tool, "
                                "with the top-level chat_template): remove it")
    columns = {role: entry.get(f"field_{role}") or role for role in ("messages", "chosen", "rejected")}
    return {"format": "axolotl_preference", "columns": columns, **({"split": own["split"]} if "split" in own else {})}


def _message_keys(entry: dict[str, Any], where: str, reader: Reader) -> dict[str, str]:
    """The message keys of role and content: `message_property_mappings`, or the legacy `message_field_*`."""
    fields = dict(entry.get("message_property_mappings") or {})
    for key in ("role", "content"):
        legacy = entry.get(f"message_field_{key}")
        if legacy is not None and fields.get(key, legacy) != legacy:
            raise SettingsError(f"config file {reader.path}: {where}: message_field_{key} {legacy!r} and "
                                f"message_property_mappings.{key} {fields[key]!r} disagree")
        fields[key] = legacy or fields.get(key) or key
    for key in sorted(set(fields) - {"role", "content"}):
        reader.refuse_value(f"{where}.message_property_mappings.{key}", "plancc maps role and content only")
    return {k: fields[k] for k in ("role", "content")}


def _chat(entry: dict[str, Any], where: str, reader: Reader) -> dict[str, Any]:
    """A `type: chat_template` entry, as Axolotl's strategy reads it (module docstring)."""
    fields = _message_keys(entry, where, reader)
    fields["training"] = entry.get("message_field_training") or ""
    spec: dict[str, Any] = {"format": "messages", "columns": {"messages": entry.get("field_messages") or "messages"},
                            "message_fields": {k: v for k, v in fields.items() if k in ("role", "content", "training")},
                            "end_of_turn": "tokens"}
    roles = _roles(entry, where, reader.path)
    spec["roles"] = roles
    if entry.get("roles_to_train") is not None:
        given = entry["roles_to_train"]
        if not isinstance(given, list) or not all(isinstance(r, str) for r in given):
            raise SettingsError(f"config file {reader.path}: {where}.roles_to_train must be a list of role names, "
                                f"got {given!r}")
        spec["roles_to_train"] = list(dict.fromkeys(roles.get(r, r) for r in given))
    own = chat_template(entry, reader.path)
    if own is not None:
        spec["chat_template"] = own
    if entry.get("split_thinking"):
        spec["split_thinking"] = True
        if entry.get("template_thinking_key"):
            spec["thinking_key"] = entry["template_thinking_key"]
    return spec


def _roles(entry: dict[str, Any], where: str, path: Path) -> dict[str, str]:
    """`roles` (`{role: [source names]}`) as {source name: role}; Axolotl's default map without it."""
    given = entry.get("roles")
    if given is None:
        return dict(AXOLOTL_ROLES)
    if not isinstance(given, dict) or not all(isinstance(v, list) and all(isinstance(s, str) for s in v)
                                              for v in given.values()):
        raise SettingsError(f"config file {path}: {where}.roles must map each role to a list of source names "
                            f"(e.g. assistant: [gpt]), got {given!r}")
    return {source: role for role, sources in given.items() for source in sources}
