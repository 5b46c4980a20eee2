"""What made each plan, side by side: its datasets, and every setting that differs, by the name a user writes it
under (the config key; the flag is `--` and the key with dashes) and both values, per dataset where it applies.

The settings come from what the plan recorded: `Plan.settings` (how samples are planned), the scan record's options
(how rows became tokens and what is trained: `ScanRecord.options`) and, for a recipe, each dataset's own options
and mix (its manifest entry). Each change has a kind, the classes `plancc diff --fail-on` tells apart:

* `plan`: how samples are planned (grad_accum, world_size, seed, mode, ...), one value for the whole plan;
* `data`: how rows become tokens (tokenizer, format, columns, long, add_eos, message_fields, ...): the scan options
  of the settings registry (`plancc.config.registry`), one value for the plan unless a recipe's dataset may give
  its own (`PerDataset.OWN`);
* `masks`: what is trained and the template that renders it (roles_to_train, train_on_eos, train_on_inputs,
  train_on, drop_eos_only, template_date, chat_template, prompt_format, no_input_format, separator);
* `mix`: a recipe dataset's role, repeat or weight.

A chat template is compared by its content, never by its name: the built-in `llama3` and a tokenizer's own
template of the same text are one template, and a template whose text differs but renders every sample of the
dataset to the same tokens (equal content fingerprints) changed nothing the model sees, which the report notes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from plancc.config import registry
from plancc.config.fields import PerDataset
from plancc.config.recipe import default_name
from plancc.config.settings import PlanSettings
from plancc.core.choices import Choice
from plancc.store.plan import Plan
from plancc.store.scan_record import RecordedOptions

# what is trained, and the template or text format that renders it: a change of these is its own class
MASKS = ("roles_to_train", "train_on_eos", "train_on_inputs", "train_on", "drop_eos_only", "template_date",
         "chat_template", "prompt_format", "no_input_format", "separator")
MIX = ("role", "repeat", "weight")
# recorded per scan, one value for a whole plan (a recipe's datasets share them): compared once, plan-wide
PLAN_WIDE_OPTIONS = tuple(f.name for f in dataclasses.fields(RecordedOptions)
                          if registry.SETTINGS[f.name].setting.dataset != PerDataset.OWN
                          and registry.SETTINGS[f.name].stage == "scan" and f.name != "tokenizer")


def setting_kind(name: str) -> str:
    """The class of a setting's change: mix, masks, data (a scan option: how rows become tokens) or plan."""
    if name in MIX:
        return "mix"
    if name in MASKS:
        return "masks"
    declared = registry.SETTINGS.get(name)
    return "data" if declared is not None and declared.stage == "scan" else "plan"


@dataclass(frozen=True)
class DatasetSide:
    """One dataset of one plan as the diff reads it (a one-source plan is one dataset, named by its file stem)."""

    name: str
    source: str | None  # its path as the user gave it
    first_id: int  # sample_id - first_id is the dataset row
    retained: int
    fingerprints: dict[str, Any]
    mix: dict[str, Any] = field(default_factory=dict)  # role and repeat or weight (a recipe's)
    options: RecordedOptions | None = None  # None: not recorded (a bare samples table, an older plan)
    template: str | None = None  # the chat template's name
    source_fingerprint: str | None = None
    files: tuple[tuple[str, int], ...] = ()
    first_pair: int = 0  # preference data: pair_id - first_pair is the dataset row

    def to_json(self) -> dict[str, Any]:
        """What the report shows of the side."""
        return {**self.mix, "source": self.source, "fingerprints": self.fingerprints, "retained": self.retained}


def dataset_sides(plan: Plan) -> dict[str, DatasetSide]:
    """The plan's datasets by name, in recipe order."""
    recipe = plan.manifest.recipe or {}
    if not recipe.get("datasets"):
        record = plan.scan_record
        name = default_name(record.source) if record.source else "samples"
        return {name: DatasetSide(
            name=name, source=record.source, first_id=0, retained=plan.manifest.samples,
            fingerprints={k: plan.fingerprints.get(k) for k in ("dataset", "metadata")}, options=record.options,
            template=record.chat_template.name if record.chat_template else None,
            source_fingerprint=record.source_fingerprint, files=record.source_files)}
    where = f"{plan.files.plan_file} metadata recipe"
    return {d["name"]: DatasetSide(
        name=d["name"], source=d.get("path"), first_id=int(d.get("first_id", 0)), retained=int(d.get("retained", 0)),
        fingerprints=d.get("fingerprints", {}), mix={k: d[k] for k in MIX if k in d},
        options=RecordedOptions.from_json(d["options"], where) if "options" in d else None,
        template=d.get("chat_template"), source_fingerprint=d.get("source_fingerprint"),
        files=tuple((str(n), int(r)) for n, r in d.get("source_files", [])),
        first_pair=int(d.get("first_pair", 0))) for d in recipe["datasets"]}


