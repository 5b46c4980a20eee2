"""Frozen settings for scan and compile, validated with messages that name the setting to change.

Two objects, because they change different things: `ScanOptions` decide the samples table (and so the
scan cache key); `PlanSettings` decide the plan given a samples table (and so the `config` fingerprint).
Settings that cannot change a plan (`num_proc`, `quiet`, output paths) live in neither.

`sequence_len` and `shift` are the two that both hold: the samples table means what it means under them (lengths
cut or dropped, label counts), and the plan is hashed with them. The scan's values win: `plancc.build.carry` copies
them into `PlanSettings` for a scan or plan directory given as source (or a scan's samples.parquet alone, whose
metadata records them), and refuses a flag that contradicts them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import hashlib
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from plancc.core.choices import Choice, CostMode, LongPolicy, Mode, Shift
from plancc.errors import SettingsError

FORMATS = ("auto", "tokenized", "prompt_completion", "alpaca", "messages", "text")
# what --columns may map a source field onto: every column name some format reads
ROLES = ("input_ids", "labels", "shift_labels", "prompt", "completion", "instruction", "input", "output", "messages",
         "conversations", "text")


def flag(name: str) -> str:
    """The command-line flag of setting `name` (`sequence_len` -> `--sequence-len`)."""
    return f"--{name.replace('_', '-')}"


# the largest value each integer setting takes: beyond these, arrays sized by them overflow or exhaust memory
MOST = {"sequence_len": 2**24, "micro_batch_size": 2**16, "pad_multiple": 2**16, "world_size": 2**20,
        "grad_accum": 2**20, "epochs": 2**10, "balance_window": 2**31, "balance_passes": 2**10, "num_proc": 2**10,
        "samples_per_epoch": 2**40}
ROW_TOKENS = 2**31 - 1  # tokens of one row: int32 offsets


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SettingsError(f"{flag(name)} must be a positive integer, got {value!r}", name)
    if value > MOST[name]:
        raise SettingsError(f"{flag(name)} must be an integer in [1, {MOST[name]:,}], got {value:,}", name)


def _boolean(obj: Any, names: tuple[str, ...]) -> None:
    """A switch must be a bool: a config file's `drop_last = "false"` would otherwise be a true (non-empty) string."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, bool):
            raise SettingsError(f"{flag(name)} must be true or false, got {value!r}", name)


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SettingsError(f"{flag(name)} must be one of {', '.join(choices)}; got {value!r}", name)


def _typed(obj: Any, name: str, kind: type[Choice]) -> None:
    """Validate a frozen dataclass's string setting `name` and store it as its `kind` member."""
    value = getattr(obj, name)
    if not isinstance(value, str) or value not in tuple(kind):
        raise SettingsError(f"{flag(name)} must be one of {', '.join(kind)}; got {value!r}", name)
    object.__setattr__(obj, name, kind(value))


def parse_columns(value: Any) -> tuple[tuple[str, str], ...]:
    """`--columns prompt=question,completion=answer` (or a config mapping) as sorted (role, field) pairs."""
    return _pairs("columns", value, ROLES, "prompt=question,completion=answer")


def _pairs(name: str, value: Any, roles: tuple[str, ...], example: str) -> tuple[tuple[str, str], ...]:
    """Setting `name`: role=field pairs (a string or a mapping) as sorted pairs, each role one of `roles`."""
    option = flag(name)
    if value is None or value == "" or value == ():
        return ()
    if isinstance(value, dict):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    elif isinstance(value, str):
        pairs = []
        for part in value.split(","):
            role, eq, field = part.partition("=")
            if not eq or not role.strip() or not field.strip():
                raise SettingsError(f"{option} {value!r}: expected role=field pairs separated by commas, "
                                    f"e.g. {option} {example}", name)
            pairs.append((role.strip(), field.strip()))
    elif isinstance(value, list | tuple) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
        pairs = [(str(r), str(f)) for r, f in value]
    else:
        raise SettingsError(f"{option} must be role=field pairs (a string or a mapping), got {value!r}", name)
    for role, _ in pairs:
        if role not in roles:
            raise SettingsError(f"{option}: unknown role {role!r}{did_you_mean(role, roles)}; roles are "
                                f"{', '.join(roles)}", name)
    mapped = [r for r, _ in pairs]
    if len(set(mapped)) != len(mapped):
        raise SettingsError(f"{option} {value!r}: a role is mapped twice", name)
    return tuple(sorted(pairs))


