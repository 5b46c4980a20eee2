"""Reading a config file: a TOML or YAML file's mapping as written (one message for anything unreadable), and its
path values read beside it."""

from __future__ import annotations

import glob
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from plancc.core.paths import file_kind
from plancc.errors import SettingsError

CONFIG_BYTES = 16 << 20  # the largest config file read: settings and dataset entries are kilobytes
YAML_NODES = 100_000  # values a YAML config may hold once its aliases are expanded (real configs: hundreds)


def _expanded_size(root: Any, path: Path) -> int:
    """How many values the composed YAML `root` holds with every alias expanded, counted without expanding (each
    node once, memoized), so a kilobyte of nested aliases (an "alias bomb", 10^9 values) is refused at once."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = ([v for pair in node.value for v in pair] if isinstance(node, yaml.MappingNode)
                    else node.value if isinstance(node, yaml.SequenceNode) else [])
        if done:
            open_nodes.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), YAML_NODES + 1)
            continue
        open_nodes.add(id(node))  # open nodes are the ancestors of what the stack holds above them
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                mark = child.start_mark
                raise SettingsError(f"config file {path} line {mark.line + 1} column {mark.column + 1}: a YAML "
                                    "alias refers to a value that holds it (a loop)")
            stack.append((child, False))
    return sizes[id(root)]


def _load_yaml(text: str, path: Path) -> Any:
    """YAML with anchors and aliases (real configs share values with them), bounded: the document must hold at most
    `YAML_NODES` values once its aliases are expanded, checked on the composed nodes before any value is built."""
    import yaml

    loader = yaml.SafeLoader(text)  # a SafeLoader: builds plain values only
    try:
        node = loader.get_single_node()
        if node is None:
            return {}
        if _expanded_size(node, path) > YAML_NODES:
            raise SettingsError(f"config file {path}: its YAML aliases expand to more than {YAML_NODES:,} values "
                                "(an alias bomb?); write the values out")
        return loader.construct_document(node) or {}
    finally:
        loader.dispose()


def _yaml_error(path: Path, exc: Exception) -> SettingsError:
    """One line naming the file, line and column of a YAML syntax error."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    return SettingsError(f"config file {path}{where}: not valid YAML ({problem})")


def _read_bytes(p: Path) -> bytes:
    """A config file's bytes: only a regular file (a FIFO would block, `/dev/zero` read until memory runs out) of at
    most `CONFIG_BYTES`, checked on the open descriptor before anything is read."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SettingsError(f"cannot read config file {p}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = file_kind(mode) or "a directory"
        raise SettingsError(f"config file {p} is {kind}, not a regular file; plancc reads a config from a regular "
                            "file")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(CONFIG_BYTES + 1)  # a file may say 0 bytes and hold more (/proc): the read is the bound
        except OSError as exc:
            raise SettingsError(f"cannot read config file {p}: {exc.strerror}") from None
    if len(data) > CONFIG_BYTES:
        raise SettingsError(f"config file {p} is larger than {CONFIG_BYTES >> 20} MiB; a config holds settings and "
                            "dataset entries, not data")
    return data


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A TOML or YAML config file's mapping, as written."""
    p = Path(path)
    try:
        text = _read_bytes(p).decode("utf-8")
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
        raise _yaml_error(p, exc) from None
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
