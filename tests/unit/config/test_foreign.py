"""Configs as users bring them: every unknown key reported at once with the plancc spelling of Axolotl's and Hugging
Face's names, paths read beside the config file, and an Axolotl or TRL YAML compiled as it is into the plan its
settings describe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import plancc
from plancc.config.resolve import read_config
from plancc.errors import SettingsError
from tests.support import REPO
from tests.support.sources import alpaca_rows, write_rows

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "plancc", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def test_every_unknown_key_is_reported_at_once_with_its_plancc_name(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("gradient_accumulation_steps: 4\nnum_epochs: 2\nsample_packing: true\nmax_seq_length: 2048\n"
                      "micro_batch_sise: 2\nseed: 3\n")
    with pytest.raises(SettingsError) as err:
        read_config(config)
    message = str(err.value)
    assert "\n" not in message
    for part in ("'gradient_accumulation_steps' (plancc: grad_accum)", "'num_epochs' (plancc: epochs)",
                 "'sample_packing' (plancc: mode = \"packed\")", "'max_seq_length' (plancc: sequence_len)",
                 "'micro_batch_sise' (did you mean 'micro_batch_size'?)", "--config-format axolotl or trl"):
        assert part in message


def test_relative_paths_resolve_beside_the_config_file(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    write_rows(project / "data" / "chat.jsonl", [{"messages": [{"role": "user", "content": f"hi {i}"},
                                                               {"role": "assistant", "content": "yo"}]}
                                                 for i in range(6)])
    (project / "chat.jinja").write_text(CHATML)
    (project / "plancc.toml").write_text('tokenizer = "builtin"\nchat_template = "chat.jinja"\nsequence_len = 128\n'
                                         '[[datasets]]\npath = "data/chat.jsonl"\nchat_template = "chat.jinja"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert read_config(project / "plancc.toml").settings["chat_template"] == str(project / "chat.jinja")
    plan = plancc.compile(None, tmp_path / "plan", config=project / "plancc.toml", cache_dir=tmp_path / "cache")
    assert plan.scan_record.chat_template.name == str((project / "chat.jinja").resolve())


def _axolotl(tmp_path: Path) -> Path:
    """A realistic Axolotl config: an alpaca dataset and a chat dataset with its own field names."""
    data = tmp_path / "data"
    data.mkdir()
    write_rows(data / "alpaca.jsonl", alpaca_rows(20))
    write_rows(data / "chat.jsonl", [{"conversation": [{"speaker": "user", "text": f"question {i}"},
                                                       {"speaker": "assistant", "text": "answer " * (1 + i % 5)}]}
                                     for i in range(16)])
    config = {
        "base_model": "builtin", "load_in_8bit": False, "adapter": "lora", "lora_r": 16,
        "datasets": [
            {"path": "data/alpaca.jsonl", "type": "alpaca", "ds_type": "json"},
            {"path": "data/chat.jsonl", "type": "chat_template", "field_messages": "conversation",
             "message_property_mappings": {"role": "speaker", "content": "text"}},
        ],
        "chat_template": "chatml", "dataset_prepared_path": "last_run_prepared", "output_dir": "./outputs/out",
        "sequence_len": 256, "sample_packing": True, "pad_to_sequence_len": True,
        "micro_batch_size": 2, "gradient_accumulation_steps": 3, "num_epochs": 2, "seed": 7,
        "learning_rate": 2e-4, "optimizer": "adamw_torch", "lr_scheduler": "cosine", "bf16": "auto",
    }
    path = tmp_path / "axolotl.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _plancc_equivalent(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text('tokenizer = "builtin"\nchat_template = "chatml"\nsequence_len = 256\nmode = "packed"\n'
                    'micro_batch_size = 2\ngrad_accum = 3\nepochs = 2\nseed = 7\n'
                    'real_batches = true\npad_multiple = 256\n'  # Axolotl's defaults without flash attention
                    '[[datasets]]\npath = "data/alpaca.jsonl"\nformat = "alpaca"\n'
                    '[[datasets]]\npath = "data/chat.jsonl"\nformat = "messages"\n'
                    'columns = {messages = "conversation"}\n'
                    'message_fields = {role = "speaker", content = "text", training = ""}\n'
                    'roles = {human = "user", user = "user", gpt = "assistant", assistant = "assistant", '
                    'system = "system", tool = "tool"}\nend_of_turn = "tokens"\n')
    return path


def test_an_axolotl_config_compiles_to_the_plan_its_settings_describe(tmp_path):
    res = _cli("compile", "--config", "axolotl.yml", "-o", "plan", "--cache-dir", "cache", cwd=_axolotl(tmp_path).parent)
    assert res.returncode == 0, res.stderr
    notes = [line for line in res.stderr.splitlines() if line.startswith("note: read axolotl.yml as an Axolotl")]
    assert len(notes) == 1
    ignored = notes[0].split("do not change the data): ")[1].split(", ")
    assert sorted(ignored) == sorted(["load_in_8bit", "adapter", "lora_r", "dataset_prepared_path", "output_dir",
                                      "learning_rate", "optimizer", "lr_scheduler", "bf16"])
    manifest = json.loads((tmp_path / "plan" / "manifest.json").read_text())
    settings = manifest["settings"]
    assert (settings["sequence_len"], settings["micro_batch_size"], settings["grad_accum"], settings["epochs"],
            settings["seed"], settings["mode"]) == (256, 2, 3, 2, 7, "packed")
    assert [(e[0], e[2], e[3]) for e in settings["mixture"]] == [("alpaca", "repeat", 1.0), ("chat", "repeat", 1.0)]
    # the same plan, byte for byte, as the plancc recipe saying the same
    plancc.compile(None, tmp_path / "same", config=_plancc_equivalent(tmp_path), cache_dir=tmp_path / "cache")
    same = json.loads((tmp_path / "same" / "manifest.json").read_text())
    assert manifest["fingerprints"]["dataset"]
    assert same["fingerprints"] == manifest["fingerprints"]


def test_axolotl_entries_map_types_and_fields(tmp_path):
    config = tmp_path / "a.yml"
    config.write_text(yaml.safe_dump({
        "base_model": "org/model", "sample_packing": False,
        "datasets": [{"path": "a.jsonl", "type": {"field_instruction": "q", "field_output": "a",
                                                  "format": "### Q: {instruction}\n### A: ", "no_input_format":
                                                  "### Q: {instruction}\n### A: "}},
                     {"path": "b.jsonl", "type": "completion", "field": "body", "split": "train"}],
        "test_datasets": [{"path": "c.jsonl", "type": "alpaca"}],
        "chat_template": "jinja", "chat_template_jinja": "templates/chat.jinja"}))
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "chat.jinja").write_text(CHATML)
    got = read_config(config)
    assert got.settings["tokenizer"] == "org/model" and got.settings["mode"] == "padded"
    assert got.settings["chat_template"] == str(tmp_path / "templates" / "chat.jinja")  # beside the config
    assert got.train == [
        {"path": "a.jsonl", "format": "alpaca", "columns": {"instruction": "q", "output": "a"},
         "prompt_format": "### Q: {instruction}\n### A: ", "no_input_format": "### Q: {instruction}\n### A: "},
        {"path": "b.jsonl", "split": "train", "format": "text", "columns": {"text": "body"}}]
    assert got.evals == [{"path": "c.jsonl", "format": "alpaca"}]


@pytest.mark.parametrize(("config", "message"), [
    ({"base_model": "m", "datasets": [{"path": "a.jsonl", "type": "alpaca_chat"}]},
     "datasets[0] has type 'alpaca_chat', which plancc does not read; types: alpaca, chat_template, completion"),
    ({"base_model": "m", "chat_template": "gemma3", "datasets": []}, "chat_template 'gemma3' is not one plancc knows"),
    ({"base_model": "m", "datasets": [{"type": "alpaca"}]}, "datasets[0] needs a path"),
    ({"base_model": "m", "sequnce_len": 2048, "datasets": []},
     "'sequnce_len' (unknown; did you mean 'sequence_len'?)"),
])
def test_axolotl_values_plancc_cannot_read_are_one_line(tmp_path, config, message):
    path = tmp_path / "a.yml"
    path.write_text(yaml.safe_dump(config))
    res = _cli("compile", "--config", path, "-o", tmp_path / "plan", cwd=tmp_path)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_trl_sft_config_maps_its_keys(tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({
        "model_name_or_path": "Qwen/Qwen2.5-0.5B", "dataset_name": "trl-lib/Capybara", "output_dir": "out",
        "max_length": 1024, "packing": True, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 8,
        "num_train_epochs": 3.0, "dataset_text_field": "body", "learning_rate": 2e-5, "seed": 42}))
    read = read_config(config)
    got = {**read.settings, "datasets": read.train}
    assert {k: got[k] for k in ("tokenizer", "sequence_len", "mode", "micro_batch_size", "grad_accum", "epochs",
                                "seed", "columns")} == {
        "tokenizer": "Qwen/Qwen2.5-0.5B", "sequence_len": 1024, "mode": "packed", "micro_batch_size": 4,
        "grad_accum": 8, "epochs": 3, "seed": 42, "columns": {"text": "body"}}
    assert got["datasets"] == [{"path": "trl-lib/Capybara"}]
    assert "learning_rate" not in got


def test_axolotl_masking_keys_map_onto_the_what_is_trained_settings(tmp_path):
    """train_on_inputs (top level) and an entry's roles_to_train (its source names mapped by Axolotl's roles),
    train_on_eos and train_on_eot keep their meaning; a chat entry reads as Axolotl's strategy reads it."""
    from plancc.config.foreign import translate

    data = {"base_model": "m", "train_on_inputs": True, "eot_tokens": ["<|im_end|>"],
            "datasets": [{"path": "a.jsonl", "type": "chat_template", "roles_to_train": ["gpt", "human"],
                          "train_on_eos": "all", "train_on_eot": "all", "field_messages": "dialog",
                          "message_property_mappings": {"role": "from", "content": "value"}}]}
    got = translate(data, tmp_path / "a.yml")
    assert got.settings["train_on_inputs"] is True and got.settings["eot_tokens"] == ["<|im_end|>"]
    [entry] = got.settings["datasets"]
    assert entry["roles_to_train"] == ["assistant", "user"] and entry["roles"]["gpt"] == "assistant"
    assert {k: entry[k] for k in ("format", "columns", "message_fields", "end_of_turn", "train_on_eos",
                                  "train_on_eot")} == {
        "format": "messages", "columns": {"messages": "dialog"},
        "message_fields": {"role": "from", "content": "value", "training": ""}, "end_of_turn": "tokens",
        "train_on_eos": "all", "train_on_eot": "all"}
    assert got.ignored == []


