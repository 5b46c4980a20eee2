"""Every setting, declared once: a field of the frozen dataclass of its stage, with its `Setting` metadata
(`plancc.config.fields`: help, check, flag, record, per-dataset, Axolotl/TRL spellings).

Three objects, because they change different things: `ScanOptions` decide the samples table (and so the scan cache
key); `PlanSettings` decide the plan given a samples table (and so the `config` fingerprint); `RunOptions` change
neither (how many processes tokenize). `sequence_len` and `shift` are declared once for both stages: the samples
table means what it means under them (lengths cut or dropped, label counts), and the plan is hashed with them.
`plancc.config.resolve` builds the three from defaults, a config file and flags, once; when a compile reads a stored
scan, the scan's values of those two win (`plancc.build.carry`).

Adding a setting: one `setting(...)` field here, its use where it acts, a test. Its flag, config key, recipe entry
key, record entry and Axolotl/TRL keys follow from the field (`plancc.config.registry`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from plancc.config.checks import (
    Date,
    Fraction,
    HoldOut,
    Mixture,
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
from plancc.config.fields import (
    Flag,
    PerDataset,
    Record,
    Setting,
    axolotl,
    both,
    elsewhere,
    setting,
    setting_of,
    trl,
)
from plancc.config.formats import FORMATS, ROLES
from plancc.core.choices import (
    ChatRole,
    Choice,
    CostMode,
    DatasetRole,
    EndOfTurn,
    LongPolicy,
    MixKind,
    Mode,
    Shift,
    TrainOn,
    TrainOnEos,
)
from plancc.errors import SettingsError

MESSAGE_KEYS = ("role", "content", "training")  # what `message_fields` maps: training may map to "" (none)
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")  # what `special_tokens` names
DEFAULT_TEMPLATE_DATE = "2024-01-01"  # the date `strftime_now` gives chat templates unless `template_date` is set
ROW_TOKENS = 2**31 - 1  # tokens of one row: int32 offsets
MIX_MOST = 2**40  # the largest repeat or weight: a repeat beyond it asks more samples of an epoch than counts hold


def _packed_or_padded(packing: Any) -> Mode:
    """Axolotl's `sample_packing`, TRL's `packing`: true packs, false pads."""
    return Mode.PACKED if packing else Mode.PADDED


def _whole(value: Any) -> Any:
    """A float that is a whole number (TRL's `num_train_epochs: 3.0`) as an int."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _text_column(field: Any) -> Any:
    """TRL's `dataset_text_field`: the column read as `text` (None: the default, `text` itself)."""
    return None if field in (None, "text") else {"text": field}


def _long_policy(value: Any) -> Any:
    """Axolotl's `excess_length_strategy` (drop, truncate, raise; any case) as `long`: raise is error."""
    return {"raise": "error"}.get(value.lower(), value.lower()) if isinstance(value, str) else value


def _negated(value: Any) -> Any:
    """TRL's `completion_only_loss` is `train_on_inputs` negated."""
    return not value if isinstance(value, bool) else value


# the settings of both stages: what a samples table means, and what a plan is hashed with
SEQUENCE_LEN = Setting(4096, "Max tokens per sample / per row.", Positive(2**24), dataset=PerDataset.RECIPE,
                       spellings=(axolotl("sequence_len"), trl("max_length"), trl("max_seq_length"),
                                  elsewhere("seq_len")))
SHIFT = Setting(Shift.SAMPLE, "Label shift: sample|row|none.", OneOf(Shift), dataset=PerDataset.RECIPE)

OWN = PerDataset.OWN  # a recipe's dataset may give its own
ADDED = Record.UNLESS_DEFAULT  # in the record only away from its default: a scan made before the setting existed
# keeps its key (how fields become text, what is trained)


@dataclass(frozen=True, kw_only=True)
class ScanOptions:
    """What turns a source into a samples table (the order of the fields is the order of the flags)."""

    format: str = setting("auto", "|".join(FORMATS), OneOf(FORMATS),
                          dataset=OWN, spellings=(elsewhere("type"),))
    tokenizer: str | None = setting(
        None, "The model's tokenizer.json or HF tokenizer dir, a Hub id in the local HF cache, or 'builtin' (byte "
              "level).", Name(), shown="none: required unless the source is already tokenized", path=True,
        dataset=PerDataset.RECIPE, spellings=(elsewhere("tokenizer_config"), elsewhere("tokenizer_name_or_path")))
    chat_template: str | None = setting(
        None, "Chat data: a .jinja file or a built-in name (chatml, llama3).", Name(),
        shown="the tokenizer dir's own; none is an error", path=True, dataset=OWN,
        spellings=(trl("chat_template_path"),))
    columns: tuple[tuple[str, str], ...] = setting(
        (), "Map source fields onto format roles, e.g. prompt=question,completion=answer or messages=dialog.",
        Pairs(ROLES, "prompt=question,completion=answer"), shown="none", dataset=OWN,
        spellings=(trl("dataset_text_field", _text_column),))
    split: str | None = setting(None, "Split of a dataset dict directory or Hub id.", Name(),
                                shown="train, said on stderr", dataset=OWN, spellings=(axolotl("split", top=False,
                                                                                               entry=True),))
    # how a format's fields become text (each format's `shape`, `plancc.scan.formats`)
    prompt_format: str | None = setting(None, "Alpaca: the prompt, with {instruction} and {input}.",
                                        PromptFormat(("instruction", "input")), shown="the Alpaca one",
                                        record=ADDED, dataset=OWN)
    no_input_format: str | None = setting(None, "Alpaca rows with an empty input: the prompt, with {instruction}.",
                                          PromptFormat(("instruction",)),
                                          shown="--prompt-format, else the Alpaca one", record=ADDED, dataset=OWN)
    separator: str = setting("", "prompt_completion: text between prompt and completion (not supervised).",
                             Text("the text between prompt and completion"), shown="none", record=ADDED,
                             dataset=OWN)
    message_fields: tuple[tuple[str, str], ...] = setting(
        (), "Messages whose keys differ, e.g. role=speaker,content=text (training=FIELD: the per-turn flag that "
            "trains or masks a turn whatever its role; training= reads none).",
        Pairs(MESSAGE_KEYS, "role=speaker,content=text", blank=("training",)),
        shown="role/content or from/value, training", record=ADDED, dataset=OWN)
    roles: tuple[tuple[str, str], ...] = setting(
        (), "Chat: source role names mapped onto roles, e.g. gpt=assistant,human=user (given: only these are "
            "renamed).", RoleMap(), shown="human, gpt, bot, model and the roles' own names", record=ADDED,
        dataset=OWN)
    drop_system_message: bool = setting(False, "Chat: leave out a conversation's leading system turn.", Switch(),
                                        off="--keep-system-message", record=ADDED, dataset=OWN,
                                        spellings=(axolotl("drop_system_message", top=False, entry=True),))
    sequence_len: int = both(SEQUENCE_LEN)
    long: LongPolicy = setting(LongPolicy.DROP, "Over-long samples: truncate|drop|error.", OneOf(LongPolicy),
                               dataset=PerDataset.RECIPE,
                               spellings=(axolotl("excess_length_strategy", _long_policy),))
    max_dropped: float = setting(0.05, "Largest share of samples the scan may drop; more is an error.", Fraction(),
                                 record=Record.NEVER)
    shift: Shift = both(SHIFT)
    add_eos: bool = setting(True, "Append the tokenizer's EOS to each sample of a non-chat format.", Switch(),
                            flag=Flag.NONE)
    # the tokenizer as the trainer will have it (`plancc.scan.sources.tokenizer.scan_tokenizer`)
    special_tokens: tuple[tuple[str, str], ...] = setting(
        (), "Tokenizer tokens set before scanning, e.g. eos_token=<|eot_id|> (bos_token, eos_token, pad_token, "
            "unk_token; one not in the vocabulary is added as a special token).", NamedTokens(SPECIAL_TOKENS),
        shown="the tokenizer's", record=ADDED, dataset=PerDataset.RECIPE)
    added_tokens: tuple[str, ...] = setting((), "Tokens added to the tokenizer before scanning (new ids, in order).",
                                            Tokens(), shown="none", record=ADDED, dataset=PerDataset.RECIPE,
                                            spellings=(axolotl("tokens"),))
    added_special_tokens: tuple[str, ...] = setting((), "Special tokens added to the tokenizer before scanning, after "
                                                        "added_tokens.", Tokens(), shown="none", record=ADDED,
                                                    dataset=PerDataset.RECIPE)
    # what is trained (`plancc.scan.formats`)
    roles_to_train: tuple[ChatRole, ...] = setting(
        ("assistant",), "Chat: roles whose turns are trained, comma-separated (system, user, assistant, tool).",
        Roles(), record=ADDED, dataset=OWN)
    train_on_eos: TrainOnEos = setting(
        TrainOnEos.TURN, "End of turn / EOS trained: turn (each trained turn's), last (the last trained turn's), all "
                         "(every turn's), none.", OneOf(TrainOnEos), record=ADDED, dataset=OWN,
        spellings=(axolotl("train_on_eos", top=False, entry=True),))
    train_on_inputs: bool = setting(False, "Train on the prompt too (alpaca, prompt_completion, input_output) or on "
                                           "every turn (chat).", Switch(),
                                    off="--no-train-on-inputs", record=ADDED, dataset=OWN,
                                    spellings=(axolotl("train_on_inputs"), trl("completion_only_loss", _negated)))
    train_on: TrainOn = setting(TrainOn.ALL_TURNS, "Chat: all_turns, last_turn (only the last trained turn), or "
                                                   "all_tokens (every token, markup too; of a conversational "
                                                   "prompt/completion the completion's, or all with train_on_inputs: "
                                                   "TRL's loss).", OneOf(TrainOn), record=ADDED, dataset=OWN)
    end_of_turn: EndOfTurn = setting(
        EndOfTurn.MARKUP, "Chat: what train_on_eos trains after a turn: markup (the template's text from the end of "
                          "its content to the next turn) or tokens (the eos, and eot_tokens by train_on_eot, found "
                          "within 3 tokens after its content: Axolotl's rule).", OneOf(EndOfTurn), record=ADDED,
        dataset=OWN)
    eot_tokens: tuple[str, ...] = setting((), "Chat, end_of_turn tokens: the end-of-turn tokens train_on_eot trains.",
                                          Tokens(), shown="the eos", record=ADDED, dataset=OWN,
                                          spellings=(axolotl("eot_tokens"),))
    train_on_eot: TrainOnEos | None = setting(None, "Chat, end_of_turn tokens: which eot_tokens are trained: turn, "
                                                    "last, all, none.", OneOf(TrainOnEos, optional=True),
                                              shown="as train_on_eos", record=ADDED, dataset=OWN,
                                              spellings=(axolotl("train_on_eot", top=False, entry=True),))
    drop_eos_only: bool = setting(False, "Drop samples whose supervised part is only the end of turn (an empty "
                                         "completion or reply).", Switch(), off="--keep-eos-only", record=ADDED,
                                  dataset=OWN)
    template_date: str = setting(DEFAULT_TEMPLATE_DATE, "YYYY-MM-DD the chat template's strftime_now reads (never "
                                                        "the clock: same inputs, same plan any day).", Date(),
                                 record=Record.WHEN_USED, dataset=OWN)

    def __post_init__(self) -> None:
        normalize(self)

    def shaping(self) -> dict[str, Any]:
        """The settings of how fields become text that differ from their defaults (what the scan key adds)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in SHAPING and getattr(self, f.name) != f.default}


SHAPING = ("prompt_format", "no_input_format", "separator", "message_fields", "roles", "drop_system_message")


@dataclass(frozen=True)
class MixEntry:
    """One dataset of a recipe's mixture (`plancc.planner.mixture`): its name, whether it trains or evaluates, and
    how it mixes (`repeat`: times an epoch; `weight`: its share of the weighted datasets' samples), checked here
    for every way it is given (a recipe entry, `--mix`, a manifest read back)."""

    name: str
    role: DatasetRole = DatasetRole.TRAIN
    kind: MixKind = MixKind.REPEAT
    value: float = 1.0

    def __post_init__(self) -> None:
        if self.role not in tuple(DatasetRole) or self.kind not in tuple(MixKind):
            raise SettingsError(f"mixture entry {self.to_json()!r}: role must be train or eval, kind repeat or "
                                "weight", "mixture")
        number = self.value
        if isinstance(number, bool) or not isinstance(number, int | float) or not 0 < number <= MIX_MOST:
            raise SettingsError(f"dataset {self.name!r}: {self.kind} must be a positive number of at most "
                                f"{MIX_MOST:,} (2**40), got {number!r}", "mixture")
        for name, value in (("name", str(self.name)), ("role", DatasetRole(self.role)),
                            ("kind", MixKind(self.kind)), ("value", float(number))):
            object.__setattr__(self, name, value)

    def to_json(self) -> list[Any]:
        """As a manifest's settings hold it: [name, role, kind, value]."""
        return [self.name, str(self.role), str(self.kind), self.value]


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """Every setting that changes a plan computed from a samples table (the order of the fields is the order of
    the flags)."""

    mode: Mode = setting(Mode.PACKED, "packed|padded|flattened.", OneOf(Mode),
                         spellings=(axolotl("sample_packing", _packed_or_padded), trl("packing", _packed_or_padded)))
    micro_batch_size: int = setting(1, "Samples (or packed sequences) per microbatch.", Positive(2**16),
                                    spellings=(axolotl("micro_batch_size"), trl("per_device_train_batch_size"),
                                               elsewhere("batch_size")))
    sequence_len: int = both(SEQUENCE_LEN)
    real_batches: bool = setting(False, "Packed: micro_batch_size rows of sequence_len per microbatch.", Switch(),
                                 off="--one-row")
    pad_multiple: int = setting(1, "Collator pads lengths to this multiple.", Positive(2**16),
                                spellings=(elsewhere("pad_to_multiple_of"),))
    world_size: int = setting(1, "Data-parallel ranks.", Positive(2**20))
    grad_accum: int = setting(1, "Microbatches per rank per optimizer step.", Positive(2**20),
                              spellings=(axolotl("gradient_accumulation_steps"), trl("gradient_accumulation_steps")))
    drop_last: bool = setting(False, "Drop the incomplete final update.", Switch(), off="--keep-last",
                              spellings=(elsewhere("dataloader_drop_last"),))
    seed: int = setting(0, "Seed of every random choice (same seed, same plan).", Seed(),
                        spellings=(axolotl("seed"), trl("seed"), elsewhere("data_seed")))
    epochs: int = setting(1, "Epochs to plan (each reshuffled from seed and epoch).", Positive(2**10),
                          spellings=(axolotl("num_epochs"), trl("num_train_epochs", _whole)))
    shift: Shift = both(SHIFT)
    balance: bool = setting(True, "Label balancing.", Switch(), off="--no-balance")
    balance_window: int = setting(64, "Microbatches per window (<= 64).", Positive(2**31))
    balance_passes: int = setting(4, "Bounded passes per window.", Positive(2**10))
    cost: CostMode = setting(CostMode.TOKENS, "What rank ordering and within-update trades even out: tokens (padded "
                                              "slots) or attention (sum of squared sample lengths).", OneOf(CostMode))
    # settings newer than the plan schema are left out of `to_dict` at their default (`Record.UNLESS_DEFAULT`)
    val_set_size: float = setting(0, "Hold out samples for evaluation: a fraction in (0, 1) or a count; a seeded "
                                     "draw, never trained on, planned once as the eval plan.", HoldOut(),
                                  shown="0: none", record=Record.UNLESS_DEFAULT)
    # a recipe's datasets in recipe order (`plancc.planner.mixture`); empty for one source
    mixture: tuple[MixEntry, ...] = setting((), "A recipe's datasets and how each mixes.", Mixture(MixEntry),
                                            flag=Flag.NONE, record=Record.UNLESS_DEFAULT, derived=True)
    samples_per_epoch: int | None = setting(None, "Samples an epoch draws from the weighted datasets.",
                                            Positive(2**40, optional=True),
                                            shown="the largest weighted dataset's size", flag=Flag.OWN,
                                            record=Record.UNLESS_DEFAULT)

    def __post_init__(self) -> None:
        normalize(self)
        if self.samples_per_epoch is not None and self.mixture and all(m.kind == MixKind.REPEAT
                                                                       for m in self.mixture):
            raise SettingsError("--samples-per-epoch sizes a recipe's weighted datasets; no dataset has a weight",
                                "samples_per_epoch")
        if self.micro_batch_size * self.sequence_len > ROW_TOKENS:
            raise SettingsError(f"--micro-batch-size x --sequence-len must be at most {ROW_TOKENS:,} tokens, got "
                                f"{self.micro_batch_size} x {self.sequence_len}")
        if self.balance_window > 64:
            raise SettingsError(f"--balance-window must be at most 64, got {self.balance_window}", "balance_window")
        if self.real_batches and self.mode != Mode.PACKED:
            raise SettingsError("--real-batches only applies to --mode packed", "real_batches")

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
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if setting_of(f).record == Record.UNLESS_DEFAULT and value == f.default:
                continue
            out[f.name] = [m.to_json() for m in value] if f.name == "mixture" else \
                str(value) if isinstance(value, Choice) else value
        return out


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a scan runs, never what it makes: in no record and no fingerprint."""

    num_proc: int = setting(1, "Tokenizer processes (results identical for any count).", Positive(2**10),
                            flag=Flag.OWN, record=Record.NEVER,
                            spellings=(axolotl("dataset_processes"), axolotl("dataset_num_proc"),
                                       trl("dataset_num_proc")))

    def __post_init__(self) -> None:
        normalize(self)


def normalize(obj: Any) -> None:
    """Check every setting field of the frozen dataclass `obj` and store its normal form (its `Setting.check`)."""
    for f in fields(obj):
        object.__setattr__(obj, f.name, setting_of(f).check(f.name, getattr(obj, f.name)))
