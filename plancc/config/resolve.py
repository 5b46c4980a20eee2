"""Settings resolved once: defaults < config file < flags (or the API's keywords, or the fields of its typed
`scan=`/`plan=` objects) -> one frozen `Resolved`, which nothing rewrites.

A config file is read once (`plancc.config.files`; an Axolotl or TRL config through `plancc.config.foreign`): its
settings, its recipe's datasets and the note on what it holds that plancc does not use. A recipe's datasets
(`plancc.config.recipe`) are resolved here too: the recipe-wide settings they repeat join the given ones, their
mixture becomes `PlanSettings.mixture`, and each dataset's own settings are checked before any work. The one step
after this is `plancc.build.carry`: a compile that reads a stored scan takes the scan's `sequence_len` and `shift`
(`Resolved.carried`), before anything is scanned or planned.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plancc.config import foreign, recipe, registry
from plancc.config.fields import did_you_mean, flag
from plancc.config.files import beside, read_config_file
from plancc.config.recipe import CONFIG_DATASETS, DatasetSpec
from plancc.config.settings import PlanSettings, RunOptions, ScanOptions
from plancc.core.choices import ConfigFormat
from plancc.errors import SettingsError


@dataclass(frozen=True)
class Resolved:
    """Every setting of one command, resolved: the scan options, plan settings and run options; the names set on
    purpose (`given`: a stored scan's values must not contradict them); what is compiled, one `source` or a
    recipe's `datasets` (neither for a scan, which is given its source); the note on an Axolotl or TRL config's
    unused keys."""

    scan: ScanOptions
    plan: PlanSettings
    run: RunOptions
    given: frozenset[str] = frozenset()
    source: str | None = None
    datasets: tuple[DatasetSpec, ...] | None = None
    note: str | None = None

    def carried(self, values: dict[str, Any]) -> Resolved:
        """These settings with a stored scan's values of the both-stage settings (`plancc.build.carry`, which
        checks them against `given` first)."""
        if not set(values) <= set(registry.BOTH):
            raise ValueError(f"a scan carries only {registry.BOTH}, not {sorted(set(values) - set(registry.BOTH))}")
        return dataclasses.replace(self, scan=dataclasses.replace(self.scan, **values),
                                   plan=dataclasses.replace(self.plan, **values))


@dataclass(frozen=True)
class ConfigFile:
    """What a config file says: its settings by name, its recipe's datasets, its note, and for another tool's
    config the key that set each setting (`spelled`)."""

    settings: dict[str, Any]
    train: list[Any]
    evals: list[Any]
    note: str | None
    spelled: dict[str, str] = field(default_factory=dict)


NO_CONFIG = ConfigFile({}, [], [], None)


def resolve(source: Any = None, *, config: str | Path | None = None, config_format: str = "auto",
            mix: Any = None, scan: ScanOptions | None = None, plan: PlanSettings | None = None,
            recipe_allowed: bool = True, **keywords: Any) -> Resolved:
    """The settings of a command (module docstring). `source` is what `compile` takes: one source, several (a
    recipe: paths or entry mappings), or None (the config file's datasets); `mix` is `--mix`. `keywords` are
    setting names (None: not given); `recipe_allowed` False (a scan) reads no recipe."""
    if not config and config_format != ConfigFormat.AUTO:
        raise SettingsError(f"--config-format {config_format} describes a --config file; none was given",
                            "config_format")
    file = read_config(Path(config), config_format) if config else NO_CONFIG
    given = typed_settings(scan, plan, keywords)
    unknown = sorted(set(given) - set(registry.GIVEN))
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]!r}{did_you_mean(unknown[0], registry.GIVEN)}; "
                            f"settings: {', '.join(sorted(registry.GIVEN))}")
    merged = {**file.settings, **given}
    one, datasets = _compiled(source, file, mix, config) if recipe_allowed else (None, None)
    if datasets is not None:
        merged |= recipe.shared_settings(datasets, {k: merged[k] for k in registry.RECIPE_WIDE if k in merged})
    elif merged.get("samples_per_epoch") is not None and recipe_allowed:
        raise SettingsError("--samples-per-epoch sizes a recipe's weighted datasets: give several sources (or a "
                            "config listing datasets) with weights", "samples_per_epoch")
    mixture = {"mixture": tuple(d.mix for d in datasets)} if datasets else {}
    try:
        resolved = Resolved(*(_build(stage, merged, mixture) for stage in ("scan", "plan", "run")),
                            frozenset(merged), one, datasets, file.note)
    except SettingsError as exc:
        raise _from_file(exc, file, given, config) from None
    for spec in datasets or ():
        spec.scan_options(resolved.scan)  # a dataset's own settings, checked before any work
    return resolved


def _build(stage: str, values: dict[str, Any], extra: dict[str, Any]) -> Any:
    """The dataclass of `stage` from the setting values that are its fields."""
    cls = registry.STAGES[stage]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names}, **{k: v for k, v in extra.items() if k in names})


def _from_file(exc: SettingsError, file: ConfigFile, given: dict[str, Any], config: Any) -> SettingsError:
    """A setting's error, said of the config file when the file set it (and no flag or keyword did), naming the
    key the file wrote (another tool's: with the plancc name)."""
    name = exc.setting
    if name not in file.settings or name in given:
        return exc
    key = f"{file.spelled[name]} (plancc: {name})" if name in file.spelled and file.spelled[name] != name else name
    return SettingsError(f"config file {config}: {str(exc).replace(flag(name), key, 1)}", name)


def typed_settings(scan: ScanOptions | None, plan: PlanSettings | None, settings: dict[str, Any]) -> dict[str, Any]:
    """The keyword settings a typed call stands for: the fields of `scan` and `plan` that differ from their
    defaults (a field at its default leaves the config file's value, as an unset flag does), then the keywords
    themselves (None: not given), which override the objects' fields by name (`plan=base, seed=3`: base with
    another seed). A wrong type, or a `sequence_len`/`shift` on which `scan` and `plan` disagree, is a
    SettingsError."""
    fields: dict[str, Any] = {}
    for name, obj, cls in (("scan", scan, ScanOptions), ("plan", plan, PlanSettings)):
        if obj is None:
            continue
        if not isinstance(obj, cls):
            raise SettingsError(f"{name}= takes a plancc.config.{cls.__name__}, got {type(obj).__name__}", name)
        for f in dataclasses.fields(cls):
            value = getattr(obj, f.name)
            if value == f.default:
                continue
            if f.name in fields and fields[f.name] != value and settings.get(f.name) is None:
                raise SettingsError(f"{f.name}: scan= says {fields[f.name]!r}, plan= says {value!r}; give the same "
                                    f"value to both (or {f.name}= to override both)", f.name)
            fields[f.name] = value
    return {**fields, **{k: v for k, v in settings.items() if v is not None}}


def read_config(path: str | Path, config_format: str = "auto") -> ConfigFile:
    """A config file read once: its settings by name (dashes or underscores; path values read beside it), its
    datasets, and the note of another tool's config. Unknown keys are one error naming each, with a hint."""
    path = Path(path)
    imported = foreign.translate(read_config_file(path), path, config_format)
    known = (*registry.GIVEN, *CONFIG_DATASETS)
    settings: dict[str, Any] = {}
    unknown = []
    for key, value in imported.settings.items():
        name = str(key).replace("-", "_")
        if name not in known:
            unknown.append((name, value))
        elif name in registry.PATHS and isinstance(value, str):
            settings[name] = beside(path.parent, value)
        else:
            settings[name] = value
    if unknown:
        raise unknown_keys_error(path, unknown, sorted(known))
    train, evals = recipe.from_config(settings, path.parent)
    for key in CONFIG_DATASETS:
        settings.pop(key, None)
    return ConfigFile(settings, train, evals, imported.note(path), imported.spelled)


def _compiled(source: Any, file: ConfigFile, mix: Any, config: Any
              ) -> tuple[str | None, tuple[DatasetSpec, ...] | None]:
    """What a compile reads: one plain source, or a recipe's datasets (when `source` is several sources or entries,
    or the config lists datasets, or `mix` is given)."""
    sources = list(source) if isinstance(source, list | tuple) else [] if source is None else [source]
    if sources and file.train:
        raise SettingsError(f"config file {config} lists datasets and sources were given too: give one or the other")
    if not sources and not file.train:
        raise SettingsError("no source: give SOURCE, several sources, or a config file listing datasets")
    mixes = mix if isinstance(mix, dict) else recipe.parse_mix(mix)
    if len(sources) == 1 and isinstance(sources[0], str | os.PathLike) and not file.evals and not mixes:
        return str(sources[0]), None
    return None, recipe.build(file.train or [str(s) if isinstance(s, os.PathLike) else s for s in sources],
                              file.evals, mixes)


def _hint(key: str, value: Any, known: list[str]) -> str:
    """What a key plancc does not know should be: the plancc spelling of another tool's key (with the value it
    means when theirs differs), else the closest of `known`."""
    spelled = registry.spellings()
    if key not in spelled:
        return did_you_mean(key, known)
    name, spelling = spelled[key]
    ours = spelling.value(value)
    return f" (plancc: {name})" if ours == value else f" (plancc: {name} = {_toml(ours)})"


def _toml(value: Any) -> str:
    """A value as a TOML config writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


def unknown_keys_error(path: Path, keys: list[tuple[str, Any]], known: list[str]) -> SettingsError:
    """One error listing every unknown key of config file `path`, each with its hint."""
    listed = ", ".join(f"{k!r}{_hint(k, v, known)}" for k, v in keys)
    tail = ("; an Axolotl or TRL config is read whole with --config-format axolotl or trl"
            if any(k in registry.spellings() for k, _ in keys) else "")
    return SettingsError(f"config file {path}: unknown setting{'s' if len(keys) > 1 else ''} {listed}{tail}")
