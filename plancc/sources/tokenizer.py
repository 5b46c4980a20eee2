"""Load a tokenizer (`tokenizer.json`, a Hugging Face tokenizer directory, or the built-in byte-level one) and the
chat template its directory ships, without transformers and without running any code from the tokenizer directory.

The built-in tokenizer (`--tokenizer builtin`, chosen on purpose, never by default) is a real
`tokenizers.Tokenizer`: a byte-level BPE with no merges (one token per UTF-8 byte, ids 0-255) plus ChatML-style
special tokens, so that plancc works with nothing downloaded. It ships no chat template. The fingerprint covers what
changes token ids: the tokenizer JSON and the eos/bos tokens; the chat template is fingerprinted on its own
(`plancc.sources.templates`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import orjson
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from plancc.errors import InputError
from plancc.fingerprint import tokenizer_fingerprint, tokenizer_specials

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
    fingerprint: str
    byte_ids: bool = False  # built-in: the ids of a text without special-token markup are its UTF-8 bytes


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
    """`spec` is `builtin`, a tokenizer.json file, or a directory with tokenizer.json (+ tokenizer_config.json)."""
    return _load_tokenizer(spec, spec if spec == BUILTIN else str(Path(spec).expanduser().absolute()))


@functools.lru_cache(maxsize=4)
def _load_tokenizer(spec: str, absolute: str) -> Tok:
    """Cached by absolute path too: one relative `spec` names different files from different folders."""
    if spec == BUILTIN:
        tok = _builtin()
        return Tok(tok, BUILTIN_NAME, None, None, "<|eos|>", tok.token_to_id("<|eos|>"), "<|bos|>",
                   tok.get_vocab_size(with_added_tokens=True),
                   tokenizer_fingerprint(tok.to_str().encode(), "<|eos|>", "<|bos|>"), byte_ids=True)
    path = Path(absolute)
    directory = path if path.is_dir() else path.parent
    json_path = path / "tokenizer.json" if path.is_dir() else path
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
               tok.get_vocab_size(with_added_tokens=True), tokenizer_fingerprint(raw, eos, bos))
