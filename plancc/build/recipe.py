"""A recipe's datasets as one samples table and one token store.

Each dataset is loaded as a single source would be (`plancc.build.samples`: read as it is from a scan or plan
directory, or scanned into the scan cache under its own key, or reused, so changing one dataset rescans only that
one), with its own `--max-dropped` check (an error names the dataset). The stored ones are read first: their
sequence_len and shift settle the recipe's (`plancc.build.carry`), which the others are scanned with. Then, in
recipe order:

* sample ids: dataset d's ids are offset by the rows of the token stores before it (`first_id`): sample_id
  `first_id + row` is row `row` of dataset d, so ids stay unique, sorted, and the row a trainer reads;
* pair ids (preference data): offset by `first_pair`, the pairs those rows hold (half of them: `_pair_span`), so
  they are unique across the recipe and sample `2p + role` stays pair p's completion;
* one kind of data: SFT, pairs or unpaired (KTO) rows in every dataset (mixing them is an error naming both);
* the samples table: the datasets' tables concatenated (with their pair or label columns), with a `dataset` column
  (the dataset's name);
* the token store: a multi-part store (`token_writer.write_parts`) of the datasets' stores, hard-linked from the
  scan cache into `recipes/KEY/` of the cache (KEY: the datasets' fingerprints, names and order), written once:
  compiles of the same recipe at once wait for the one writing it and reuse it; the runtime maps
  it as one store, so its per-sample read stays O(1) and each chunk is still hashed on first read;
* the record: rows, drops and cuts summed, the tokenizer (one for the recipe: datasets scanned with different
  ones are an error naming both), and per dataset its counts, fingerprints, first id and mix (`datasets`; for
  pairs also `first_pair` and `pairs`, the pairs kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.build.carry import Stored, settle
from plancc.build.samples import Samples, open_stored, scan_source
from plancc.config.recipe import DatasetSpec
from plancc.config.resolve import Resolved
from plancc.core.hashing import canonical_hash
from plancc.core.paths import cache_path
from plancc.errors import InputError, PlanccError, SettingsError
from plancc.planner.mixture import dataset_index
from plancc.store import atomic, outputs, parquet, schemas, token_store, token_writer
from plancc.store.samples import dataset_codes, samples_fingerprints
from plancc.store.scan_record import TOTALS, ScanRecord, Template


@dataclass(frozen=True)
class Loaded:
    """One dataset of the recipe loaded: its entry and its samples."""

    spec: DatasetSpec
    samples: Samples

    @property
    def record(self) -> ScanRecord:
        """Its scan record."""
        return self.samples.record

    @property
    def rows(self) -> int:
        """Rows its sample ids address: the token store's, else one past the largest id."""
        if self.samples.tokens is not None:
            return int(token_store.read_header(self.samples.tokens)["rows"])
        return int(parquet.column(self.samples.table, "sample_id")[-1]) + 1


def _named(spec: DatasetSpec, load: Any, *args: Any, **kw: Any) -> Any:
    """`load(*args, **kw)`, its error naming the dataset."""
    try:
        return load(*args, **kw)
    except PlanccError as exc:
        if f"dataset {spec.name!r}" in str(exc):
            raise
        raise type(exc)(f"dataset {spec.name!r}: {exc}") from None


def _load_all(resolved: Resolved, **kw: Any) -> tuple[Resolved, list[Loaded]]:
    """Every dataset, in recipe order, and the settings settled: the stored scans are read first and settle the
    recipe's sequence_len and shift (`plancc.build.carry`), then the raw datasets are scanned with them."""
    specs = resolved.datasets
    stored = {i: found for i, spec in enumerate(specs) if (found := _named(spec, open_stored, spec.path)) is not None}
    resolved = settle(resolved, [Stored(specs[i].name, f"dataset {specs[i].name!r} ({specs[i].path})", found,
                                        specs[i].scan_options(resolved.scan)) for i, found in stored.items()])
    loaded = [Loaded(spec, stored[i] if i in stored else _named(spec, scan_source, spec.path,
                                                                 spec.scan_options(resolved.scan),
                                                                 num_proc=resolved.run.num_proc, **kw))
              for i, spec in enumerate(specs)]
    return resolved, loaded


