"""What the read side needs of a scan to describe one of its samples: the tokenizer the scan recorded, loaded as
the scan loaded it, and what the scan's format trained, in one line (`plancc show`, `plancc.review.show`)."""

from __future__ import annotations

from plancc.config.settings import ScanOptions
from plancc.errors import InputError
from plancc.scan import formats
from plancc.scan.sources.tokenizer import Tok, load_tokenizer, spec_of, with_tokens
from plancc.store.scan_record import ScanRecord


def recorded_tokenizer(record: ScanRecord, tokenizer: str | None = None) -> Tok:
    """The tokenizer `record` names, with the tokens the scan added; `tokenizer` is where it is now, if it moved."""
    spec = spec_of(record.tokenizer, tokenizer)
    if spec is None:
        raise InputError("the scan recorded no tokenizer (its source was already tokenized): give the tokenizer "
                         "to decode with (--tokenizer)")
    options = record.options
    added = (tuple(options.special_tokens), tuple(options.added_tokens), tuple(options.added_special_tokens)) \
        if options is not None else ((), (), ())
    return with_tokens(load_tokenizer(spec), *added) if any(added) else load_tokenizer(spec)


def trained(record: ScanRecord) -> str:
    """What the scan supervised, in one line: the what-is-trained settings that apply to its format, defaults
    included ("" for a record of no known format)."""
    if record.format not in {f.name for f in formats.FORMATS}:
        return ""
    template = record.chat_template
    return formats.get(record.format).trained(record.options or ScanOptions(),
                                              generation=bool(template and template.generation))
