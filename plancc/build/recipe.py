"""A recipe's datasets as one samples table and one token store.

Each dataset is loaded as a single source would be (`plancc.build.samples.load_samples`: scanned into the scan cache under its
own key, or reused, so changing one dataset rescans only that one; a scan or plan directory is read as is), with
its own `--max-dropped` check (an error names the dataset). Then, in recipe order:

* sample ids: dataset d's ids are offset by the rows of the token stores before it (`first_id`): sample_id
  `first_id + row` is row `row` of dataset d, so ids stay unique, sorted, and the row a trainer reads;
* the samples table: the datasets' tables concatenated, with a `dataset` column (the dataset's name);
* the token store: a multi-part store (`token_writer.write_parts`) of the datasets' stores, hard-linked from the
  scan cache into `recipes/KEY/` of the cache (KEY: the datasets' fingerprints, names and order); the runtime maps
  it as one store, so its per-sample read stays O(1) and each chunk is still hashed on first read;
* a stored scan's sequence_len and shift (read first) are those the others are scanned with, unless set;
* the report: rows, drops and cuts summed, the tokenizer (one for the recipe: datasets scanned with different
  ones are an error naming both), and per dataset its counts, fingerprints, first id and mix (`datasets`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from plancc.build.carry import carry
from plancc.config.recipe import DatasetSpec
from plancc.config.settings import SHARED_SETTINGS, PlanSettings, ScanOptions, canonical_hash
from plancc.core.paths import default_cache_dir
from plancc.errors import InputError, PlanccError, SettingsError
from plancc.planner.mixture import dataset_index
from plancc.store import outputs, parquet, plan_files, schemas, token_store, token_writer
from plancc.store.plan import Plan
from plancc.store.scan_record import TOTALS, ScanRecord, Template


@dataclass(frozen=True)
class Loaded:
    """One dataset loaded: its samples table, scan report, token store and the plan settings its scan implies."""

    spec: DatasetSpec
    table: pa.Table
    report: ScanRecord
    tokens: Path | None
    settings: PlanSettings

    @property
    def rows(self) -> int:
        """Rows its sample ids address: the token store's, else one past the largest id."""
        if self.tokens is not None:
            return int(token_store.read_header(self.tokens)["rows"])
        return int(parquet.column(self.table, "sample_id")[-1]) + 1


@dataclass(frozen=True)
class Joined:
    """The recipe's datasets together (see the module docstring)."""

    table: pa.Table
    report: ScanRecord
    tokens: Path | None
    settings: PlanSettings
    datasets: list[dict[str, Any]]
    index: np.ndarray  # each sample's position in `settings.mixture`


def _load_one(spec: DatasetSpec, scan_options: ScanOptions, settings: PlanSettings, given: Any, **kw: Any) -> Loaded:
    from plancc.build.samples import load_samples

    options = spec.scan_options(scan_options)
    try:
        table, report, tokens = load_samples(spec.path, options, **kw)
        implied = carry(report, options, settings, given, f"dataset {spec.name!r} ({spec.path})")
    except PlanccError as exc:
        if f"dataset {spec.name!r}" in str(exc):
            raise
        raise type(exc)(f"dataset {spec.name!r}: {exc}") from None
    return Loaded(spec, table, report, tokens, implied)


def _is_stored(path: str) -> bool:
    """Whether a dataset's path is a scan or plan directory or a samples table (its options are what they are)."""
    p = Path(path)
    if p.is_dir():
        return (p / schemas.SAMPLES_FILE).is_file()
    try:
        return p.suffix == ".parquet" and set(pq.read_schema(p).names) == set(schemas.SAMPLES_SCHEMA.names)
    except (OSError, pa.ArrowException):
        return False


