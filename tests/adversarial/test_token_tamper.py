"""Every file of a plan and its token store is bound: an edit of any header value, a truncated, emptied,
deleted or swapped file or part is reported by `plancc validate` naming the file (exit 1, no traceback), and the
runtime refuses to load it.

Two real plans: one whose token store is a single store in which every row fits one chunk (where an edited
`chunk_tokens` used to pass: nothing but the header held it), and one compiled from a scan streamed in shards (a
multi-part store). Each test tampers with a private copy (real files: a plan's store is hard-linked to the scan's).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from plancc.cli import app
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.review.validate import validate_plan
from plancc.runtime import PlanMismatchError, load_tokens
from plancc.store import parquet, schemas, token_digest, token_store, token_writer
from plancc.store.plan import Plan
from tests.support import REPO
from tests.support.plans import byte_flip_verdicts

pytestmark = pytest.mark.slow  # exhaustive tampering: every byte of plans flipped, every file damaged

runner = CliRunner()


def _rows(n: int) -> str:
    return "".join(json.dumps({"prompt": f"Question {i}: " + "why? " * (i % 5), "completion": "because " * (1 + i % 7)})
                   + "\n" for i in range(n))


def _cli(*args: str) -> str:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("single")
    (tmp / "d.jsonl").write_text(_rows(40))
    _cli("compile", str(tmp / "d.jsonl"), "-o", str(tmp / "plan"), "--tokenizer", "builtin", "--sequence-len", "256",
         "--cache-dir", str(tmp / "cache"), "-q")
    header = orjson.loads((tmp / "plan" / schemas.TOKENS_DIR / token_store.HEADER_FILE).read_bytes())
    assert header["chunks"] == 1 and header["tokens"] < header["chunk_tokens"]  # the case of the old hole
    return tmp / "plan"


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("parts")
    (tmp / "d.jsonl").write_text(_rows(40))
    _cli("scan", str(tmp / "d.jsonl"), "-o", str(tmp / "scan"), "--tokenizer", "builtin", "--sequence-len", "256",
         "--shard-rows", "15", "--cache-dir", str(tmp / "cache"), "-q")
    _cli("compile", str(tmp / "scan"), "-o", str(tmp / "plan"), "-q")
    header = token_store.read_header(tmp / "plan" / schemas.TOKENS_DIR)
    assert header["format"] == token_store.PARTS_FORMAT and len(header["parts"]) == 3
    return tmp / "plan"


@pytest.fixture(params=["single", "parts"])
def plan(request, tmp_path) -> Path:
    return Path(shutil.copytree(request.getfixturevalue(request.param), tmp_path / "plan"))


def validate(plan_dir: Path, *args: str) -> str:
    r = runner.invoke(app, ["validate", str(plan_dir), *args])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    return r.output


def refused_by_runtime(plan_dir: Path) -> None:
    with pytest.raises(PlanMismatchError):
        tokens = load_tokens(plan_dir)
        tokens.check(np.arange(len(tokens)))  # what the collator does before it reads rows


def headers(plan_dir: Path) -> list[Path]:
    """Every token store header of the plan: the store's, and each part's of a multi-part store."""
    return sorted((plan_dir / schemas.TOKENS_DIR).rglob(token_store.HEADER_FILE))


def leaves(value, path: tuple = ()) -> Iterator[tuple]:
    """(key path, value) of every scalar of a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, (*path, i))
    else:
        yield path, value


