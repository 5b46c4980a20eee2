"""Preference pairs and unpaired feedback are never compiled as SFT: a rejected or undesirable completion would be
taught as a target. Auto-detection compiles them as preference plans (docs/preference.md); an SFT format forced on
them is one exit-2 line saying so, with nothing written. Axolotl and TRL preference configs are not read yet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import plancc
from plancc.errors import InputError, PlanccError, SettingsError
from tests.support import REPO
from tests.support.sources import pc_rows, write_rows

PAIRS = [{"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": str(2 * i + 1)} for i in range(8)]
FEEDBACK = [{**row, "label": i % 2 == 0} for i, row in enumerate(pc_rows(8))]


@pytest.mark.parametrize(("rows", "says"), [
    (PAIRS, "columns chosen and rejected are preference pairs"),
    ([{**r, "messages": [{"role": "user", "content": "hi"}]} for r in PAIRS], "preference pairs"),
    (FEEDBACK, r"a label column beside prompt and completion is unpaired feedback \(KTO\)"),
])
def test_preference_or_feedback_rows_are_refused_as_sft(tmp_path, rows, says):
    src = write_rows(tmp_path / "rows.jsonl", rows)
    for fmt in ("prompt_completion", "messages"):
        with pytest.raises(InputError, match=says):
            plancc.compile(src, tmp_path / "plan", tokenizer="builtin", chat_template="chatml", sequence_len=64,
                           format=fmt, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "plan").exists()


def test_an_axolotl_rl_config_is_refused(tmp_path):
    src = write_rows(tmp_path / "rows.jsonl", PAIRS)
    axolotl = tmp_path / "dpo.yml"
    axolotl.write_text(f"base_model: builtin\nrl: dpo\ndatasets:\n  - path: {src}\n    type: chat_template.default\n")
    with pytest.raises(SettingsError, match="rl: dpo trains on preference or feedback data rendered by Axolotl"):
        plancc.compile(None, tmp_path / "plan", config=axolotl, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "plan").exists()


def _trl_config(tmp_path, extra: str) -> Path:
    path = tmp_path / "trl.yml"
    path.write_text(f"model_name_or_path: builtin\noutput_dir: out\nmax_length: 64\n"
                    f"per_device_train_batch_size: 2\n{extra}")
    return path


@pytest.mark.parametrize(("rows", "extra", "kind"), [
    (PAIRS, "beta: 0.1\nloss_type: [sigmoid]\n", "preference"),
    (PAIRS, "f_divergence_type: reverse_kl\n", "preference"),
    (FEEDBACK, "beta: 0.1\ndesirable_weight: 1.0\n", "unpaired_preference"),
])
def test_a_trl_dpo_or_kto_config_plans_its_preference_data(tmp_path, rows, extra, kind):
    src = write_rows(tmp_path / "rows.jsonl", rows)
    plan = plancc.compile(src, tmp_path / "plan", config=_trl_config(tmp_path, extra), cache_dir=tmp_path / "cache")
    assert plan.manifest.data_kind == kind and plan.settings.sequence_len == 64
    assert plan.settings.micro_batch_size == 2  # pairs a microbatch, as TRL's per_device_train_batch_size


def test_a_trl_dpo_config_naming_its_dataset_plans_it_as_a_recipe_of_pairs(tmp_path):
    src = write_rows(tmp_path / "rows.jsonl", PAIRS)
    plan = plancc.compile(None, tmp_path / "plan", config=_trl_config(tmp_path, f"beta: 0.1\ndataset_name: {src}\n"),
                          cache_dir=tmp_path / "cache")
    assert plan.manifest.data_kind == "preference" and plan.manifest.recipe["datasets"][0]["pairs"] == len(PAIRS)


@pytest.mark.parametrize(("rows", "extra", "says"), [
    (pc_rows(8), "desirable_weight: 1.0\n", "unpaired_preference"),  # a KTO config on SFT rows
    (PAIRS, "desirable_weight: 1.0\nloss_weights: [1.0]\n", "desirable_weight is a KTOConfig key and loss_weights"),
    (PAIRS, "beta: 0.1\nassistant_only_loss: true\n", "assistant_only_loss belongs to an SFT config"),
])
def test_a_trl_preference_config_that_cannot_hold_is_refused(tmp_path, rows, extra, says):
    src = write_rows(tmp_path / "rows.jsonl", rows)
    config = _trl_config(tmp_path, extra.format(src=src))
    with pytest.raises(PlanccError, match=says):
        plancc.compile(src, tmp_path / "plan", config=config, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "plan").exists()


def test_auto_detection_compiles_them_as_preference_plans(tmp_path):
    for rows, kind in ((PAIRS, "preference"), (FEEDBACK, "unpaired_preference")):
        plan = plancc.compile(write_rows(tmp_path / f"{kind}.jsonl", rows), tmp_path / kind, tokenizer="builtin",
                              sequence_len=64, cache_dir=tmp_path / "cache")
        assert plan.manifest.data_kind == kind and plan.scan_record.format == kind


def test_the_command_says_it_in_one_line(tmp_path):
    src = write_rows(tmp_path / "rows.jsonl", FEEDBACK)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PLANCC_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "plancc", "compile", str(src), "-o", str(tmp_path / "plan"),
                           "--tokenizer", "builtin", "--sequence-len", "64", "--format", "prompt_completion",
                           "--quiet"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "unpaired feedback (KTO)" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "plan").exists()