def plain(value: Any) -> Any:
    """A setting's value as JSON: tuples as lists (pairs as `role=field` strings), choices as their text."""
    if isinstance(value, Choice):
        return str(value)
    if isinstance(value, tuple):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return [f"{a}={b}" for a, b in value]
        return [plain(v) for v in value]
    return value


def _change(name: str, old: Any, new: Any, dataset: str | None) -> dict[str, Any]:
    return {"setting": name, "dataset": dataset, "old": plain(old), "new": plain(new), "kind": setting_kind(name)}


def plan_changes(old: PlanSettings, new: PlanSettings) -> list[dict[str, Any]]:
    """The plan settings that differ (a recipe's mixture is said per dataset, as its mix)."""
    return [_change(f.name, getattr(old, f.name), getattr(new, f.name), None)
            for f in dataclasses.fields(PlanSettings)
            if f.name != "mixture" and getattr(old, f.name) != getattr(new, f.name)]


def _template_change(a: DatasetSide, b: DatasetSide, dataset: str | None, notes: list[str]) -> list[dict[str, Any]]:
    """The chat template by content: a change only when its text differs and the dataset's tokens changed."""
    if a.options.chat_template == b.options.chat_template:
        return []
    names = (a.template or "none", b.template or "none")
    if a.fingerprints.get("dataset") == b.fingerprints.get("dataset"):
        notes.append(f"{'dataset ' + repr(dataset) + ': ' if dataset else ''}chat template {names[0]} -> "
                     f"{names[1]}: other text, but every sample renders to the same tokens (no change)")
        return []
    if names[0] == names[1]:
        names = (f"{names[0]} (old text)", f"{names[1]} (new text)")
    return [_change("chat_template", *names, dataset)]


def _option_changes(a: RecordedOptions, b: RecordedOptions, names: tuple[str, ...], dataset: str | None
                    ) -> list[dict[str, Any]]:
    return [_change(n, getattr(a, n), getattr(b, n), dataset) for n in names if getattr(a, n) != getattr(b, n)]


OWN_OPTIONS = tuple(f.name for f in dataclasses.fields(RecordedOptions)
                    if registry.SETTINGS[f.name].setting.dataset == PerDataset.OWN and f.name != "chat_template")


def dataset_changes(a: DatasetSide, b: DatasetSide, dataset: str | None, notes: list[str]
                    ) -> list[dict[str, Any]]:
    """One dataset's own settings that differ (a recipe entry's own keys): its mix, then its scan options (the
    template by content)."""
    out = [_change(k, a.mix.get(k), b.mix.get(k), dataset) for k in MIX if a.mix.get(k) != b.mix.get(k)]
    if a.options is None or b.options is None:
        if (a.options is None) != (b.options is None):
            which = "old" if a.options is None else "new"
            notes.append(f"{'dataset ' + repr(dataset) if dataset else 'the samples'}: the {which} plan records no "
                         "scan options (a samples table, or an older plancc): its settings are not compared")
        return out
    return out + _option_changes(a.options, b.options, OWN_OPTIONS, dataset) + _template_change(a, b, dataset, notes)


def setting_changes(old: Plan, new: Plan, sides: dict[str, tuple[DatasetSide | None, DatasetSide | None]]
                    ) -> tuple[list[dict[str, Any]], list[str]]:
    """Every changed setting (plan-wide first, then per dataset; a one-source plan's scan options are plan-wide)
    and the notes on what could not be compared or changed nothing."""
    notes: list[str] = []
    out = plan_changes(old.settings, new.settings)
    ro, rn = old.scan_record, new.scan_record
    if ro.options is not None and rn.options is not None:
        out += _option_changes(ro.options, rn.options, PLAN_WIDE_OPTIONS, None)
    if ro.tokenizer_fingerprint != rn.tokenizer_fingerprint and ro.tokenizer_fingerprint and rn.tokenizer_fingerprint:
        names = (ro.tokenizer, rn.tokenizer) if ro.tokenizer != rn.tokenizer else \
            (f"{ro.tokenizer} (old vocabulary)", f"{rn.tokenizer} (new vocabulary)")
        out.append(_change("tokenizer", *names, None))
    if old.manifest.data_kind != new.manifest.data_kind:  # SFT or preference data (docs/preference.md): what the plan trains
        out.append(_change("data_kind", old.manifest.data_kind, new.manifest.data_kind, None))
    recipe = bool(old.settings.mixture or new.settings.mixture)
    for name, (a, b) in sides.items():
        if a is not None and b is not None:
            out += dataset_changes(a, b, name if recipe else None, notes)
    return out, notes