def changed(value):
    """Another value of the same JSON type (and one that still looks plausible)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return value[:-1] + ("0" if value[-1:] != "0" else "1")


def edit(header_file: Path, path: tuple, value) -> None:
    header = orjson.loads(header_file.read_bytes())
    target = header
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    header_file.unlink()  # never write through a hard link
    header_file.write_bytes(orjson.dumps(header, option=orjson.OPT_INDENT_2))


# ---------------------------------------------------------------- the known hole


@pytest.mark.parametrize("value", [8193, 2 * token_store.CHUNK_TOKENS, 10**9, "8192", 8192.0])
def test_an_edited_chunk_tokens_is_reported_when_every_row_fits_one_chunk(single, tmp_path, value):
    plan_dir = Path(shutil.copytree(single, tmp_path / "plan"))
    header_file = plan_dir / schemas.TOKENS_DIR / token_store.HEADER_FILE
    edit(header_file, ("chunk_tokens",), value)
    for args in ((), ("--fast",)):
        out = validate(plan_dir, *args)
        assert f"{plan_dir / schemas.TOKENS_DIR}: {token_store.HEADER_FILE} was edited" in out, out
    refused_by_runtime(plan_dir)


# ---------------------------------------------------------------- every header value


def test_any_edit_of_any_header_value_is_reported_naming_the_header(plan):
    """Every scalar of every header (the store's, each part's, each part record) changed alone: reported at open
    (`--fast` too), naming the header that was edited."""
    originals = {f: f.read_bytes() for f in headers(plan)}
    edits = 0
    for header_file, original in originals.items():
        for path, value in leaves(orjson.loads(original)):
            edit(header_file, path, changed(value))
            problems, _ = validate_plan(str(plan), fast=True)
            where = str(header_file.parent)
            assert any(where in p and token_store.HEADER_FILE in p for p in problems), (header_file, path, problems)
            header_file.unlink()
            header_file.write_bytes(original)
            edits += 1
    assert edits >= 10 * len(originals)
    assert validate_plan(str(plan))[0] == []
    edit(headers(plan)[-1], ("max_id",), 10**6)  # one through the CLI and the runtime: exit 1, no traceback
    assert token_store.HEADER_FILE in validate(plan)
    refused_by_runtime(plan)


def test_spacing_and_key_order_of_a_header_are_not_edits(plan):
    for header_file in headers(plan):
        header = orjson.loads(header_file.read_bytes())
        header_file.unlink()
        header_file.write_text(json.dumps(dict(reversed(header.items())), indent=7))
    assert validate_plan(str(plan))[0] == []


def test_a_header_rewritten_consistently_with_wrong_types_is_still_refused(plan):
    """A tool that recomputes header_hash after its edit: the types and the parts' records still bind."""
    header_file = plan / schemas.TOKENS_DIR / token_store.HEADER_FILE
    header = orjson.loads(header_file.read_bytes())
    header["rows"] = True if header["format"] == token_store.PARTS_FORMAT else header["rows"]
    header["labels_shifted"] = 0
    header["header_hash"] = token_store.header_hash(header)
    header_file.unlink()
    header_file.write_bytes(orjson.dumps(header))
    assert "values of the wrong type" in validate(plan, "--fast")


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_store_of_an_older_plancc_is_refused_with_what_to_do(plan, version):
    """Format 1 had no header hash; format 2's digest depended on how the scan was split (chunk hashes per part)."""
    for header_file in headers(plan):
        header = orjson.loads(header_file.read_bytes())
        header["format"] = header["format"].replace("/3", f"/{version}")
        del header["header_hash"]
        header_file.unlink()
        header_file.write_bytes(orjson.dumps(header))
    out = validate(plan)
    assert "written by an older plancc" in out and "recompile the plan" in out, out
    assert ("split" in out) == (version == "2"), out
    refused_by_runtime(plan)


# ---------------------------------------------------------------- every file: truncated, emptied, deleted


def inventory(plan_dir: Path) -> list[Path]:
    """The files a plan holds: its four Parquet files and manifest, and its token store's header and six arrays (a
    multi-part store: its own header and block hashes, and each part's header and arrays)."""
    tokens = plan_dir / schemas.TOKENS_DIR
    header = token_store.read_header(tokens)
    single = [token_store.HEADER_FILE, *(f"{name}.npy" for name in token_store.ARRAYS)]
    stored = ([tokens / name for name in single] if header["format"] != token_store.PARTS_FORMAT else
              [tokens / token_store.HEADER_FILE, tokens / "blocks.npy",
               *(tokens / p["dir"] / name for p in header["parts"] for name in single)])
    plan_files = [schemas.PLAN_FILE, schemas.SAMPLES_FILE, schemas.METRICS_FILE, schemas.BEFORE_FILE, schemas.MANIFEST_FILE]
    return sorted([*(plan_dir / name for name in plan_files), *stored])