@pytest.mark.parametrize(("data", "refused"), [
    ({"train_on_eos": "last"}, "'train_on_eos' (a key of each dataset entry in Axolotl: set it on the entries)"),
    ({"val_set_size": 0.05}, "'val_set_size' (not honoured yet: holds out the last rows of Axolotl's shuffled merge"),
    ({"grad_accum": 4}, "'grad_accum' (a plancc setting, not an Axolotl key"),
    ({"sequnce_len": 2048}, "'sequnce_len' (unknown; did you mean 'sequence_len'?)"),
    ({"dataset_exact_deduplication": True}, "'dataset_exact_deduplication' (not honoured yet: drops every prepared "
                                            "row whose tokens and labels repeat"),
    ({"datasets": [{"path": "a.jsonl", "type": "chat_template", "feild_messages": "x"}]},
     "'datasets[0].feild_messages' (unknown; did you mean 'field_messages'?)"),
    ({"datasets": [{"path": "a.jsonl", "type": "chat_template", "message_field_training_detail": "d"}]},
     "'datasets[0].message_field_training_detail' (not honoured yet: per-turn character spans"),
])
def test_axolotl_keys_plancc_cannot_honour_are_refused(tmp_path, data, refused):
    from plancc.config.foreign import translate

    with pytest.raises(SettingsError) as err:
        translate({"base_model": "m", **data}, tmp_path / "a.yml")
    assert refused in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_axolotl_keys_at_values_that_change_nothing_are_accepted(tmp_path):
    from plancc.config.foreign import translate

    got = translate({"base_model": "m", "val_set_size": 0, "min_sample_len": 2, "curriculum_sampling": False,
                     "shuffle_merged_datasets": True, "default_system_message": "Be brief.", "lora_r": 8,
                     "dataset_exact_deduplication": False}, tmp_path / "a.yml")
    assert got.ignored == ["lora_r"]