def _agree(loaded: list[Loaded]) -> None:
    """One tokenizer for the recipe: the first dataset tokenized by another is named with the first."""
    first = loaded[0]
    for d in loaded[1:]:
        a, b = first.record.tokenizer_fingerprint, d.record.tokenizer_fingerprint
        if a != b and a and b:
            raise SettingsError(f"datasets {first.spec.name!r} and {d.spec.name!r} were tokenized by different "
                                f"tokenizers ({first.record.tokenizer} and {d.record.tokenizer}): a "
                                "recipe has one tokenizer")


KIND_NAMES = {"sft": "SFT data", "preference": "preference pairs", "unpaired_preference": "unpaired (KTO) data"}


def _one_kind(loaded: list[Loaded]) -> str:
    """The recipe's kind of data (`schemas.data_kind_of`): every dataset's; the first that differs is an error
    naming it with the first dataset (pairs and SFT samples, or pairs and KTO labels, have no common unit)."""
    kinds = [schemas.data_kind_of(d.samples.table.column_names) for d in loaded]
    for d, kind in zip(loaded[1:], kinds[1:], strict=True):
        if kind != kinds[0]:
            raise InputError(f"dataset {loaded[0].spec.name!r} holds {KIND_NAMES[kinds[0]]} ({kinds[0]}) but dataset "
                             f"{d.spec.name!r} holds {KIND_NAMES[kind]} ({kind}): a recipe's datasets are all SFT "
                             "data, all preference pairs or all unpaired (KTO) data; compile each kind as a plan of "
                             "its own (docs/preference.md)")
    return kinds[0]


def _pair_span(d: Loaded) -> int:
    """Pair ids dataset d's pairs may take: half the rows its sample ids address (a pair is two rows: scanned
    data keeps sample_id = 2 x pair_id + role), or one past its largest pair id if that is more."""
    return max(d.rows // 2, int(parquet.column(d.samples.table, schemas.PAIR_ID_COLUMN).max()) + 1)


def _offset(table: pa.Table, name: str, by: int) -> pa.Table:
    """`table` with int64 column `name` raised by `by`."""
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), parquet.arrow_array(parquet.column(table, name) + by, pa.int64()))


def _with_ids(d: Loaded, kind: str, first_id: int, first_pair: int) -> pa.Table:
    """Dataset d's samples table in the recipe's id space (module docstring), with its `dataset` column."""
    schema = schemas.samples_schema(False, kind)
    table = _offset(d.samples.table.select(schema.names).cast(schema), "sample_id", first_id)
    if kind == "preference":
        table = _offset(table, schemas.PAIR_ID_COLUMN, first_pair)
    return table.append_column(schemas.RECIPE_SAMPLES_SCHEMA.field(schemas.DATASET_COLUMN),
                               _repeated(d.spec.name, table.num_rows))


def _repeated(text: str, n: int) -> pa.Array:
    """`text` n times as an Arrow string array, built from buffers (`pa.array` of a list imports pandas: a second
    of every compile)."""
    encoded = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(encoded)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * n)])


def _summary(d: Loaded, first_id: int, rows: int) -> dict[str, Any]:
    """What the manifest says of one dataset: where it is, how it mixes, its scan's counts and fingerprints."""
    table = d.samples.table
    length, labels = parquet.column(table, "length"), parquet.column(table, "label_count")
    record = d.record
    return {
        "name": d.spec.name, "role": str(d.spec.role), "path": d.spec.path, str(d.spec.mix.kind): d.spec.mix.value,
        "first_id": first_id, "rows": rows,
        "rows_read": record.rows_read if "rows_read" in record.keys else table.num_rows,
        "retained": table.num_rows, "dropped_samples": record.dropped_samples,
        "truncated_samples": record.truncated_samples,
        "tokens": int(length.sum()), "label_tokens": int(labels.sum()),
        "format": record.format, "chat_template": record.chat_template.name if record.chat_template else None,
        "fingerprints": samples_fingerprints(table, record.identity),
        # how its rows were made and where each came from: what `plancc diff` names per dataset
        **({"options": record.options.to_json()} if record.options is not None else {}),
        **{k: v for k, v in record.to_json().items() if k in ("source_fingerprint", "source_files")},
    }


