"""Integrity (docs/spec.md §6, 9): `plancc validate` checks every file a plan ships, and the runtime refuses a
changed plan before its first microbatch.

Each tampering is applied to a copy of one small plan compiled from a raw source (so it ships the token store
written by the scan, `tokens/`). A seeded byte-flip sweep over every file then shows that each flip is either reported by
validate or provably harmless: the file decodes to exactly the same tables, metadata, epoch reads and statistics.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from plancc.build.run import write_plan_dir
from plancc.cli import app
from plancc.config.settings import PlanSettings
from plancc.planner.pipeline import compile_plan
from plancc.review.validate import validate_plan
from plancc.runtime import PlanCollator, PlanDataset, PlanMismatchError, PlanSampler, load_tokens
from plancc.store import schemas, token_store
from plancc.store.parquet import sample_arrays
from plancc.store.plan_store import PlanFiles
from plancc.store.scan_record import ScanRecord
from tests.support.plans import byte_flip_verdicts, random_dataset, samples_table

runner = CliRunner()
WORLD = 2


def _rows(variant: int = 0) -> list[dict[str, str]]:
    """60 prompt/completion rows; rows i and i+30 are equal (so two equal samples can be swapped)."""
    return [{"prompt": f"Question {j + variant}: " + "why? " * (j % 7), "completion": "because " * (1 + j % 11)}
            for j in (i % 30 for i in range(60))]


def _compile(tmp: Path, rows: list[dict[str, str]]) -> Path:
    source = tmp / "pc.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "plan"
    res = runner.invoke(app, ["compile", str(source), "-o", str(out), "--tokenizer", "builtin", "--sequence-len",
                              "128", "--world-size", str(WORLD), "--grad-accum", "2", "--epochs", "2", "--quiet",
                              "--cache-dir", str(tmp / "cache")])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("pristine"), _rows())


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("foreign"), _rows(variant=100))


@pytest.fixture
def plan(pristine, tmp_path) -> Path:
    """A private copy (real files: the pristine token store may be hard links into the scan cache)."""
    return Path(shutil.copytree(pristine, tmp_path / "plan"))


def validate(plan_dir: Path, *args: str):
    r = runner.invoke(app, ["validate", str(plan_dir), *args])
    assert "Traceback" not in r.output, r.output
    return r


def replay_first_microbatch(plan_dir: Path) -> None:
    """What a trainer does for step 1: open the sampler, load the tokens, collate the first microbatch (which
    verifies the token store's chunks it reads)."""
    for rank in range(WORLD):
        sampler = PlanSampler(plan_dir, rank=rank, world_size=WORLD)
        dataset = PlanDataset(load_tokens(plan_dir), PlanCollator.from_plan(sampler.plan))
        dataset[next(iter(sampler))]


# ---------------------------------------------------------------- tampering one thing at a time


def _rewrite(path: Path, change: Callable[[pa.Table], pa.Table]) -> None:
    """Rewrite a Parquet file with changed rows, keeping its metadata (what a careless or hostile edit does)."""
    table = pq.read_table(path)
    pq.write_table(change(table).replace_schema_metadata(table.schema.metadata), path)


def _set(table: pa.Table, name: str, values) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), table.schema.field(name), [values])


def _edit_column(name: str, row: int, delta: int):
    def change(t: pa.Table) -> pa.Table:
        v = t.column(name).to_numpy().copy()
        v[row] += delta
        return _set(t, name, pa.array(v, t.schema.field(name).type))
    return change


def _edit_ids(edit: Callable[[list], None]):
    def change(t: pa.Table) -> pa.Table:
        rows = t.column("sample_ids").to_pylist()
        edit(rows)
        return _set(t, "sample_ids", pa.array(rows, schemas.PLAN_SCHEMA.field("sample_ids").type))
    return change


