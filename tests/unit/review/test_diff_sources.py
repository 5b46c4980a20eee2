"""`plancc diff` of plans scanned from real sources: rows named by file and row, each dataset's settings named
(what is trained as its own class, `--fail-on masks`), a chat template compared by content, not by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import plancc
from plancc.cli import app
from plancc.scan.sources.templates import BUILTIN_TEMPLATES
from plancc.store import schemas
from tests.support import REPO
from tests.support.sources import DEEPSEEK_JSON

EXAMPLES = REPO / "examples" / "data"
runner = CliRunner()


def report(old: Path, new: Path, *fail_on: str) -> tuple[int, dict]:
    r = runner.invoke(app, ["diff", str(old), str(new), "--json", *(f"--fail-on={f}" for f in fail_on)])
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def head(src: str, n: int, out: Path) -> Path:
    out.write_text("".join((EXAMPLES / src).read_text(encoding="utf-8").splitlines(True)[:n]), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def recipe_plans(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("recipe")
    chat, inst = head("chat.jsonl", 80, d / "chat.jsonl"), head("instructions.jsonl", 60, d / "inst.jsonl")

    def compile_(name: str, **chat_settings) -> Path:
        datasets = [{"path": str(chat), "name": "chat", "chat_template": "chatml", **chat_settings},
                    {"path": str(inst), "name": "alpaca", "format": "alpaca"}]
        plancc.compile(datasets, d / name, tokenizer="builtin", sequence_len=2048, world_size=2, grad_accum=2,
                       cache_dir=d / "cache")
        return d / name

    return {"base": compile_("base"), "eos": compile_("eos", train_on_eos="last"), "mix": compile_("mix", repeat=2)}


def test_a_masking_change_is_named_per_dataset_and_is_its_own_class(recipe_plans):
    code, r = report(recipe_plans["base"], recipe_plans["eos"], "masks", "config", "dataset")
    assert r["config"] == [{"setting": "train_on_eos", "dataset": "chat", "old": "turn", "new": "last",
                            "kind": "masks"}]
    chat, alpaca = r["datasets"]
    assert chat["status"] == "rederived" and chat["rows"]["edited"] > 0 and chat["rows"]["added"] == 0
    assert alpaca["status"] == "unchanged"
    assert code == 1 and [f.split(":")[0] for f in r["failed"]] == ["masks", "config"]  # not dataset: no data changed
    assert "train_on_eos" in r["failed"][0] and "chat: train_on_eos" in r["failed"][1]
    md = runner.invoke(app, ["diff", str(recipe_plans["base"]), str(recipe_plans["eos"]), "--format", "markdown"])
    assert "- `chat`: `train_on_eos` turn → last (masks)" in md.stdout
    assert "`chat` rows:" in md.stdout and "source being unchanged" in md.stdout


def test_a_mix_change_is_named_per_dataset(recipe_plans):
    code, r = report(recipe_plans["base"], recipe_plans["mix"], "masks", "dataset")
    assert r["config"] == [{"setting": "repeat", "dataset": "chat", "old": 1.0, "new": 2.0, "kind": "mix"}]
    assert [d["status"] for d in r["datasets"]] == ["reweighted", "unchanged"] and code == 0
    shares = {s["dataset"]: s for s in r["training"]["label_shares"]}
    assert shares["chat"]["new"] > shares["chat"]["old"]
    assert r["training"]["samples"]["new"] > r["training"]["samples"]["old"]


def _as_older_plancc(plan: Path, out: Path) -> Path:
    """A copy of `plan` as an older plancc wrote it: no per-dataset options, source fingerprints or files."""
    shutil.copytree(plan, out)
    table = pq.read_table(out / schemas.PLAN_FILE)
    meta = json.loads(table.schema.metadata[schemas.META_KEY])
    for d in meta["recipe"]["datasets"]:
        for key in ("options", "source_fingerprint", "source_files"):
            d.pop(key)
    pq.write_table(table.replace_schema_metadata({schemas.META_KEY: json.dumps(meta).encode()}),
                   out / schemas.PLAN_FILE)
    (out / schemas.MANIFEST_FILE).write_text(json.dumps({k: v for k, v in meta.items() if k != "kind"}))
    return out


def test_a_plan_of_an_older_plancc_still_diffs(recipe_plans, tmp_path):
    older = _as_older_plancc(recipe_plans["base"], tmp_path / "older")
    code, r = report(older, recipe_plans["base"], "any")
    assert code == 0 and r["identical"] and r["config"] == []
    assert r["notes"] == [f"dataset {n!r}: the old plan records no scan options (a samples table, or an older "
                          "plancc): its settings are not compared" for n in ("chat", "alpaca")]
    _, r = report(older, recipe_plans["eos"])
    chat = r["datasets"][0]
    assert chat["status"] == "content_changed"  # without the old source fingerprint a data change cannot be ruled out
    assert chat["rows"]["edited"] > 0 and chat["rows"]["examples"]["edited"][0]["old"]["file"] == \
        str(recipe_plans["base"].parent / "chat.jsonl")  # the path as given names a one-file dataset


def test_rows_are_named_by_file_of_a_glob(tmp_path):
    lines = (EXAMPLES / "instructions.jsonl").read_text(encoding="utf-8").splitlines(True)[:90]
    for version, edit in (("old", None), ("new", 40)):
        folder = tmp_path / version / "data"
        folder.mkdir(parents=True)
        rows = list(lines)
        if edit is not None:
            rows[edit] = rows[edit].replace('"output": "', '"output": "Edited: ', 1)
        (folder / "part-0.jsonl").write_text("".join(rows[:30]), encoding="utf-8")
        (folder / "part-1.jsonl").write_text("".join(rows[30:]), encoding="utf-8")
        plancc.compile(str(folder / "*.jsonl"), tmp_path / f"{version}-plan", tokenizer="builtin", sequence_len=1024,
                       cache_dir=tmp_path / "cache")
    recorded = json.loads((tmp_path / "old-plan" / "manifest.json").read_text())["scan"]["source_files"]
    assert recorded == [["part-0.jsonl", 30], ["part-1.jsonl", 60]]
    _, r = report(tmp_path / "old-plan", tmp_path / "new-plan")
    (d,) = r["datasets"]
    assert d["status"] == "content_changed" and d["rows"]["edited"] == 1
    assert d["rows"]["examples"]["edited"] == [{"file": "part-1.jsonl", "row": 10,
                                                "old": {"file": "part-1.jsonl", "row": 10}}]


@pytest.mark.slow  # loads the DeepSeek tokenizer for four compiles
def test_a_template_is_compared_by_content_not_name(tmp_path):
    """The built-in llama3 template and a tokenizer's own template of the same text are one template: no change.
    A text that differs only where it renders nothing (a trailing newline) changes no sample: no change either,
    and the report says so."""
    chat = head("chat.jsonl", 40, tmp_path / "chat.jsonl")

    def tokenizer(name: str, template: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        shutil.copyfile(DEEPSEEK_JSON, d / "tokenizer.json")
        (d / "tokenizer_config.json").write_bytes(orjson.dumps({
            "bos_token": {"content": "<｜begin▁of▁sentence｜>"}, "eos_token": {"content": "<｜end▁of▁sentence｜>"},
            "chat_template": template}))
        return d

    def compile_(name: str, tok: Path, template: str | None) -> Path:
        entry = {"path": str(chat), "name": "chat", **({"chat_template": template} if template else {})}
        plancc.compile([entry], tmp_path / name, tokenizer=str(tok), sequence_len=2048,
                       cache_dir=tmp_path / f"cache-{name}")  # own caches: each scan records its own template name
        return tmp_path / name

    same = tokenizer("tok-same", BUILTIN_TEMPLATES["llama3"])
    newline = tokenizer("tok-newline", BUILTIN_TEMPLATES["llama3"] + "\n")
    builtin = compile_("builtin", same, "llama3")
    code, r = report(builtin, compile_("own", same, None), "any", "dataset", "masks", "config")
    assert code == 0 and r["identical"] and r["config"] == [] and r["notes"] == []
    code, r = report(builtin, compile_("own-newline", newline, None), "dataset", "masks", "config")
    assert code == 0 and r["config"] == [] and r["datasets"][0]["status"] == "unchanged"
    assert r["notes"] == [f"dataset 'chat': chat template llama3 -> {newline / 'tokenizer_config.json'}: other "
                          "text, but every sample renders to the same tokens (no change)"]
