"""`Manifest`: what a plan records of itself, typed; the one reader (`from_json`) and writer (`to_json`) of it.

The manifest is `plan.parquet`'s key-value metadata (`manifest.json` is its mirror): versions, fingerprints,
settings, the scan record, where the data came from, a summary per epoch, the eval plan's sizes, checksums of the
metrics and before tables, and a recipe's datasets. Each fact is held once: the tokenizer, chat template, warnings
and drop counts are the scan record's (`Manifest.scan`). Copies of them at the top level (`LEGACY_KEYS`, which
plans of earlier plancc versions hold) are read and ignored, never written. A manifest that is not one plancc
wrote is one `ManifestError` naming the key, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.errors import SettingsError
from plancc.store.scan_record import ScanRecord, ScanRecordError
from plancc.store.schemas import TOKENS_DIR, StoreError

REQUIRED = ("checksums", "data", "epochs", "fingerprints", "plancc", "samples", "scan", "schema", "settings")
OPTIONAL = ("eval", "recipe", "data_kind")
# copies of the scan record's entries older plans hold at the top level: accepted when read, never written
LEGACY_KEYS = ("rows_read", "dropped_samples", "truncated_samples", "tokenizer", "chat_template", "warnings")
EPOCH_KEYS = ("epoch", "batches", "updates", "samples", "dropped_samples")
EVAL_KEYS = ("samples", "batches", "batches_per_rank", "tokens", "label_count", "cost")
# a preference plan's eval totals (docs/preference.md): what its eval loss divides by
EVAL_KIND_KEYS = ("pairs", "desirable", "undesirable")
DATA_KINDS = ("sft", "preference", "unpaired_preference")


class ManifestError(StoreError):
    """A plan's metadata that is not a manifest plancc wrote (a key missing or of the wrong shape)."""


@dataclass(frozen=True)
class EpochSummary:
    """One epoch as the plan records it: microbatches, optimizer updates, samples, and source samples not in it."""

    epoch: int
    batches: int
    updates: int
    samples: int
    dropped_samples: int

    def to_json(self) -> dict[str, int]:
        """As the manifest writes it."""
        return {k: getattr(self, k) for k in EPOCH_KEYS}


@dataclass(frozen=True)
class EvalSummary:
    """The eval plan's sizes: what `inspect` shows, and `label_count`, what the eval loss divides by."""

    samples: int
    batches: int
    batches_per_rank: int
    tokens: int
    label_count: int
    cost: int
    counts: dict[str, int] = field(default_factory=dict)  # a preference plan's: pairs, or (un)desirable completions

    @staticmethod
    def of(cols: dict[str, np.ndarray], world_size: int, counts: dict[str, int] | None = None) -> EvalSummary:
        """The summary of eval plan columns (`evaluation.eval_columns`, or read back from `eval.parquet`), with a
        preference plan's `counts` (`samples.kind_counts`)."""
        n = int(cols["index"].shape[0])
        return EvalSummary(int(cols["sample_ids"].shape[0]), n, layout.steps_per_rank(n, world_size),
                           int(cols["tokens"].sum()), int(cols["label_count"].sum()), int(cols["cost"].sum()),
                           dict(counts or {}))

    def to_json(self) -> dict[str, int]:
        """As the manifest writes it."""
        return {**self.counts, **{k: getattr(self, k) for k in EVAL_KEYS}}


