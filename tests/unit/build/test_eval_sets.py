"""What an eval set may be: held out by content, not only by sample id. An eval dataset that is a copy of the
training data is refused; eval samples that share a training sample's tokens (`token_hash`) are a counted warning
in the plan, recomputed by `validate`; an `[[eval_datasets]]` entry refuses the mixing settings it cannot use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import plancc
from plancc.cli import app
from plancc.errors import SettingsError
from plancc.planner import holdout
from plancc.review.validate import validate_plan
from plancc.store import schemas

runner = CliRunner()


def _pc(path: Path, rows: range) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"question {i}", "completion": f"answer {i}"}) + "\n"
                            for i in rows))
    return path


def _recipe(tmp_path: Path, train: Path, ev: Path, *, entry: str = "", top: str = "") -> Path:
    config = tmp_path / "recipe.toml"
    config.write_text(f'tokenizer = "builtin"\nsequence_len = 256\n{top}[[datasets]]\npath = "{train}"\n'
                      f'[[eval_datasets]]\npath = "{ev}"\nname = "held"\n{entry}')
    return config


def _compile(tmp_path: Path, *args) -> object:
    return runner.invoke(app, ["compile", "-o", str(tmp_path / "plan"), "--cache-dir", str(tmp_path / "cache"),
                               "-q", *map(str, args)])


def _one_error(res) -> str:
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


# ---------------------------------------------------------------- content shared with training


def test_an_eval_dataset_identical_to_the_training_data_is_refused(tmp_path):
    """The same file as `[[datasets]]` and `[[eval_datasets]]` compiled (rc 0, no warning) and validated as
    "none trained on": every eval sample had a training sample's token_hash."""
    data = _pc(tmp_path / "train.jsonl", range(40))
    line = _one_error(_compile(tmp_path, "--config", _recipe(tmp_path, data, data)))
    assert line == ("error: eval dataset 'held': all 40 of its samples have the same tokens as training samples "
                    "(first: sample_id 40 = training sample_id 0): it is training data, not held out; evaluate on "
                    "data that is not in [[datasets]]")
    assert not (tmp_path / "plan").exists()


def test_eval_samples_sharing_a_training_sample_are_counted_in_a_warning_validate_recomputes(tmp_path):
    train = _pc(tmp_path / "train.jsonl", range(30))
    ev = _pc(tmp_path / "ev.jsonl", range(20, 45))  # 10 of its 25 rows are training rows 20..29
    res = _compile(tmp_path, "--config", _recipe(tmp_path, train, ev))
    assert res.exit_code == 0, res.output
    warning = ("10 of 25 eval samples have the same tokens (token_hash) as a training sample (first: sample_id 30 = "
               "training sample_id 20): the eval loss partly measures training data; deduplicate the data to hold "
               "them out")
    assert f"warning: {warning}" in res.output
    plan = plancc.open_plan(tmp_path / "plan")
    assert warning in plan.warnings
    out = runner.invoke(app, ["validate", str(tmp_path / "plan")])
    assert out.exit_code == 0 and f"warning: {warning}" in out.output, out.output
    assert "some have a training sample's tokens, as the warning says" in out.output

    # a plan that hides the overlap (its warning removed from the plan file's metadata and its mirror) fails
    _drop_warnings(tmp_path / "plan")
    problems, _ = validate_plan(str(tmp_path / "plan"))
    assert problems == [f"{schemas.EVAL_FILE}: 10 of 25 eval samples have the same tokens (token_hash) as a training "
                        "sample (first: sample_id 30); the plan does not warn of it"]


def test_validate_names_an_eval_dataset_forged_into_a_copy_of_training(tmp_path):
    train, ev = _pc(tmp_path / "train.jsonl", range(30)), _pc(tmp_path / "ev.jsonl", range(100, 110))
    assert _compile(tmp_path, "--config", _recipe(tmp_path, train, ev)).exit_code == 0
    path = tmp_path / "plan" / schemas.SAMPLES_FILE
    table = pq.read_table(path)
    hashes = table.column("token_hash").to_numpy().copy()
    hashes[30:] = hashes[:10]  # the eval dataset's rows now hash like training rows 0..9
    table = table.set_column(table.schema.get_field_index("token_hash"), "token_hash", [hashes])
    pq.write_table(table.replace_schema_metadata(pq.read_table(path).schema.metadata), path)
    problems, _ = validate_plan(str(tmp_path / "plan"))
    assert f"{schemas.EVAL_FILE}: eval dataset 'held': all 10 of its samples have the same tokens as training " \
           "samples: it is training data, not held out" in problems, problems


