"""Reading a config file: a TOML or YAML file's mapping as written (one message for anything unreadable), and its
path values read beside it."""

from __future__ import annotations

import glob
import tomllib
from pathlib import Path
from typing import Any

from plancc.errors import SettingsError


def _load_yaml(text: str, path: Path) -> Any:
    """YAML without aliases: settings are flat values, and a kilobyte of nested aliases (an "alias bomb") expands
    to gigabytes wherever the values are walked or printed."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise SettingsError(f"config file {path} line {mark.line + 1}: YAML aliases (*name) are not "
                                    "allowed in a plancc config; write the value out")
            return super().compose_node(parent, index)

    return yaml.load(text, Loader=NoAliases) or {}  # a SafeLoader: builds plain values only


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A TOML or YAML config file's mapping, as written."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read config file {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SettingsError(f"config file {p} is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset "
                            f"{exc.start})") from None
    try:
        if p.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif p.suffix.lower() in (".yaml", ".yml"):
            data = _load_yaml(text, p)
        else:
            raise SettingsError(f"config file {p} must end in .toml, .yaml or .yml")
    except SettingsError:
        raise
    except RecursionError:
        raise SettingsError(f"config file {p} nests values too deeply (settings are plain values)") from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise SettingsError(f"config file {p} is not valid: {exc}") from None
    except Exception as exc:  # yaml.YAMLError has no common base we import eagerly
        raise SettingsError(f"config file {p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {p} must hold a mapping of settings")
    return data


def beside(folder: Path, path: str) -> str:
    """A config file's path value: relative to the config file's folder when something is there (a file,
    directory or glob match), so a config travels with its files; else as written (a built-in name, a Hub id, or
    a path from the working folder)."""
    candidate = folder / path
    if Path(path).is_absolute() or not (candidate.exists() or glob.glob(str(candidate), recursive=True)):
        return path
    return str(candidate)
