"""Load a tokenizer (`tokenizer.json`, a Hugging Face tokenizer directory, or the built-in byte-level one) and the
chat template its directory ships, without transformers and without running any code from the tokenizer directory.

The built-in tokenizer (`--tokenizer builtin`, chosen on purpose, never by default) is a real
`tokenizers.Tokenizer`: a byte-level BPE with no merges (one token per UTF-8 byte, ids 0-255) plus ChatML-style
special tokens, so that plancc works with nothing downloaded. It ships no chat template. The fingerprint is the
tokenizer's identity by content (`plancc.store.tokenizer_identity`: vocabulary, merges, added tokens, normalizer,
pre- and post-processor, eos/bos), so a `save_pretrained` copy is the same tokenizer; the chat template is
fingerprinted on its own (`plancc.scan.sources.templates`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from plancc.core.paths import not_regular
from plancc.errors import InputError
from plancc.store.fingerprint import tokenizer_specials
from plancc.store.tokenizer_identity import file_fingerprint, identity_fingerprint, tokenizer_identity

BUILTIN = "builtin"  # the --tokenizer value that selects the built-in byte-level tokenizer
BUILTIN_NAME = "plancc-byte-level"
BUILTIN_SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class Tok:
    """A loaded tokenizer with what scanning needs: template, special tokens, vocabulary size, fingerprint."""

    tokenizer: Tokenizer
    name: str
    chat_template: str | None  # the directory's own template (tokenizer_config.json or chat_template.jinja)
    template_source: str | None  # the file it came from
    eos_token: str | None
    eos_id: int | None
    bos_token: str | None
    vocab_size: int
    fingerprint: str  # identity by content (`plancc.store.tokenizer_identity`)
    file_fingerprint: str  # what plans recorded before content identity: the file's bytes and eos/bos
    byte_ids: bool = False  # built-in: the ids of a text without special-token markup are its UTF-8 bytes

    def made(self, fingerprint: str | None) -> bool:
        """Whether a scan or plan that records `fingerprint` was made with this tokenizer (either digest)."""
        return fingerprint in (self.fingerprint, self.file_fingerprint)


def _bytes_to_unicode() -> dict[int, str]:
    """The printable-character alphabet byte-level BPE uses for the 256 byte values."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _builtin() -> Tokenizer:
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # no merges, so word splitting cannot change ids: skipping the split regex halves the encode time
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BUILTIN_SPECIALS])
    return tok


def _template_from(config: dict, config_path: Path) -> tuple[str | None, str | None]:
    """(template text, the file it came from) of a tokenizer directory, or (None, None)."""
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str):
        return template, str(config_path)
    jinja_file = config_path.parent / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            return jinja_file.read_text(encoding="utf-8"), str(jinja_file)
        except UnicodeDecodeError as exc:
            raise InputError(f"{jinja_file}: not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset "
                             f"{exc.start}); save the chat template as UTF-8") from None
    return None, None


def load_tokenizer(spec: str) -> Tok:
    """`spec` is `builtin`, a tokenizer.json file, a directory with tokenizer.json (+ tokenizer_config.json), or a
    Hugging Face Hub id whose tokenizer is in the local Hub cache (`hub_snapshot`)."""
    if spec == BUILTIN:
        return _load_tokenizer(spec, spec)
    path = Path(spec).expanduser()
    if not path.exists() and HUB_ID.fullmatch(spec) and not spec.endswith(".json"):
        path = hub_snapshot(spec)
    return _load_tokenizer(spec, str(path.absolute()))


def scan_tokenizer(options: Any) -> Tok | None:
    """The tokenizer a scan with `options` (`ScanOptions` or the record's `RecordedOptions`, whose `tokenizer` is
    where to load it from here) tokenizes with: `tokenizer`, with `special_tokens`, `added_tokens` and
    `added_special_tokens` applied as the trainer's tokenizer will have them; None without one."""
    if options.tokenizer is None:
        return None
    tok = load_tokenizer(options.tokenizer)
    added = (tuple(options.special_tokens), tuple(options.added_tokens), tuple(options.added_special_tokens))
    return with_tokens(tok, *added) if any(added) else tok