def did_you_mean(word: str, choices: Any) -> str:
    """` (did you mean 'x'?)` for the closest of `choices`, else an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


DEFAULT_TEMPLATE_DATE = "2024-01-01"  # the date `strftime_now` gives chat templates unless `template_date` is set
ROLES_TO_TRAIN = ("system", "user", "assistant", "tool")
TRAIN_ON_EOS = ("turn", "last", "all", "none")
TRAIN_ON = ("all_turns", "last_turn")
SUPERVISION = ("roles_to_train", "train_on_eos", "train_on_inputs", "train_on", "drop_eos_only", "template_date")


def _roles(value: Any) -> tuple[str, ...]:
    """`roles_to_train` as a tuple in `ROLES_TO_TRAIN` order (a list, or a comma-separated string from a flag)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or not all(isinstance(r, str) for r in items):
        raise SettingsError(f"{flag('roles_to_train')} must be a non-empty list of {', '.join(ROLES_TO_TRAIN)}; "
                            f"got {value!r}", "roles_to_train")
    roles = {r.strip() for r in items}
    for role in sorted(roles - set(ROLES_TO_TRAIN)):
        raise SettingsError(f"{flag('roles_to_train')}: unknown role {role!r}{did_you_mean(role, ROLES_TO_TRAIN)}; "
                            f"roles are {', '.join(ROLES_TO_TRAIN)}", "roles_to_train")
    return tuple(r for r in ROLES_TO_TRAIN if r in roles)


def _date(value: Any) -> str:
    """`template_date` as YYYY-MM-DD (a TOML date value, or a string)."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    try:
        return dt.datetime.strptime(value, "%Y-%m-%d").date().isoformat()
    except (TypeError, ValueError):
        raise SettingsError(f"{flag('template_date')} must be a date YYYY-MM-DD (e.g. 2024-07-26), got {value!r}",
                            "template_date") from None


def _supervision(options: Any) -> None:
    """Check and normalize the what-is-trained block of ScanOptions."""
    object.__setattr__(options, "roles_to_train", _roles(options.roles_to_train))
    for name, choices in (("train_on_eos", TRAIN_ON_EOS), ("train_on", TRAIN_ON)):
        value = getattr(options, name)
        if not isinstance(value, str):
            raise SettingsError(f"{flag(name)} must be one of {', '.join(choices)}; got {value!r}", name)
        _choice(name, value, choices)
    object.__setattr__(options, "template_date", _date(options.template_date))


@dataclass(frozen=True, kw_only=True)
class ScanOptions:
    """What turns a source into a samples table.

    `tokenizer` is a tokenizer path or `builtin`; None only suits already-tokenized sources. `chat_template` is a
    built-in name or a .jinja file (None: the tokenizer directory's own). `max_dropped` is a check on the result,
    not part of it (the scan cache key leaves it out)."""

    format: str = "auto"
    tokenizer: str | None = None
    chat_template: str | None = None
    columns: tuple[tuple[str, str], ...] = ()
    split: str | None = None
    sequence_len: int = 4096
    long: LongPolicy = LongPolicy.DROP
    shift: Shift = Shift.SAMPLE
    add_eos: bool = True
    max_dropped: float = 0.05
    # how a format's fields become text (`plancc.scan.sources.detect.shape`); left out of the scan key at their defaults
    prompt_format: str | None = None  # alpaca: the prompt, with {instruction} and {input}
    no_input_format: str | None = None  # alpaca rows with an empty input: the prompt, with {instruction}
    separator: str = ""  # prompt_completion: text between prompt and completion (not supervised)
    message_fields: tuple[tuple[str, str], ...] = ()  # messages: role=FIELD,content=FIELD of each message
    # what is trained (`plancc.scan.sources.encode.Supervise`); left out of the scan key at their defaults
    roles_to_train: tuple[str, ...] = ("assistant",)
    train_on_eos: str = "turn"
    train_on_inputs: bool = False
    train_on: str = "all_turns"
    drop_eos_only: bool = False
    template_date: str = DEFAULT_TEMPLATE_DATE

    def __post_init__(self) -> None:
        _choice("format", self.format, FORMATS)
        _typed(self, "long", LongPolicy)
        _typed(self, "shift", Shift)
        _positive("sequence_len", self.sequence_len)
        object.__setattr__(self, "columns", parse_columns(self.columns))
        _boolean(self, ("add_eos", "train_on_inputs", "drop_eos_only"))
        _supervision(self)
        if isinstance(self.max_dropped, bool) or not isinstance(self.max_dropped, int | float) or not (
            0 <= self.max_dropped <= 1
        ):
            raise SettingsError(f"--max-dropped must be a fraction in [0, 1], got {self.max_dropped!r}", "max_dropped")
        for name in ("tokenizer", "chat_template", "split"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise SettingsError(f"{flag(name)} must be a non-empty string, got {value!r}", name)
        _prompt_format("prompt_format", self.prompt_format, ("instruction", "input"))
        _prompt_format("no_input_format", self.no_input_format, ("instruction",))
        if not isinstance(self.separator, str):
            raise SettingsError(f"--separator must be a string (the text between prompt and completion), got "
                                f"{self.separator!r}", "separator")
        object.__setattr__(self, "message_fields", _pairs("message_fields", self.message_fields, MESSAGE_KEYS,
                                                          "role=speaker,content=text"))

    def shaping(self) -> dict[str, Any]:
        """The settings of how fields become text that differ from their defaults (what the scan key adds)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in SHAPING and getattr(self, f.name) != f.default}


