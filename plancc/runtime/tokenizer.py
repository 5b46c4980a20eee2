"""The tokenizer a plan was compiled with, and the check that a trainer is given that one.

A plan's token ids mean something only under the tokenizer that made them: training with another one (another
vocabulary, another eos) runs without an error and learns the wrong thing, and a Trainer saves that tokenizer beside
the model. The plan records the tokenizer's name (its resolved path, or `plancc-byte-level` for the built-in one)
and its fingerprint (`plancc.store.fingerprint.tokenizer_fingerprint`), bound by the plan's metadata fingerprint;
`check_tokenizer` computes the same fingerprint of the tokenizer given to training and refuses another one.

How a tokenizer object is fingerprinted, as compile did: one loaded from a local directory or `tokenizer.json`
(`name_or_path`, what `AutoTokenizer.from_pretrained(path)` records) by those files: the file's bytes, the eos and
bos of its `tokenizer_config.json` (`plancc.store.fingerprint.tokenizer_specials`). One built in memory (the built-in
tokenizer wrapped in a `PreTrainedTokenizerFast`, a `tokenizers.Tokenizer`) by its JSON and its eos and bos tokens,
less the empty post-processor transformers adds (it changes no id). `tokenizers` is imported only here, and only
when a tokenizer object is checked.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plancc.errors import PlanMismatchError
from plancc.store.fingerprint import tokenizer_fingerprint, tokenizer_specials
from plancc.store.plan import Plan, verified_plan

BUILTIN_NAME = "plancc-byte-level"  # the name a plan records for `--tokenizer builtin`


@dataclass(frozen=True)
class PlanTokenizer:
    """The tokenizer a plan records: `name` (a resolved path, or `BUILTIN_NAME`) and its fingerprint."""

    name: str
    fingerprint: str

    @property
    def builtin(self) -> bool:
        """Whether the plan was compiled with plancc's built-in byte-level tokenizer."""
        return self.name == BUILTIN_NAME


def plan_tokenizer(plan: str | Path | Plan) -> PlanTokenizer | None:
    """The tokenizer `plan` was compiled with; None for a plan of already tokenized data (no tokenizer made it)."""
    scan = verified_plan(plan).scan_record
    name, fingerprint = scan.tokenizer, scan.tokenizer_fingerprint
    if not isinstance(name, str) or not isinstance(fingerprint, str):
        return None
    return PlanTokenizer(name, fingerprint)


def _file_fingerprint(path: Path) -> str:
    """The compiler's fingerprint of a tokenizer directory or `tokenizer.json` (see module docstring)."""
    from tokenizers import Tokenizer

    json_path = path / "tokenizer.json" if path.is_dir() else path
    config_path = json_path.parent / "tokenizer_config.json"
    try:
        raw = json_path.read_bytes()
        vocab = Tokenizer.from_str(raw.decode("utf-8"))
        config = json.loads(config_path.read_bytes()) if config_path.is_file() else {}
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise PlanMismatchError(f"tokenizer {path}: unreadable ({str(exc).splitlines()[0]})") from None
    eos, bos = tokenizer_specials(config if isinstance(config, dict) else {},
                                  lambda t: vocab.token_to_id(t) is not None)
    return tokenizer_fingerprint(raw, eos, bos)


def _object_fingerprint(tokenizer: Any) -> str:
    """The compiler's fingerprint of a tokenizer built in memory (see module docstring)."""
    from tokenizers import Tokenizer

    text = getattr(tokenizer, "backend_tokenizer", tokenizer).to_str()
    post = json.loads(text).get("post_processor") or {}
    if post.get("type") == "TemplateProcessing" and not post.get("special_tokens"):  # adds no token
        tok = Tokenizer.from_str(text)
        tok.post_processor = None
        text = tok.to_str()
    return tokenizer_fingerprint(text.encode(), getattr(tokenizer, "eos_token", None),
                                 getattr(tokenizer, "bos_token", None))


def _source(tokenizer: Any) -> Path | None:
    """The local tokenizer directory or `tokenizer.json` `tokenizer` was loaded from, if any."""
    where = tokenizer if isinstance(tokenizer, str | os.PathLike) else getattr(tokenizer, "name_or_path", None)
    if not where:
        return None
    path = Path(where).expanduser()
    return path if (path / "tokenizer.json").is_file() or (path.is_file() and path.suffix == ".json") else None


def describe(tokenizer: Any) -> str:
    """How a message names `tokenizer`: its source path, else its class."""
    source = _source(tokenizer)
    return str(source.resolve()) if source is not None else f"an in-memory {type(tokenizer).__name__}"


def fingerprint_of(tokenizer: Any) -> str | None:
    """The compiler's fingerprint of `tokenizer` (a path, a Hugging Face or `tokenizers` tokenizer); None when it
    has no tokenizer JSON to fingerprint (a slow tokenizer not loaded from a local directory)."""
    source = _source(tokenizer)
    if source is not None:
        return _file_fingerprint(source)
    if isinstance(tokenizer, str | os.PathLike):
        raise PlanMismatchError(f"tokenizer {tokenizer}: no tokenizer.json there")
    if hasattr(getattr(tokenizer, "backend_tokenizer", tokenizer), "to_str"):
        return _object_fingerprint(tokenizer)
    return None


def check_tokenizer(plan: str | Path | Plan, tokenizer: Any) -> None:
    """Refuse `tokenizer` (a path, a Hugging Face or `tokenizers` tokenizer) unless it is the one `plan` was
    compiled with: PlanMismatchError naming both. A plan of already tokenized data records none: nothing to check."""
    plan = verified_plan(plan)
    recorded = plan_tokenizer(plan)
    if recorded is None:
        return
    found = fingerprint_of(tokenizer)
    if found == recorded.fingerprint:
        return
    got = (f"{describe(tokenizer)} (fingerprint {found})" if found is not None
           else f"{describe(tokenizer)}, which has no tokenizer JSON to fingerprint")
    raise PlanMismatchError(
        f"the tokenizer given is {got}, but plan {plan.path} was compiled with {recorded.name} (fingerprint "
        f"{recorded.fingerprint}): its token ids mean nothing under another tokenizer; load that one "
        "(AutoTokenizer.from_pretrained(path)) or recompile the plan with this tokenizer")


__all__ = ["BUILTIN_NAME", "PlanTokenizer", "check_tokenizer", "fingerprint_of", "plan_tokenizer"]
