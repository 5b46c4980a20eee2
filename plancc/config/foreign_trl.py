"""A TRL (`SFTConfig` / `trl sft --config`) config's data section as plancc settings: what `SFTTrainer` would
tokenize, label and batch, said in plancc's settings (`plancc.config.foreign` says how a key is read, noted or
refused)."""

from __future__ import annotations

from typing import Any

from plancc.config.foreign_keys import TRL_PREFERENCE_ONLY
from plancc.config.foreign_reader import TRL_READ, Reader, tokenizer
from plancc.errors import SettingsError


def trl_settings(data: dict[str, Any], reader: Reader) -> dict[str, Any]:
    """The plancc settings of TRL config `data` (every key sorted by `reader`)."""
    preference = [k for k in data if k in TRL_PREFERENCE_ONLY]
    if preference:
        raise SettingsError(f"config file {reader.path}: {', '.join(preference)} belong to a DPO or KTO config "
                            "(preference or feedback data, not SFT data): plancc does not plan it yet")
    settings = {**tokenizer(data, ("tokenizer_name_or_path", "model_name_or_path")),
                **reader.settings(data, TRL_READ)}
    if not data.get("assistant_only_loss"):  # TRL's default: every token of a conversation, markup too
        settings["train_on"] = "all_tokens"
    elif data.get("completion_only_loss") is False:
        reader.refuse_value("completion_only_loss", "false with assistant_only_loss true trains the assistant turns "
                            "of a conversational prompt too, which plancc has no setting for: remove it")
    else:
        settings["roles_to_train"] = ["assistant"]
    if isinstance(data.get("dataset_name"), str):
        split = {"split": data["dataset_train_split"]} if data.get("dataset_train_split") else {}
        settings["datasets"] = [{"path": data["dataset_name"], **split}]
    return settings
