"""An Axolotl `rl: dpo` or `ipo` config with `type: chat_template.default` compiles as format
`axolotl_preference` (its datasets a recipe of pairs, the fields Axolotl's DPO schema keeps as columns, the loss
keys noted); every other `rl`, type, or entry key that schema drops is one exit-2 line saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

import plancc
from plancc.config.foreign import translate
from plancc.errors import SettingsError
from tests.support import REPO
from tests.support.sources import write_rows

ROWS = [{"conversation": [{"role": "user", "content": f"What is {i} + {i}?"}], "better": str(2 * i),
         "worse": {"role": "assistant", "content": str(2 * i + 1)}} for i in range(8)]
ENTRY = {"type": "chat_template.default", "field_messages": "conversation", "field_chosen": "better",
         "field_rejected": "worse"}


def _config(tmp_path, entry: dict | None = None, **top) -> dict:
    src = write_rows(tmp_path / "pairs.jsonl", ROWS)
    return {"base_model": "builtin", "rl": "dpo", "rl_beta": 0.1, "chat_template": "chatml", "sequence_len": 128,
            "micro_batch_size": 2, "learning_rate": 1e-5, **top, "datasets": [{"path": str(src), **ENTRY,
                                                                                  **(entry or {})}]}


def _compile(tmp_path, config: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "axolotl.yml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "plancc", "compile", "--config", str(path), "-o",
                           str(tmp_path / "plan"), "--cache-dir", str(tmp_path / "cache")], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)


@pytest.mark.parametrize("rl", ["dpo", "ipo"])
def test_an_rl_config_maps_onto_the_axolotl_preference_format(tmp_path, rl):
    config = _config(tmp_path, {"split": "train"}, rl=rl)
    got = translate(config, tmp_path / "a.yml")
    assert got.settings["datasets"] == [{"path": config["datasets"][0]["path"], "format": "axolotl_preference",
                                         "columns": {"messages": "conversation", "chosen": "better",
                                                     "rejected": "worse"}, "split": "train"}]
    assert got.settings["chat_template"] == "chatml" and got.settings["sequence_len"] == 128
    assert {"rl_beta", "learning_rate"} <= set(got.ignored)


def test_an_rl_config_compiles_its_dataset_as_pairs(tmp_path):
    res = _compile(tmp_path, _config(tmp_path))
    assert res.returncode == 0, res.stderr
    plan = plancc.open_plan(tmp_path / "plan")
    manifest = json.loads((tmp_path / "plan" / "manifest.json").read_text())
    assert plan.manifest.data_kind == "preference"
    assert [d["format"] for d in manifest["recipe"]["datasets"]] == ["axolotl_preference"]
    assert plan.samples_table().num_rows == 2 * len(ROWS)


@pytest.mark.parametrize(("entry", "top", "says"), [
    ({}, {"rl": "kto"}, "rl: kto: Axolotl 0.19.0's KTO types"),
    ({}, {"rl": "orpo"}, "rl: orpo: Axolotl 0.19.0 renders ORPO pairs with its chat_template.argilla strategy"),
    ({}, {"rl": "simpo"}, "rl: simpo: Axolotl 0.19.0 trains SimPO with TRL's CPOTrainer"),
    ({}, {"rl": "grpo"}, "rl: grpo: online RL"),
    ({}, {"rl": "dop"}, "rl: dop: unknown; values: dpo, ipo"),
    ({"type": "chatml.intel"}, {}, "has type 'chatml.intel' with rl: dpo, which plancc does not read"),
    ({"message_property_mappings": {"role": "from", "content": "value"}}, {},
     "'datasets[0].message_property_mappings' (Axolotl 0.19.0's DPO dataset schema drops it"),
    ({"roles": {"user": ["human"]}}, {}, "'datasets[0].roles' (Axolotl 0.19.0's DPO dataset schema drops it"),
    ({"chat_template": "llama3"}, {}, "'datasets[0].chat_template' (Axolotl 0.19.0's DPO dataset schema drops it"),
    ({"train_on_eos": "all"}, {}, "'datasets[0].train_on_eos' (Axolotl 0.19.0's DPO dataset schema drops it"),
    ({}, {"excess_length_strategy": "truncate"}, "'excess_length_strategy' (truncate cuts an Axolotl preference"),
    ({"type": "chat_template"}, {"rl": None}, "'datasets[0].field_chosen' (preference pairs (chosen/rejected) are "
                                              "not SFT data: set rl: dpo"),
])
def test_what_axolotl_does_not_train_that_way_is_refused_in_one_line(tmp_path, entry, top, says):
    path = tmp_path / "axolotl.yml"
    path.write_text(yaml.safe_dump(_config(tmp_path, entry, **top)))
    with pytest.raises(SettingsError) as err:
        plancc.compile(None, tmp_path / "plan", config=path, cache_dir=tmp_path / "cache")
    assert says in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "plan").exists()


def test_a_refused_rl_config_exits_2_with_one_line(tmp_path):
    res = _compile(tmp_path, _config(tmp_path, rl="kto"))
    assert res.returncode == 2 and "rl: kto:" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
