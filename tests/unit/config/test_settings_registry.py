"""The settings registry: each setting is one declaration (a dataclass field and its `Setting`), and its flag, config
key, recipe entry key, record entry and other tools' keys are made from it; a command's settings are resolved once,
from one reading of its config file."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from plancc.cli import app
from plancc.cli.options import GROUP, PLAN_FLAGS, SCAN_FLAGS, Flags, grouped
from plancc.config import foreign, recipe, registry
from plancc.config.checks import (
    Date,
    Fraction,
    HoldOut,
    Name,
    NamedTokens,
    OneOf,
    Pairs,
    Positive,
    PromptFormat,
    RoleMap,
    Roles,
    Seed,
    Switch,
    Text,
    Tokens,
)
from plancc.config.fields import Flag, Record, Setting, flag, setting, setting_of
from plancc.config.resolve import resolve
from plancc.config.settings import PlanSettings, ScanOptions
from plancc.errors import SettingsError
from plancc.store.scan_record import RecordedOptions
from tests.support.sources import pc_rows, write_rows

RECIPE = ["a.jsonl", {"path": "b.jsonl", "weight": 1.0}]  # a recipe: every setting applies (samples_per_epoch too)


def _other(d: registry.Declared) -> Any:
    """A valid value of setting `d` other than its default, to see it arrive where it belongs."""
    check = d.setting.check
    values = {Switch: lambda: not d.default, Positive: lambda: 3, Seed: lambda: 7, Fraction: lambda: 0.5,
              HoldOut: lambda: 3, Name: lambda: "x", Text: lambda: "--", Roles: lambda: ("user",),
              Date: lambda: "2025-02-03", PromptFormat: lambda: "Q: {instruction}",
              Pairs: lambda: ((check.roles[0], "f"),), RoleMap: lambda: (("gpt", "assistant"),),
              Tokens: lambda: ("<|x|>",), NamedTokens: lambda: ((check.names[0], "<|x|>"),),
              OneOf: lambda: next(c for c in check.choices if c != d.default)}
    return values[type(check)]()


def _landed(resolved: Any, name: str) -> list[Any]:
    """The value setting `name` has in each stage object that holds it."""
    return [getattr(obj, name) for obj in (resolved.scan, resolved.plan, resolved.run) if hasattr(obj, name)]


def _flag_args(name: str, value: Any) -> list[str]:
    """The command-line arguments that give setting `name` the value `value`."""
    s = registry.SETTINGS[name].setting
    if isinstance(s.check, Switch):
        return [flag(name) if value else s.off]
    text = ",".join("=".join(p) for p in value) if isinstance(s.check, Pairs | NamedTokens) else \
        ",".join(value) if isinstance(value, tuple) else str(value)
    return [flag(name), text]


@pytest.mark.parametrize("name", registry.GIVEN)
def test_every_setting_arrives_from_a_keyword_a_config_key_and_a_flag(tmp_path, name):
    """A setting is declared once; the API keyword, the config-file key and (for a flagged one) the flag all set it,
    in each stage object that holds it (both, for sequence_len and shift)."""
    d = registry.SETTINGS[name]
    value = _other(d)
    by_keyword = resolve(RECIPE, **{name: value})
    assert _landed(by_keyword, name) == [value] * (2 if d.stage == "both" else 1) and name in by_keyword.given
    config = tmp_path / "c.yaml"
    plain = [list(v) if isinstance(v, tuple) else v for v in value] if isinstance(value, tuple) else value
    config.write_text(yaml.safe_dump({name: plain}))
    assert _landed(resolve(RECIPE, config=config), name) == _landed(by_keyword, name)
    if d.setting.flag == Flag.NONE:
        assert all(p.name != name for p in (*SCAN_FLAGS, *PLAN_FLAGS))
        return
    seen: dict[str, Any] = {}
    demo = typer.Typer()

    @demo.command()
    @grouped(scan_flags=SCAN_FLAGS, plan_flags=PLAN_FLAGS)
    def run(scan_flags: Flags = GROUP, plan_flags: Flags = GROUP, num_proc: int | None = None,
            samples_per_epoch: int | None = None) -> None:
        seen.update(scan_flags, **plan_flags, num_proc=num_proc, samples_per_epoch=samples_per_epoch)

    res = CliRunner().invoke(demo, _flag_args(name, value))
    assert res.exit_code == 0, res.output
    assert _landed(resolve(RECIPE, **seen), name) == _landed(by_keyword, name)


def test_the_commands_list_the_flags_the_declarations_make():
    """compile and scan take every flagged setting of their stages, in declaration order, with its help."""
    def params(command: str) -> list[tuple[str, str]]:
        return [(p.name, p.help) for p in typer.main.get_command(app).commands[command].params
                if p.name in registry.SETTINGS]

    scan = [(d.name, d.setting.help) for d in registry.flagged("scan")]
    plan = [(d.name, d.setting.help) for d in registry.flagged("plan")]
    assert params("scan") == [*scan, ("num_proc", registry.SETTINGS["num_proc"].setting.help)]
    assert params("compile") == [*scan, *plan, ("samples_per_epoch",
                                                registry.SETTINGS["samples_per_epoch"].setting.help),
                                 ("num_proc", registry.SETTINGS["num_proc"].setting.help)]


def test_a_setting_of_both_stages_is_one_declaration():
    for name in registry.BOTH:
        scan, plan = ({f.name: f for f in dataclasses.fields(cls)}[name] for cls in (ScanOptions, PlanSettings))
        assert setting_of(scan) is setting_of(plan)
    assert registry.BOTH == ("sequence_len", "shift")

    @dataclasses.dataclass(frozen=True)
    class A:
        n: int = setting(1, "n.", Positive(9))

    @dataclasses.dataclass(frozen=True)
    class B:
        n: int = setting(1, "n.", Positive(9))

    with pytest.raises(TypeError, match="setting n is declared twice"):
        registry.declared({"scan": A, "plan": B})
    shared = Setting(1, "n.", Positive(9))
    both = dataclasses.make_dataclass("Both", [("n", int, shared.field())])
    assert registry.declared({"scan": both, "plan": dataclasses.make_dataclass("P", [("n", int, shared.field())])}
                             )["n"].stage == "both"


def test_the_scan_record_holds_what_the_declarations_say():
    """RecordedOptions' entries are the scan settings declared recorded; those recorded unless at their default
    appear only away from it (a scan made before the setting existed keeps its key)."""
    recorded = [d for d in registry.of_stage("scan", "both") if d.setting.record != Record.NEVER]
    assert [f.name for f in dataclasses.fields(RecordedOptions)] == [d.name for d in recorded]
    assert "max_dropped" not in {d.name for d in recorded}
    base = RecordedOptions.of(ScanOptions(), "tok", None, reads_date=False)
    always = {d.name for d in recorded if d.setting.record == Record.ALWAYS}
    assert set(base.to_json()) == always
    for d in recorded:
        if d.setting.record == Record.UNLESS_DEFAULT:
            moved = RecordedOptions.of(ScanOptions(**{d.name: _other(d)}), "tok", None, reads_date=False)
            assert set(moved.to_json()) == always | {d.name}
            assert RecordedOptions.from_json(moved.to_json(), "x") == moved


def test_a_plans_settings_omit_what_is_newer_than_the_schema_at_its_default():
    added = {d.name for d in registry.of_stage("plan", "both") if d.setting.record == Record.UNLESS_DEFAULT}
    assert added == {"val_set_size", "mixture", "samples_per_epoch"}
    assert not added & set(PlanSettings().to_dict())


def test_a_recipe_entry_takes_the_per_dataset_settings():
    """An entry's keys are its path, name, mix and the settings declared per dataset; its own ones reach its scan
    options only, the recipe-wide ones are checked against the rest."""
    assert set(recipe.ENTRY_KEYS) == {"path", "name", "repeat", "weight", *registry.OWN, *registry.RECIPE_WIDE}
    assert set(registry.RECIPE_WIDE) == {"tokenizer", "special_tokens", "added_tokens", "added_special_tokens",
                                         "sequence_len", "shift", "long"}
    base = ScanOptions()
    for name in registry.OWN:
        value = _other(registry.SETTINGS[name])
        own = recipe.dataset_spec({"path": "a.jsonl", name: value}).scan_options(base)
        assert getattr(own, name) == value and getattr(base, name) != value
    with pytest.raises(SettingsError, match="dataset 'a' sets sequence_len 512 but the recipe's settings 256"):
        resolve([{"path": "a.jsonl", "sequence_len": 512}, "b.jsonl"], sequence_len=256)
    with pytest.raises(SettingsError, match=r"^dataset 'a': train_on must be one of all_turns, last_turn"):
        resolve([{"path": "a.jsonl", "train_on": "first_turn"}, "b.jsonl"])  # checked before any work


def _axolotl(tmp_path, config: dict[str, Any], known: foreign.Known) -> foreign.Imported:
    return foreign.translate({"base_model": "m", **config}, tmp_path / "a.yml", known={"axolotl": known})


def test_another_tools_keys_are_honoured_noted_or_refused(tmp_path):
    """A key that spells a setting sets it (its value transformed); a training-only key is noted; one the
    catalogue lists as unsupported is refused saying what to do; with the catalogue complete, any other key is
    refused with a did-you-mean over plancc's settings and the tool's own keys."""
    partial = foreign.Known(frozenset({"lora_r"}), {"curriculum_sampling": "plancc plans a seeded order"})
    got = _axolotl(tmp_path, {"sample_packing": False, "lora_r": 8, "wandb_project": "w", "datasets": [
        {"path": "a.jsonl", "type": "chat_template", "train_on_eos": "all", "field_humans": "x"}]}, partial)
    assert got.settings["mode"] == "padded" and got.settings["datasets"][0]["train_on_eos"] == "all"
    assert got.ignored == ["lora_r", "wandb_project", "datasets[0].field_humans"]  # an incomplete catalogue notes
    # the rest
    complete = dataclasses.replace(partial, complete=True)
    with pytest.raises(SettingsError) as err:
        _axolotl(tmp_path, {"lora_r": 8, "sequnce_len": 2048, "gradient_accumulation_step": 2,
                            "curriculum_sampling": True,
                            "datasets": [{"path": "a.jsonl", "type": "completion", "feild": "body"}]}, complete)
    message = str(err.value)
    assert "\n" not in message and "lora_r" not in message
    for part in ("'sequnce_len' (unknown; did you mean 'sequence_len'?)",
                 "'gradient_accumulation_step' (unknown; did you mean 'gradient_accumulation_steps'?)",
                 "'curriculum_sampling' (plancc plans a seeded order)",
                 "'datasets[0].feild' (unknown; did you mean 'field'?)"):
        assert part in message, message
    assert _axolotl(tmp_path, {"lora_r": 8, "datasets": []}, complete).ignored == ["lora_r"]
    with pytest.raises(SettingsError, match=r"'sequnce_len' \(unknown; did you mean 'sequence_len'\?\)"):
        foreign.translate({"base_model": "m", "sequnce_len": 2048}, tmp_path / "a.yml")  # the real catalogue


def test_a_trl_key_set_to_null_leaves_the_setting_unset(tmp_path):
    got = foreign.translate({"output_dir": "o", "completion_only_loss": None, "seed": None, "packing": False},
                            tmp_path / "sft.yaml")
    assert got.settings == {"mode": "padded", "train_on": "all_tokens"}  # TRL's loss without assistant_only_loss


def test_an_error_names_the_key_the_config_wrote(tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({"output_dir": "o", "max_length": -1, "dataset_name": "d.jsonl"}))
    with pytest.raises(SettingsError, match=re.escape(f"config file {config}: max_length (plancc: sequence_len) "
                                                      "must be a positive integer, got -1")):
        resolve(None, config=config)


def test_a_config_file_is_read_once_per_compile(tmp_path, monkeypatch):
    """The settings, the recipe and the note all come from one reading of the file."""
    import plancc.config.resolve as resolution

    reads = []
    real = resolution.read_config_file
    monkeypatch.setattr(resolution, "read_config_file", lambda path: reads.append(path) or real(path))
    write_rows(tmp_path / "d.jsonl", pc_rows(8))
    config = tmp_path / "axolotl.yml"
    config.write_text(yaml.safe_dump({"base_model": "builtin", "sequence_len": 128, "learning_rate": 1e-4,
                                      "datasets": [{"path": "d.jsonl", "type": "completion", "field": "prompt"}]}))
    res = CliRunner().invoke(app, ["compile", "--config", str(config), "-o", str(tmp_path / "p"), "--cache-dir",
                                   str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    assert len(reads) == 1
    assert re.search(r"note: read .*axolotl.yml as an Axolotl config: .*training-only keys .*: learning_rate", res.output)
