"""Which chat template renders conversations: explicit, named in the manifest, fingerprinted, checked against the
vocabulary.

Chat data needs a template, and a wrong one trains the model on the wrong markup without any error, so nothing is
guessed: the template is `--chat-template NAME` (one of ours below), `--chat-template FILE.jinja`, or the one the
tokenizer directory ships (`tokenizer_config.json` / `chat_template.jinja`). The built-in ones are written for
plancc; `bos_token` is the tokenizer's.

A template whose markers (`<|im_start|>`, `<｜User｜>`, ...) are not single tokens of the vocabulary renders them as
several ordinary pieces: legal, usually a mistake (the model never saw them so), hence a warning.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plancc.core.paths import not_regular
from plancc.errors import InputError
from plancc.scan.sources.chat import TemplateProblem, compiled, has_generation_tags
from plancc.scan.sources.tokenizer import Tok

BUILTIN_TEMPLATES = {
    # <|im_start|>role\ncontent<|im_end|>\n per turn
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    # bos, then <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> per turn (content trimmed)
    "llama3": (
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
        " + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
}

_MARKER = re.compile(r"<\|[^|<>\s'\"]{1,48}\|>|<｜[^｜<>'\"]{1,48}｜>|<(?:start|end)_of_turn>")


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's Jinja text, its name and where it came from."""

    name: str  # a built-in name, or the file it was read from
    text: str
    origin: str  # "builtin", "file" (--chat-template FILE) or "tokenizer" (the tokenizer directory's own)

    @property
    def fingerprint(self) -> str:
        """BLAKE2b-128 of the template text (folds into the metadata fingerprint)."""
        return hashlib.blake2b(self.text.encode(), digest_size=16).hexdigest()

    def at(self, line: int | None) -> str:
        """Where line `line` of the template's text is: a line of its file, or of the `chat_template` value of a
        tokenizer_config.json."""
        if line is None:
            return self.name
        if self.origin == "tokenizer" and self.name.endswith(".json"):
            return f"{self.name}: chat_template line {line}"
        return f"{self.name} line {line}"

    def describe(self) -> dict[str, Any]:
        """Name, origin and fingerprint, as the scan report and manifest record them (and `generation`: true for a
        template whose `{% generation %}` blocks mark what is trained)."""
        tagged = {"generation": True} if has_generation_tags(self.text) else {}
        return {"name": self.name, "origin": self.origin, "fingerprint": self.fingerprint, **tagged}


def resolve(spec: str | None, tok: Tok | None) -> ChatTemplate | None:
    """The template `--chat-template spec` names, else the tokenizer directory's own; None when there is neither."""
    if spec is None:
        if tok is None or tok.chat_template is None:
            return None
        return ChatTemplate(tok.template_source or tok.name, tok.chat_template, "tokenizer")
    if spec in BUILTIN_TEMPLATES:
        return ChatTemplate(spec, BUILTIN_TEMPLATES[spec], "builtin")
    path = Path(spec).expanduser()
    special = not_regular(path, "a chat template from a regular file")
    if special:
        raise InputError(f"--chat-template {spec}: {special}")
    if not path.is_file():
        raise InputError(f"--chat-template {spec}: no such file, and not a built-in template "
                         f"({', '.join(BUILTIN_TEMPLATES)})")
    try:
        return ChatTemplate(str(path.resolve()), path.read_text(encoding="utf-8"), "file")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--chat-template {spec}: cannot read it as UTF-8 text ({exc})") from None


def require(template: ChatTemplate | None, tok: Tok) -> ChatTemplate:
    """`template`, once it compiles (a syntax error names its file and line), or an error naming --chat-template
    when chat data has none."""
    if template is None:
        raise InputError(
            f"chat data needs a chat template and tokenizer {tok.name} ships none: pass --chat-template "
            f"FILE.jinja or a built-in name ({', '.join(BUILTIN_TEMPLATES)}) matching the model you train"
        )
    try:
        compiled(template.text)
    except TemplateProblem as exc:
        raise InputError(f"{template.at(exc.line)}: {exc}") from None
    return template


def split_markers(template: ChatTemplate, tok: Tok) -> dict[str, int]:
    """Markers written in the template that the tokenizer does not encode as one token: {marker: pieces}."""
    out = {}
    for marker in sorted(set(_MARKER.findall(template.text))):
        pieces = len(tok.tokenizer.encode(marker, add_special_tokens=False).ids)
        if pieces != 1:
            out[marker] = pieces
    return out


def marker_warning(template: ChatTemplate, tok: Tok) -> str | None:
    """A warning when the template's markers are not single tokens of the tokenizer's vocabulary (likely another
    model's template), else None."""
    split = split_markers(template, tok)
    if not split:
        return None
    listed = ", ".join(f"{m} ({n} tokens)" for m, n in list(split.items())[:4])
    return (f"chat template {template.name}: markers are not single tokens of tokenizer {tok.name}: {listed}; "
            "is this the model's template?")
