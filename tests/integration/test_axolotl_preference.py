"""An Axolotl `rl: dpo` config compiles to the token ids and label masks Axolotl 0.19.0 trains on: its own
preference pipeline (strategy, long-pair filter, its DPO trainer's tokenization, TRL's cut to `sequence_len`), run
in its venv by `benchmarks/bench_axolotl_preference.py`'s worker, against `plancc compile --config` of the same
YAML, sequence for sequence.

Axolotl pins its own transformers and TRL, so it runs from a separate venv: `$PLANCC_AXOLOTL_VENV` (default
/tmp/plancc-axolotl-venv, built by `make axolotl-venv`). The test builds it when missing only with
`PLANCC_AXOLOTL_INSTALL=1`, and skips, saying why, when it is not there or cannot be built.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import plancc
from plancc.store.token_store import open_store
from tests.support import REPO
from tests.support.axolotl import axolotl_python as venv_python
from tests.support.preference import instruction_pairs
from tests.support.sources import write_rows

pytestmark = pytest.mark.slow  # runs Axolotl in a subprocess

WORKER = REPO / "benchmarks" / "bench_axolotl_preference.py"
# chatml that renders the bos first, as Llama 3's template does: TRL then adds a second one
BOS_CHATML = ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
              "message['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def axolotl_python() -> Path:
    return venv_python()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """The built-in byte-level tokenizer as a model folder Axolotl loads (bos <|bos|>, which it adds to a text as
    Llama's does, eos <|eos|>)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import LlamaConfig

    from plancc.scan.sources.tokenizer import _builtin

    where = tmp_path_factory.mktemp("model")
    tok = _builtin()
    tok.post_processor = TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>",
                                                                                 tok.token_to_id("<|bos|>"))])
    tok.save(str(where / "tokenizer.json"))
    (where / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
        "pad_token": "<|pad|>"}))
    LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=2, bos_token_id=tok.token_to_id("<|bos|>"),
                eos_token_id=tok.token_to_id("<|eos|>")).save_pretrained(where)
    return where


def _rows(n: int) -> list[dict]:
    """DPO rows of the project's instruction pairs: a system turn on every third, replies as a string or a
    message."""
    out = []
    for i, p in enumerate(instruction_pairs(n, seed=0)):
        messages = [{"role": "user", "content": p["prompt"]}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "Answer briefly."})
        out.append({"conversation": messages, "better": p["chosen"],
                    "worse": {"role": "assistant", "content": p["rejected"]}})
    return out


def _plancc(config: Path, plan: Path) -> list[tuple]:
    opened = plancc.compile(None, plan, config=config, cache_dir=plan.parent / "cache")
    kept = opened.samples_table().column("sample_id").to_numpy()
    store = open_store(plan / "tokens")
    return [(tuple(store.input_ids[store.offsets[i]:store.offsets[i + 1]].tolist()),
             tuple(store.labels[store.offsets[i]:store.offsets[i + 1]].tolist())) for i in kept]


@pytest.mark.parametrize(("template", "sequence_len"), [("chatml", 2048), ("bos_chatml", 2048), ("bos_chatml", 400)])
def test_rl_dpo_config_gives_axolotls_sequences(tmp_path, axolotl_python, model, template, sequence_len):
    src = write_rows(tmp_path / "pairs.jsonl", _rows(40))
    top = "chat_template: chatml\n"
    if template == "bos_chatml":
        (tmp_path / "bos.jinja").write_text(BOS_CHATML)
        top = f"chat_template: jinja\nchat_template_jinja: {tmp_path / 'bos.jinja'}\n"
    config = tmp_path / "axolotl.yml"
    config.write_text(f"base_model: {model}\nrl: dpo\nrl_beta: 0.1\nsequence_len: {sequence_len}\n"
                      f"micro_batch_size: 2\nnum_epochs: 1\nlearning_rate: 0.0001\noutput_dir: {tmp_path / 'out'}\n"
                      f"dataset_prepared_path: {tmp_path / 'prepared'}\n{top}datasets:\n  - path: {src}\n"
                      "    type: chat_template.default\n    field_messages: conversation\n    field_chosen: better\n"
                      "    field_rejected: worse\n")
    env = {**os.environ, "AXOLOTL_DO_NOT_TRACK": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": ""}
    done = subprocess.run([str(axolotl_python), str(WORKER), "--axolotl-worker", str(config),
                           str(tmp_path / "axolotl.jsonl")], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = [(tuple(r["input_ids"]), tuple(r["labels"]))
              for r in map(json.loads, (tmp_path / "axolotl.jsonl").read_text().splitlines())]
    ours = _plancc(config, tmp_path / "plan")
    assert collections.Counter(ours) == collections.Counter(theirs)
    assert theirs and all(np.count_nonzero(np.array(labels) != -100) for _, labels in theirs)
    bos = theirs[0][0][0]
    doubled = template == "bos_chatml"  # the template renders the bos and the tokenizer adds one: both trained on
    assert all((ids[1] == bos) == doubled for ids, _ in theirs)
    if sequence_len == 400:  # Axolotl's long-pair filter dropped some
        assert 0 < len(theirs) < 80 and max(len(ids) for ids, _ in theirs) <= sequence_len