def _load_all(specs: tuple[DatasetSpec, ...], scan_options: ScanOptions, settings: PlanSettings, given: Any,
              **kw: Any) -> list[Loaded]:
    """Every dataset, in recipe order; stored scans are read first, and the first that records its sequence_len
    and shift gives them to the datasets still to scan (unless they were set on purpose)."""
    order = sorted(range(len(specs)), key=lambda i: not _is_stored(specs[i].path))
    loaded: dict[int, Loaded] = {}
    for i in order:
        loaded[i] = _load_one(specs[i], scan_options, settings, given, **kw)
        recorded = loaded[i].report.options
        if _is_stored(specs[i].path) and recorded is not None:
            carried = {k: getattr(recorded, k) for k in SHARED_SETTINGS if k not in given}
            scan_options = dataclasses.replace(scan_options, **carried)
            settings = dataclasses.replace(settings, **carried)
    return [loaded[i] for i in range(len(specs))]


def _agree(loaded: list[Loaded]) -> None:
    """One sequence_len, shift and tokenizer for the recipe: the first dataset that differs is named with the first."""
    first = loaded[0]
    for d in loaded[1:]:
        for name in ("sequence_len", "shift"):
            a, b = getattr(first.settings, name), getattr(d.settings, name)
            if a != b:
                raise SettingsError(f"datasets {first.spec.name!r} and {d.spec.name!r} have {name} {a} and {b}: a "
                                    f"recipe has one {name}; rescan one of them with the other's")
        a, b = first.report.tokenizer_fingerprint, d.report.tokenizer_fingerprint
        if a != b and a and b:
            raise SettingsError(f"datasets {first.spec.name!r} and {d.spec.name!r} were tokenized by different "
                                f"tokenizers ({first.report.tokenizer} and {d.report.tokenizer}): a "
                                "recipe has one tokenizer")


def _with_ids(d: Loaded, first_id: int) -> pa.Table:
    table = d.table.select(schemas.SAMPLES_SCHEMA.names).cast(schemas.SAMPLES_SCHEMA)
    ids = parquet.column(table, "sample_id") + first_id
    table = table.set_column(0, schemas.SAMPLES_SCHEMA.field(0), parquet.arrow_array(ids, pa.int64()))
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
    length, labels = parquet.column(d.table, "length"), parquet.column(d.table, "label_count")
    kind, value = d.spec.mix()[2:]
    report = d.report
    return {
        "name": d.spec.name, "role": d.spec.role, "path": d.spec.path, kind: value,
        "first_id": first_id, "rows": rows,
        "rows_read": report.rows_read if "rows_read" in report.keys else d.table.num_rows,
        "retained": d.table.num_rows, "dropped_samples": report.dropped_samples,
        "truncated_samples": report.truncated_samples,
        "tokens": int(length.sum()), "label_tokens": int(labels.sum()),
        "format": report.format, "chat_template": report.chat_template.name if report.chat_template else None,
        "fingerprints": plan_files.samples_fingerprints(d.table, report.identity),
        # how its rows were made and where each came from: what `plancc diff` names per dataset
        **({"options": report.options.to_json()} if report.options is not None else {}),
        **{k: v for k, v in report.to_json().items() if k in ("source_fingerprint", "source_files")},
    }


def _report(loaded: list[Loaded], datasets: list[dict[str, Any]]) -> ScanRecord:
    """The recipe's scan record: the first dataset's options and tokenizer, counts summed, every warning named."""
    first = loaded[0].report
    templates = [d.report.chat_template for d in loaded]
    values = {k: v for k, v in first.held().items() if k in ("tokenizer", "tokenizer_fingerprint", "options")}
    values |= {k: sum(int(d.get(k, 0)) for d in datasets) for k in TOTALS}
    if any(templates):  # each dataset's own template: the metadata fingerprint folds them all in
        values["chat_template"] = Template(", ".join(sorted({t.name for t in templates if t})),
                                           canonical_hash({"templates": [t and t.fingerprint for t in templates]}))
    values["warnings"] = tuple(f"dataset {d.spec.name!r}: {w}" for d in loaded for w in d.report.warnings)
    values["source_paths"] = tuple(p for d in loaded for p in d.report.source_paths)
    return ScanRecord.of(**values)