SHAPING = ("prompt_format", "no_input_format", "separator", "message_fields")
MESSAGE_KEYS = ("role", "content")


def _prompt_format(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """A prompt format is a string whose named fields are exactly `allowed`'s ({instruction} required)."""
    import string

    if value is None:
        return
    expected = f"a string with {' and '.join('{' + a + '}' for a in allowed)}"
    try:
        names = {n for _, n, _, _ in string.Formatter().parse(value) if n is not None} if isinstance(value, str) \
            else None
    except ValueError as exc:
        raise SettingsError(f"{flag(name)} {value!r}: {exc} (write a literal brace as {{{{ or }}}}); expected "
                            f"{expected}", name) from None
    if names is None or "instruction" not in names or not names <= set(allowed):
        extra = sorted((names or set()) - set(allowed))
        why = f"unknown field {{{extra[0]}}}; " if extra else ""
        raise SettingsError(f"{flag(name)} must be {expected}; {why}got {value!r}", name)


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """Every setting that changes a plan computed from a samples table."""

    mode: Mode = Mode.PACKED
    micro_batch_size: int = 1
    sequence_len: int = 4096
    real_batches: bool = False
    pad_multiple: int = 1
    world_size: int = 1
    grad_accum: int = 1
    drop_last: bool = False
    seed: int = 0
    epochs: int = 1
    shift: Shift = Shift.SAMPLE
    balance: bool = True
    balance_window: int = 64
    balance_passes: int = 4
    cost: CostMode = CostMode.TOKENS
    val_set_size: float = 0  # held out for evaluation: a fraction in (0, 1), a count >= 1, or 0 (none)
    # a recipe's datasets in recipe order: (name, role "train"/"eval", "repeat"/"weight", value); empty for one
    # source (`plancc.planner.mixture`)
    mixture: tuple[tuple[str, str, str, float], ...] = ()
    samples_per_epoch: int | None = None

    def __post_init__(self) -> None:
        _typed(self, "mode", Mode)
        object.__setattr__(self, "mixture", _mixture(self.mixture))
        if self.samples_per_epoch is not None:
            _positive("samples_per_epoch", self.samples_per_epoch)
            if self.mixture and not any(kind == "weight" for _, _, kind, _ in self.mixture):
                raise SettingsError("--samples-per-epoch sizes a recipe's weighted datasets; no dataset has a "
                                    "weight", "samples_per_epoch")
        _typed(self, "cost", CostMode)
        _typed(self, "shift", Shift)
        for name in ("micro_batch_size", "sequence_len", "pad_multiple", "world_size", "grad_accum", "epochs",
                     "balance_window", "balance_passes"):
            _positive(name, getattr(self, name))
        _boolean(self, ("real_batches", "drop_last", "balance"))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise SettingsError(f"--seed must be an integer in [0, 2**63), got {self.seed!r}", "seed")
        if self.micro_batch_size * self.sequence_len > ROW_TOKENS:
            raise SettingsError(f"--micro-batch-size x --sequence-len must be at most {ROW_TOKENS:,} tokens, got "
                                f"{self.micro_batch_size} x {self.sequence_len}")
        if self.balance_window > 64:
            raise SettingsError(f"--balance-window must be at most 64, got {self.balance_window}", "balance_window")
        if self.real_batches and self.mode != Mode.PACKED:
            raise SettingsError("--real-batches only applies to --mode packed", "real_batches")
        object.__setattr__(self, "val_set_size", _val_set_size(self.val_set_size))

    @property
    def row_capacity(self) -> int:
        """Most tokens one row may hold: a packed row of `micro_batch_size * sequence_len` (or `sequence_len` with
        real batches), a flattened row of `micro_batch_size` samples, a padded row of one sample."""
        if (self.mode == Mode.PACKED and not self.real_batches) or self.mode == Mode.FLATTENED:
            return self.micro_batch_size * self.sequence_len
        return self.sequence_len

    @property
    def max_sample_len(self) -> int:
        """Longest sample a plan can place: a whole packed row, else one `sequence_len`."""
        return self.row_capacity if self.mode == Mode.PACKED else self.sequence_len

    @property
    def batches_per_update(self) -> int:
        """Microbatches of one optimizer update: world_size x grad_accum."""
        return self.world_size * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name, plain JSON values (what the manifest stores and the config fingerprint hashes).

        A setting newer than the plan schema is left out at its default, so a plan that does not use it keeps the
        bytes and config fingerprint older plancc gave it (and reads back with the default)."""
        out = {k: str(v) if isinstance(v, Choice) else v for k, v in dataclasses.asdict(self).items()}
        for name in OMITTED_AT_DEFAULT:
            if out[name] == _DEFAULTS[name]:
                del out[name]
        return out


RECIPE_SETTINGS = ("mixture", "samples_per_epoch")
OMITTED_AT_DEFAULT = ("val_set_size", *RECIPE_SETTINGS)  # settings newer than the plan schema (`to_dict`)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PlanSettings)}


def _val_set_size(value: Any) -> int | float:
    """`--val-set-size` as a count (int >= 1), a fraction (float in (0, 1)) or 0 (nothing held out)."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and value >= 0
    if ok and (value == 0 or value >= 1):
        ok = float(value).is_integer()
        value = int(value) if ok else value
    if not ok:
        raise SettingsError(f"--val-set-size must be a fraction in (0, 1) or a whole count >= 1 of samples to hold "
                            f"out for evaluation (0: none), got {value!r}", "val_set_size")
    return value


CONFIG_DATASETS = ("datasets", "eval_datasets")  # config keys listing a recipe's datasets (`plancc.config.recipe`)
MIX_KINDS = ("repeat", "weight")
DATASET_ROLES = ("train", "eval")


def _mixture(value: Any) -> tuple[tuple[str, str, str, float], ...]:
    """The mixture as tuples (a manifest's JSON gives lists), each entry checked."""
    if not isinstance(value, list | tuple):
        raise SettingsError(f"mixture must be a list of (name, role, kind, value), got {value!r}", "mixture")
    out = []
    for entry in value:
        if not (isinstance(entry, list | tuple) and len(entry) == 4):
            raise SettingsError(f"mixture entry {entry!r}: expected (name, role, kind, value)", "mixture")
        name, role, kind, number = entry
        if role not in DATASET_ROLES or kind not in MIX_KINDS:
            raise SettingsError(f"mixture entry {entry!r}: role must be train or eval, kind repeat or weight",
                                "mixture")
        if isinstance(number, bool) or not isinstance(number, int | float) or not (
                number > 0 and number < float("inf")):
            raise SettingsError(f"dataset {name!r}: {kind} must be a positive number, got {number!r}", "mixture")
        out.append((str(name), role, kind, float(number)))
    names = [e[0] for e in out]
    if len(set(names)) != len(names):
        raise SettingsError(f"mixture: dataset names must be unique, got {names}", "mixture")
    return tuple(out)


SHARED_SETTINGS = ("sequence_len", "shift")  # in both: what a samples table means, and what a plan is hashed with
SETTING_NAMES = frozenset({f.name for f in fields(ScanOptions)} | {f.name for f in fields(PlanSettings)})


def split_settings(values: dict[str, Any]) -> tuple[ScanOptions, PlanSettings]:
    """One flat mapping of setting names onto the two dataclasses (`sequence_len`, `shift` go to both).

    Unknown names are an error with a did-you-mean, so a typo in `plancc.compile(..., world_sise=8)` is not
    silently a default.
    """
    unknown = sorted(set(values) - SETTING_NAMES)
    if unknown:
        raise SettingsError(f"unknown setting {unknown[0]!r}{did_you_mean(unknown[0], sorted(SETTING_NAMES))}; "
                            f"settings: {', '.join(sorted(SETTING_NAMES))}")
    scan_names = {f.name for f in fields(ScanOptions)}
    plan_names = {f.name for f in fields(PlanSettings)}
    return (ScanOptions(**{k: v for k, v in values.items() if k in scan_names}),
            PlanSettings(**{k: v for k, v in values.items() if k in plan_names}))


def canonical_hash(obj: dict[str, Any]) -> str:
    """Stable hex digest of a JSON-able mapping: sorted keys, no whitespace."""
    return hashlib.blake2b(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()


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
        raise _yaml_error(p, exc) from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {p} must hold a mapping of settings")
    return data


# other tools' names (Axolotl, Hugging Face TrainingArguments / TRL SFTConfig) for plancc's settings: a plancc config
# holding one is told the plancc spelling (`plancc.config.foreign` reads such a config whole)
ALIASES = {
    "gradient_accumulation_steps": "grad_accum", "num_epochs": "epochs", "num_train_epochs": "epochs",
    "max_seq_length": "sequence_len", "max_length": "sequence_len", "seq_len": "sequence_len",
    "per_device_train_batch_size": "micro_batch_size", "batch_size": "micro_batch_size",
    "tokenizer_config": "tokenizer", "tokenizer_name_or_path": "tokenizer", "data_seed": "seed",
    "dataloader_drop_last": "drop_last", "pad_to_multiple_of": "pad_multiple", "dataset_num_proc": "num_proc",
    "dataset_processes": "num_proc", "type": "format",
}
PACKING_KEYS = ("sample_packing", "packing")  # true: mode = "packed"; false: mode = "padded"
CONFIG_PATHS = ("tokenizer", "chat_template")  # settings that may name a file: read beside the config file


def _hint(key: str, value: Any, known: list[str]) -> str:
    """What a config key plancc does not know should be: the plancc spelling of another tool's key, else the
    closest known name."""
    if key in PACKING_KEYS:
        mode = Mode.PACKED if value else Mode.PADDED
        return f' (plancc: mode = "{mode}")'
    if key in ALIASES:
        return f" (plancc: {ALIASES[key]})"
    return did_you_mean(key, known)


def unknown_keys_error(p: Path, keys: list[tuple[str, Any]], known: list[str]) -> SettingsError:
    """One error listing every unknown key of config file `p`, each with its hint."""
    listed = ", ".join(f"{k!r}{_hint(k, v, known)}" for k, v in keys)
    tail = ("; an Axolotl or TRL config is read whole with --config-format axolotl or trl"
            if any(k in ALIASES or k in PACKING_KEYS for k, _ in keys) else "")
    return SettingsError(f"config file {p}: unknown setting{'s' if len(keys) > 1 else ''} {listed}{tail}")


def beside(folder: Path, path: str) -> str:
    """A config file's path value: relative to the config file's folder when something is there (a file,
    directory or glob match), so a config travels with its files; else as written (a built-in name, a Hub id, or
    a path from the working folder)."""
    import glob

    candidate = folder / path
    if Path(path).is_absolute() or not (candidate.exists() or glob.glob(str(candidate), recursive=True)):
        return path
    return str(candidate)


def load_config_file(path: str | Path, config_format: str = "auto") -> dict[str, Any]:
    """Read a TOML or YAML config file into a flat mapping of setting names (dashes or underscores), its
    tokenizer and chat template read beside it. `config_format` `axolotl` or `trl` (or `auto` on such a file's
    keys) translates another tool's config (`plancc.config.foreign`)."""
    from plancc.config import foreign

    p = Path(path)
    data = foreign.translate(read_config_file(p), p, config_format).settings
    known = (SETTING_NAMES - {"mixture"}) | {"num_proc", *CONFIG_DATASETS}
    out: dict[str, Any] = {}
    unknown = []
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            unknown.append((name, value))
        elif name in CONFIG_PATHS and isinstance(value, str):
            out[name] = beside(p.parent, value)
        else:
            out[name] = value
    if unknown:
        raise unknown_keys_error(p, unknown, sorted(known))
    return out


def resolve_settings(config: str | Path | None = None, num_proc: int | None = None, config_format: str = "auto",
                     **settings: Any) -> tuple[ScanOptions, PlanSettings, int, set[str]]:
    """Defaults < `config` file (TOML/YAML; `config_format`: see `load_config_file`) < keyword settings (None
    means "not given"); also `num_proc` and the names set on purpose (which a scan directory's carried options
    must not contradict: `plancc.build.carry`)."""
    if not config and config_format != "auto":
        raise SettingsError(f"--config-format {config_format} describes a --config file; none was given",
                            "config_format")
    from_file = load_config_file(config, config_format) if config else {}
    merged: dict[str, Any] = dict(from_file)
    given = {k: v for k, v in settings.items() if v is not None}
    try:
        procs = merged.pop("num_proc", 1) if num_proc is None else num_proc
        _positive("num_proc", procs)
        merged.update(given)
        for key in CONFIG_DATASETS:  # a recipe's dataset lists: `plancc.config.recipe` reads them
            merged.pop(key, None)
        return (*split_settings(merged), procs, set(merged))
    except SettingsError as exc:
        name = exc.setting
        if name not in from_file or name in given or (name == "num_proc" and num_proc is not None):
            raise
        raise SettingsError(f"config file {config}: {str(exc).replace(flag(name), name, 1)}", name) from None