def _swap_equal_samples(rows: list) -> None:
    """Swap samples 3 and 33 (equal content) where they first sit: epoch 0 (the file's first rows)."""
    where: dict[int, tuple[int, int, int]] = {}
    for b, batch in enumerate(rows):
        for r, row in enumerate(batch):
            for k, sid in enumerate(row):
                if sid in (3, 33):
                    where.setdefault(sid, (b, r, k))
    (b1, r1, k1), (b2, r2, k2) = where[3], where[33]
    rows[b1][r1][k1], rows[b2][r2][k2] = 33, 3


def _change_one_id(rows: list, at: int = 20) -> None:
    rows[at][0][0] = rows[0][0][0]  # a later row of epoch 0 (rank 0: the file's first rows) takes row 0's sample


def _manifest(change: Callable[[dict], None]):
    def tamper(plan_dir: Path) -> None:
        path = plan_dir / schemas.MANIFEST_FILE
        m = json.loads(path.read_text())
        change(m)
        path.write_text(json.dumps(m, indent=2))
    return tamper


def _settings(**new):
    return lambda m: m["settings"].update(new)


def _metrics(plan_dir: Path) -> None:
    def change(t: pa.Table) -> pa.Table:
        v = t.column("label_cv").to_numpy().copy()
        v[-1] *= 0.5
        return _set(t, "label_cv", pa.array(v))
    _rewrite(plan_dir / schemas.METRICS_FILE, change)


def _plan_metadata(**new):
    """Edit the settings in plan.parquet's own metadata (and the manifest mirror, consistently)."""
    def tamper(plan_dir: Path) -> None:
        path = plan_dir / schemas.PLAN_FILE
        table = pq.read_table(path)
        meta = json.loads(table.schema.metadata[schemas.META_KEY])
        meta["settings"].update(new)
        pq.write_table(table.replace_schema_metadata({schemas.META_KEY: json.dumps(meta).encode()}), path)
        _manifest(_settings(**new))(plan_dir)
    return tamper