@pytest.mark.parametrize("how", ["truncated", "emptied", "deleted", "last byte changed"])
def test_every_file_of_a_plan_damaged_is_reported_naming_it(plan, how):
    files = inventory(plan)
    assert files == sorted(p for p in plan.rglob("*") if p.is_file())
    for f in files:
        original = f.read_bytes()
        f.unlink()
        if how == "truncated":
            f.write_bytes(original[: len(original) // 2])
        elif how == "emptied":
            f.write_bytes(b"")
        elif how == "last byte changed":
            f.write_bytes(original[:-1] + bytes([original[-1] ^ 0x01]))
        try:
            problems, _ = validate_plan(str(plan))
        except schemas.StoreError as exc:  # no plan.parquet: not a plan directory (exit 2)
            problems = [str(exc)]
        named = f.name if f.parent == plan else str(f.parent)  # a store's chunk is named by its folder
        assert any(named in p for p in problems), (f, how, problems)
        f.unlink(missing_ok=True)
        f.write_bytes(original)
    assert validate_plan(str(plan))[0] == []


def test_a_deleted_part_folder_is_reported(parts, tmp_path):
    plan_dir = Path(shutil.copytree(parts, tmp_path / "plan"))
    shutil.rmtree(plan_dir / schemas.TOKENS_DIR / "part-00001")
    assert "part-00001 is missing" in validate(plan_dir, "--fast")
    refused_by_runtime(plan_dir)


# ---------------------------------------------------------------- swaps


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def test_two_parts_swapped_are_reported(parts, tmp_path):
    plan_dir = Path(shutil.copytree(parts, tmp_path / "plan"))
    tokens = plan_dir / schemas.TOKENS_DIR
    _swap(tokens / "part-00000", tokens / "part-00002")
    assert "replaced or rewritten" in validate(plan_dir, "--fast")
    refused_by_runtime(plan_dir)
    _swap(tokens / "part-00000", tokens / "part-00002")
    _swap(tokens / "part-00000" / token_store.HEADER_FILE, tokens / "part-00001" / token_store.HEADER_FILE)
    out = validate(plan_dir, "--fast")  # each part's files against its (other part's) header
    assert "part-0000" in out, out


@pytest.mark.parametrize(("a", "b"), [("input_ids.npy", "labels.npy"), ("chunks.npy", "offsets.npy")])
def test_two_arrays_of_a_store_swapped_are_reported(single, tmp_path, a, b):
    plan_dir = Path(shutil.copytree(single, tmp_path / "plan"))
    tokens = plan_dir / schemas.TOKENS_DIR
    _swap(tokens / a, tokens / b)
    assert str(tokens) in validate(plan_dir)
    refused_by_runtime(plan_dir)


# ---------------------------------------------------------------- byte flips over a multi-part plan


def test_every_byte_flip_of_a_multi_part_plan_is_detected_or_harmless(parts, tmp_path):
    """As test_validate's sweep over a single-store plan: seeded flips in every file of the multi-part plan."""
    plan_dir = Path(shutil.copytree(parts, tmp_path / "plan"))
    files = sorted(str(p.relative_to(plan_dir)) for p in plan_dir.rglob("*") if p.is_file())
    tally, silent = byte_flip_verdicts(plan_dir, files, flips=12, seed=16, epochs=1)
    print("byte flips:", tally)
    assert silent == [], f"flips accepted although content changed: {silent}"
    assert sum(c["detected"] for c in tally.values()) > 0.5 * 12 * len(files)


def test_header_schemas_describe_what_is_written(single, parts):
    import jsonschema

    root = REPO / "schemas"
    for plan_dir in (single, parts):
        for header_file in headers(plan_dir):
            header = orjson.loads(header_file.read_bytes())
            name = "tokens-parts" if header["format"] == token_store.PARTS_FORMAT else "tokens"
            jsonschema.validate(header, orjson.loads((root / f"{name}.schema.json").read_bytes()))


def _compile_cached(tmp_path: Path) -> list[str]:
    """Compile 10 rows to `a` through a scan cache in `tmp_path`; the arguments to compile them again."""
    (tmp_path / "d.jsonl").write_text(_rows(10))
    args = ["compile", str(tmp_path / "d.jsonl"), "--tokenizer", "builtin", "--sequence-len", "256", "--cache-dir",
            str(tmp_path / "cache"), "-q"]
    _cli(*args, "-o", str(tmp_path / "a"))
    return args


def test_a_damaged_store_in_the_scan_cache_is_scanned_again(tmp_path):
    args = _compile_cached(tmp_path)
    [cached] = (tmp_path / "cache" / "scans").glob(f"*/{schemas.TOKENS_DIR}/{token_store.HEADER_FILE}")
    edit(cached, ("chunk_tokens",), 1)
    _cli(*args, "-o", str(tmp_path / "b"))  # the edited entry is not linked into the new plan
    assert validate_plan(str(tmp_path / "b"))[0] == []
    assert token_store.read_header(cached.parent)["chunk_tokens"] == token_store.CHUNK_TOKENS


def test_an_edited_samples_table_in_the_scan_cache_is_scanned_again(tmp_path):
    args = _compile_cached(tmp_path)
    [cached] = (tmp_path / "cache" / "scans").glob(f"*/{schemas.SAMPLES_FILE}")
    table = pq.read_table(cached)
    counts = table.column("label_count").to_numpy().copy()
    counts[2] -= 1
    cached.unlink()  # a hard link to the first plan's: a file of its own
    pq.write_table(table.set_column(2, "label_count", pa.array(counts, pa.int32())), cached)
    _cli(*args, "-o", str(tmp_path / "b"))
    assert Plan(tmp_path / "b").fingerprints == Plan(tmp_path / "a").fingerprints


# ---------------------------------------------------------------- the store bound to the plan


def _rewrite_ids_and_rehash(plan_dir: Path, value: int | None, *, top: bool = True) -> None:
    """Every supervised id of the plan's store set to `value` (None: every part's ids rotated by one, the largest
    kept), then every row hash, block hash, `content_hash`,
    `index_hash` and `header_hash` recomputed (and a multi-part header's record of its parts and, with `top`, its
    block hashes of all rows): a store consistent in itself, with other tokens."""
    tokens = plan_dir / schemas.TOKENS_DIR
    header = token_store.read_header(tokens)
    singles = [tokens / p["dir"] for p in header["parts"]] if header["format"] == token_store.PARTS_FORMAT else [tokens]
    rows = []
    for k, d in enumerate(singles):
        m = token_store.open_store(d)
        ids, labels, offsets = np.array(m.input_ids), np.array(m.labels), np.array(m.offsets)
        if value is None:
            ids = np.roll(ids, 1)
        else:
            ids[labels != IGNORE_INDEX] = value
        kept = {key: m.header[key] for key in ("fingerprints", "labels_shifted", "chunk_tokens", "chunk_rows")}
        del m
        shutil.rmtree(d)  # never write through a hard link into the scan cache
        token_writer.write_store(d, ids, labels, offsets, **kept)
        rows.append(np.load(d / "row_hashes.npy"))
        if d != tokens:
            new = token_store.read_header(d)
            header["parts"][k].update(header_hash=new["header_hash"])
            header["max_id"] = max(header["max_id"], new["max_id"])
    if singles != [tokens]:
        if top:
            blocks = token_digest.block_hashes(rows, header["block_rows"])
            (tokens / "blocks.npy").unlink()
            np.save(tokens / "blocks.npy", blocks)
            header["content_hash"] = token_digest.content_hash(blocks)
        (tokens / token_store.HEADER_FILE).unlink()
        token_writer.write_header(tokens, {k: v for k, v in header.items() if k != "header_hash"})
    assert token_store.open_store(tokens)  # consistent in itself: every open-time check of the store passes


@pytest.mark.parametrize("verify", ["chunks", "counts"])
def test_tokens_rewritten_and_rehashed_are_refused_at_open_by_the_default_checks(plan, verify):
    _rewrite_ids_and_rehash(plan, 666)
    with pytest.raises(PlanMismatchError, match="is not the token store this plan was compiled with"):
        load_tokens(plan, verify=verify)
    assert "is not the token store this plan was compiled with" in validate(plan, "--fast")


@pytest.mark.parametrize("verify", ["chunks", "counts"])
def test_parts_rewritten_under_the_blocks_of_the_whole_are_refused_before_their_tokens_are_read(parts, tmp_path,
                                                                                                  verify):
    """Every part rehashed, their record in the multi-part header too, but not the whole dataset's block hashes
    (which the digest binds): the open passes; the first read of any row is refused, before it reaches a batch."""
    plan_dir = Path(shutil.copytree(parts, tmp_path / "plan"))
    _rewrite_ids_and_rehash(plan_dir, None, top=False)  # the header keeps every value the digest hashes
    tokens = load_tokens(plan_dir, verify=verify)
    with pytest.raises(PlanMismatchError, match="samples changed content"):
        tokens.check(np.array([int(parquet.column(Plan(plan_dir).samples_table(), "sample_id")[-1])]))
    assert "changed since it was written" in validate(plan_dir)


def _edit_plan_meta(plan_dir: Path, change, *, everywhere: bool = False) -> None:
    """Change the plan file's metadata (the whole manifest) and `manifest.json` consistently; `everywhere` also
    applies `change` to the sibling files' metadata (their fingerprints), as a thorough forger would."""
    names = [schemas.PLAN_FILE] + ([schemas.SAMPLES_FILE, schemas.METRICS_FILE, schemas.BEFORE_FILE] if everywhere else [])
    for name in names:
        table = pq.read_table(plan_dir / name)
        meta = orjson.loads(table.schema.metadata[schemas.META_KEY])
        change(meta)
        parquet.write_parquet(table, plan_dir / name, {schemas.META_KEY: orjson.dumps(meta, option=orjson.OPT_SORT_KEYS)},
                            schemas.PLAN_ROW_GROUP)
        if name == schemas.PLAN_FILE:
            parquet.write_json({k: v for k, v in meta.items() if k != "kind"}, plan_dir / schemas.MANIFEST_FILE)


@pytest.mark.parametrize("where", ["/etc", "../elsewhere", "tokens/../tokens"])
def test_a_token_path_in_the_metadata_is_never_followed(single, tmp_path, where):
    plan_dir = Path(shutil.copytree(single, tmp_path / "plan"))
    shutil.copytree(plan_dir / schemas.TOKENS_DIR, tmp_path / "elsewhere")
    _edit_plan_meta(plan_dir, lambda m: m["data"].update(tokens=where))
    out = validate(plan_dir)
    assert out.count("\n") == 1 and f"data.tokens is {where!r}" in out, out
    with pytest.raises(PlanMismatchError, match=r"data\.tokens is"):
        load_tokens(plan_dir)


def test_a_plan_naming_another_source_is_not_ok(single, tmp_path):
    """data.tokens removed and data.source pointed at /etc/passwd: the plan still binds tokens/, so validate reports
    the inconsistency; with the binding removed from every file too, tokens/ is unbound and the runtime asks for
    data= (it never opens /etc/passwd)."""
    plan_dir = Path(shutil.copytree(single, tmp_path / "plan"))

    def to_passwd(meta):
        meta["data"].pop("tokens")
        meta["data"].update(source=["/etc/passwd"], source_relative=["/etc/passwd"])

    _edit_plan_meta(plan_dir, to_passwd)
    assert "data.tokens is missing" in validate(plan_dir)
    with pytest.raises(PlanMismatchError, match=r"data\.tokens is missing"):
        load_tokens(plan_dir)
    _edit_plan_meta(plan_dir, lambda m: m["fingerprints"].pop("tokens"), everywhere=True)
    assert "plan binds no token store" in validate(plan_dir)
    with pytest.raises(PlanMismatchError, match="holds no tokenized data"):
        load_tokens(plan_dir)


@pytest.mark.parametrize(("change", "named"), [
    (lambda m: m.update(data=[]), "data is []"),
    (lambda m: m["data"].update(tokens=5), "data.tokens is 5"),
    (lambda m: m["data"].update(source="x"), "data.source is 'x'"),
    (lambda m: m.update(fingerprints=[]), "fingerprints is []"),
    (lambda m: m["fingerprints"].update(plan="x"), "fingerprints.plan is 'x'"),
    (lambda m: m["fingerprints"].update(tokens=5), "fingerprints.tokens is 5"),
])
def test_metadata_of_the_wrong_shape_is_one_line_naming_it(single, tmp_path, change, named):
    plan_dir = Path(shutil.copytree(single, tmp_path / "plan"))
    _edit_plan_meta(plan_dir, change)
    out = validate(plan_dir)
    assert out.count("\n") == 1 and named in out and schemas.PLAN_FILE in out, out
    with pytest.raises(PlanMismatchError, match=re.escape(named)):
        load_tokens(plan_dir)