def _drop_warnings(plan_dir: Path) -> None:
    """Remove the manifest's warnings where a reader reads them: the plan file's metadata and manifest.json."""
    table = pq.read_table(plan_dir / schemas.PLAN_FILE)
    meta = json.loads(table.schema.metadata[schemas.META_KEY])
    meta["scan"]["warnings"] = []
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, schemas.META_KEY: json.dumps(meta)}),
                   plan_dir / schemas.PLAN_FILE)
    manifest = json.loads((plan_dir / schemas.MANIFEST_FILE).read_text())
    manifest["scan"]["warnings"] = []
    (plan_dir / schemas.MANIFEST_FILE).write_text(json.dumps(manifest))


def test_a_val_set_size_draw_from_repeated_rows_is_a_warning_not_an_error(tmp_path):
    data = _pc(tmp_path / "five.jsonl", [*range(30)] * 5)  # every row 5 times: a draw of 6 leaves each a twin
    res = _compile(tmp_path, data, "--tokenizer", "builtin", "--val-set-size", "6", "--sequence-len", "256")
    assert res.exit_code == 0, res.output
    assert "warning: 6 of 6 eval samples have the same tokens (token_hash) as a training sample" in res.output
    assert validate_plan(str(tmp_path / "plan"))[0] == []


def test_validate_says_none_is_a_copy_when_none_is(tmp_path):
    train, ev = _pc(tmp_path / "train.jsonl", range(30)), _pc(tmp_path / "ev.jsonl", range(100, 110))
    assert _compile(tmp_path, "--config", _recipe(tmp_path, train, ev)).exit_code == 0
    out = runner.invoke(app, ["validate", str(tmp_path / "plan")])
    assert out.exit_code == 0 and "warning" not in out.output, out.output
    assert "eval plan (held-out set once each, none trained on, none a training sample's tokens)" in out.output


@settings(max_examples=80, deadline=None)
@given(hashes=st.lists(st.integers(0, 6), min_size=1, max_size=30), data=st.data())
def test_training_twins_are_exactly_the_eval_samples_whose_hash_a_training_sample_has(hashes, data):
    n = len(hashes)
    held = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    ids, token_hash = np.arange(n, dtype=np.int64) * 3, np.array(hashes, dtype=np.uint64)
    twins = holdout.training_twins(token_hash, ids, ids[held])
    for i in range(n):
        same = [j for j in range(n) if not held[j] and hashes[j] == hashes[i]]
        if held[i] and same:
            assert twins[i] in ids[same]
        else:
            assert twins[i] == -1


def test_a_copy_among_several_eval_datasets_is_named():
    ids, token_hash = np.arange(6), np.array([1, 2, 3, 1, 2, 9], dtype=np.uint64)
    mix = (plancc.config.settings.MixEntry("train"), plancc.config.settings.MixEntry("copy", "eval"),
           plancc.config.settings.MixEntry("fresh", "eval"))
    index = np.array([0, 0, 0, 1, 1, 2])
    with pytest.raises(SettingsError, match="eval dataset 'copy': all 2 of its samples"):
        holdout.shared_content(token_hash, ids, ids[3:], index, mix)
    assert holdout.shared_content(token_hash, ids, ids[4:], np.array([0, 0, 0, 0, 2, 2]), mix).startswith(
        "1 of 2 eval samples")


# ---------------------------------------------------------------- settings an eval entry cannot use


@pytest.mark.parametrize("entry", ["repeat = 3", "weight = 0.5", "repeat = 1"])
def test_an_eval_entry_refuses_repeat_and_weight(tmp_path, entry):
    """`repeat` on an eval entry was ignored (each sample still once) yet recorded in the config fingerprint."""
    train, ev = _pc(tmp_path / "train.jsonl", range(30)), _pc(tmp_path / "ev.jsonl", range(100, 110))
    line = _one_error(_compile(tmp_path, "--config", _recipe(tmp_path, train, ev, entry=entry + "\n")))
    key = entry.split()[0]
    assert line == (f"error: eval dataset 'held': {key} applies to training datasets only (an eval dataset's "
                    f"samples are each evaluated once); remove {key} from its [[eval_datasets]] entry")


def test_mix_refuses_an_eval_dataset(tmp_path):
    train, ev = _pc(tmp_path / "train.jsonl", range(30)), _pc(tmp_path / "ev.jsonl", range(100, 110))
    line = _one_error(_compile(tmp_path, "--config", _recipe(tmp_path, train, ev), "--mix", "held=2x"))
    assert line == ("error: --mix held=...: 'held' is an eval dataset (its samples are each evaluated once); --mix "
                    "sets how training datasets mix")
