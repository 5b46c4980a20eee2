"""Test helpers: random token-level datasets and the samples tables they imply (by docs/spec.md §2's definitions)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from plancc.review.validate import validate_plan
from plancc.store import plan_body, schemas
from plancc.store.fingerprint import token_hashes
from plancc.store.parquet import column


def write_plan_rows(rows: pa.Table, path: Path, metadata: dict[bytes, bytes]) -> None:
    """Write a whole plan table, sorted by (epoch, rank, index), as compile writes its rows (`plan_body`): a rank
    block a row group, the body digest in the footer. For tests that rewrite a plan's rows."""
    plan_body.write_row_groups(rows.schema, column(rows, "epoch"), column(rows, "rank"),
                               lambda a, b: rows.slice(a, b - a), path, metadata)


def random_dataset(rng: np.random.Generator, n: int, max_len: int, mask_rate: float = 0.6
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(input_ids, labels) per sample; every sample keeps at least one supervised target after its shift."""
    ids, labels = [], []
    for _ in range(n):
        length = int(rng.integers(2, max_len + 1))
        tok = rng.integers(0, 1000, length).astype(np.int32)
        lab = tok.copy()
        lab[rng.random(length) < mask_rate] = -100
        if (lab[1:] == -100).all():
            lab[-1] = tok[-1]
        ids.append(tok)
        labels.append(lab)
    return ids, labels


def samples_table(ids: list[np.ndarray], labels: list[np.ndarray], sample_ids: np.ndarray | None = None) -> pa.Table:
    """The samples table docs/spec.md §2 defines for these samples (label_count counts the given label arrays)."""
    n = len(ids)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    flat_ids = np.concatenate(ids) if n else np.zeros(0, np.int32)
    flat_labels = np.concatenate(labels) if n else np.zeros(0, np.int32)
    return pa.table(
        {
            "sample_id": np.arange(n, dtype=np.int64) if sample_ids is None else sample_ids.astype(np.int64),
            "length": np.diff(offsets).astype(np.int32),
            "label_count": np.array([int((x != -100).sum()) for x in labels], dtype=np.int32),
            "first_label_supervised": np.array([bool(x[0] != -100) for x in labels]),
            "token_hash": token_hashes(flat_ids, offsets, flat_labels, offsets),
        }
    )


def write_samples_file(directory: Path, seed: int, n: int, max_len: int) -> Path:
    """`directory/samples.parquet`: the samples table of `random_dataset` drawn with `seed` (a compile source)."""
    ids, labels = random_dataset(np.random.default_rng(seed), n, max_len)
    path = directory / "samples.parquet"
    pq.write_table(samples_table(ids, labels), path)
    return path


def direct_targets(rows: list[list[int]], labels: list[np.ndarray], shift: str) -> int:
    """Supervised targets of one microbatch counted on the label tokens themselves (docs/spec.md §3), no plan helpers."""
    total = 0
    for row in rows:
        if shift == "row":
            joined = np.concatenate([labels[i] for i in row])
            total += int((joined[1:] != -100).sum())
        elif shift == "sample":
            total += sum(int((labels[i][1:] != -100).sum()) for i in row)
        else:  # "none": the label arrays are already shifted labels
            total += sum(int((labels[i] != -100).sum()) for i in row)
    return total


# ---------------------------------------------------------------- byte flips


def _decoded(path: Path, epochs: int) -> object:
    """Everything a reader can get from one file, or the error reading it gives: the table with its schema and
    metadata, the Arrow schema, every column statistic (filtered reads skip row groups on them) and, for the plan,
    each epoch's filtered read. Parquet's own leaf names are left out: readers take names from the Arrow schema."""
    try:
        if path.suffix == ".json":
            return json.loads(path.read_bytes())
        if path.suffix == ".npy":  # what np.load (and so the map) gives: dtype, shape, values
            arr = np.load(path, allow_pickle=False)
            return arr.dtype.str, arr.shape, arr.tobytes()
        pf = pq.ParquetFile(path)
        table = pf.read()
        stats = [[c.statistics.to_dict() if c.statistics is not None else None
                  for c in (pf.metadata.row_group(i).column(j) for j in range(pf.metadata.num_columns))]
                 for i in range(pf.metadata.num_row_groups)]
        epoch_reads = ([pq.read_table(path, filters=[("epoch", "=", e)]) for e in range(epochs)]
                       if path.name == schemas.PLAN_FILE else [])
        return table, table.schema, table.schema.metadata, pf.schema_arrow, stats, epoch_reads
    except Exception as exc:  # any failure to decode is a change a reader sees
        return f"unreadable: {type(exc).__name__}"


def _same(a: object, b: object) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 6:
        ta, sa, ma, pa_, st_a, ea = a
        tb, sb, mb, pb, st_b, eb = b
        return (ta.equals(tb) and sa.equals(sb) and ma == mb and pa_.equals(pb) and st_a == st_b
                and len(ea) == len(eb) and all(x.equals(y) for x, y in zip(ea, eb, strict=True)))
    return a == b


def byte_flip_verdicts(plan: Path, files: list[str], *, flips: int, seed: int, epochs: int
                       ) -> tuple[dict[str, dict[str, int]], list[tuple[str, int]]]:
    """Flip `flips` random bytes (XOR a random non-zero value), one at a time, at random offsets of each of the
    plan's `files` (in order, one seeded generator) and validate each: (per file {detected, harmless} counts, the
    flips validate accepted although what a reader decodes changed). Every file is restored."""
    rng = np.random.default_rng(seed)
    tally: dict[str, dict[str, int]] = {}
    silent = []
    for name in files:
        path = plan / name
        original = path.read_bytes()
        before = _decoded(path, epochs)
        counts = tally.setdefault(name, {"detected": 0, "harmless": 0})
        for _ in range(flips):
            at = int(rng.integers(len(original)))
            flipped = bytearray(original)
            flipped[at] ^= int(rng.integers(1, 256))
            path.write_bytes(bytes(flipped))
            try:
                problems, _ = validate_plan(str(plan))
            except schemas.StoreError as exc:  # not even recognisable as a plan: still a refusal
                problems = [str(exc)]
            if problems:
                counts["detected"] += 1
            elif _same(_decoded(path, epochs), before):
                counts["harmless"] += 1
            else:
                silent.append((name, at))
        path.write_bytes(original)
    return tally, silent


def plan_files(plan_dir: Path) -> dict[str, bytes]:
    """Every file of a plan directory but its token store's, by name: the Parquet files and the manifest."""
    return {f.name: f.read_bytes() for f in sorted(plan_dir.iterdir()) if f.is_file()}