@functools.lru_cache(maxsize=8)
def with_tokens(tok: Tok, special: tuple[tuple[str, str], ...], added: tuple[str, ...] = (),
                added_special: tuple[str, ...] = ()) -> Tok:
    """`tok` as Hugging Face's `add_special_tokens` and `add_tokens` leave it (Axolotl's order): each named token of
    `special` (bos_token, eos_token, pad_token, unk_token) made special, then `added` added as ordinary tokens, then
    `added_special` as special ones; a token not in the vocabulary gets the next id. The eos and bos become the
    named ones; the post-processor is kept (the bos a text starts with is the tokenizer's own)."""
    tokenizer = Tokenizer.from_str(tok.tokenizer.to_str())
    named = dict(special)
    for _, token in special:
        tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    if added:
        tokenizer.add_tokens([AddedToken(token, normalized=False) for token in added])
    if added_special:
        tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in added_special])
    eos, bos = named.get("eos_token", tok.eos_token), named.get("bos_token", tok.bos_token)
    return dataclasses.replace(
        tok, tokenizer=tokenizer, eos_token=eos, eos_id=tokenizer.token_to_id(eos) if eos is not None else None,
        bos_token=bos, vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        fingerprint=_content(tokenizer.to_str(), eos, bos),
        file_fingerprint=file_fingerprint(tokenizer.to_str().encode(), eos, bos))


def spec_of(recorded: str | None, override: str | None = None) -> str | None:
    """The `--tokenizer` value that loads a tokenizer a scan recorded by name (`builtin` for the built-in one's
    name); `override` (where it is now) wins. None: none was recorded or given."""
    return override or (BUILTIN if recorded == BUILTIN_NAME else recorded)


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name


def hub_cache() -> Path:
    """The Hugging Face Hub cache, read from the environment now (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(repo_id: str) -> Path:
    """The cached snapshot directory holding Hub model `repo_id`'s tokenizer.json. Never downloads (a scan is
    offline, and `HF_HUB_OFFLINE` is honoured by not asking): a tokenizer not in the cache is an error saying how
    to fetch it."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "tokenizer.json", cache_dir=hub_cache())
    except ValueError:  # not a valid repo id after all (huggingface_hub's HFValidationError)
        found = None
    if isinstance(found, str):
        return Path(found).parent
    raise InputError(f"--tokenizer {repo_id}: not a local path, and Hub model {repo_id} has no tokenizer.json in the "
                     f"Hugging Face cache ({hub_cache()}); download it with `hf download {repo_id} tokenizer.json "
                     "tokenizer_config.json` (or give the tokenizer directory's path)")


@functools.lru_cache(maxsize=4)
def _load_tokenizer(spec: str, absolute: str) -> Tok:
    """Cached by absolute path too: one relative `spec` names different files from different folders (and a Hub id
    its snapshot's)."""
    if spec == BUILTIN:
        tok = _builtin()
        text = tok.to_str()
        return Tok(tok, BUILTIN_NAME, None, None, "<|eos|>", tok.token_to_id("<|eos|>"), "<|bos|>",
                   tok.get_vocab_size(with_added_tokens=True), _content(text, "<|eos|>", "<|bos|>"),
                   file_fingerprint(text.encode(), "<|eos|>", "<|bos|>"), byte_ids=True)
    path = Path(absolute)
    directory = path if path.is_dir() else path.parent
    json_path = path / "tokenizer.json" if path.is_dir() else path
    for where in (path, json_path, directory / "tokenizer_config.json", directory / "chat_template.jinja"):
        special = not_regular(where, "a tokenizer from a tokenizer.json file or a directory holding one")
        if special:
            raise InputError(f"--tokenizer {spec}: {special}")
    if not json_path.is_file():
        hint = " (only tokenizer.json based tokenizers are supported)" if path.is_dir() else ""
        raise InputError(f"--tokenizer {spec}: {json_path} not found{hint}; `--tokenizer {BUILTIN}` selects the "
                         "built-in byte-level tokenizer")
    raw = json_path.read_bytes()
    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise InputError(f"--tokenizer {spec}: {json_path} is not a valid tokenizer.json ({exc})") from None
    config: dict = {}
    config_path = directory / "tokenizer_config.json"
    if config_path.is_file():
        try:
            config = orjson.loads(config_path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise InputError(f"--tokenizer {spec}: {config_path} is not valid JSON ({exc})") from None
        if not isinstance(config, dict):
            raise InputError(f"--tokenizer {spec}: {config_path} holds a JSON {type(config).__name__}, expected an "
                             "object of settings (eos_token, chat_template, ...)")
    template, template_source = _template_from(config, config_path)
    eos, bos = tokenizer_specials(config, lambda t: tok.token_to_id(t) is not None)
    eos_id = tok.token_to_id(eos) if eos is not None else None
    return Tok(tok, str(path.resolve()), template, template_source, eos, eos_id, bos,
               tok.get_vocab_size(with_added_tokens=True), _content(tok.to_str(), eos, bos),
               file_fingerprint(raw, eos, bos))


def _content(tokenizer_json: str, eos: str | None, bos: str | None) -> str:
    """The identity fingerprint of a loaded tokenizer's JSON (as `tokenizers` writes it: defaults spelled out)."""
    return identity_fingerprint(tokenizer_identity(tokenizer_json, eos, bos))
