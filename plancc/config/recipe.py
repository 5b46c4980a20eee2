"""A recipe: several datasets, each scanned on its own, planned as one mixture (`plancc.planner.mixture`).

Datasets come from a config file's `datasets` (training) and `eval_datasets` lists, or from several sources given
to `plancc compile` / `plancc.compile([...])` (paths, or dicts with the keys of a config entry). An entry::

    [[datasets]]
    path = "data/chat.jsonl"      # file, glob, save_to_disk dir, scan dir, Hub id
    name = "chat"                 # default: the file stem; unique in the recipe
    format = "messages"           # format, columns, split, chat_template: this dataset's own
    train_on_inputs = true        # and what is trained (roles_to_train, train_on_eos, train_on, ...)
    repeat = 2                    # or weight = 0.3 (one of them; default repeat 1; not for eval_datasets)

The keys an entry may give for its own dataset are the settings declared `PerDataset.OWN`; those declared
`PerDataset.RECIPE` (the tokenizer, `sequence_len`, `shift`, `long`) are the recipe's: an entry may repeat them,
but two entries (or an entry and the top-level settings) that disagree are an error naming both
(`plancc.config.registry`). A relative `path` (or `chat_template` file) is read beside the config file when
something is there. `--mix NAME=2x` sets a repeat, `--mix NAME=0.3` a weight (the `x` says "times"); it overrides
the entry's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plancc.config import registry
from plancc.config.fields import did_you_mean, flag
from plancc.config.files import beside
from plancc.config.settings import MixEntry, ScanOptions
from plancc.core.choices import DatasetRole, MixKind
from plancc.errors import SettingsError

CONFIG_DATASETS = ("datasets", "eval_datasets")  # config keys listing a recipe's datasets
TRAINING_ONLY = ("repeat", "weight")  # how a training dataset mixes: an eval dataset's entry refuses them
ENTRY_KEYS = ("path", "name", *registry.OWN, *TRAINING_ONLY, *registry.RECIPE_WIDE)


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of a recipe: where it is, how it mixes (and whether it trains or evaluates), its own settings."""

    path: str
    mix: MixEntry
    own: tuple[tuple[str, Any], ...] = ()  # its own settings (`registry.OWN`), over the recipe's
    shared: tuple[tuple[str, Any], ...] = ()  # recipe-wide settings it repeats (checked, not per dataset)

    @property
    def name(self) -> str:
        """Its name in the recipe (unique)."""
        return self.mix.name

    @property
    def role(self) -> DatasetRole:
        """Whether it trains or evaluates."""
        return self.mix.role

    def scan_options(self, base: ScanOptions) -> ScanOptions:
        """The recipe's scan options with this dataset's own."""
        try:
            return dataclasses.replace(base, **dict(self.own))
        except SettingsError as exc:
            name = exc.setting or ""
            raise SettingsError(f"dataset {self.name!r}: {str(exc).replace(flag(name), name, 1)}",
                                exc.setting) from None


def dataset_spec(entry: Any, role: DatasetRole = DatasetRole.TRAIN) -> DatasetSpec:
    """One entry (a path, or a mapping of `ENTRY_KEYS`) as a DatasetSpec."""
    if isinstance(entry, str | Path):
        entry = {"path": str(entry)}
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str | Path) or not str(entry["path"]):
        raise SettingsError(f"a dataset entry needs a path, got {entry!r}")
    entry = {str(k).replace("-", "_"): v for k, v in entry.items()}
    for key in entry:
        if key not in ENTRY_KEYS:
            raise SettingsError(f"dataset {entry['path']}: unknown key {key!r}{did_you_mean(key, ENTRY_KEYS)}; "
                                f"keys: {', '.join(ENTRY_KEYS)}")
    path = str(entry["path"])
    name = str(entry.get("name") or default_name(path))
    for key in TRAINING_ONLY:
        if role == DatasetRole.EVAL and key in entry:
            raise SettingsError(f"eval dataset {name!r}: {key} applies to training datasets only (an eval dataset's "
                                f"samples are each evaluated once); remove {key} from its [[eval_datasets]] entry")
    if entry.get("repeat") is not None and entry.get("weight") is not None:
        raise SettingsError(f"dataset {name!r}: give repeat or weight, not both")
    kind = MixKind.WEIGHT if entry.get("weight") is not None else MixKind.REPEAT
    amount = entry.get(kind)
    return DatasetSpec(path, MixEntry(name, role, kind, 1.0 if amount is None else amount),
                       own=tuple((k, entry[k]) for k in registry.OWN if entry.get(k) is not None),
                       shared=tuple((k, entry[k]) for k in registry.RECIPE_WIDE if entry.get(k) is not None))