@pytest.mark.parametrize(("strategy", "long"), [("drop", "drop"), ("truncate", "truncate"), ("raise", "error"),
                                                ("Truncate", "truncate")])
def test_axolotl_excess_length_strategy_and_dataset_num_proc_are_read(tmp_path, strategy, long):
    """What Axolotl does with a row over sequence_len is `long` (its raise is plancc's error); its
    dataset_num_proc, like dataset_processes, is num_proc."""
    from plancc.config.resolve import resolve

    config = tmp_path / "a.yml"
    config.write_text(f"base_model: m\nexcess_length_strategy: {strategy}\ndataset_num_proc: 3\n")
    got = resolve(config=config, recipe_allowed=False)
    assert got.scan.long == long and got.run.num_proc == 3


def test_trl_loss_keys_map_onto_train_on_inputs_roles_to_train_and_train_on(tmp_path):
    """completion_only_loss is not train_on_inputs; assistant_only_loss true trains the assistant turns, false or
    unset every token of a conversation (TRL's loss: train_on all_tokens); true beside completion_only_loss false is
    refused, naming it."""
    from plancc.config.foreign import translate

    for value in (True, False):
        trl = translate({"output_dir": "o", "completion_only_loss": value}, tmp_path / "sft.yaml")
        assert trl.kind == "trl" and trl.settings["train_on_inputs"] is (not value)
        assert trl.settings["train_on"] == "all_tokens"
    only = translate({"output_dir": "o", "assistant_only_loss": True}, tmp_path / "sft.yaml")
    assert only.settings["roles_to_train"] == ["assistant"] and only.ignored == ["output_dir"]
    assert "train_on" not in only.settings
    every = translate({"output_dir": "o", "assistant_only_loss": False}, tmp_path / "sft.yaml")
    assert every.settings["train_on"] == "all_tokens" and "roles_to_train" not in every.settings
    with pytest.raises(SettingsError, match=r"'completion_only_loss' \(false with assistant_only_loss true"):
        translate({"output_dir": "o", "assistant_only_loss": True, "completion_only_loss": False},
                  tmp_path / "sft.yaml")