def _record(loaded: list[Loaded], datasets: list[dict[str, Any]]) -> ScanRecord:
    """The recipe's scan record: the first dataset's options and tokenizer, counts summed, every warning named."""
    first = loaded[0].record
    templates = [d.record.chat_template for d in loaded]
    values = {k: v for k, v in first.held().items() if k in ("tokenizer", "tokenizer_fingerprint", "options")}
    values |= {k: sum(int(d.get(k, 0)) for d in datasets) for k in TOTALS}
    if any(templates):  # each dataset's own template: the metadata fingerprint folds them all in
        values["chat_template"] = Template(", ".join(sorted({t.name for t in templates if t})),
                                           canonical_hash({"templates": [t and t.fingerprint for t in templates]}))
    values["warnings"] = tuple(f"dataset {d.spec.name!r}: {w}" for d in loaded for w in d.record.warnings)
    values["source_paths"] = tuple(p for d in loaded for p in d.record.source_paths)
    return ScanRecord.of(**values)


def _token_store(loaded: list[Loaded], table: pa.Table, record: ScanRecord, shift: str,
                 cache_dir: Path | None) -> Path | None:
    """The datasets' token stores as one multi-part store in the cache, bound to the joined samples `table` (reused
    when its fingerprints match); None for bare samples tables."""
    missing = [d.spec.name for d in loaded if d.samples.tokens is None]
    if missing:
        if len(missing) < len(loaded):
            raise InputError(f"dataset {missing[0]!r} has no token store (a bare samples table) while others do: a "
                             "recipe's datasets are all scanned sources (or all bare tables)")
        return None
    fingerprints = samples_fingerprints(table, record.identity)
    key = canonical_hash({"fingerprints": fingerprints,
                          "stores": [token_store.read_header(d.samples.tokens)["fingerprints"] for d in loaded]})
    entry = cache_path(cache_dir, "recipes", key)
    tokens = entry / schemas.TOKENS_DIR
    if _cached(tokens, fingerprints):
        return tokens
    with atomic.exclusive(entry.parent, f"{key}.recipe"):  # a compile of the same recipe meanwhile: wait, reuse
        if not _cached(tokens, fingerprints):
            with outputs.atomic_directory(entry, owned=True, what="scan") as tmp:
                token_writer.write_parts(tmp / schemas.TOKENS_DIR, [d.samples.tokens for d in loaded],
                                         fingerprints=fingerprints, labels_shifted=shift == "none")
    return tokens


def _cached(tokens: Path, fingerprints: dict[str, str]) -> bool:
    """Whether the cache holds the joined token store bound to `fingerprints`."""
    try:
        return token_store.open_store(tokens).header["fingerprints"] == fingerprints
    except token_store.TokenStoreError:
        return False


def join_recipe(resolved: Resolved, *, cache_dir: Path | None = None, progress: Any = None) -> tuple[Resolved, Samples]:
    """Every dataset of the recipe loaded and joined into one samples table and token store (module docstring),
    with the settings settled by the stored scans among them (`plancc.build.carry`)."""
    resolved, loaded = _load_all(resolved, cache_dir=cache_dir, progress=progress)
    _agree(loaded)
    kind = _one_kind(loaded)
    tables, datasets, first_id, first_pair = [], [], 0, 0
    for d in loaded:
        rows = d.rows
        tables.append(_with_ids(d, kind, first_id, first_pair))
        datasets.append(_summary(d, first_id, rows))
        if kind == "preference":
            datasets[-1] |= {"first_pair": first_pair, "pairs": d.samples.table.num_rows // 2}
            first_pair += _pair_span(d)
        first_id += rows
    table = pa.concat_tables(tables).combine_chunks()
    record = _record(loaded, datasets)
    tokens = _token_store(loaded, table, record, resolved.plan.shift, cache_dir)
    codes, names = dataset_codes(table)
    return resolved, Samples(table, record, tokens, dataset_index(codes, names, resolved.plan.mixture), datasets)


def epoch_metrics(epochs: list[Any], joined: Samples, shift: str) -> list[dict[str, Any]]:
    """Per dataset per epoch: samples, tokens, label tokens and shares, `before` (the mixture as drawn, label tokens
    as each sample counts alone) and `after` (what the plan holds, label tokens as the collator counts them)."""
    from plancc.planner.metrics import dataset_rows, entry_targets

    names = [d["name"] for d in joined.datasets]
    rows: list[dict[str, Any]] = []
    for p in epochs:
        s, index = p.samples, joined.index[p.positions]
        rows += dataset_rows(p.epoch, "before", names, index, s.length, s.targets(shift), s.chosen)
        b = p.batches
        rows += dataset_rows(p.epoch, "after", names, index[b.samples], s.length[b.samples],
                             entry_targets(b, s, shift), None if s.chosen is None else s.chosen[b.samples])
    return rows