@dataclass(frozen=True)
class DataPaths:
    """What compile recorded of the trainer's data, for people: whether the plan ships its token store (`tokens/`,
    bound by `fingerprints.tokens`), and the source files, absolute and relative to the plan. Readers never follow
    these paths. `older_tokenized`: the tokenized file an older plancc shipped instead of a token store."""

    tokens: bool
    source: tuple[str, ...] = ()
    source_relative: tuple[str, ...] = ()
    older_tokenized: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As the manifest writes it."""
        return {**({"tokens": TOKENS_DIR} if self.tokens else {"format": "tokenized"}),
                "source": list(self.source), "source_relative": list(self.source_relative)}


@dataclass(frozen=True, eq=False)
class Manifest:
    """A plan's record of itself (module docstring). `fingerprints` maps `dataset`, `metadata`, `config`, `eval`,
    `tokens`, `plancc`, `schema` to their hashes and `plan` to {epoch: hash}; `checksums` the metrics and before
    tables' checksums; `recipe` a recipe's `datasets` and per-dataset `metrics` (None for one source)."""

    plancc: str
    schema: int
    fingerprints: dict[str, Any]
    settings: PlanSettings
    scan: ScanRecord
    data: DataPaths
    epochs: tuple[EpochSummary, ...]
    samples: int
    checksums: dict[str, str]
    eval: EvalSummary | None = None
    recipe: dict[str, Any] | None = None
    data_kind: str = "sft"  # what the plan trains: SFT, or preference data (docs/preference.md)
    _json: dict[str, Any] | None = field(default=None, repr=False)  # exactly what was read (None: built to write)

    # ------------------------------------------------------------ facts held by the scan record
    @property
    def rows_read(self) -> int:
        """Rows of the source the scan read (the samples, for a bare samples table: nothing records more)."""
        return self.scan.rows_read if "rows_read" in self.scan.keys else self.samples

    @property
    def dropped_samples(self) -> int:
        """Source rows the scan dropped (too long, nothing supervised)."""
        return self.scan.dropped_samples

    @property
    def truncated_samples(self) -> int:
        """Retained samples the scan cut to sequence_len."""
        return self.scan.truncated_samples

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the scan (or the recipe) told the user."""
        return self.scan.warnings

    @property
    def has_eval(self) -> bool:
        """Whether the plan holds an eval plan (`eval.parquet`, bound by `fingerprints["eval"]`)."""
        return "eval" in self.fingerprints

    @property
    def binds_tokens(self) -> bool:
        """Whether the plan ships a token store (its digest is `fingerprints["tokens"]`)."""
        return "tokens" in self.fingerprints

    # ------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON values: what was read, exactly, or what a compile writes."""
        if self._json is not None:
            return self._json
        out: dict[str, Any] = {
            "plancc": self.plancc, "schema": self.schema, "fingerprints": self.fingerprints,
            "settings": self.settings.to_dict(), "scan": self.scan.to_json(), "data": self.data.to_json(),
            "epochs": [e.to_json() for e in self.epochs], "samples": self.samples, "checksums": self.checksums,
        }
        if self.eval is not None:
            out["eval"] = self.eval.to_json()
        if self.recipe is not None:
            out["recipe"] = self.recipe
        if self.data_kind != "sft":  # written only for preference plans: SFT manifests keep their bytes
            out["data_kind"] = self.data_kind
        return out

    def __getitem__(self, key: str) -> Any:
        """`manifest["samples"]`: the JSON entry, for code written when `Plan.manifest` was a dict (deprecated)."""
        import warnings

        warnings.warn("Plan.manifest is a typed Manifest: use its attributes (plan.manifest.samples), or "
                      "plan.manifest.to_json() for the JSON", DeprecationWarning, stacklevel=2)
        return self.to_json()[key]

    @staticmethod
    def from_json(d: Any, where: str) -> Manifest:
        """The manifest `to_json` (or an older plancc) wrote; `ManifestError` naming `where` and the key otherwise."""
        if not isinstance(d, dict):
            raise ManifestError(f"{where}: not a plancc manifest (an object expected)")
        missing = sorted(set(REQUIRED) - set(d))
        if missing:
            raise ManifestError(f"{where}: metadata lacks {missing} (written by an older plancc, or edited); "
                                "recompile the plan")
        problem = shape_problem(d)
        if problem:
            raise ManifestError(f"{where} metadata: {problem}; recompile the plan")
        try:
            settings = PlanSettings(**d["settings"])
        except (TypeError, SettingsError) as exc:
            raise ManifestError(f"{where}: settings this plancc cannot use ({exc})") from None
        try:
            scan = ScanRecord.from_json(d["scan"], f"{where} metadata scan")
        except ScanRecordError as exc:
            raise ManifestError(str(exc)) from None
        data = d["data"]
        return Manifest(
            plancc=d["plancc"], schema=d["schema"], fingerprints=d["fingerprints"], settings=settings, scan=scan,
            data=DataPaths("tokens" in data, tuple(data.get("source", ())), tuple(data.get("source_relative", ())),
                           data.get("tokenized")),
            epochs=tuple(EpochSummary(**{k: e[k] for k in EPOCH_KEYS}) for e in d["epochs"]),
            samples=d["samples"], checksums=d["checksums"],
            eval=EvalSummary(**{k: d["eval"][k] for k in EVAL_KEYS},
                             counts={k: d["eval"][k] for k in EVAL_KIND_KEYS if k in d["eval"]}) if "eval" in d else None,
            recipe=d.get("recipe"), data_kind=d.get("data_kind", "sft"), _json=d)


