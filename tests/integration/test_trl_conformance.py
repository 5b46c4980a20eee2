"""A TRL `SFTConfig` YAML compiles to the tokens and labels TRL's `SFTTrainer` trains on: per dataset format
(language modeling, prompt-completion, conversational messages, conversational prompt-completion) and loss keys
(`completion_only_loss`, `assistant_only_loss`), compared token for token with the dataset TRL itself prepares
(real chatterbot-corpus conversations, the real DeepSeek tokenizer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import plancc
from plancc.cli import app
from plancc.store.token_store import open_store
from tests.support.sources import (
    DEEPSEEK_JSON,
    GENERATION_CHATML,
    TEMPLATES,
    chatterbot_conversations,
    write_rows,
)

runner = CliRunner()


def tokenizer_dir(root: Path, template: str) -> Path:
    """The DeepSeek tokenizer with `template` as its chat template, saved as a Hugging Face tokenizer folder."""
    d = root / "tok"
    d.mkdir(exist_ok=True)
    shutil.copyfile(DEEPSEEK_JSON, d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<｜begin▁of▁sentence｜>",
        "eos_token": "<｜end▁of▁sentence｜>", "chat_template": template}), encoding="utf-8")
    return d


def _rows(kind: str) -> list[dict]:
    """Real rows in one of TRL's dataset formats."""
    convs = chatterbot_conversations(120)
    if kind == "messages":
        return [{"messages": c} for c in convs]
    if kind == "conversational_pc":
        return [{"prompt": c[:-1], "completion": c[-1:]} for c in convs if c[-1]["role"] == "assistant"]
    pairs = [(c[-2]["content"], c[-1]["content"]) for c in convs if c[-1]["role"] == "assistant"]
    if kind == "prompt_completion":
        return [{"prompt": f"Q: {q}\nA:", "completion": f" {a}"} for q, a in pairs]
    return [{"text": f"{q}\n{a}"} for q, a in pairs]


def plancc_rows(root: Path, rows: list[dict], keys: dict, template: str) -> list[tuple[list[int], list[int]]]:
    """`plancc compile --config sft.yml` of a TRL config naming the rows, the tokenizer and `keys`: each sample's
    input_ids and labels, in source order."""
    root.mkdir(parents=True, exist_ok=True)
    write_rows(root / "train.jsonl", rows)
    tokenizer_dir(root, template)
    config = root / "sft.yml"
    config.write_text(yaml.safe_dump({"model_name_or_path": "tok", "dataset_name": "train.jsonl",
                                      "output_dir": "out", "max_length": 4096, **keys}), encoding="utf-8")
    res = runner.invoke(app, ["compile", "--config", str(config), "-o", str(root / "plan"), "--quiet"])
    assert res.exit_code == 0, res.output
    kept = np.sort(plancc.open_plan(root / "plan").samples_table().column("sample_id").to_numpy())
    store = open_store(root / "plan" / "tokens")
    ids, labels, offsets = store.input_ids, store.labels, store.offsets
    return [(ids[offsets[i]:offsets[i + 1]].tolist(), labels[offsets[i]:offsets[i + 1]].tolist()) for i in kept]


CASES = [  # (format, TRL keys, chat template)
    ("messages", {}, TEMPLATES["chatml"][0]),
    ("messages", {"assistant_only_loss": False}, TEMPLATES["llama3"][0]),
    ("messages", {"completion_only_loss": False}, TEMPLATES["deepseek"][0]),
    ("messages", {"assistant_only_loss": True}, GENERATION_CHATML),
    ("conversational_pc", {}, TEMPLATES["llama3"][0]),
    ("conversational_pc", {"completion_only_loss": False}, TEMPLATES["chatml"][0]),
    ("conversational_pc", {"assistant_only_loss": True}, GENERATION_CHATML),
    ("prompt_completion", {}, TEMPLATES["chatml"][0]),
    ("prompt_completion", {"completion_only_loss": False}, TEMPLATES["chatml"][0]),
    ("text", {}, TEMPLATES["chatml"][0]),
]


@pytest.mark.slow  # builds TRL's SFTTrainer (torch, a tiny model) for each case
@pytest.mark.parametrize(("kind", "keys", "template"), CASES)
def test_a_trl_config_compiles_to_what_sft_trainer_trains(tmp_path, kind, keys, template):
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from tests.support.training import tiny_model

    datasets = pytest.importorskip("datasets")
    rows = _rows(kind)
    ours = plancc_rows(tmp_path, rows, keys, template)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=4096, use_cpu=True, bf16=False, report_to=[],
                     **keys)
    trainer = SFTTrainer(model=tiny_model(vocab=len(tok)), args=args, processing_class=tok,
                         train_dataset=datasets.Dataset.from_list(rows))
    theirs = [(r["input_ids"], r["labels"]) for r in trainer.train_dataset]
    assert len(theirs) == len(ours) == len(rows)
    differing = [i for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) if a != b]
    assert differing == [], f"{len(differing)} of {len(rows)} rows differ, first {differing[0]}"


def test_a_trl_config_trains_every_token_of_a_conversation(tmp_path):
    """Without assistant_only_loss, TRL trains every token of a conversational row, its role markup too."""
    rows = _rows("messages")
    got = plancc_rows(tmp_path, rows, {}, TEMPLATES["chatml"][0])
    assert len(got) == len(rows) and all(ids == labels for ids, labels in got)


def test_a_trl_conversational_prompt_is_trained_only_with_completion_only_loss_false(tmp_path):
    """A conversational prompt/completion trains its completion from where the prompt with its generation prompt
    ends (TRL's default), or every token with `completion_only_loss: false`."""
    from transformers import PreTrainedTokenizerFast

    rows = _rows("conversational_pc")
    template = TEMPLATES["chatml"][0]
    tok = PreTrainedTokenizerFast(tokenizer_file=str(DEEPSEEK_JSON))
    default = plancc_rows(tmp_path / "default", rows, {}, template)
    every = plancc_rows(tmp_path / "every", rows, {"completion_only_loss": False}, template)
    for row, (ids, labels), (_, all_labels) in zip(rows, default, every, strict=True):
        prompt = tok.apply_chat_template(row["prompt"], chat_template=template, add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]
        assert ids[:len(prompt)] == list(prompt)
        assert labels == [-100] * len(prompt) + ids[len(prompt):]
        assert all_labels == ids


@pytest.mark.parametrize(("keys", "refused"), [
    ({"assistant_only_loss": True, "completion_only_loss": False}, "'completion_only_loss' (false with "
                                                                   "assistant_only_loss true"),
])
def test_trl_loss_keys_plancc_cannot_honour_are_one_line(tmp_path, keys, refused):
    config = tmp_path / "sft.yml"
    config.write_text(yaml.safe_dump({"model_name_or_path": "tok", "output_dir": "o", **keys}), encoding="utf-8")
    res = runner.invoke(app, ["compile", "--config", str(config), "-o", str(tmp_path / "plan")])
    assert res.exit_code == 2 and refused in res.output, res.output
    assert not (tmp_path / "plan").exists()
