"""A TRL (`SFTConfig` / `trl sft --config`, or `DPOConfig` / `KTOConfig`) config's data section as plancc settings:
what TRL's trainer would tokenize, label and batch, said in plancc's settings (`plancc.config.foreign` says how a key is read, noted or
refused)."""

from __future__ import annotations

from typing import Any

from plancc.config.foreign_keys import TRL_DPO_AND_KTO, TRL_KTO_ONLY, TRL_PREFERENCE_ONLY
from plancc.config.foreign_reader import TRL_READ, Reader, tokenizer
from plancc.errors import SettingsError


def trl_settings(data: dict[str, Any], reader: Reader) -> dict[str, Any]:
    """The plancc settings of TRL config `data` (every key sorted by `reader`)."""
    preference = [k for k in data if k in TRL_PREFERENCE_ONLY]
    settings = {**tokenizer(data, ("tokenizer_name_or_path", "model_name_or_path")),
                **reader.settings(data, (*TRL_READ, *preference)), **_preference(data, preference, reader)}
    if not preference:
        settings.update(_sft_loss(data, reader))
    if isinstance(data.get("dataset_name"), str):
        split = {"split": data["dataset_train_split"]} if data.get("dataset_train_split") else {}
        settings["datasets"] = [{"path": data["dataset_name"], **split}]
    return settings


def _sft_loss(data: dict[str, Any], reader: Reader) -> dict[str, Any]:
    """What SFTTrainer trains of a conversation: with `assistant_only_loss` the assistant turns, else every token,
    markup too (`train_on all_tokens`; a conversational prompt's by `completion_only_loss`, read as
    train_on_inputs)."""
    if not data.get("assistant_only_loss"):
        return {"train_on": "all_tokens"}
    if data.get("completion_only_loss") is False:
        reader.refuse_value("completion_only_loss", "false with assistant_only_loss true trains the assistant turns "
                            "of a conversational prompt too, which plancc has no setting for: remove it")
    return {"roles_to_train": ["assistant"]}


def _preference(data: dict[str, Any], preference: list[str], reader: Reader) -> dict[str, Any]:
    """A DPOConfig or KTOConfig (`preference`: its keys SFTConfig lacks) plans preference data (docs/preference.md):
    KTO's own keys force the format `unpaired_preference`, DPO's `preference` (keys both have, such as `beta`,
    leave the rows to tell); the loss keys are noted, and SFT's what-is-trained key is refused (a completion is
    always the target, its prompt never). Their data keys are SFTConfig's: `max_length` bounds each completion,
    `per_device_train_batch_size` counts pairs."""
    if not preference:
        return {}
    if data.get("assistant_only_loss") is not None:
        raise SettingsError(f"config file {reader.path}: assistant_only_loss belongs to an SFT config; "
                            f"{preference[0]} makes it a DPO or KTO config, whose completions are always the "
                            "targets and prompts never")
    kto = [k for k in preference if k in TRL_KTO_ONLY]
    dpo = [k for k in preference if k not in TRL_KTO_ONLY and k not in TRL_DPO_AND_KTO]
    if kto and dpo:
        raise SettingsError(f"config file {reader.path}: {kto[0]} is a KTOConfig key and {dpo[0]} a DPOConfig "
                            "key; a config trains one of them")
    reader.noted += preference
    return {"format": "unpaired_preference"} if kto else {"format": "preference"} if dpo else {}
