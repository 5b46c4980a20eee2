"""The tokenizer a plan was compiled with, and the check that a trainer is given that one.

A plan's token ids mean something only under the tokenizer that made them: training with another one (another
vocabulary, another eos) runs without an error and learns the wrong thing, and a Trainer saves that tokenizer beside
the model. The plan records the tokenizer's name (its resolved path, or `plancc-byte-level` for the built-in one)
and its identity fingerprint (`plancc.store.tokenizer_identity`: vocabulary, merges, added tokens and their flags,
normalizer, pre- and post-processor, eos and bos), bound by the plan's metadata fingerprint; `check_tokenizer`
computes the identity of the tokenizer given to training and refuses another one, naming what differs when the
plan's own tokenizer files are still where the plan says.

A tokenizer object (a transformers tokenizer, a `tokenizers.Tokenizer`) is identified by what it holds in memory:
its JSON as `tokenizers` writes it and its eos and bos (an eos it lacks is guessed as compile guessed it,
`tokenizer_specials`); a path by its `tokenizer.json` and `tokenizer_config.json`. So a `save_pretrained` copy (what
every checkpoint holds) passes, and a token added after loading is seen. Plans compiled before the identity recorded
a digest of the file's bytes; that digest is accepted too. `tokenizers` is imported only here, and only when a
tokenizer is checked.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plancc.errors import PlanMismatchError
from plancc.store.fingerprint import tokenizer_specials
from plancc.store.plan import Plan, verified_plan
from plancc.store.tokenizer_identity import (
    file_fingerprint,
    identity_difference,
    identity_fingerprint,
    tokenizer_identity,
)

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


@dataclass(frozen=True)
class _Given:
    """A tokenizer's JSON (as `tokenizers` writes it), eos and bos, and the digests older plans recorded of it."""

    text: str
    eos: str | None
    bos: str | None
    legacy: tuple[str, ...]

    @property
    def identity(self) -> dict[str, Any]:
        return tokenizer_identity(self.text, self.eos, self.bos)


def _from_file(path: Path) -> _Given:
    """A tokenizer directory or `tokenizer.json`, read as compile reads it."""
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
    return _Given(vocab.to_str(), eos, bos, (file_fingerprint(raw, eos, bos),))


def _from_object(tokenizer: Any) -> _Given:
    """A tokenizer in memory; its legacy digests: of its JSON less an empty post-processor (how older plancc
    fingerprinted objects), and of the files it was loaded from (how older plancc preferred them)."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    text = backend.to_str()
    specials = {"eos_token": getattr(tokenizer, "eos_token", None), "bos_token": getattr(tokenizer, "bos_token", None)}
    eos, bos = tokenizer_specials(specials, lambda t: backend.token_to_id(t) is not None)
    plain = text
    post = json.loads(text).get("post_processor") or {}
    if post.get("type") == "TemplateProcessing" and not post.get("special_tokens"):  # adds no token
        tok = Tokenizer.from_str(text)
        tok.post_processor = None
        plain = tok.to_str()
    legacy = [file_fingerprint(plain.encode(), specials["eos_token"], specials["bos_token"])]
    source = _source(tokenizer)
    if source is not None:
        legacy += _from_file(source).legacy
    return _Given(text, eos, bos, tuple(legacy))


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


def _given(tokenizer: Any) -> _Given | None:
    if isinstance(tokenizer, str | os.PathLike):
        source = _source(tokenizer)
        if source is None:
            raise PlanMismatchError(f"tokenizer {tokenizer}: no tokenizer.json there")
        return _from_file(source)
    if hasattr(getattr(tokenizer, "backend_tokenizer", tokenizer), "to_str"):
        return _from_object(tokenizer)
    return None


def fingerprint_of(tokenizer: Any) -> str | None:
    """The identity fingerprint of `tokenizer` (a path, a Hugging Face or `tokenizers` tokenizer), as compile records
    it; None when it has no tokenizer JSON to fingerprint (a slow tokenizer)."""
    given = _given(tokenizer)
    return identity_fingerprint(given.identity) if given is not None else None


def _difference(recorded: PlanTokenizer, given: _Given) -> str:
    """What differs from the plan's tokenizer, when its files are still where the plan recorded them."""
    source = _source(recorded.name) if not recorded.builtin else None
    if source is None:
        return ""
    found = identity_difference(_from_file(source).identity, given.identity)
    return f" ({found})" if found else ""


def check_tokenizer(plan: str | Path | Plan, tokenizer: Any) -> None:
    """Refuse `tokenizer` (a path, a Hugging Face or `tokenizers` tokenizer) unless it is the one `plan` was
    compiled with, by content: PlanMismatchError naming both and what differs. A plan of already tokenized data
    records none: nothing to check."""
    plan = verified_plan(plan)
    recorded = plan_tokenizer(plan)
    if recorded is None:
        return
    given = _given(tokenizer)
    if given is None:
        got = f"{describe(tokenizer)}, which has no tokenizer JSON to fingerprint"
    else:
        found = identity_fingerprint(given.identity)
        if recorded.fingerprint == found or recorded.fingerprint in given.legacy:
            return
        got = f"{describe(tokenizer)} (fingerprint {found}){_difference(recorded, given)}"
    raise PlanMismatchError(
        f"the tokenizer given is {got}, but plan {plan.path} was compiled with {recorded.name} (fingerprint "
        f"{recorded.fingerprint}): its token ids mean nothing under another tokenizer; load that one "
        "(AutoTokenizer.from_pretrained(path)) or recompile the plan with this tokenizer")


__all__ = ["BUILTIN_NAME", "PlanTokenizer", "check_tokenizer", "fingerprint_of", "plan_tokenizer"]