# ---------------------------------------------------------------- a consistent forgery of the eval plan


def swap_eval_for_training(plan: Path) -> None:
    """Replace eval.parquet's rows by epoch 0's first training microbatches (as many as it held), with the eval
    fingerprint and summary recomputed into every file's metadata and manifest.json: every hash a reader checks
    then agrees, and only the held-out draw tells the rows are training samples."""
    from plancc.core import layout
    from plancc.store import parquet, plan_tables
    from plancc.store.fingerprint import eval_fingerprint
    from plancc.store.manifest import EvalSummary
    from plancc.store.plan import Plan

    opened = Plan(plan)
    n, W = opened.manifest.eval.batches, opened.settings.world_size
    rows = opened.files.read_epoch(0).slice(0, n)
    ids, row_bounds, batch_bounds = parquet.nested_arrays(rows.column("sample_ids"))
    cols = {"index": np.arange(n, dtype=np.int64), "rank": layout.ranks(n, W), "sample_ids": ids,
            "row_bounds": row_bounds, "batch_bounds": batch_bounds,
            **{k: parquet.column(rows, k) for k in ("tokens", "label_count", "cost")}}
    manifest = opened.manifest.to_json()
    manifest["fingerprints"]["eval"] = eval_fingerprint(cols)
    manifest["eval"] = EvalSummary.of(cols, W).to_json()
    for name in (schemas.SAMPLES_FILE, schemas.METRICS_FILE, schemas.BEFORE_FILE, schemas.EVAL_FILE):
        table = plan_tables.eval_table(cols) if name == schemas.EVAL_FILE else pq.read_table(plan / name)
        meta = json.loads(pq.read_metadata(plan / name).metadata[schemas.META_KEY])
        meta["fingerprints"] = manifest["fingerprints"]
        parquet.write_parquet(table.replace_schema_metadata(None), plan / name,
                              {schemas.META_KEY: json.dumps(meta, sort_keys=True).encode()})
    write_plan_rows(pq.read_table(plan / schemas.PLAN_FILE).replace_schema_metadata(None), plan / schemas.PLAN_FILE,
                    {schemas.META_KEY: json.dumps({**manifest, "kind": "plan"}, sort_keys=True).encode()})
    (plan / schemas.MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