def _tokens(how: str):
    def tamper(plan_dir: Path, foreign: Path) -> None:
        tokens = plan_dir / schemas.TOKENS_DIR
        ids = tokens / "input_ids.npy"
        if how == "deleted":
            shutil.rmtree(tokens)
        elif how == "ids emptied":
            ids.write_bytes(b"")
        elif how == "ids truncated":
            ids.write_bytes(ids.read_bytes()[: ids.stat().st_size // 2])
        elif how == "header deleted":
            (tokens / token_store.HEADER_FILE).unlink()
        elif how == "swapped":
            shutil.rmtree(tokens)
            shutil.copytree(foreign / schemas.TOKENS_DIR, tokens)
        elif how == "one label":  # sample 7's last label, rewritten in place (sizes and header unchanged)
            m = token_store.open_store(tokens)
            at = int(m.offsets[8]) - 1
            labels = np.load(tokens / "labels.npy")
            labels[at] = -100 if labels[at] != -100 else 5
            np.save(tokens / "labels.npy", labels)
    return tamper


# (name, tamper, text validate must print, whether the runtime reads what was changed)
TAMPERS = [
    ("two equal samples swapped", lambda p: _rewrite(p / schemas.PLAN_FILE, _edit_ids(_swap_equal_samples)),
     "do not hash to the epoch's plan fingerprint", True),
    ("num_items edited", lambda p: _rewrite(p / schemas.PLAN_FILE, _edit_column("num_items", 0, 3)),
     "row 0: num_items", True),
    ("label_count and num_items edited together",
     lambda p: _rewrite(p / schemas.PLAN_FILE, lambda t: _edit_all_num_items(_edit_column("label_count", 0, 1)(t))),
     "label_count is", True),
    ("first row deleted", lambda p: _rewrite(p / schemas.PLAN_FILE, lambda t: t.slice(1)),
     "row 0: index is 1", True),
    ("one sample id changed", lambda p: _rewrite(p / schemas.PLAN_FILE, _edit_ids(_change_one_id)),
     "again (already in row 0)", True),
    ("manifest grad_accum halved", _manifest(_settings(grad_accum=1)), "settings.grad_accum", True),
    ("manifest world size doubled, accumulation halved", _manifest(_settings(world_size=4, grad_accum=1)),
     "settings.grad_accum", True),
    ("plan metadata grad_accum halved", _plan_metadata(grad_accum=1), "config fingerprint", True),
    ("plan metadata world size doubled, accumulation halved", _plan_metadata(world_size=4, grad_accum=1),
     "config fingerprint", True),
    ("manifest epoch batch count lowered", _manifest(lambda m: m["epochs"][0].update(batches=m["epochs"][0]["batches"] - 1)),
     "epochs[0].batches", True),
    ("manifest data path changed", _manifest(lambda m: m["data"].update(tokens="other")),
     "data.tokens", True),
    ("manifest deleted", lambda p: (p / schemas.MANIFEST_FILE).unlink(), "manifest.json is missing", False),
    ("metrics label_cv edited", _metrics, "label_cv", False),
    # the runtime's default (verify="chunks") reads the token store, bound by its own hashes, not samples.parquet
    ("samples token_hash edited", lambda p: _rewrite(p / schemas.SAMPLES_FILE, _edit_column("token_hash", 4, 1)),
     "dataset fingerprint", False),
    ("samples length edited", lambda p: _rewrite(p / schemas.SAMPLES_FILE, _edit_column("length", 4, 1)),
     "metadata fingerprint", False),
]


def _edit_all_num_items(t: pa.Table) -> pa.Table:
    """Recompute every num_items from the (edited) label counts, so only the samples table can tell."""
    plan = t.sort_by([("epoch", "ascending"), ("index", "ascending")])
    per_update = WORLD * 2
    labels = plan.column("label_count").to_numpy()
    epochs = plan.column("epoch").to_numpy()
    index = plan.column("index").to_numpy()
    key = epochs * 10**6 + index // per_update
    _, inverse = np.unique(key, return_inverse=True)
    totals = np.bincount(inverse, weights=labels).astype(np.int64)[inverse]
    return _set(plan, "num_items", pa.array(totals, pa.int64()))


TOKENS = ["ids emptied", "ids truncated", "header deleted", "swapped", "one label"]


@pytest.mark.parametrize(("name", "tamper", "message", "runtime_reads"), TAMPERS, ids=[t[0] for t in TAMPERS])
def test_validate_and_runtime_refuse_a_tampered_plan(plan, name, tamper, message, runtime_reads):
    replay_first_microbatch(plan)  # sound before
    tamper(plan)
    r = validate(plan)
    assert r.exit_code == 1, (name, r.output)
    assert message in r.output, (name, r.output)
    if runtime_reads:
        with pytest.raises((PlanMismatchError, schemas.StoreError)):
            replay_first_microbatch(plan)


@pytest.mark.parametrize("how", TOKENS)
def test_token_data_is_checked_by_validate_and_the_runtime(plan, foreign, how):
    _tokens(how)(plan, foreign)
    r = validate(plan)
    assert r.exit_code == 1 and schemas.TOKENS_DIR in r.output, (how, r.output)
    with pytest.raises(PlanMismatchError):
        replay_first_microbatch(plan)


def test_a_plan_without_its_token_store_validates_what_it_holds_and_says_what_it_skipped(plan, foreign):
    """A plan kept in git without `tokens/` (diff does not need it): every other check runs, the token data check
    is reported as skipped, and the runtime still refuses to train on it without data."""
    _tokens("deleted")(plan, foreign)
    for flags in ((), ("--fast",)):
        r = validate(plan, *flags)
        assert r.exit_code == 0, r.output
        assert "token data" not in r.stdout and "fingerprints" in r.stdout
        assert f"skipped: token data: {plan / schemas.TOKENS_DIR} is not there" in r.stderr
    r = validate(plan, "--json")
    assert json.loads(r.stdout)["skipped"][0].startswith("token data:")
    _rewrite(plan / schemas.PLAN_FILE, _edit_column("num_items", 0, 3))
    assert validate(plan).exit_code == 1  # the rest is still checked
    with pytest.raises(PlanMismatchError):
        replay_first_microbatch(plan)


@pytest.mark.parametrize("column", ["token_hash", "length"])
def test_runtime_checking_the_samples_refuses_an_edited_samples_table(plan, column):
    _rewrite(plan / schemas.SAMPLES_FILE, _edit_column(column, 4, 1))
    with pytest.raises(PlanMismatchError, match=r"samples\.parquet"):
        load_tokens(plan, verify="hash")


def test_a_tampered_last_epoch_is_refused_at_open_before_any_microbatch(plan):
    """One sample id changed in the last epoch: the runtime refuses the plan when it opens it, not hours later when
    that epoch starts."""
    last = pq.read_metadata(plan / schemas.PLAN_FILE).num_rows - 1  # the file ends with epoch 1
    _rewrite(plan / schemas.PLAN_FILE, _edit_ids(lambda rows: _change_one_id(rows, last)))
    with pytest.raises(PlanMismatchError, match="epoch 1"):
        PlanSampler(plan, rank=0, world_size=WORLD)


def test_fast_does_only_the_open_time_checks(plan, foreign):
    assert validate(plan, "--fast").exit_code == 0
    _tokens("one label")(plan, foreign)
    assert validate(plan, "--fast").exit_code == 0  # content is the full check's job
    r = validate(plan)
    assert r.exit_code == 1 and "tokens chunk 0 (rows 0.." in r.output, r.output
    _tokens("ids truncated")(plan, foreign)
    assert validate(plan, "--fast").exit_code == 1


def test_fast_refuses_token_data_of_another_plan(plan, foreign):
    _tokens("swapped")(plan, foreign)
    r = validate(plan, "--fast")
    assert r.exit_code == 1 and "is not the token store this plan was compiled with" in r.output


def test_a_plan_shipping_tokenized_parquet_is_refused_clearly(plan):
    """Plans of an older plancc ship tokenized.parquet instead of tokens/: validate says to recompile."""
    shutil.rmtree(plan / schemas.TOKENS_DIR)
    table = pq.read_table(plan / schemas.PLAN_FILE)
    meta = json.loads(table.schema.metadata[schemas.META_KEY])
    del meta["data"]["tokens"]
    meta["data"]["tokenized"] = schemas.TOKENIZED_FILE
    pq.write_table(table.replace_schema_metadata({schemas.META_KEY: json.dumps(meta).encode()}), plan / schemas.PLAN_FILE)
    _manifest(lambda m: m.update(data=meta["data"]))(plan)
    r = validate(plan)
    assert r.exit_code == 1 and "tokenized.parquet" in r.output and "recompile" in r.output, r.output


def test_a_sound_plan_validates_and_replays(plan):
    r = validate(plan)
    assert r.exit_code == 0 and "token data content" in r.output, r.output
    replay_first_microbatch(plan)


def test_not_a_plan_directory_is_exit_2(tmp_path):
    assert validate(tmp_path).exit_code == 2
    assert validate(tmp_path / "missing").exit_code == 2


def test_unreadable_plan_file_is_a_violation(plan):
    (plan / schemas.PLAN_FILE).write_bytes(b"PAR1 garbage")
    r = validate(plan)
    assert r.exit_code == 1 and "plan.parquet" in r.output


@pytest.fixture(scope="module")
def epoch0(pristine) -> tuple[PlanFiles, pa.Table]:
    plan = PlanFiles(pristine)
    return plan, plan.read_epoch(0)


EDITABLE = ["index", "update", "rank", "micro_step", "tokens", "label_count", "cost", "num_items", "complete_update"]


@given(name=st.sampled_from([*EDITABLE, "sample_ids"]), row=st.integers(0, 10**6), delta=st.integers(1, 2**40))
def test_any_single_value_edit_of_an_epoch_is_refused(epoch0, name, row, delta):
    """Invariant: changing any one value of any row of an epoch (what the runtime replays) is a problem."""
    plan, table = epoch0
    row %= table.num_rows
    if name == "sample_ids":
        rows = table.column(name).to_pylist()
        rows[row][0][0] = (rows[row][0][0] + delta) % 60  # another sample of the plan (or an equal one)
        if rows[row][0][0] == table.column(name)[row][0][0].as_py():
            return
        column = pa.array(rows, schemas.PLAN_SCHEMA.field(name).type)
    elif name == "complete_update":
        v = table.column(name).to_pylist()
        v[row] = not v[row]
        column = pa.array(v, pa.bool_())
    else:
        v = table.column(name).to_numpy().copy()
        old = v[row]
        v[row] = (int(old) + delta) % np.iinfo(v.dtype).max
        if v[row] == old:
            return
        column = pa.array(v, table.schema.field(name).type)
    assert plan.epoch_problems(0, _set(table, name, column))
    assert plan.epoch_problems(0, table) == []


# ---------------------------------------------------------------- the byte-flip sweep

FLIPS_PER_FILE = 60
FILES = [schemas.PLAN_FILE, schemas.SAMPLES_FILE, schemas.METRICS_FILE, schemas.MANIFEST_FILE,
         *(f"{schemas.TOKENS_DIR}/{name}" for name in [token_store.HEADER_FILE, *(f"{a}.npy" for a in token_store.ARRAYS)]),
         schemas.BEFORE_FILE]  # last: a file added later takes its draws after the others' (theirs stay the same)


@pytest.mark.slow
def test_every_byte_flip_is_detected_or_harmless(plan):
    """Seeded: 60 flips (a random byte XOR a random non-zero value) at random offsets of each file of the plan."""
    assert sorted(FILES) == sorted(str(p.relative_to(plan)) for p in plan.rglob("*") if p.is_file())
    tally, silent = byte_flip_verdicts(plan, FILES, flips=FLIPS_PER_FILE, seed=15, epochs=2)
    print("byte flips:", tally)
    assert silent == [], f"flips accepted although content changed: {silent}"
    assert sum(c["detected"] for c in tally.values()) > 0.5 * FLIPS_PER_FILE * len(FILES)
    assert validate_plan(str(plan))[0] == []


# ---------------------------------------------------------------- moved from test_store: hand-made plans

SETTINGS = PlanSettings(micro_batch_size=2, sequence_len=64, world_size=2, grad_accum=2, epochs=2)


def _write(path: Path, settings: PlanSettings = SETTINGS, n: int = 200) -> Path:
    ids, labels = random_dataset(np.random.default_rng(1), n, 64)
    table = samples_table(ids, labels)
    s = sample_arrays(table)
    write_plan_dir(path, table, s, settings, compile_plan(s, settings), ScanRecord(), None)
    return path


def test_validate_accepts_a_sound_plan_without_tokenized_data(tmp_path):
    assert validate_plan(str(_write(tmp_path / "plan")))[0] == []


def test_validate_catches_an_edited_label_count(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    _rewrite(plan_dir / schemas.PLAN_FILE, _edit_column("label_count", 3, 1))
    problems, _ = validate_plan(str(plan_dir))
    assert any("label_count is" in p and "recomputed from samples.parquet" in p for p in problems), problems


def test_validate_catches_a_duplicated_sample(tmp_path):
    plan_dir = _write(tmp_path / "plan")

    def duplicate(rows: list) -> None:
        rows[1] = [list(rows[0][0])]

    _rewrite(plan_dir / schemas.PLAN_FILE, _edit_ids(duplicate))
    problems, _ = validate_plan(str(plan_dir))
    assert any("more than once" in p for p in problems)
    assert any("missing" in p for p in problems)


def test_validate_catches_a_changed_fingerprint(tmp_path):
    plan_dir = _write(tmp_path / "plan")
    _manifest(lambda m: m["fingerprints"].update(config="0" * 32))(plan_dir)
    problems, _ = validate_plan(str(plan_dir))
    assert any("fingerprints.config" in p and "manifest.json" in p for p in problems), problems
