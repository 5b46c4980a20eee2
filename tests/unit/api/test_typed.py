"""The typed form of the API: `plancc.compile(..., scan=ScanOptions(...), plan=PlanSettings(...))` and
`plancc.api.scan(..., scan=...)` give what the keyword form gives, byte for byte; keywords override the objects'
fields by name; a field at its default leaves the config file's value; bad combinations are one SettingsError."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import plancc
from plancc import api
from plancc.config.settings import PlanSettings, ScanOptions
from plancc.errors import SettingsError
from tests.support.sources import pc_rows, write_rows

SCAN = {"tokenizer": "builtin", "sequence_len": 256}
PLAN = {"sequence_len": 256, "micro_batch_size": 2, "world_size": 2, "grad_accum": 2, "epochs": 2, "seed": 3,
        "balance_window": 8}


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def source(tmp_path):
    return write_rows(tmp_path / "pc.jsonl", pc_rows(40))


def test_typed_and_keyword_forms_write_the_same_plan(tmp_path, source):
    keyword = plancc.compile(source, tmp_path / "kw", cache_dir=tmp_path / "c", **{**SCAN, **PLAN})
    typed = plancc.compile(source, tmp_path / "typed", cache_dir=tmp_path / "c", scan=ScanOptions(**SCAN),
                           plan=PlanSettings(**PLAN))
    assert typed.settings == keyword.settings == PlanSettings(**PLAN)
    assert _files(tmp_path / "typed") == _files(tmp_path / "kw")


def test_typed_and_keyword_scans_are_the_same(tmp_path, source):
    api.scan(source, tmp_path / "kw", cache_dir=tmp_path / "c", **SCAN)
    api.scan(source, tmp_path / "typed", cache_dir=tmp_path / "c", scan=ScanOptions(**SCAN))
    assert _files(tmp_path / "typed") == _files(tmp_path / "kw")


def test_keywords_override_the_objects_fields(tmp_path, source):
    plan = plancc.compile(source, tmp_path / "p", cache_dir=tmp_path / "c", scan=ScanOptions(**SCAN),
                          plan=PlanSettings(**PLAN), seed=4, sequence_len=512)
    assert (plan.settings.seed, plan.settings.sequence_len, plan.settings.world_size) == (4, 512, 2)
    assert plan.scan_record.options.sequence_len == 512


def test_a_field_at_its_default_leaves_the_config_files_value(tmp_path, source):
    config = tmp_path / "c.toml"
    config.write_text('tokenizer = "builtin"\nsequence_len = 256\nseed = 5\nmicro_batch_size = 4\n')
    plan = plancc.compile(source, tmp_path / "p", cache_dir=tmp_path / "c", config=config,
                          plan=PlanSettings(micro_batch_size=3, seed=0))
    assert (plan.settings.micro_batch_size, plan.settings.seed) == (3, 5)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"plan": ScanOptions()}, "plan= takes a plancc.config.PlanSettings, got ScanOptions"),
    ({"scan": {"tokenizer": "builtin"}}, "scan= takes a plancc.config.ScanOptions, got dict"),
    ({"scan": ScanOptions(sequence_len=512), "plan": PlanSettings(sequence_len=256)},
     "sequence_len: scan= says 512, plan= says 256"),
])
def test_bad_combinations_are_one_settings_error(tmp_path, source, kwargs, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        plancc.compile(source, tmp_path / "p", cache_dir=tmp_path / "c", **kwargs)
    assert not (tmp_path / "p").exists()


def test_scan_takes_scan_options_only(tmp_path, source):
    with pytest.raises(SettingsError, match=re.escape("scan= takes a plancc.config.ScanOptions, got PlanSettings")):
        api.scan(source, tmp_path / "s", cache_dir=tmp_path / "c", scan=PlanSettings())
    assert not (tmp_path / "s").exists()

def test_a_keyword_settles_a_disagreement(tmp_path, source):
    plan = plancc.compile(source, tmp_path / "p", cache_dir=tmp_path / "c", tokenizer="builtin",
                          scan=ScanOptions(sequence_len=512), plan=PlanSettings(sequence_len=256), sequence_len=128)
    assert plan.settings.sequence_len == plan.scan_record.options.sequence_len == 128