def test_axolotl_datasets_each_train_by_their_own_keys(tmp_path):
    """Two entries with different train_on_eos/roles_to_train each keep theirs through the recipe (Axolotl sets
    them per dataset only); an entry without its own has Axolotl's defaults."""
    from plancc.config.foreign import translate
    from plancc.config.recipe import dataset_spec
    from plancc.config.settings import ScanOptions

    entries = [{"path": "a.jsonl", "type": "chat_template", "train_on_eos": "turn"},
               {"path": "b.jsonl", "type": "chat_template", "train_on_eos": "all", "roles_to_train": ["human"]},
               {"path": "c.jsonl", "type": "chat_template"}]
    got = translate({"base_model": "m", "datasets": entries}, tmp_path / "a.yml")
    opts = [dataset_spec(e).scan_options(ScanOptions()) for e in got.settings["datasets"]]
    assert [(o.train_on_eos, o.roles_to_train) for o in opts] == [
        ("turn", ("assistant",)), ("all", ("user",)), ("turn", ("assistant",))]


def test_config_format_without_a_config_is_an_error(tmp_path):
    src = write_rows(tmp_path / "d.jsonl", [{"text": "hi"}])
    res = _cli("scan", src, "-o", tmp_path / "s", "--tokenizer", "builtin", "--config-format", "axolotl", cwd=tmp_path)
    assert res.returncode == 2 and "--config-format axolotl describes a --config file" in res.stderr, res.stderr


def test_the_catalogue_says_what_the_reader_does():
    """A key catalogued as honoured is one the reader reads (a setting's spelling, or read for the recipe), and
    every key read is catalogued as honoured: a key listed as honoured but refused as unknown, or read and
    silently dropped while listed as refused, is a catalogue that lies."""
    from plancc.config import foreign_keys as fk
    from plancc.config import registry
    from plancc.config.foreign_reader import AXOLOTL_ENTRY_READ, AXOLOTL_READ, TRL_READ

    read = {"top": {*registry.spellings("axolotl"), *AXOLOTL_READ},
            "entry": {*registry.spellings("axolotl", entry=True), *AXOLOTL_ENTRY_READ},
            "trl": {*registry.spellings("trl"), *TRL_READ}}
    honoured = {"top": set(fk.AXOLOTL_HONOURED), "entry": set(fk.AXOLOTL_DATASET_HONOURED),
                "trl": set(fk.TRL_HONOURED)}
    for where in read:
        assert read[where] == honoured[where], (where, read[where] ^ honoured[where])