def _is(value: Any, type_: type) -> bool:
    return isinstance(value, type_) and not (isinstance(value, bool) and type_ is not bool)


def _want(type_: type) -> str:
    return {dict: "an object", list: "a list", int: "an integer", str: "a string"}[type_]


_TYPES = {"checksums": dict, "data": dict, "epochs": list, "fingerprints": dict, "scan": dict, "settings": dict,
          "samples": int, "plancc": str, "schema": int}


def shape_problem(d: dict[str, Any]) -> str | None:
    """What in a manifest has the wrong shape (`data = []`, `data.tokens = 5`, `fingerprints.plan = "x"`, an epoch
    summary without `batches`), else None: readers index into these values, so a wrong type would be a
    traceback, not a message."""
    for key, type_ in _TYPES.items():
        if not _is(d[key], type_):
            return f"{key} is {d[key]!r}, expected {_want(type_)}"
    data, fingerprints = d["data"], d["fingerprints"]
    if "tokens" in data and data["tokens"] != TOKENS_DIR:
        return (f"data.tokens is {data['tokens']!r}; a plan's token store is always its {TOKENS_DIR!r} folder (plancc "
                "reads no other path from a plan)")
    for key in ("source", "source_relative"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(p, str) for p in data[key])):
            return f"data.{key} is {data[key]!r}, expected a list of paths"
    if "tokenized" in data and not isinstance(data["tokenized"], str):
        return f"data.tokenized is {data['tokenized']!r}, expected a path"
    if not isinstance(fingerprints.get("plan"), dict):
        return f"fingerprints.plan is {fingerprints.get('plan')!r}, expected an object (epoch: fingerprint)"
    for key in ("tokens", "eval"):
        if key in fingerprints and not isinstance(fingerprints[key], str):
            return f"fingerprints.{key} is {fingerprints[key]!r}, expected a hash (a string)"
    for i, e in enumerate(d["epochs"]):
        if not (isinstance(e, dict) and all(_is(e.get(k), int) for k in EPOCH_KEYS)):
            return f"epochs[{i}] is {e!r}, expected an object of integers {list(EPOCH_KEYS)}"
    if "eval" in d and not (isinstance(d["eval"], dict) and all(_is(d["eval"].get(k), int) for k in EVAL_KEYS)):
        return f"eval is {d['eval']!r}, expected an object of integers {list(EVAL_KEYS)}"
    if d.get("data_kind", "sft") not in DATA_KINDS:
        return f"data_kind is {d['data_kind']!r}, expected one of {', '.join(DATA_KINDS)}"
    if "eval" in d and not all(_is(d["eval"][k], int) for k in EVAL_KIND_KEYS if k in d["eval"]):
        return f"eval is {d['eval']!r}, its {'/'.join(EVAL_KIND_KEYS)} counts must be integers"
    recipe = d.get("recipe")
    if recipe is not None and not (isinstance(recipe, dict) and all(
            isinstance(recipe.get(k), list) and all(isinstance(x, dict) for x in recipe[k])
            for k in ("datasets", "metrics"))):
        return "recipe is not an object of lists {datasets, metrics}"
    return None
