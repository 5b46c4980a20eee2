"""Every setting by name, with its stage: the one table the flags, config keys, recipe entry keys, record entries
and other tools' spellings are made from (`plancc.config.settings` declares them; see `plancc.config.fields`).

A setting's stage is the class that declares it: `scan` (`ScanOptions`), `plan` (`PlanSettings`), `both` (one
`Setting` made a field of both: `sequence_len`, `shift`) or `run` (`RunOptions`, neither).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from plancc.config.fields import Flag, PerDataset, Setting, Spelling, setting_of
from plancc.config.settings import PlanSettings, RunOptions, ScanOptions

STAGES = {"scan": ScanOptions, "plan": PlanSettings, "run": RunOptions}


@dataclass(frozen=True)
class Declared:
    """One setting: its name, declaration, stage and value type (the annotation, as written)."""

    name: str
    setting: Setting
    stage: str
    type: str

    @property
    def default(self) -> Any:
        """Its default value."""
        return self.setting.default


def declared(stages: dict[str, type]) -> dict[str, Declared]:
    """Every setting of the classes of `stages`, in declaration order; a field of two stages must be one
    declaration (a TypeError otherwise)."""
    out: dict[str, Declared] = {}
    for stage, cls in stages.items():
        for f in dataclasses.fields(cls):
            declared = Declared(f.name, setting_of(f), stage, str(f.type))
            if f.name in out:
                if out[f.name].setting is not declared.setting:
                    raise TypeError(f"setting {f.name} is declared twice: declare it once and use its field in both")
                declared = dataclasses.replace(out[f.name], stage="both")
            out[f.name] = declared
    return out


SETTINGS: MappingProxyType[str, Declared] = MappingProxyType(declared(STAGES))
BOTH = tuple(name for name, d in SETTINGS.items() if d.stage == "both")  # the scan's value wins in a compile
# what users give (config keys, API keywords): every setting but those computed (a recipe's mixture)
GIVEN = tuple(name for name, d in SETTINGS.items() if not d.setting.derived)
PATHS = tuple(name for name, d in SETTINGS.items() if d.setting.path)  # read beside the config file
OWN = tuple(name for name, d in SETTINGS.items() if d.setting.dataset == PerDataset.OWN)  # a dataset's own
RECIPE_WIDE = tuple(name for name, d in SETTINGS.items() if d.setting.dataset == PerDataset.RECIPE)


def of_stage(*stages: str) -> tuple[Declared, ...]:
    """The settings of `stages`, in declaration order."""
    return tuple(d for d in SETTINGS.values() if d.stage in stages)


def flagged(stage: str) -> tuple[Declared, ...]:
    """The settings listed among the flags of `stage` (`scan`: the scan and both-stage ones; `plan`: plan only)."""
    stages = ("scan", "both") if stage == "scan" else (stage,)
    return tuple(d for d in of_stage(*stages) if d.setting.flag == Flag.GROUP)


def spellings(tool: str | None = None, *, entry: bool = False) -> dict[str, tuple[str, Spelling]]:
    """`{their key: (setting, spelling)}` of one tool's keys (None: every tool's and the other names), top-level
    keys or (`entry`) a dataset entry's."""
    return {s.key: (name, s) for name, d in SETTINGS.items() for s in d.setting.spellings
            if (tool is None or s.tool == tool) and (s.entry if entry else s.top)}