def default_name(path: str) -> str:
    """A dataset's default name: its file stem (`data/chat.jsonl` -> `chat`), or its directory's name."""
    p = Path(path.rstrip("/"))
    while p.suffix and p.stem:
        p = p.with_suffix("")
    return p.name or path


def parse_mix(values: list[str] | str | None) -> dict[str, tuple[MixKind, float]]:
    """`--mix a=2x,b=0.5` (repeatable): NAME=Nx is a repeat, NAME=W a weight; {name: (kind, value)}."""
    if isinstance(values, str):
        values = [values]
    out: dict[str, tuple[MixKind, float]] = {}
    for value in values or []:
        for part in str(value).split(","):
            name, eq, amount = (x.strip() for x in part.partition("="))
            kind = MixKind.REPEAT if amount.lower().endswith("x") else MixKind.WEIGHT
            try:
                number = float(amount[:-1] if kind == MixKind.REPEAT else amount)
            except ValueError:
                number = -1.0
            if not eq or not name or not 0 < number < float("inf"):
                raise SettingsError(f"--mix {value!r}: expected NAME=Nx (repeat N times an epoch) or NAME=W (weight "
                                    "W), e.g. --mix chat=2x,alpaca=0.5x or --mix chat=3,alpaca=1", "mix")
            out[name] = (kind, number)
    return out


def build(train: list[Any], evals: list[Any] = (), mix: dict[str, tuple[str, float]] | None = None
          ) -> tuple[DatasetSpec, ...]:
    """The recipe's datasets in order (training, then eval), with `mix` applied; names unique."""
    specs = [dataset_spec(e, DatasetRole.TRAIN) for e in train] + [dataset_spec(e, DatasetRole.EVAL) for e in evals]
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        paths = [s.path for s in specs if s.name == twice[0]]
        raise SettingsError(f"dataset name {twice[0]!r} is used twice ({paths[0]} and {paths[1]}); give each a "
                            "unique `name`")
    for name, (kind, value) in (mix or {}).items():
        if name not in names:
            raise SettingsError(f"--mix {name}=...: no dataset named {name!r}{did_you_mean(name, names)}; datasets: "
                                f"{', '.join(names)}", "mix")
        i = names.index(name)
        if specs[i].role == DatasetRole.EVAL:
            raise SettingsError(f"--mix {name}=...: {name!r} is an eval dataset (its samples are each evaluated "
                                "once); --mix sets how training datasets mix", "mix")
        specs[i] = dataclasses.replace(specs[i], mix=MixEntry(name, specs[i].role, kind, value))
    return tuple(specs)


def shared_settings(specs: tuple[DatasetSpec, ...], top: dict[str, Any]) -> dict[str, Any]:
    """The recipe-wide settings its entries set, checked: two entries, or an entry and `top` (the settings given
    outside the entries), that disagree are an error naming both."""
    seen: dict[str, tuple[Any, str]] = {k: (v, "the recipe's settings") for k, v in top.items()
                                        if k in registry.RECIPE_WIDE and v is not None}
    for spec in specs:
        for key, value in spec.shared:
            if key in seen and seen[key][0] != value:
                raise SettingsError(f"dataset {spec.name!r} sets {key} {value!r} but {seen[key][1]} {seen[key][0]!r}; "
                                    f"a recipe has one {key} ({flag(key)}) for all its datasets")
            seen.setdefault(key, (value, f"dataset {spec.name!r} sets {key}"))
    return {k: v for k, (v, _) in seen.items()}


def _entry_beside(folder: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """A config entry with its path and path-valued settings read beside the config file (`files.beside`)."""
    return {**entry, **{k: beside(folder, str(entry[k])) for k in ("path", *registry.PATHS) if k in entry}}


def from_config(config: dict[str, Any], folder: Path) -> tuple[list[Any], list[Any]]:
    """The training and eval entries a config file (in `folder`) lists (each must be a list), paths resolved."""
    lists = []
    for key in CONFIG_DATASETS:
        value = config.get(key, [])
        if not isinstance(value, list):
            raise SettingsError(f"config {key} must be a list of datasets ([[{key}]] tables in TOML), got {value!r}")
        lists.append([_entry_beside(folder, e) if isinstance(e, dict) else beside(folder, e) if isinstance(e, str)
                      else e for e in value])
    return lists[0], lists[1]
