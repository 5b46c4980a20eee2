"""Preference pairs and unpaired feedback are never compiled as SFT: a rejected or undesirable completion would be
taught as a target. Until preference plans land, each is one exit-2 line saying so, with nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import plancc
from plancc.errors import InputError, SettingsError
from tests.sources_fixtures import pc_rows, write_rows

PAIRS = [{"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": str(2 * i + 1)} for i in range(8)]
FEEDBACK = [{**row, "label": i % 2 == 0} for i, row in enumerate(pc_rows(8))]


@pytest.mark.parametrize(("rows", "says"), [
    (PAIRS, "columns chosen and rejected are preference pairs"),
    ([{**r, "messages": [{"role": "user", "content": "hi"}]} for r in PAIRS], "preference pairs"),
    (FEEDBACK, r"a label column beside prompt and completion is unpaired feedback \(KTO\)"),
])
def test_preference_or_feedback_rows_are_refused(tmp_path, rows, says):
    src = write_rows(tmp_path / "rows.jsonl", rows)
    for fmt in ("auto", "prompt_completion", "messages"):
        with pytest.raises(InputError, match=says):
            plancc.compile(src, tmp_path / "plan", tokenizer="builtin", chat_template="chatml", sequence_len=64,
                           format=fmt, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "plan").exists()


def test_an_axolotl_rl_config_or_a_dpo_config_is_refused(tmp_path):
    src = write_rows(tmp_path / "rows.jsonl", pc_rows(8))
    axolotl = tmp_path / "dpo.yml"
    axolotl.write_text(f"base_model: builtin\nrl: dpo\ndatasets:\n  - path: {src}\n    type: chat_template\n")
    with pytest.raises(SettingsError, match="rl: dpo trains on preference or feedback data"):
        plancc.compile(None, tmp_path / "plan", config=axolotl, cache_dir=tmp_path / "cache")
    trl = tmp_path / "dpo-trl.yml"
    trl.write_text(f"model_name_or_path: builtin\ndataset_name: {src}\nbeta: 0.1\n")
    with pytest.raises(SettingsError, match="beta belong to a DPO or KTO config"):
        plancc.compile(None, tmp_path / "plan", config=trl, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "plan").exists()


def test_the_command_says_it_in_one_line(tmp_path):
    src = write_rows(tmp_path / "rows.jsonl", FEEDBACK)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "PLANCC_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "plancc", "compile", str(src), "-o", str(tmp_path / "plan"),
                           "--tokenizer", "builtin", "--sequence-len", "64", "--quiet"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "unpaired feedback (KTO)" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "plan").exists()