def _token_store(loaded: list[Loaded], table: pa.Table, report: ScanRecord, shift: str,
                 cache_dir: Path | None) -> Path | None:
    """The datasets' token stores as one multi-part store in the cache, bound to the joined samples `table` (reused
    when its fingerprints match); None for bare samples tables."""
    missing = [d.spec.name for d in loaded if d.tokens is None]
    if missing:
        if len(missing) < len(loaded):
            raise InputError(f"dataset {missing[0]!r} has no token store (a bare samples table) while others do: a "
                             "recipe's datasets are all scanned sources (or all bare tables)")
        return None
    fingerprints = plan_files.samples_fingerprints(table, report.identity)
    key = canonical_hash({"fingerprints": fingerprints, "stores": [token_store.read_header(d.tokens)["fingerprints"]
                                                                   for d in loaded]})
    entry = Path(cache_dir if cache_dir is not None else default_cache_dir()) / "recipes" / key
    tokens = entry / schemas.TOKENS_DIR
    try:
        if token_store.open_store(tokens).header["fingerprints"] == fingerprints:
            return tokens
    except token_store.TokenStoreError:
        pass
    entry.parent.mkdir(parents=True, exist_ok=True)
    with outputs.atomic_directory(entry, owned=True, what="scan") as tmp:
        token_writer.write_parts(tmp / schemas.TOKENS_DIR, [d.tokens for d in loaded], fingerprints=fingerprints,
                                 labels_shifted=shift == "none")
    return tokens


def load(specs: tuple[DatasetSpec, ...], scan_options: ScanOptions, settings: PlanSettings, given: Any, *,
         num_proc: int = 1, cache_dir: Path | None = None, progress: Any = None) -> Joined:
    """Load every dataset of the recipe and join them (see the module docstring)."""
    loaded = _load_all(specs, scan_options, settings, given, num_proc=num_proc, cache_dir=cache_dir,
                       progress=progress)
    _agree(loaded)
    tables, datasets, first_id = [], [], 0
    for d in loaded:
        rows = d.rows
        tables.append(_with_ids(d, first_id))
        datasets.append(_summary(d, first_id, rows))
        first_id += rows
    table = pa.concat_tables(tables).combine_chunks()
    settings = dataclasses.replace(loaded[0].settings, mixture=tuple(spec.mix() for spec in specs))
    report = _report(loaded, datasets)
    tokens = _token_store(loaded, table, report, settings.shift, cache_dir)
    codes, names = plan_files.dataset_codes(table)
    return Joined(table, report, tokens, settings, datasets, dataset_index(codes, names, settings.mixture))


def epoch_metrics(epochs: list[Any], joined: Joined, shift: str) -> list[dict[str, Any]]:
    """Per dataset per epoch: samples, tokens, label tokens and shares, `before` (the mixture as drawn, label tokens
    as each sample counts alone) and `after` (what the plan holds, label tokens as the collator counts them)."""
    from plancc.planner.metrics import dataset_rows, entry_targets

    names = [d["name"] for d in joined.datasets]
    rows: list[dict[str, Any]] = []
    for p in epochs:
        s, index = p.samples, joined.index[p.positions]
        rows += dataset_rows(p.epoch, "before", names, index, s.length, s.targets(shift))
        b = p.batches
        rows += dataset_rows(p.epoch, "after", names, index[b.samples], s.length[b.samples],
                             entry_targets(b, s, shift))
    return rows


def eval_sample_ids(samples: pa.Table, mixture: tuple) -> np.ndarray:
    """The sample ids of a recipe's eval datasets (`eval_datasets`): in the samples table, never in a training
    epoch; the eval plan draws on them. Empty for a recipe without eval datasets or a one-source table."""
    if schemas.DATASET_COLUMN not in samples.column_names:
        return np.zeros(0, dtype=np.int64)
    from plancc.planner.mixture import eval_positions

    codes, names = plan_files.dataset_codes(samples)
    positions = eval_positions(dataset_index(codes, names, mixture), mixture)
    return parquet.column(samples, "sample_id")[positions]


def plan_eval_sample_ids(plan_dir: str | Path) -> np.ndarray:
    """`eval_sample_ids` of a plan directory (its samples table and its settings' mixture)."""
    plan = Plan(plan_dir)
    return eval_sample_ids(plan.read_samples(), plan.settings.mixture)
