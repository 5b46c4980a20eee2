"""The review commands on preference plans (docs/preference.md): `inspect plan` lists pairs side by side with their
update's pair count, `inspect metrics` the pair CVs, `show` a pair's two completions (or a KTO completion's label),
`validate` passes a compiled plan and names a pair whose completions were swapped, `diff` reports the pair metrics
and a change of data kind. Real compiles of real rows through the CLI, the built-in byte-level tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from plancc.cli import app
from plancc.store import schemas
from tests.support.sources import write_rows

runner = CliRunner()

PAIRS = [{"prompt": f"What is {i} + {i}?", "chosen": f"It is {2 * i}." + " Indeed." * (i % 4),
          "rejected": str(2 * i + 1) * (i % 3 + 1)} for i in range(40)]
FEEDBACK = [{"prompt": f"What is {i} + {i}?", "completion": f"It is {2 * i + i % 2}.", "label": i % 2 == 0}
            for i in range(40)]
LAYOUT = ("--sequence-len", "128", "--micro-batch-size", "2", "--world-size", "2", "--grad-accum", "2")


def _run(*args, code: int = 0):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == code, res.output
    return res


def _json(*args) -> dict:
    return json.loads(_run(*args, "--json").stdout)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path | str]:
    tmp = tmp_path_factory.mktemp("preference_cli")
    sources = {"pairs": write_rows(tmp / "pairs.jsonl", PAIRS), "kto": write_rows(tmp / "kto.jsonl", FEEDBACK),
               "sft": write_rows(tmp / "sft.jsonl", [{"prompt": r["prompt"], "completion": r["chosen"]}
                                                     for r in PAIRS])}
    out = {}
    for name, src, extra in (("pairs", "pairs", ("--val-set-size", "4")), ("seed", "pairs", ("--seed", "7", "--quiet")),
                             ("kto", "kto", ("--quiet",)), ("sft", "sft", ("--quiet",))):
        out[name] = tmp / name
        res = _run("compile", sources[src], "-o", out[name], "--tokenizer", "builtin", *LAYOUT, *extra,
                   "--cache-dir", tmp / "cache")
        out[f"{name} summary"] = res.stdout
    return out


def test_the_compile_summary_counts_pairs(plans):
    summary = plans["pairs summary"]
    assert "pairs      40 kept, 0 dropped" in summary and "format preference" in summary
    assert "eval       4 pairs (8 samples) held out (--val-set-size 4)" in summary
    assert "update pair CV" in summary


def test_inspect_plan_lists_pairs_side_by_side_with_their_update_counts(plans):
    rows = _json("inspect", "plan", plans["pairs"], "--limit", "0")["microbatches"]
    per_update: dict[int, int] = {}
    stored: dict[int, int] = {}
    for r in rows:
        ids = [k for row in r["sample_ids"] for k in row]
        assert ids[0::2] == [k - 1 for k in ids[1::2]] and all(k % 2 == 0 for k in ids[0::2])  # chosen, rejected
        per_update[r["update"]] = per_update.get(r["update"], 0) + len(ids) // 2
        stored[r["update"]] = r["num_pairs"]
    assert per_update == stored and sum(per_update.values()) == len(PAIRS) - 4  # every training pair once
    table = _run("inspect", "plan", plans["pairs"], "--limit", "2").stdout
    assert "upd pairs" in table and "pairs chosen,rejected" in table


def test_inspect_metrics_show_the_pair_cvs(plans):
    text = _run("inspect", "metrics", plans["pairs"]).stdout
    assert "pair_cv" in text and "update_pair_cv" in text
    epochs = _json("inspect", "metrics", plans["pairs"])
    flat = json.dumps(epochs)
    assert '"update_pair_cv"' in flat and '"update_chosen_label_cv"' in flat
    assert '"update_desirable_cv"' in json.dumps(_json("inspect", "metrics", plans["kto"]))


def test_show_puts_a_pair_side_by_side(plans):
    view = _json("show", plans["pairs"], "--sample", 5)
    partner = view["partner"]
    assert view["pair_role"] == "rejected" and partner["pair_role"] == "chosen" and partner["sample_id"] == 4
    assert view["pair_id"] == partner["pair_id"] == 2
    text = _run("show", plans["pairs"], "--sample", 5, "--no-color").stdout
    assert "chosen: sample 4" in text and "rejected: sample 5" in text
    for side, shown in (("rejected", view), ("chosen", partner)):  # the completion is trained, the prompt never
        marked = "".join(s["text"] for s in shown["segments"] if s["supervised"])
        assert marked.startswith(PAIRS[2][side]) and PAIRS[2]["prompt"] not in marked
    kto = _json("show", plans["kto"], "--sample", 3)
    assert kto["desirable"] is False and kto.get("partner") is None
    assert "undesirable" in _run("show", plans["kto"], "--sample", 3, "--no-color").stdout


def test_validate_passes_and_names_a_swapped_pair(plans, tmp_path):
    for name in ("pairs", "kto"):
        assert "ok" in _run("validate", plans[name]).stdout
    broken = tmp_path / "broken"
    shutil.copytree(plans["pairs"], broken)
    path = broken / schemas.SAMPLES_FILE
    table = pq.read_table(path)
    roles = table.column(schemas.PAIR_ROLE_COLUMN).to_pylist()
    roles[0], roles[1] = roles[1], roles[0]  # pair 0: its rejected completion now says it is the chosen one
    pq.write_table(table.set_column(table.column_names.index(schemas.PAIR_ROLE_COLUMN), schemas.PAIR_ROLE_COLUMN,
                                    pa.array(roles, pa.string())), path)
    res = _run("validate", broken, code=1)
    assert "Traceback" not in res.output
    assert "sample_id 0 is not a chosen completion followed by its pair's rejected one" in res.output
    assert "num_chosen_items" in res.output  # the update's chosen targets, recounted from the roles


def test_diff_reports_pair_metrics_and_a_change_of_data_kind(plans):
    report = _json("diff", plans["pairs"], plans["seed"])
    metrics = {c["metric"] for epoch in report["metrics"] for c in epoch["changes"]}
    assert metrics & {"pair_cv", "update_pair_cv", "update_chosen_label_cv"}
    kind = _json("diff", plans["sft"], plans["seed"])
    change = next(c for c in kind["config"] if c["setting"] == "data_kind")
    assert (change["old"], change["new"]) == ("sft", "preference")
    assert "data_kind sft -> preference" in _run("diff", plans["sft"], plans["seed"]).stdout
